#include "request.h"

#include <algorithm>
#include <cmath>

namespace mitt::native {
namespace {

grpc::Status Invalid(const std::string& message) { return {grpc::StatusCode::INVALID_ARGUMENT, message}; }

grpc::Status Unimplemented(const std::string& field) {
  return {grpc::StatusCode::UNIMPLEMENTED,
          "the native engine does not answer " + field + " yet: serve with --engine python"};
}

// The first field set that the native engine does not answer, or "" when there is none.
std::string UnansweredField(const retrieval::v1::RetrieveRequest& request) {
  using retrieval::v1::MergeStrategy;
  if (request.merge() != retrieval::v1::MERGE_STRATEGY_UNSPECIFIED && request.merge() != retrieval::v1::MAX_SCORE) {
    return "merge " + MergeStrategy_Name(request.merge());
  }
  if (request.allow_ids_size() > 0) return "allow_ids";
  if (!request.category().empty()) return "category";
  if (request.return_interests()) return "return_interests";
  if (request.has_rerank()) return "rerank";
  if (request.explain()) return "explain";
  return "";
}

}  // namespace

grpc::Status ParseRequest(const retrieval::v1::RetrieveRequest& request, const Vocabulary& vocabulary,
                          const Limits& limits, Query* query) {
  // Events replace the history: refused before the history's checks, which would misread them.
  if (request.events_size() > 0) return Unimplemented("events");
  const uint32_t k = request.k();
  if (k < 1 || k > limits.max_k) {
    return Invalid("k must be between 1 and " + std::to_string(limits.max_k) + ", got " + std::to_string(k));
  }
  const int length = request.history_size();
  if (length == 0) return Invalid("history is empty: send at least one item id");
  if (static_cast<uint32_t>(length) > limits.max_history) {
    return Invalid("history has " + std::to_string(length) + " ids, at most " + std::to_string(limits.max_history) +
                   " are accepted");
  }
  const float lambda = request.diversity_lambda();
  if (!std::isfinite(lambda) || lambda < 0) {
    return Invalid("diversity_lambda must be a finite number >= 0, got " + std::to_string(lambda));
  }
  if (lambda != 0 && request.merge() != retrieval::v1::DIVERSITY) {
    const auto merge = request.merge() == retrieval::v1::MERGE_STRATEGY_UNSPECIFIED ? retrieval::v1::MAX_SCORE
                                                                                     : request.merge();
    return Invalid("diversity_lambda is only used by the DIVERSITY merge, not " +
                   retrieval::v1::MergeStrategy_Name(merge));
  }
  const uint32_t per_interest_k = request.per_interest_k();
  if (per_interest_k != 0 && (per_interest_k < k || per_interest_k > limits.max_per_interest_k)) {
    return Invalid("per_interest_k must be 0 (= k) or between k (" + std::to_string(k) + ") and " +
                   std::to_string(limits.max_per_interest_k) + ", got " + std::to_string(per_interest_k));
  }
  for (const auto& [name, size] : {std::pair<const char*, int>{"exclude_ids", request.exclude_ids_size()},
                                   std::pair<const char*, int>{"allow_ids", request.allow_ids_size()}}) {
    if (static_cast<uint32_t>(size) > limits.max_filter_ids) {
      return Invalid(std::string(name) + " has " + std::to_string(size) + " ids, at most " +
                     std::to_string(limits.max_filter_ids) + " are accepted");
    }
  }
  if (request.user_id().size() > limits.max_user_id) {
    return Invalid("user_id has " + std::to_string(request.user_id().size()) + " characters, at most " +
                   std::to_string(limits.max_user_id));
  }
  if (const std::string field = UnansweredField(request); !field.empty()) return Unimplemented(field);

  query->history.clear();
  query->history.reserve(static_cast<size_t>(length));
  for (const std::string& id : request.history()) {
    if (const int32_t dense = vocabulary.Lookup(id); dense != 0) query->history.push_back(dense);
  }
  if (query->history.empty()) {
    return Invalid("none of the " + std::to_string(length) + " history ids is in the model's vocabulary");
  }
  query->excluded.assign(query->history.begin(), query->history.end());
  for (const std::string& id : request.exclude_ids()) {
    if (const int32_t dense = vocabulary.Lookup(id); dense != 0) query->excluded.push_back(dense);
  }
  std::sort(query->excluded.begin(), query->excluded.end());
  query->excluded.erase(std::unique(query->excluded.begin(), query->excluded.end()), query->excluded.end());
  query->k = k;
  const size_t fetch = std::max(k, per_interest_k) + query->excluded.size();
  query->fetch = static_cast<uint32_t>(std::min(fetch, vocabulary.size()));
  query->unknown = static_cast<uint32_t>(length) - static_cast<uint32_t>(query->history.size());
  return grpc::Status::OK;
}

}  // namespace mitt::native
