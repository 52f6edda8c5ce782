#include "merge.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace mitt::native {
namespace {

// The max-score order: higher score, then smaller id, then lower interest.
inline bool Better(const ScoredItem& a, const ScoredItem& b) {
  if (a.score != b.score) return a.score > b.score;
  if (a.id != b.id) return a.id < b.id;
  return a.interest < b.interest;
}

}  // namespace

void Merger::Start(const std::vector<int64_t>& excluded, int64_t max_id) {
  if (stamps_.size() < static_cast<size_t>(max_id) + 1) stamps_.resize(static_cast<size_t>(max_id) + 1, 0);
  if (++round_ == 0) {  // the stamps wrapped around: start them afresh
    std::fill(stamps_.begin(), stamps_.end(), 0);
    round_ = 1;
  }
  for (const int64_t id : excluded) {
    if (id >= 1 && id <= max_id) Mark(id);
  }
}

void Merger::Gather(const Lists& lists, size_t cut, int64_t max_id, bool sort) {
  items_.clear();
  rows_.assign(1, 0);
  for (size_t row = 0; row < lists.interests; ++row) {
    const size_t begin = items_.size();
    bool sorted = true;
    for (size_t col = 0; col < lists.n && items_.size() - begin < cut; ++col) {
      const int64_t id = lists.ids[row * lists.n + col];
      if (id < 0) continue;
      if (id == 0 || id > max_id) {
        throw std::out_of_range("the kernel returned id " + std::to_string(id) + ", outside the vocabulary's 1.." +
                                std::to_string(max_id));
      }
      const float score = lists.scores[row * lists.n + col];
      if (std::isnan(score)) throw std::domain_error("the kernel returned a NaN score for id " + std::to_string(id));
      if (Marked(id)) continue;
      items_.push_back({id, score, static_cast<int32_t>(row)});
      sorted = sorted && (items_.size() == begin + 1 || !Better(items_.back(), items_[items_.size() - 2]));
    }
    // A search lists ties in any order (FAISS does): the max-score merge needs them by id.
    if (sort && !sorted) std::sort(items_.begin() + static_cast<std::ptrdiff_t>(begin), items_.end(), Better);
    rows_.push_back(items_.size());
  }
}

std::vector<ScoredItem> Merger::MaxScore(const Lists& lists, const std::vector<int64_t>& excluded, size_t k,
                                         int64_t max_id) {
  Start(excluded, max_id);
  Gather(lists, std::numeric_limits<size_t>::max(), max_id, true);
  // K-way merge of the rows, best first: an id's first appearance is its best (and its lowest
  // interest among equal scores); later ones are skipped. Only about k steps, each over K heads.
  next_.assign(rows_.begin(), rows_.end() - 1);
  std::vector<ScoredItem> merged;
  merged.reserve(std::min(k, items_.size()));
  while (merged.size() < k) {
    size_t best = lists.interests;
    for (size_t row = 0; row < lists.interests; ++row) {
      if (next_[row] < rows_[row + 1] && (best == lists.interests || Better(items_[next_[row]], items_[next_[best]]))) {
        best = row;
      }
    }
    if (best == lists.interests) break;  // every row used up
    const ScoredItem& item = items_[next_[best]++];
    if (!Marked(item.id)) {
      Mark(item.id);
      merged.push_back(item);
    }
  }
  return merged;
}

std::vector<ScoredItem> Merger::RoundRobin(const Lists& lists, const std::vector<int64_t>& excluded, size_t k,
                                           size_t cut, int64_t max_id) {
  Start(excluded, max_id);
  Gather(lists, cut, max_id, false);
  std::vector<ScoredItem> picked;
  size_t longest = 0;
  for (size_t row = 0; row < lists.interests; ++row) longest = std::max(longest, rows_[row + 1] - rows_[row]);
  for (size_t rank = 0; rank < longest && picked.size() < k; ++rank) {
    for (size_t row = 0; row < lists.interests && picked.size() < k; ++row) {
      if (rows_[row] + rank >= rows_[row + 1]) continue;
      const ScoredItem& item = items_[rows_[row] + rank];
      if (!Marked(item.id)) {
        Mark(item.id);
        picked.push_back(item);
      }
    }
  }
  return picked;
}

std::vector<ScoredItem> Merger::Diversity(const Lists& lists, const std::vector<int64_t>& excluded, size_t k,
                                          size_t cut, int64_t max_id, const std::vector<size_t>& active,
                                          const Scorer& score, const Categories& categories, double lambda) {
  Start(excluded, max_id);
  Gather(lists, cut, max_id, false);
  std::vector<int64_t> found;
  for (const ScoredItem& item : items_) found.push_back(item.id);
  std::sort(found.begin(), found.end());
  found.erase(std::unique(found.begin(), found.end()), found.end());
  // Every candidate scored under every active interest: its best score f and that interest
  // (ties: the lowest), as index.multi_interest rescores before index.merge.diversity.
  std::vector<ScoredItem> best(found.size(), {0, -std::numeric_limits<float>::infinity(), -1});
  if (!found.empty() && !active.empty()) {
    const std::vector<float> scores = score(active, found);
    if (scores.size() != active.size() * found.size()) {
      throw std::length_error("the rescore answered " + std::to_string(scores.size()) + " scores for " +
                              std::to_string(active.size()) + " interests and " + std::to_string(found.size()) +
                              " candidates");
    }
    for (size_t r = 0; r < active.size(); ++r) {
      for (size_t c = 0; c < found.size(); ++c) {
        const float value = scores[r * found.size() + c];
        if (std::isnan(value)) throw std::domain_error("a NaN score for id " + std::to_string(found[c]));
        if (best[c].interest < 0 || value > best[c].score) best[c] = {found[c], value, static_cast<int32_t>(active[r])};
      }
    }
  }
  best.erase(std::remove_if(best.begin(), best.end(), [](const ScoredItem& item) { return item.interest < 0; }),
             best.end());
  std::sort(best.begin(), best.end(), Better);  // by (-f, id): the greedy's ties resolve alike
  std::unordered_map<int64_t, int64_t> picked_per_category;
  std::vector<int64_t> category(best.size());
  for (size_t c = 0; c < best.size(); ++c) category[c] = categories.Code(best[c].id);
  std::vector<bool> available(best.size(), true);
  std::vector<ScoredItem> picked;
  for (size_t step = 0; step < std::min(k, best.size()); ++step) {
    size_t choice = best.size();
    double top = -std::numeric_limits<double>::infinity();
    for (size_t c = 0; c < best.size(); ++c) {
      if (!available[c]) continue;
      // Each picked item of another category adds lambda: step - (picked ones in the same category).
      const auto others = static_cast<double>(static_cast<int64_t>(step) - picked_per_category[category[c]]);
      const double gain = static_cast<double>(best[c].score) + lambda * others;
      if (choice == best.size() || gain > top) {
        choice = c;
        top = gain;
      }
    }
    available[choice] = false;
    ++picked_per_category[category[choice]];
    picked.push_back(best[choice]);
  }
  return picked;
}

}  // namespace mitt::native
