#include "service.h"

#include <cmath>
#include <string>
#include <vector>

#include <grpcpp/support/proto_buffer_reader.h>

#include "python_text.h"

namespace mitt::native {
namespace {

grpc::Status Invalid(const std::string& message) { return {grpc::StatusCode::INVALID_ARGUMENT, message}; }

grpc::Status Indexed(const grpc::Status& status, size_t index) {
  return {status.error_code(), "requests[" + std::to_string(index) + "]: " + status.error_message()};
}

// The grpc-retry-pushback-ms trailer of a refusal: retry after `seconds`.
void AddPushback(grpc::CallbackServerContext* context, double seconds) {
  const double ms = std::max(1.0, std::nearbyint(seconds * 1000));  // round() of Python: ties to even
  context->AddTrailingMetadata("grpc-retry-pushback-ms", std::to_string(static_cast<int64_t>(ms)));
}

// A request of `bytes` over the engine's `limit`, refused unread in the words grpcio's core
// answers the Python engine's clients with (that engine counts the call message_size when gRPC
// hands its handler no message).
Refusal Oversized(size_t bytes, uint64_t limit) {
  return {"message_size",
          "SERVER: Received message larger than max (" + std::to_string(bytes) + " vs. " + std::to_string(limit) + ")",
          std::nullopt};
}

void Put(const std::string& bytes, grpc::ByteBuffer* buffer) {
  grpc::Slice slice(bytes);
  grpc::ByteBuffer filled(&slice, 1);
  buffer->Swap(&filled);
}

// admission.chunks: the queries cut into consecutive runs of at most `chunk_cost` units (one
// query at least each); each run's end.
std::vector<size_t> Chunks(const std::vector<double>& costs, double chunk_cost) {
  std::vector<size_t> ends;
  size_t start = 0;
  double total = 0;
  for (size_t i = 0; i < costs.size(); ++i) {
    if (i > start && total + costs[i] > chunk_cost) {
      ends.push_back(i);
      start = i;
      total = 0;
    }
    total += costs[i];
  }
  ends.push_back(costs.size());
  return ends;
}

}  // namespace

void RetrievalService::End(std::unique_ptr<PendingCall> call, const grpc::Status& status) {
  Finish(std::move(call), status, nullptr);
}

void RetrievalService::End(std::unique_ptr<PendingCall> call, const Refusal& refused) {
  Finish(std::move(call), {refused.code, refused.message}, &refused);
}

void RetrievalService::Finish(std::unique_ptr<PendingCall> call, const grpc::Status& status, const Refusal* refused) {
  if (status.ok()) {
    const auto serialising = Stages::Clock::now();
    if (call->method == Method::kBatchRetrieve) {
      retrieval::v1::BatchRetrieveResponse answers;
      for (auto& answer : call->answers) answers.add_responses()->Swap(&answer);
      Put(answers.SerializeAsString(), call->response);
    } else if (call->method == Method::kRetrieve) {  // GetModelInfo's answer is in place already
      Put(call->answers.front().SerializeAsString(), call->response);
    }
    stages_.Add(Stage::kResponse, serialising);
  } else if (refused != nullptr && refused->retry_after) {
    AddPushback(call->context, *refused->retry_after);
  }
  // Last: a refusal sets trailing metadata of its own.
  if (!call->request_id.empty()) call->context->AddTrailingMetadata("x-request-id", call->request_id);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - call->arrived).count();
  // Counted before it is sent, as the Python engine counts: a client holding its answer sees it counted.
  metrics_.Answered(call->method, status.error_code(), seconds, refused != nullptr ? refused->reason : "",
                    call->caller != nullptr ? call->caller->label() : std::string_view());
  if (call->record != nullptr) {
    call->record->code = status.error_code();
    call->record->seconds = seconds;
    if (status.ok()) call->record->model_version = call->servable->model_version;  // the version that answered
    log_.Write(std::move(*call->record));
  }
  call->reactor->Finish(status);
  if (call->heavy) admission_.Leave(call->cost, seconds);
  calls_.Leave(seconds);
}

