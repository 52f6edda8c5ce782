// How one user's K per-interest candidate lists become one list (index/merge.py's max_score).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace mitt::native {

struct ScoredItem {
  int64_t id;
  float score;
  int32_t interest;  // the interest (row) that gave the score
};

// The k distinct ids with the best score over the interests, best first (ties: smaller id; an
// id's interest: the lowest among those giving its best score), as index.merge.max_score.
//
// ids, scores: [num_interests, n] row-major; id -1 marks an empty slot. excluded: sorted ids
// never returned (the history and the request's exclude list).
std::vector<ScoredItem> MergeMaxScore(const int64_t* ids, const float* scores, size_t num_interests, size_t n,
                                      const std::vector<int64_t>& excluded, size_t k);

}  // namespace mitt::native
