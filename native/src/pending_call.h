// An RPC waiting for its answers (a Retrieve: one query; a BatchRetrieve: several), and the work
// of one batch.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "access.h"
#include "access_log.h"
#include "call_metrics.h"
#include "python_text.h"
#include "query.h"
#include "retrieval.pb.h"
#include "servable.h"

namespace mitt::native {

struct PendingCall {
  grpc::CallbackServerContext* context = nullptr;
  grpc::ServerUnaryReactor* reactor = nullptr;
  grpc::ByteBuffer* response = nullptr;  // owned by gRPC
  Method method = Method::kRetrieve;     // a BatchRetrieve's answers go in one BatchRetrieveResponse
  std::shared_ptr<const Servable> servable;  // the version it was checked with answers it
  std::shared_ptr<const Identity> caller;    // nullptr: anonymous, every permission, nothing checked
  std::string request_id;                    // with the access log on: sent back in x-request-id
  std::unique_ptr<AccessRecord> record;      // a call the access log samples: its line
  std::vector<Query> queries;
  std::vector<retrieval::v1::RetrieveResponse> answers;  // one per query
  double cost = 0;             // the call's (admission units)
  double costliest = 0;        // its costliest query's
  bool heavy = false;          // admitted as heavy: computed alone, in chunks
  std::vector<size_t> chunks;  // heavy: each chunk's end (a query index)
  size_t next_chunk = 0;
  grpc::Status status;         // the first failure of one of its queries
  std::chrono::steady_clock::time_point arrived;
  size_t rows() const { return queries.size(); }
};

// A batch's queries (its calls' in [begin, end)) and the calls it finishes.
struct Batch {
  struct Slice {
    PendingCall* call;
    size_t begin, end;
  };
  std::vector<Slice> slices;
  std::vector<std::unique_ptr<PendingCall>> finished;  // answered once the slices are computed
};

// The call's deadline, nullopt for none.
inline std::optional<std::chrono::system_clock::time_point> DeadlineOf(const grpc::CallbackServerContext& context) {
  const auto deadline = context.deadline();
  // gRPC reports "no deadline" as a time centuries away.
  if (deadline - std::chrono::system_clock::now() > std::chrono::hours(24 * 365 * 100)) return std::nullopt;
  return deadline;
}

// "the deadline passed X s ago, after STAGE; the work stopped" (retriever.check_deadline's).
inline grpc::Status DeadlinePassed(double late_seconds, const std::string& stage) {
  return {grpc::StatusCode::DEADLINE_EXCEEDED,
          "the deadline passed " + Fixed(late_seconds, 3) + " s ago, after " + stage + "; the work stopped"};
}

}  // namespace mitt::native
