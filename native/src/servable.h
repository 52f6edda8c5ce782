// One loaded version as the data plane serves it: immutable, swapped whole (hot reload); every
// call keeps the version it was parsed with until it is answered.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "categories.h"
#include "kernel.h"
#include "vocabulary.h"

namespace mitt::native {

struct RankerInfo {
  std::string version;
  uint32_t num_unclicked = 0;  // unclicked items it reads (0 = none)
};

struct Servable {
  std::shared_ptr<Kernel> kernel;
  std::unique_ptr<const Vocabulary> vocabulary;
  uint32_t tower_items = 0;  // dense ids 1..tower_items are read as history
  std::string model_version;
  uint32_t max_len = 0;
  uint32_t num_interests = 0;
  uint64_t num_items = 0;  // items in the index (the cost formula's N)
  std::unique_ptr<const Categories> categories;
  std::string explanation;  // retrieval.api.types.ExplanationKind's value
  std::map<std::string, RankerInfo> rankers;
  bool side_features = false;
};

}  // namespace mitt::native
