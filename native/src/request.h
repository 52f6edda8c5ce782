// A RetrieveRequest checked and turned into dense ids (what the Python engine's _check and
// _prepare do for the fields the native engine answers).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <grpcpp/support/status.h>

#include "retrieval.pb.h"
#include "vocabulary.h"

namespace mitt::native {

// The API's limits, handed over from retrieval.api.types (their one definition).
struct Limits {
  uint32_t max_k = 0;
  uint32_t max_history = 0;
  uint32_t max_per_interest_k = 0;
  uint32_t max_filter_ids = 0;
  uint32_t max_batch = 0;  // requests in a BatchRetrieve
  uint32_t max_user_id = 0;
};

// One user's query in dense ids.
struct Query {
  std::vector<int32_t> history;   // known ids, oldest first
  std::vector<int64_t> excluded;  // sorted unique: the known history and exclude ids
  uint32_t k = 0;
  uint32_t fetch = 0;    // candidates each interest must return: max(k, per_interest_k) + excluded
  uint32_t unknown = 0;  // history ids not in the vocabulary
};

// Checks `request` and fills `query`. INVALID_ARGUMENT for a value out of range (the message as
// the Python engine's), UNIMPLEMENTED for a field the native engine does not answer yet (the
// message names it and --engine python).
grpc::Status ParseRequest(const retrieval::v1::RetrieveRequest& request, const Vocabulary& vocabulary,
                          const Limits& limits, Query* query);

}  // namespace mitt::native
