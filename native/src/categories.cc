#include "categories.h"

#include <utility>

namespace mitt::native {

Categories::Categories(std::unordered_map<std::string, std::vector<int64_t>> members, std::vector<int64_t> codes)
    : members_(std::move(members)), codes_(std::move(codes)) {}

const std::vector<int64_t>* Categories::Members(const std::string& category) const {
  const auto found = members_.find(category);
  return found == members_.end() ? nullptr : &found->second;
}

}  // namespace mitt::native
