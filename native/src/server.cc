#include "server.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/server_builder_option.h>
#include <grpcpp/impl/server_builder_plugin.h>

namespace mitt::native {
namespace {

const std::string& ServiceName() {
  static const std::string name = retrieval::v1::RetrievalService::service_full_name();
  return name;
}

// Drops server reflection's plugin from a server's builder (--no-reflection): gRPC registers the
// plugin for every server of the process once it is linked in.
class WithoutReflection final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->erase(std::remove_if(plugins->begin(), plugins->end(),
                                  [](const std::unique_ptr<grpc::ServerBuilderPlugin>& plugin) {
                                    return dynamic_cast<grpc::reflection::ProtoServerReflectionPlugin*>(plugin.get()) !=
                                           nullptr;
                                  }),
                   plugins->end());
  }
};

}  // namespace

NativeServer::NativeServer(std::shared_ptr<const Servable> servable, ModelInfos model_info, ServerOptions options)
    : options_(std::move(options)),
      text_(options_.printable),
      checker_(options_.limits, text_),
      slot_(std::move(servable), std::move(model_info)),
      access_(text_, options_.access),
      admission_(options_.admission),
      calls_(options_.max_queued),
      metrics_(options_.latency_bounds, options_.batch_bounds),
      engine_(options_.explain_top, metrics_, stages_, [this](std::unique_ptr<PendingCall> call) {
        const grpc::Status status = call->status;
        service_.End(std::move(call), status);
      }),
      batcher_(options_.batching, [this](Batch batch) { engine_.Answer(std::move(batch)); }),
      service_(slot_, checker_, options_.units, access_, admission_, calls_, batcher_, metrics_, stages_) {}

NativeServer::~NativeServer() { Stop(0); }

int NativeServer::Start(const std::vector<std::string>& addresses, bool serving, bool reuse_port) {
  std::lock_guard<std::mutex> lock(lifecycle_mu_);
  if (started_) throw std::logic_error("the server was already started");
  started_ = true;
  // Process-wide switches gRPC reads when a server is built (neither has a per-server form);
  // both only matter to this module's private copy of gRPC. The reflection plugin registers
  // itself as soon as it is linked in; the call is what links it.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // One selected port each: BuildAndStart fails if any address cannot be bound.
  std::vector<int> ports(addresses.size(), 0);
  for (size_t i = 0; i < addresses.size(); ++i) {
    builder.AddListeningPort(addresses[i], grpc::InsecureServerCredentials(), &ports[i]);
  }
  builder.RegisterService(&service_);
  if (!options_.reflection) builder.SetOption(std::make_unique<WithoutReflection>());
  if (options_.max_request_bytes > 0) builder.SetMaxReceiveMessageSize(options_.max_request_bytes);
  if (options_.max_response_bytes > 0) builder.SetMaxSendMessageSize(options_.max_response_bytes);
  // A second server on the port would silently take half the traffic: refuse it, as the Python
  // engine does (only a serving group's workers share a port).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, reuse_port ? 1 : 0);
  server_ = builder.BuildAndStart();
  const bool bound = server_ != nullptr && !ports.empty() &&
                     std::all_of(ports.begin(), ports.end(), [&](int port) { return port != 0 && port == ports[0]; });
  if (!bound) {
    if (server_ != nullptr) server_->Shutdown();
    server_.reset();
    admission_.Close();
    batcher_.Stop();
    stopped_ = true;
    std::string joined;
    for (const std::string& address : addresses) joined += (joined.empty() ? "" : ", ") + address;
    throw std::runtime_error("cannot serve on " + joined);
  }
  port_ = ports[0];
  // gRPC's health service starts with the whole server ("") SERVING: set both at once.
  SetStatus(serving);
  return port_;
}

void NativeServer::SetServing(bool serving) {
  std::lock_guard<std::mutex> lock(lifecycle_mu_);
  if (server_ != nullptr && !stopped_) SetStatus(serving);
}

void NativeServer::SetStatus(bool serving) {
  server_->GetHealthCheckService()->SetServingStatus(ServiceName(), serving);
  server_->GetHealthCheckService()->SetServingStatus("", serving);
}

void NativeServer::Stop(double grace_seconds) {
  std::lock_guard<std::mutex> lock(lifecycle_mu_);
  if (stopped_) return;
  stopped_ = true;
  admission_.Close();  // heavy calls waiting for room are refused now: they would not fit in the grace
  if (server_ != nullptr) {
    server_->GetHealthCheckService()->Shutdown();  // NOT_SERVING, and stays so
    const auto grace = std::chrono::duration<double>(std::max(grace_seconds, 0.0));
    // Returns once every call is finished: the batcher keeps answering meanwhile (a call still
    // queued at the deadline is cancelled by gRPC, and its batch finishes it CANCELLED).
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::duration_cast<std::chrono::microseconds>(grace));
    server_->Wait();
  }
  batcher_.Stop();
}

}  // namespace mitt::native
