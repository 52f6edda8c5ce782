#include "service.h"

#include <string>

namespace mitt::native {
namespace {

grpc::ServerUnaryReactor* Refuse(grpc::CallbackServerContext* context, const grpc::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* RetrievalService::Retrieve(grpc::CallbackServerContext* context,
                                                     const retrieval::v1::RetrieveRequest* request,
                                                     retrieval::v1::RetrieveResponse* response) {
  auto call = std::make_unique<PendingCall>(PendingCall{context, nullptr, {Query{}}, {response}});
  const grpc::Status status =
      ParseRequest(*request, engine_.vocabulary(), engine_.options().limits, &call->queries.front());
  if (!status.ok()) return Refuse(context, status);
  return Queue(std::move(call));
}

grpc::ServerUnaryReactor* RetrievalService::BatchRetrieve(grpc::CallbackServerContext* context,
                                                          const retrieval::v1::BatchRetrieveRequest* request,
                                                          retrieval::v1::BatchRetrieveResponse* response) {
  const int count = request->requests_size();
  const uint32_t most = engine_.options().limits.max_batch;
  if (count == 0) return Refuse(context, {grpc::StatusCode::INVALID_ARGUMENT, "the batch is empty: send at least one request"});
  if (static_cast<uint32_t>(count) > most) {
    return Refuse(context, {grpc::StatusCode::INVALID_ARGUMENT, "the batch has " + std::to_string(count) +
                                                                    " requests, at most " + std::to_string(most) +
                                                                    " are accepted"});
  }
  auto call = std::make_unique<PendingCall>(PendingCall{context, nullptr, {}, {}});
  call->queries.resize(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    const grpc::Status status =
        ParseRequest(request->requests(i), engine_.vocabulary(), engine_.options().limits, &call->queries[i]);
    if (!status.ok()) {
      // One bad request fails the whole batch, naming it (as the Python engine).
      const std::string prefix = count > 1 ? "requests[" + std::to_string(i) + "]: " : "";
      return Refuse(context, {status.error_code(), prefix + status.error_message()});
    }
    call->responses.push_back(response->add_responses());
  }
  return Queue(std::move(call));
}

grpc::ServerUnaryReactor* RetrievalService::Queue(std::unique_ptr<PendingCall> call) {
  grpc::ServerUnaryReactor* reactor = call->context->DefaultReactor();
  call->reactor = reactor;
  if (std::unique_ptr<PendingCall> refused = batcher_.Submit(std::move(call))) {
    reactor->Finish({grpc::StatusCode::UNAVAILABLE, "the server is stopping"});
  }
  return reactor;
}

}  // namespace mitt::native
