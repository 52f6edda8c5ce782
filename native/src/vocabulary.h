// The item vocabulary, handed over once per version from Python: external string id <-> dense id.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mitt::native {

// Dense id i + 1 is ids[i]; 0 is padding and stands for "unknown" (as in the model's vocab.json).
// The ids are kept in one buffer with an open-addressing table of dense ids over it: about 22 MB
// for a million ids of ten bytes, where a std::unordered_map of std::string took about 90.
class Vocabulary {
 public:
  // Throws std::invalid_argument on a repeated id (the message names it).
  explicit Vocabulary(const std::vector<std::string>& ids);

  // The dense id of `id`, 0 when it is not in the vocabulary.
  int32_t Lookup(std::string_view id) const;
  // The external id of `dense`, 1..size().
  std::string_view External(int64_t dense) const {
    const auto i = static_cast<size_t>(dense - 1);
    return std::string_view(chars_).substr(offsets_[i], offsets_[i + 1] - offsets_[i]);
  }
  size_t size() const { return offsets_.size() - 1; }

 private:
  std::string chars_;              // every id, one after the other
  std::vector<uint64_t> offsets_;  // id i spans chars_[offsets_[i], offsets_[i + 1])
  std::vector<int32_t> table_;     // dense ids by hash (linear probing), 0 = empty; a power of two
};

}  // namespace mitt::native
