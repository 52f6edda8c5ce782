// The item vocabulary, handed over once per version from Python: external string id <-> dense id.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace mitt::native {

// Dense id i + 1 is ids[i]; 0 is padding and stands for "unknown" (as in the model's vocab.json).
class Vocabulary {
 public:
  // Throws std::invalid_argument on a repeated id (the message names it).
  explicit Vocabulary(std::vector<std::string> ids);
  Vocabulary(const Vocabulary&) = delete;  // the table holds views into ids_
  Vocabulary& operator=(const Vocabulary&) = delete;

  // The dense id of `id`, 0 when it is not in the vocabulary.
  int32_t Lookup(std::string_view id) const;
  // The external id of `dense`, 1..size().
  const std::string& External(int64_t dense) const { return ids_[static_cast<size_t>(dense - 1)]; }
  size_t size() const { return ids_.size(); }

 private:
  const std::vector<std::string> ids_;
  std::unordered_map<std::string_view, int32_t> dense_;
};

}  // namespace mitt::native
