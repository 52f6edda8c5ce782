// How one user's K per-interest candidate lists become one list (index/merge.py's strategies, over
// the lists index.multi_interest hands them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "categories.h"
#include "kernel.h"

namespace mitt::native {

// One user's candidate lists: [interests, n] row-major, each row best first as the search
// returned it; id -1 marks an empty slot.
struct Lists {
  const int64_t* ids;
  const float* scores;
  size_t interests;
  size_t n;
};

// The merges, with scratch space for one merge at a time (the batcher's thread's). Each drops
// `excluded` (the history and the request's exclude list) from the lists first, and throws
// std::out_of_range naming an id outside 1..max_id, std::domain_error for a NaN score.
class Merger {
 public:
  // index.merge.max_score: the k distinct ids with the best score over the interests (ties:
  // smaller id; an id's interest: the lowest giving its best score).
  std::vector<ScoredItem> MaxScore(const Lists& lists, const std::vector<int64_t>& excluded, size_t k, int64_t max_id);
  // index.merge.round_robin over each list's first `cut` kept candidates: the best of interest
  // 0, 1, ..., K-1, then the second of each..., ids already taken skipped, until k.
  std::vector<ScoredItem> RoundRobin(const Lists& lists, const std::vector<int64_t>& excluded, size_t k, size_t cut,
                                     int64_t max_id);
  // Scores candidates under interests: float32 [interests.size(), ids.size()], row r for
  // interest interests[r] (the kernel's rescore, NumPy's own product).
  using Scorer = std::function<std::vector<float>(const std::vector<size_t>& interests, const std::vector<int64_t>& ids)>;

  // index.merge.diversity over each list's first `cut` kept candidates, each scored by `score`
  // under every active interest (`active`: the interests searched; a masked one is not), as
  // index.multi_interest rescores them: greedily the candidate maximising its best score +
  // lambda × the picked items of other categories.
  std::vector<ScoredItem> Diversity(const Lists& lists, const std::vector<int64_t>& excluded, size_t k, size_t cut,
                                    int64_t max_id, const std::vector<size_t>& active, const Scorer& score,
                                    const Categories& categories, double lambda);

 private:
  // A new round of stamps over 0..max_id, with `excluded` marked.
  void Start(const std::vector<int64_t>& excluded, int64_t max_id);
  bool Marked(int64_t id) const { return stamps_[static_cast<size_t>(id)] == round_; }
  void Mark(int64_t id) { stamps_[static_cast<size_t>(id)] = round_; }
  // Each row's candidates not marked into items_ (rows_[r]..rows_[r + 1]), the first `cut` of
  // each; `sort`: rows listing ties out of the max-score order are sorted.
  void Gather(const Lists& lists, size_t cut, int64_t max_id, bool sort);

  std::vector<uint32_t> stamps_;  // stamps_[id] == round_: excluded (or taken) in the current merge
  uint32_t round_ = 0;
  std::vector<ScoredItem> items_;
  std::vector<size_t> rows_, next_;
};

}  // namespace mitt::native
