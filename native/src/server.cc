#include "server.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <stdexcept>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/server_builder_option.h>
#include <grpcpp/impl/server_builder_plugin.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include "reflection_gate.h"

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

// gRPC's own receive limit, above the engine's: 4x it, at most INT_MAX (gRPC's setting is an
// int). The engine refuses a request over its limit itself (RetrievalService::Read), counted as
// message_size, in the access log, worded as the Python engine's clients read it; gRPC refuses
// one over its limit before any handler sees the call, uncounted and in its own words. gRPC 1.51
// compares a message's length with its limit only once it holds the whole message
// (message_size_filter), so a higher limit costs no memory on a plain request; it compares a
// compressed one's length before inflating it (message_decompress_filter), so the ceiling bounds
// what a compressed request can be inflated to before the engine refuses it: 4x what grpcio
// inflates for the Python engine. A client over the limit by a few times (a list or a batch too
// long) is counted; one past 4x is refused by gRPC.
int ReceiveCeiling(int max_request_bytes) {
  return static_cast<int>(std::min<int64_t>(int64_t{4} * max_request_bytes, std::numeric_limits<int>::max()));
}

// Binds `builder` to every one of `addresses` with `credentials`; the ports it will pick (on the
// heap: the builder writes them when it starts).
std::unique_ptr<std::vector<int>> Listen(grpc::ServerBuilder& builder, const std::vector<std::string>& addresses,
                                         const std::shared_ptr<grpc::ServerCredentials>& credentials) {
  auto ports = std::make_unique<std::vector<int>>(addresses.size(), 0);
  for (size_t i = 0; i < addresses.size(); ++i) builder.AddListeningPort(addresses[i], credentials, &(*ports)[i]);
  return ports;
}

// Starts `builder`'s server once every address is bound, on one port (0 picks one): BuildAndStart
// fails if any address cannot be bound. Throws std::runtime_error: `refusal` and the addresses.
std::unique_ptr<grpc::Server> BuildBound(grpc::ServerBuilder& builder, const std::vector<int>& ports,
                                         const std::vector<std::string>& addresses, const std::string& refusal) {
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  const bool bound = server != nullptr && !ports.empty() &&
                     std::all_of(ports.begin(), ports.end(), [&](int port) { return port != 0 && port == ports[0]; });
  if (!bound) {
    if (server != nullptr) server->Shutdown();
    std::string joined;
    for (const std::string& address : addresses) joined += (joined.empty() ? "" : ", ") + address;
    throw std::runtime_error(refusal + joined);
  }
  return server;
}

}  // namespace

NativeServer::NativeServer(std::shared_ptr<const Servable> servable, ModelInfos model_info, ServerOptions options)
    : options_(std::move(options)),
      text_(options_.printable),
      checker_(options_.limits, text_),
      slot_(std::move(servable), std::move(model_info)),
      access_(text_, options_.access),
      access_log_(options_.log_sample, options_.log_user_ids),
      admission_(options_.admission),
      calls_(options_.max_queued),
      metrics_(options_.latency_bounds, options_.batch_bounds),
      trimmer_(options_.large_request_bytes, std::chrono::milliseconds(200)),
      engine_(options_.explain_top, metrics_, stages_, [this](std::unique_ptr<PendingCall> call) {
        const grpc::Status status = call->status;
        service_.End(std::move(call), status);
      }),
      batcher_(options_.batching, [this](Batch batch) { engine_.Answer(std::move(batch)); }),
      service_(slot_, checker_, static_cast<uint64_t>(options_.max_request_bytes), options_.units, access_,
               access_log_, admission_, calls_, batcher_, metrics_, stages_, trimmer_) {}

NativeServer::~NativeServer() { Stop(0); }

