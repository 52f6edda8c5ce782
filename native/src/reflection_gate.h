// Access control of gRPC's server reflection (access.CallGate's check of the services other than
// the retrieval service): a server interceptor identifies, authorizes and rate-limits each
// reflection call from its metadata, as the retrieval service checks its own calls. A refused
// call gets the Python engine's status, message and pushback; the reflection service, which is
// gRPC's own and cannot be stopped from answering, answers an empty request with empty messages
// meanwhile, so a refused caller learns nothing of the server's services.
#pragma once

#include <grpcpp/support/server_interceptor.h>

#include "access.h"
#include "call_metrics.h"

namespace mitt::native {

class ReflectionGate final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  ReflectionGate(AccessControl& access, CallMetrics& metrics) : access_(access), metrics_(metrics) {}

  // An interceptor for a reflection call, nullptr for any other (no cost to them).
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override;

 private:
  AccessControl& access_;
  CallMetrics& metrics_;
};

}  // namespace mitt::native
