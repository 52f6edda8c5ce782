#include "merge.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace mitt::native {
namespace {

// Heap order: the best candidate (highest score, then smaller id, then lower interest) on top.
bool Worse(const ScoredItem& a, const ScoredItem& b) {
  if (a.score != b.score) return a.score < b.score;
  if (a.id != b.id) return a.id > b.id;
  return a.interest > b.interest;
}

}  // namespace

std::vector<ScoredItem> MaxScoreMerge::operator()(const int64_t* ids, const float* scores, size_t num_interests,
                                                  size_t n, const std::vector<int64_t>& excluded, size_t k) {
  if (++round_ == 0) {  // the stamps wrapped around: start them afresh
    std::fill(stamps_.begin(), stamps_.end(), 0);
    round_ = 1;
  }
  const auto max_id = static_cast<int64_t>(stamps_.size()) - 1;
  for (const int64_t id : excluded) {
    if (id >= 1 && id <= max_id) stamps_[static_cast<size_t>(id)] = round_;
  }
  heap_.clear();
  for (size_t row = 0; row < num_interests; ++row) {
    for (size_t col = 0; col < n; ++col) {
      const int64_t id = ids[row * n + col];
      if (id < 0) continue;
      if (id == 0 || id > max_id) {
        throw std::out_of_range("the kernel returned id " + std::to_string(id) + ", outside the vocabulary's 1.." +
                                std::to_string(max_id));
      }
      if (stamps_[static_cast<size_t>(id)] != round_) {
        heap_.push_back({id, scores[row * n + col], static_cast<int32_t>(row)});
      }
    }
  }
  // Popped best first, the first entry of an id is its best; the later ones are skipped. Only
  // about k pops are needed, not a sort of every candidate.
  std::make_heap(heap_.begin(), heap_.end(), Worse);
  std::vector<ScoredItem> merged;
  merged.reserve(std::min(k, heap_.size()));
  for (auto end = heap_.end(); end != heap_.begin() && merged.size() < k; --end) {
    std::pop_heap(heap_.begin(), end, Worse);
    const ScoredItem& best = *(end - 1);
    if (stamps_[static_cast<size_t>(best.id)] != round_) {
      stamps_[static_cast<size_t>(best.id)] = round_;
      merged.push_back(best);
    }
  }
  return merged;
}

}  // namespace mitt::native
