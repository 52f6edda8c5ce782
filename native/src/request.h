// A RetrieveRequest checked and turned into a Query, in the Python engine's steps and with its
// messages (retrieval.api.convert and retrieval.serving.retriever), so that each call is refused
// for what the Python engine refuses it for, in the same order.
#pragma once

#include <cstdint>
#include <string>

#include <grpcpp/support/status.h>

#include "python_text.h"
#include "query.h"
#include "retrieval.pb.h"
#include "servable.h"

namespace mitt::native {

// The API's limits, handed over from retrieval.api.types (their one definition).
struct Limits {
  uint32_t max_k = 0;
  uint32_t max_history = 0;
  uint32_t max_per_interest_k = 0;
  uint32_t max_filter_ids = 0;
  uint32_t max_batch = 0;  // requests in a BatchRetrieve
  uint32_t max_user_id = 0;
  uint32_t max_name = 0;   // category and ranker names
  uint32_t default_rerank_candidates = 0;
};

class RequestChecker {
 public:
  RequestChecker(Limits limits, const PythonText& text) : limits_(limits), text_(text) {}

  const Limits& limits() const { return limits_; }

  // convert.check_sizes: lists and names over their limits, from their lengths alone.
  grpc::Status CheckSizes(const retrieval::v1::RetrieveRequest& request) const;
  // The rest of convert.query_from_request: history and events both sent, an unknown merge.
  grpc::Status CheckConversion(const retrieval::v1::RetrieveRequest& request) const;
  // Retriever.validate: the arguments' ranges (_check), the ranker, the category: what a call
  // passes before it joins a micro-batch.
  grpc::Status Validate(const retrieval::v1::RetrieveRequest& request, const Servable& servable) const;
  // Retriever._check then _prepare: the arguments' ranges, the ranker, the lookups (no known
  // history id), the category; fills `query`.
  grpc::Status Prepare(const retrieval::v1::RetrieveRequest& request, const Servable& servable, Query* query) const;

 private:
  grpc::Status Check(const retrieval::v1::RetrieveRequest& request) const;
  // The rerank's ranker (nullptr without a rerank) and the items to retrieve (`depth`).
  grpc::Status Ranker(const retrieval::v1::RetrieveRequest& request, const Servable& servable,
                      const std::pair<const std::string, RankerInfo>** ranker, uint32_t* depth) const;
  // The category's members (nullptr without a category).
  grpc::Status Category(const retrieval::v1::RetrieveRequest& request, const Servable& servable,
                        const std::vector<int64_t>** members) const;

  const Limits limits_;
  const PythonText& text_;
};

}  // namespace mitt::native