std::unique_ptr<PendingCall> RetrievalService::Arrive(grpc::CallbackServerContext* context,
                                                      grpc::ServerUnaryReactor* reactor, grpc::ByteBuffer* response,
                                                      Method method) {
  if (!calls_.Enter()) {  // refused before anything is held
    const auto arrived = std::chrono::steady_clock::now();
    const Refusal refused = calls_.Refused();
    AddPushback(context, *refused.retry_after);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - arrived).count();
    metrics_.Answered(method, refused.code, seconds, refused.reason);
    reactor->Finish({refused.code, refused.message});
    return nullptr;
  }
  auto call = std::make_unique<PendingCall>();
  call->context = context;
  call->reactor = reactor;
  call->response = response;
  call->method = method;
  call->arrived = std::chrono::steady_clock::now();
  call->servable = slot_.current();  // one version for the whole call
  if (log_.on()) {
    call->request_id = AccessLog::RequestId(context->client_metadata());
    if (log_.Sampled()) {
      call->record = std::make_unique<AccessRecord>();
      call->record->request_id = call->request_id;
      call->record->method = method;
    }
  }
  if (const auto deadline = DeadlineOf(*context); deadline && *deadline <= std::chrono::system_clock::now()) {
    const double late = std::chrono::duration<double>(std::chrono::system_clock::now() - *deadline).count();
    End(std::move(call), {grpc::StatusCode::DEADLINE_EXCEEDED,
                          "the deadline passed " + Fixed(late, 3) + " s before the server started"});
    return nullptr;
  }
  // From the metadata alone, before the request is read: a caller refused costs no parse.
  std::optional<Refusal> refused = access_.Identify(*context, context->client_metadata(), &call->caller);
  if (!refused && call->record != nullptr) {  // its identity, or its address when none is checked
    call->record->identity = call->caller != nullptr ? call->caller->name : PeerHost(context->peer());
  }
  if (!refused) refused = access_.Allow(method, call->caller.get());
  if (refused) {
    End(std::move(call), *refused);
    return nullptr;
  }
  return call;
}

RetrievalService::Started RetrievalService::Begin(grpc::CallbackServerContext* context, const grpc::ByteBuffer& request,
                                                 grpc::ByteBuffer* response, Method method,
                                                 google::protobuf::Message* message) {
  // Once per call: each DefaultReactor() call starts a new reactor, forgetting a Finish.
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto call = Arrive(context, reactor, response, method);
  if (call != nullptr && !Read(call, request, message)) return {reactor, nullptr};
  return {reactor, std::move(call)};
}

bool RetrievalService::Read(std::unique_ptr<PendingCall>& call, const grpc::ByteBuffer& request,
                            google::protobuf::Message* message) {
  const auto parsing = Stages::Clock::now();
  trimmer_.Note(request.Length());  // refused or not, gRPC has held its bytes
  if (request.Length() > max_request_bytes_) {
    End(std::move(call), Oversized(request.Length(), max_request_bytes_));
    return false;
  }
  if (const auto refused = admission_.Screen(request.Length())) {
    End(std::move(call), *refused);
    return false;
  }
  grpc::ByteBuffer copy(request);  // the reader consumes its buffer
  grpc::ProtoBufferReader reader(&copy);
  if (!message->ParseFromZeroCopyStream(&reader)) {
    const std::string type = message->GetTypeName();
    End(std::move(call), Invalid("the request is not a valid " + type + ": Error parsing message with type '" + type + "'"));
    return false;
  }
  stages_.Add(Stage::kParse, parsing);
  return true;
}

grpc::ServerUnaryReactor* RetrievalService::Retrieve(grpc::CallbackServerContext* context,
                                                     const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
  retrieval::v1::RetrieveRequest parsed;
  auto [reactor, call] = Begin(context, *request, response, Method::kRetrieve, &parsed);
  if (call == nullptr) return reactor;
  if (call->record != nullptr) log_.Read(parsed, call->record.get());
  const auto checking = Stages::Clock::now();
  if (grpc::Status status = checker_.CheckSizes(parsed); !status.ok()) {
    End(std::move(call), status);
    return reactor;
  }
  const Servable& servable = *call->servable;
  call->cost = call->costliest = RequestCost(parsed, {servable.num_interests, servable.num_items}, units_);
  call->queries.resize(1);
  call->answers.resize(1);
  grpc::Status checked = checker_.CheckConversion(parsed);
  // A cheap call is validated before it joins a batch (the category before the lookups); a heavy
  // one computes alone, checked as a batch checks (the lookups before the category).
  if (checked.ok() && admission_.IsCheap(call->cost)) checked = checker_.Validate(parsed, servable);
  if (checked.ok()) checked = checker_.Prepare(parsed, servable, &call->queries.front());
  stages_.Add(Stage::kChecks, checking);
  Admit(std::move(call), checked);
  return reactor;
}

