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

// The max-score merge over ids 1..max_id, with scratch space for one merge at a time (it is
// used by the batcher's thread only).
class MaxScoreMerge {
 public:
  explicit MaxScoreMerge(size_t max_id) : stamps_(max_id + 1, 0) {}

  // The k distinct ids with the best score over the interests, best first (ties: smaller id; an
  // id's interest: the lowest among those giving its best score), as index.merge.max_score.
  //
  // ids, scores: [num_interests, n] row-major, each row best first (a row out of that order is
  // sorted here); id -1 marks an empty slot. excluded: ids never returned (the history and the
  // request's exclude list). Throws std::out_of_range naming an id outside 1..max_id, and
  // std::domain_error for a NaN score.
  std::vector<ScoredItem> operator()(const int64_t* ids, const float* scores, size_t num_interests, size_t n,
                                     const std::vector<int64_t>& excluded, size_t k);

 private:
  // stamps_[id] == round_: the id is excluded or already taken in the current merge.
  std::vector<uint32_t> stamps_;
  uint32_t round_ = 0;
  std::vector<ScoredItem> items_;  // the rows' usable candidates, row after row
  std::vector<size_t> next_, end_;  // per row: its next candidate in items_, and its end
};

}  // namespace mitt::native
