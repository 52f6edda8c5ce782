// retrieval.v1.RetrievalService on gRPC's callback API, each call in the Python engine's order
// (docs/serving.md, "Admission"): the call limit, the deadline, the caller's identity, permission
// and rate, the request read and parsed, its
// lengths, its cost and admission, its checks and lookups; then it is queued for the batcher,
// which answers it. Requests arrive as bytes (raw methods) so that one that does not parse is
// refused INVALID_ARGUMENT, and one over --max-request-mb refused and counted message_size, as
// the Python engine refuses them.
#pragma once

#include <memory>
#include <optional>

#include <grpcpp/grpcpp.h>

#include "access.h"
#include "access_log.h"
#include "admission.h"
#include "batcher.h"
#include "call_limit.h"
#include "call_metrics.h"
#include "cost.h"
#include "memory_trimmer.h"
#include "request.h"
#include "retrieval.grpc.pb.h"
#include "servable_slot.h"
#include "stages.h"

namespace mitt::native {

using RawRetrievalService = retrieval::v1::RetrievalService::WithRawCallbackMethod_Retrieve<
    retrieval::v1::RetrievalService::WithRawCallbackMethod_BatchRetrieve<
        retrieval::v1::RetrievalService::WithRawCallbackMethod_GetModelInfo<retrieval::v1::RetrievalService::Service>>>;

class RetrievalService final : public RawRetrievalService {
 public:
  // `max_request_bytes`: the largest request read (gRPC's own limit is set above it: server.cc).
  RetrievalService(const ServableSlot& slot, const RequestChecker& checker, uint64_t max_request_bytes,
                   const CostUnits& units, AccessControl& access, AccessLog& log, Admission& admission,
                   CallLimit& calls, MicroBatcher& batcher, CallMetrics& metrics, Stages& stages,
                   MemoryTrimmer& trimmer)
      : slot_(slot), checker_(checker), max_request_bytes_(max_request_bytes), units_(units), access_(access),
        log_(log), admission_(admission), calls_(calls), batcher_(batcher), metrics_(metrics), stages_(stages),
        trimmer_(trimmer) {}

  grpc::ServerUnaryReactor* Retrieve(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* BatchRetrieve(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;

  // Sends a call's answers (status OK) or its status, releases what it held and counts it (a
  // capacity refusal by its reason): the engine's last step for every call it answers, and the
  // service's for every call it refuses.
  void End(std::unique_ptr<PendingCall> call, const grpc::Status& status);
  void End(std::unique_ptr<PendingCall> call, const Refusal& refused);

 private:
  // A held call for `context` answered by `reactor` (its default reactor), its caller identified,
  // authorized and rate-limited; nullptr when it was refused (the call limit, a deadline already
  // passed, access control) and answered already.
  std::unique_ptr<PendingCall> Arrive(grpc::CallbackServerContext* context, grpc::ServerUnaryReactor* reactor,
                                      grpc::ByteBuffer* response, Method method);
  void Finish(std::unique_ptr<PendingCall> call, const grpc::Status& status, const Refusal* refused);
  // Parses `request` into `message`; false (the call ended) when it does not parse or is refused
  // unread (over max_request_bytes, or large while heavy calls leave no room).
  bool Read(std::unique_ptr<PendingCall>& call, const grpc::ByteBuffer& request, google::protobuf::Message* message);
  // A call's start: its reactor, and the call as Arrive, then Read `request` into `message` leave it
  // (nullptr when it was refused and answered already).
  struct Started {
    grpc::ServerUnaryReactor* reactor;
    std::unique_ptr<PendingCall> call;
  };
  Started Begin(grpc::CallbackServerContext* context, const grpc::ByteBuffer& request, grpc::ByteBuffer* response,
                Method method, google::protobuf::Message* message);
  // Admits `call` (cheap at once; heavy by the admission, maybe later), then ends it with
  // `checked` when that is a failure, else queues it.
  void Admit(std::unique_ptr<PendingCall> call, grpc::Status checked);
  void Queue(std::unique_ptr<PendingCall> call);

  const ServableSlot& slot_;
  const RequestChecker& checker_;
  const uint64_t max_request_bytes_;
  const CostUnits& units_;
  AccessControl& access_;
  AccessLog& log_;
  Admission& admission_;
  CallLimit& calls_;
  MicroBatcher& batcher_;
  CallMetrics& metrics_;
  Stages& stages_;
  MemoryTrimmer& trimmer_;
};

}  // namespace mitt::native
