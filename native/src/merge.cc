#include "merge.h"

#include <algorithm>

namespace mitt::native {

std::vector<ScoredItem> MergeMaxScore(const int64_t* ids, const float* scores, size_t num_interests, size_t n,
                                      const std::vector<int64_t>& excluded, size_t k) {
  std::vector<ScoredItem> candidates;
  candidates.reserve(num_interests * n);
  for (size_t row = 0; row < num_interests; ++row) {
    for (size_t col = 0; col < n; ++col) {
      const int64_t id = ids[row * n + col];
      if (id >= 0 && !std::binary_search(excluded.begin(), excluded.end(), id)) {
        candidates.push_back({id, scores[row * n + col], static_cast<int32_t>(row)});
      }
    }
  }
  // Each id's best entry first (best score, then the lowest interest), then keep one per id.
  std::sort(candidates.begin(), candidates.end(), [](const ScoredItem& a, const ScoredItem& b) {
    if (a.id != b.id) return a.id < b.id;
    if (a.score != b.score) return a.score > b.score;
    return a.interest < b.interest;
  });
  const auto last = std::unique(candidates.begin(), candidates.end(),
                                [](const ScoredItem& a, const ScoredItem& b) { return a.id == b.id; });
  candidates.erase(last, candidates.end());
  const auto better = [](const ScoredItem& a, const ScoredItem& b) {
    return a.score != b.score ? a.score > b.score : a.id < b.id;
  };
  const size_t kept = std::min(k, candidates.size());
  std::partial_sort(candidates.begin(), candidates.begin() + static_cast<std::ptrdiff_t>(kept), candidates.end(),
                    better);
  candidates.resize(kept);
  return candidates;
}

}  // namespace mitt::native
