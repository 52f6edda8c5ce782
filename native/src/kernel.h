// The calls the data plane makes into a servable's kernel (Python: retrieval.serving.native_kernel),
// each once per batch at most, on the batcher's thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "query.h"

namespace mitt::native {

struct ScoredItem {
  int64_t id;
  float score;
  int32_t interest;  // the interest (row) that gave the score
};

// A batch's rows for the user tower and the index.
struct SearchInput {
  size_t batch = 0;
  size_t width = 0;                      // the tower's history width
  std::vector<int32_t> histories;        // int32 [batch, width]: known ids, the last `width`, left-padded
  std::vector<int32_t> fetch;            // int32 [batch]: candidates each interest needs
  std::vector<int32_t> allow_group;      // int32 [batch]: an index into `allows`, -1 = no filter
  std::vector<const std::vector<int64_t>*> allows;
  std::vector<const Query*> rows;        // the rows' queries (their events, for side features)
  bool want_interests = false;
  std::vector<int32_t> explain_rows;     // rows asking for explanations
};

struct SearchOutput {
  size_t batch = 0, interests = 0, n = 0, dim = 0;
  std::vector<int64_t> ids;       // int64 [batch, interests, n], -1 = empty
  std::vector<float> scores;      // float32 [batch, interests, n]
  std::vector<int32_t> fetched;   // int32 [batch]: the depth each row was searched to
  std::vector<float> vectors;     // float32 [batch, interests, dim] when asked
  size_t weight_width = 0;
  std::vector<float> weights;     // float32 [explain rows, interests, weight_width] when the tower has them
};

// One row searched and merged by the Python engine itself.
struct AloneInput {
  const float* interests = nullptr;  // [num_interests, dim]
  size_t num_interests = 0, dim = 0;
  const Query* query = nullptr;
};

// One ranker's rows.
struct RerankInput {
  std::string ranker;
  size_t rows = 0, width = 0;
  std::vector<const std::vector<int32_t>*> histories;
  std::vector<int64_t> candidates;  // int64 [rows, width], 0 = no item
  std::vector<float> scores;        // float32 [rows, width]
  bool with_unclicked = false;
  std::vector<const std::vector<int64_t>*> unclicked;
};

// A servable's calls; each throws std::exception (with what failed) to fail its batch's calls.
class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual SearchOutput Search(SearchInput input) = 0;
  virtual std::vector<ScoredItem> Alone(const AloneInput& input) = 0;
  virtual std::vector<float> Rerank(const RerankInput& input) = 0;  // float32 [rows, width] logits
  // float32 [rows, ids.size()]: `interests` (float32 [rows, dim]) times the ids' item vectors.
  virtual std::vector<float> Rescore(const float* interests, size_t rows, size_t dim,
                                     const std::vector<int64_t>& ids) = 0;
};

}  // namespace mitt::native
