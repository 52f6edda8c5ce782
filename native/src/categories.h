// The items' categories as the Python engine's Retriever holds them (retrieval.artifacts.categories):
// the members of each category (the `category` filter) and a category code per item (DIVERSITY).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace mitt::native {

class Categories {
 public:
  // members: category -> sorted unique dense ids; codes: a code per dense id 0..max id.
  Categories(std::unordered_map<std::string, std::vector<int64_t>> members, std::vector<int64_t> codes);

  // The sorted dense ids of `category`, nullptr when no item has it.
  const std::vector<int64_t>* Members(const std::string& category) const;
  // The category code of dense id `id` (0 <= id < codes' size).
  int64_t Code(int64_t id) const { return codes_[static_cast<size_t>(id)]; }
  size_t size() const { return codes_.size(); }

 private:
  const std::unordered_map<std::string, std::vector<int64_t>> members_;
  const std::vector<int64_t> codes_;
};

}  // namespace mitt::native
