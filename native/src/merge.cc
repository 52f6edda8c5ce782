#include "merge.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace mitt::native {
namespace {

// The merge's order: higher score, then smaller id, then lower interest.
inline bool Better(const ScoredItem& a, const ScoredItem& b) {
  if (a.score != b.score) return a.score > b.score;
  if (a.id != b.id) return a.id < b.id;
  return a.interest < b.interest;
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
  items_.clear();
  next_.clear();
  end_.clear();
  for (size_t row = 0; row < num_interests; ++row) {
    const size_t begin = items_.size();
    bool sorted = true;
    for (size_t col = 0; col < n; ++col) {
      const int64_t id = ids[row * n + col];
      if (id < 0) continue;
      if (id == 0 || id > max_id) {
        throw std::out_of_range("the kernel returned id " + std::to_string(id) + ", outside the vocabulary's 1.." +
                                std::to_string(max_id));
      }
      const float score = scores[row * n + col];
      if (std::isnan(score)) throw std::domain_error("the kernel returned a NaN score for id " + std::to_string(id));
      if (stamps_[static_cast<size_t>(id)] == round_) continue;
      items_.push_back({id, score, static_cast<int32_t>(row)});
      sorted = sorted && (items_.size() == begin + 1 || !Better(items_.back(), items_[items_.size() - 2]));
    }
    // A kernel lists ties in any order (FAISS does): the merge needs them by id.
    if (!sorted) std::sort(items_.begin() + static_cast<std::ptrdiff_t>(begin), items_.end(), Better);
    next_.push_back(begin);
    end_.push_back(items_.size());
  }
  // K-way merge of the rows, best first: an id's first appearance is its best (and its lowest
  // interest among equal scores); later ones are skipped. Only about k steps, each over K heads.
  std::vector<ScoredItem> merged;
  merged.reserve(std::min(k, items_.size()));
  while (merged.size() < k) {
    size_t best = num_interests;
    for (size_t row = 0; row < num_interests; ++row) {
      if (next_[row] < end_[row] && (best == num_interests || Better(items_[next_[row]], items_[next_[best]]))) {
        best = row;
      }
    }
    if (best == num_interests) break;  // every row used up
    const ScoredItem& item = items_[next_[best]++];
    if (stamps_[static_cast<size_t>(item.id)] != round_) {
      stamps_[static_cast<size_t>(item.id)] = round_;
      merged.push_back(item);
    }
  }
  return merged;
}

}  // namespace mitt::native
