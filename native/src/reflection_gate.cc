#include "reflection_gate.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>

#include <google/protobuf/message.h>

namespace mitt::native {
namespace {

using grpc::experimental::InterceptionHookPoints;

class Gate final : public grpc::experimental::Interceptor {
 public:
  Gate(grpc::experimental::ServerRpcInfo* info, AccessControl& access, CallMetrics& metrics)
      : info_(info), access_(access), metrics_(metrics) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_INITIAL_METADATA)) {
      std::shared_ptr<const Identity> caller;
      refused_ = access_.Identify(*info_->server_context(), *methods->GetRecvInitialMetadata(), &caller);
      if (!refused_) refused_ = access_.Allow(Method::kServerReflectionInfo, caller.get());
      if (caller != nullptr) identity_ = std::string(caller->label());
    }
    if (refused_) {
      // The request emptied before reflection reads it, its answer before it is sent.
      if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE)) {
        if (void* request = methods->GetRecvMessage()) static_cast<google::protobuf::Message*>(request)->Clear();
      }
      if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_MESSAGE)) {
        if (grpc::ByteBuffer* answer = methods->GetSerializedSendMessage()) answer->Clear();
      }
      if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) Refuse(methods);
    }
    methods->Proceed();
  }

 private:
  void Refuse(grpc::experimental::InterceptorBatchMethods* methods) {
    if (refused_->retry_after) {
      const double ms = std::max(1.0, std::nearbyint(*refused_->retry_after * 1000));  // as the service's
      methods->GetSendTrailingMetadata()->emplace("grpc-retry-pushback-ms", std::to_string(static_cast<int64_t>(ms)));
    }
    methods->ModifySendStatus({refused_->code, refused_->message});
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - arrived_).count();
    metrics_.Answered(Method::kServerReflectionInfo, refused_->code, seconds, refused_->reason, identity_);
  }

  grpc::experimental::ServerRpcInfo* const info_;
  AccessControl& access_;
  CallMetrics& metrics_;
  const std::chrono::steady_clock::time_point arrived_ = std::chrono::steady_clock::now();
  std::optional<Refusal> refused_;
  std::string identity_;
};

}  // namespace

grpc::experimental::Interceptor* ReflectionGate::CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) {
  if (std::strcmp(info->method(), FullMethodName(Method::kServerReflectionInfo)) != 0) return nullptr;
  return new Gate(info, access_, metrics_);
}

}  // namespace mitt::native
