// The access log (retrieval.serving.access_log): a sampled share of the calls, each written as a
// record that Python drains and writes to the `retrieval.access` logger (one line each, the
// Python engine's fields); and while it is on, every call's request id in the x-request-id
// trailer.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "call_metrics.h"
#include "retrieval.pb.h"

namespace mitt::native {

// One call's line: the Python engine's fields, in its order.
struct AccessRecord {
  std::string request_id;
  std::optional<std::string> identity;  // nullopt: not identified (yet)
  Method method = Method::kRetrieve;
  bool read = false;  // the request was parsed: the next four fields are its
  uint64_t history_len = 0, k = 0;
  std::optional<size_t> batch;        // a BatchRetrieve's requests
  std::vector<std::string> user_ids;  // only when asked for
  grpc::StatusCode code = grpc::StatusCode::OK;
  double seconds = 0;  // in the server, checks included
  std::optional<std::string> model_version;  // of the answer; nullopt for a failed call
};

class AccessLog {
 public:
  // access_log.MAX_REQUEST_ID: longer ids sent by callers are replaced by a generated one.
  static constexpr size_t kMaxRequestId = 128;
  // Records kept for Python beyond which new ones are dropped (counted): Python drains them
  // every few milliseconds, a stalled interpreter must not fill the memory.
  static constexpr size_t kMaxRecords = 100000;

  // `sample`: the share of calls logged, 0 for no log; `user_ids`: log the requests' user_id.
  AccessLog(double sample, bool user_ids) : sample_(sample), user_ids_(user_ids) {}

  bool on() const { return sample_ > 0; }
  // Whether to log this call (at random, at `sample`).
  bool Sampled() const;
  // access_log.request_id: the caller's x-request-id if usable, else a new random id.
  static std::string RequestId(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata);
  // access_log.request_fields: a parsed request's history_len, k (batch, user_id).
  void Read(const retrieval::v1::RetrieveRequest& request, AccessRecord* record) const;
  void Read(const retrieval::v1::BatchRetrieveRequest& request, AccessRecord* record) const;

  void Write(AccessRecord record);
  // The records written since the last call, and how many were dropped meanwhile.
  std::pair<std::vector<AccessRecord>, uint64_t> Take();

 private:
  const double sample_;
  const bool user_ids_;
  std::mutex mu_;
  std::vector<AccessRecord> records_;  // under mu_
  uint64_t dropped_ = 0;               // under mu_
};

}  // namespace mitt::native