grpc::ServerUnaryReactor* RetrievalService::BatchRetrieve(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* request,
                                                          grpc::ByteBuffer* response) {
  retrieval::v1::BatchRetrieveRequest parsed;
  auto [reactor, call] = Begin(context, *request, response, Method::kBatchRetrieve, &parsed);
  if (call == nullptr) return reactor;
  if (call->record != nullptr) log_.Read(parsed, call->record.get());
  const auto checking = Stages::Clock::now();
  const auto count = static_cast<size_t>(parsed.requests_size());
  const uint32_t most = checker_.limits().max_batch;
  if (count > most) {  // before looking at any request
    End(std::move(call), Invalid("the batch has " + std::to_string(count) + " requests, at most " + std::to_string(most)));
    return reactor;
  }
  for (size_t i = 0; i < count; ++i) {
    if (grpc::Status status = checker_.CheckSizes(parsed.requests(static_cast<int>(i))); !status.ok()) {
      End(std::move(call), Indexed(status, i));
      return reactor;
    }
  }
  const Servable& servable = *call->servable;
  std::vector<double> costs;
  for (const auto& one : parsed.requests()) {
    costs.push_back(RequestCost(one, {servable.num_interests, servable.num_items}, units_));
    call->cost += costs.back();
    call->costliest = std::max(call->costliest, costs.back());
  }
  grpc::Status checked = count == 0 ? Invalid("the batch is empty: send at least one request") : grpc::Status::OK;
  for (size_t i = 0; i < count && checked.ok(); ++i) {
    if (grpc::Status status = checker_.CheckConversion(parsed.requests(static_cast<int>(i))); !status.ok()) {
      checked = Indexed(status, i);
    }
  }
  call->queries.resize(count);
  call->answers.resize(count);
  // The first bad request by its place: the batch is refused, naming it when there are several.
  for (size_t i = 0; i < count && checked.ok(); ++i) {
    if (grpc::Status status = checker_.Prepare(parsed.requests(static_cast<int>(i)), servable, &call->queries[i]);
        !status.ok()) {
      checked = count > 1 ? Indexed(status, i) : status;
    }
  }
  if (checked.ok() && !admission_.IsCheap(call->cost)) call->chunks = Chunks(costs, admission_.limits().chunk_cost);
  stages_.Add(Stage::kChecks, checking);
  Admit(std::move(call), checked);
  return reactor;
}

grpc::ServerUnaryReactor* RetrievalService::GetModelInfo(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
  retrieval::v1::GetModelInfoRequest parsed;
  auto [reactor, call] = Begin(context, *request, response, Method::kGetModelInfo, &parsed);
  if (call == nullptr) return reactor;
  const std::shared_ptr<const ModelInfos> info = slot_.model_info();
  const bool whole = call->caller == nullptr || call->caller->Has("admin");
  Put(whole ? info->whole : info->cut, response);
  End(std::move(call), grpc::Status::OK);
  return reactor;
}

void RetrievalService::Admit(std::unique_ptr<PendingCall> call, grpc::Status checked) {
  if (admission_.IsCheap(call->cost)) {
    if (!checked.ok()) return End(std::move(call), checked);
    return Queue(std::move(call));
  }
  // Heavy: the admission holds it until it fits, or refuses it; a bad one is refused only once
  // admitted, as the Python engine checks a heavy call after admitting it.
  const auto remaining = DeadlineOf(*call->context);
  auto wait = std::chrono::duration<double>(admission_.limits().heavy_wait);
  if (remaining) wait = std::min(wait, std::chrono::duration<double>(*remaining - std::chrono::system_clock::now()));
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::nanoseconds>(wait);
  if (call->chunks.empty()) call->chunks = {call->queries.size()};
  PendingCall* held = call.release();  // owned by the admission's callback from here
  admission_.Enter(held->cost, until, [this, held, checked](std::optional<Refusal> refused) {
    std::unique_ptr<PendingCall> admitted(held);
    if (refused) return End(std::move(admitted), *refused);
    admitted->heavy = true;
    if (!checked.ok()) return End(std::move(admitted), checked);
    Queue(std::move(admitted));
  });
}

void RetrievalService::Queue(std::unique_ptr<PendingCall> call) {
  double retry_after = 0;
  switch (batcher_.Submit(call, &retry_after)) {
    case MicroBatcher::Queued::kYes:
      return;
    case MicroBatcher::Queued::kStopping:
      return End(std::move(call), {grpc::StatusCode::UNAVAILABLE, "the server is shutting down"});
    case MicroBatcher::Queued::kFull:
      return End(std::move(call), Refusal{"batch_queue_full",
                                          "server busy: " + std::to_string(batcher_.max_queue()) +
                                              " requests queued, retry in about " + Fixed(retry_after * 1000, 0) +
                                              " ms",
                                          retry_after});
  }
}

}  // namespace mitt::native
