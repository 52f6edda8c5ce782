#include "explain.h"

#include <algorithm>

namespace mitt::native {

retrieval::v1::ExplanationKind ExplanationKindOf(const std::string& explanation) {
  if (explanation == "attention") return retrieval::v1::EXPLANATION_KIND_ATTENTION;
  if (explanation == "routing") return retrieval::v1::EXPLANATION_KIND_ROUTING;
  if (explanation == "none") return retrieval::v1::EXPLANATION_KIND_NONE;
  return retrieval::v1::EXPLANATION_KIND_UNAVAILABLE;
}

void TopEvents(const float* weights, size_t interests, size_t width, const std::vector<std::string>& history,
               const std::vector<uint32_t>& positions, size_t top, retrieval::v1::Explanations* out) {
  const size_t read = std::min(positions.size(), width);  // the events the tower read
  const size_t first = positions.size() - read;
  std::vector<size_t> weighed;
  for (size_t interest = 0; interest < interests; ++interest) {
    const float* row = weights + interest * width + (width - read);
    weighed.clear();
    for (size_t j = 0; j < read; ++j) {
      if (row[j] != 0) weighed.push_back(j);  // a masked interest or an unread event weighs exactly 0
    }
    std::stable_sort(weighed.begin(), weighed.end(), [row](size_t a, size_t b) { return -row[a] < -row[b]; });
    auto* explained = out->add_interests();
    for (size_t i = 0; i < std::min(top, weighed.size()); ++i) {
      const uint32_t position = positions[first + weighed[i]];
      auto* event = explained->add_events();
      event->set_item_id(history[position]);
      event->set_weight(row[weighed[i]]);
      event->set_position(position);
    }
  }
}

}  // namespace mitt::native
