// retrieval.v1.RetrievalService on gRPC's callback API: each handler checks and converts its
// request on gRPC's thread, queues it for the batcher and returns; the batch finishes it.
#pragma once

#include <memory>

#include <grpcpp/grpcpp.h>

#include "batcher.h"
#include "engine.h"
#include "retrieval.grpc.pb.h"

namespace mitt::native {

class RetrievalService final : public retrieval::v1::RetrievalService::CallbackService {
 public:
  RetrievalService(const Engine& engine, MicroBatcher<PendingCall>& batcher) : engine_(engine), batcher_(batcher) {}

  grpc::ServerUnaryReactor* Retrieve(grpc::CallbackServerContext* context,
                                     const retrieval::v1::RetrieveRequest* request,
                                     retrieval::v1::RetrieveResponse* response) override;
  grpc::ServerUnaryReactor* BatchRetrieve(grpc::CallbackServerContext* context,
                                          const retrieval::v1::BatchRetrieveRequest* request,
                                          retrieval::v1::BatchRetrieveResponse* response) override;

 private:
  // Queues `call` (or finishes it UNAVAILABLE when the server is stopping); its reactor.
  grpc::ServerUnaryReactor* Queue(std::unique_ptr<PendingCall> call);

  const Engine& engine_;
  MicroBatcher<PendingCall>& batcher_;
};

}  // namespace mitt::native