std::shared_ptr<grpc::ServerCredentials> NativeServer::Credentials() const {
  if (!options_.tls) return grpc::InsecureServerCredentials();
  const TlsFiles& files = *options_.tls;
  // Re-read when they change (a renewed certificate for new connections, without a restart); a
  // key that does not match its certificate is refused by gRPC, which keeps the pair in use.
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      files.key, files.cert, files.ca, files.refresh_seconds);
  grpc::experimental::TlsServerCredentialsOptions tls(provider);
  tls.watch_identity_key_cert_pairs();
  if (!files.ca.empty()) {  // mutual TLS: clients present a certificate signed by the CA
    tls.watch_root_certs();
    tls.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  return grpc::experimental::TlsServerCredentials(tls);
}

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
  const auto ports = Listen(builder, addresses, Credentials());
  builder.RegisterService(&service_);
  if (!options_.reflection) {
    builder.SetOption(std::make_unique<WithoutReflection>());
  } else if (access_.checks()) {  // Python hands the access file's identities over before the start
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> gates;
    gates.push_back(std::make_unique<ReflectionGate>(access_, metrics_));
    builder.experimental().SetInterceptorCreators(std::move(gates));
  }
  builder.SetMaxReceiveMessageSize(ReceiveCeiling(options_.max_request_bytes));
  if (options_.max_response_bytes > 0) builder.SetMaxSendMessageSize(options_.max_response_bytes);
  // A second server on the port would silently take half the traffic: refuse it, as the Python
  // engine does (only a serving group's workers share a port).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, reuse_port ? 1 : 0);
  try {
    server_ = BuildBound(builder, *ports, addresses, "cannot serve on ");
  } catch (const std::runtime_error&) {
    admission_.Close();
    batcher_.Stop();
    stopped_ = true;
    throw;
  }
  port_ = (*ports)[0];
  // gRPC's health service starts with the whole server ("") SERVING: set both at once.
  serving_ = serving;
  SetStatus(serving);
  return port_;
}

int NativeServer::StartHealth(const std::vector<std::string>& addresses, bool reuse_port) {
  std::lock_guard<std::mutex> lock(lifecycle_mu_);
  if (server_ == nullptr || stopped_ || health_server_ != nullptr) {
    throw std::logic_error("the health port starts once, after the server and before its stop");
  }
  grpc::ServerBuilder builder;
  const auto ports = Listen(builder, addresses, grpc::InsecureServerCredentials());
  // Nothing but gRPC's default health service: no reflection, no retrieval service.
  builder.RegisterCallbackGenericService(&unimplemented_);
  builder.SetOption(std::make_unique<WithoutReflection>());
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, reuse_port ? 1 : 0);
  health_server_ = BuildBound(builder, *ports, addresses, "cannot serve the health port on ");
  health_port_ = (*ports)[0];
  SetStatus(serving_);
  return health_port_;
}

void NativeServer::SetServing(bool serving) {
  std::lock_guard<std::mutex> lock(lifecycle_mu_);
  if (server_ == nullptr || stopped_) return;
  serving_ = serving;
  SetStatus(serving);
}

void NativeServer::SetStatus(bool serving) {
  // The health port reports what the main port reports.
  for (grpc::Server* server : {server_.get(), health_server_.get()}) {
    if (server == nullptr) continue;
    server->GetHealthCheckService()->SetServingStatus(ServiceName(), serving);
    server->GetHealthCheckService()->SetServingStatus("", serving);
  }
}

void NativeServer::Stop(double grace_seconds) {
  std::lock_guard<std::mutex> lock(lifecycle_mu_);
  if (stopped_) return;
  stopped_ = true;
  admission_.Close();  // heavy calls waiting for room are refused now: they would not fit in the grace
  if (health_server_ != nullptr) health_server_->GetHealthCheckService()->Shutdown();
  if (server_ != nullptr) {
    server_->GetHealthCheckService()->Shutdown();  // NOT_SERVING, and stays so
    const auto grace = std::chrono::duration<double>(std::max(grace_seconds, 0.0));
    // Returns once every call is finished: the batcher keeps answering meanwhile (a call still
    // queued at the deadline is cancelled by gRPC, and its batch finishes it CANCELLED).
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::duration_cast<std::chrono::microseconds>(grace));
    server_->Wait();
  }
  if (health_server_ != nullptr) {  // stops with the server (its probes hold no call)
    health_server_->Shutdown(std::chrono::system_clock::now());
    health_server_->Wait();
  }
  batcher_.Stop();
}

}  // namespace mitt::native
