#include "vocabulary.h"

#include <limits>
#include <stdexcept>

namespace mitt::native {

Vocabulary::Vocabulary(std::vector<std::string> ids) : ids_(std::move(ids)) {
  if (ids_.size() >= static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    throw std::invalid_argument("the vocabulary has more ids than an int32 dense id can name");
  }
  dense_.reserve(ids_.size());
  for (size_t i = 0; i < ids_.size(); ++i) {
    if (!dense_.emplace(ids_[i], static_cast<int32_t>(i + 1)).second) {
      throw std::invalid_argument("the vocabulary repeats the id '" + ids_[i] + "'");
    }
  }
}

int32_t Vocabulary::Lookup(std::string_view id) const {
  const auto found = dense_.find(id);
  return found == dense_.end() ? 0 : found->second;
}

}  // namespace mitt::native
