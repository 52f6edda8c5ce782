#include "vocabulary.h"

#include <functional>
#include <limits>
#include <stdexcept>

namespace mitt::native {

Vocabulary::Vocabulary(const std::vector<std::string>& ids) {
  if (ids.size() >= static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    throw std::invalid_argument("the vocabulary has more ids than an int32 dense id can name");
  }
  size_t bytes = 0;
  for (const std::string& id : ids) bytes += id.size();
  chars_.reserve(bytes);
  offsets_.reserve(ids.size() + 1);
  offsets_.push_back(0);
  for (const std::string& id : ids) {
    chars_ += id;
    offsets_.push_back(chars_.size());
  }
  size_t slots = 1;
  while (slots < 2 * ids.size() + 1) slots <<= 1;  // at most half full: short probes
  table_.assign(slots, 0);
  for (size_t i = 0; i < ids.size(); ++i) {
    size_t slot = std::hash<std::string_view>{}(ids[i]) & (slots - 1);
    for (; table_[slot] != 0; slot = (slot + 1) & (slots - 1)) {
      if (External(table_[slot]) == ids[i]) throw std::invalid_argument("the vocabulary repeats the id '" + ids[i] + "'");
    }
    table_[slot] = static_cast<int32_t>(i + 1);
  }
}

int32_t Vocabulary::Lookup(std::string_view id) const {
  const size_t mask = table_.size() - 1;
  for (size_t slot = std::hash<std::string_view>{}(id) & mask; table_[slot] != 0; slot = (slot + 1) & mask) {
    if (External(table_[slot]) == id) return table_[slot];
  }
  return 0;
}

}  // namespace mitt::native
