// One user's query, checked and in dense ids: what the Python engine's Retriever._prepare makes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mitt::native {

enum class Merge { kMaxScore, kRoundRobin, kDiversity };

// index.merge's name of `merge` ("max_score", "round_robin", "diversity").
const char* MergeName(Merge merge);

struct Query {
  uint32_t k = 0;
  uint32_t depth = 0;           // items retrieved: k, or the rerank's candidates
  uint32_t per_interest_k = 0;  // each interest's depth as the Python engine's search key has it (0 = depth)
  uint32_t fetch = 0;           // candidates each interest is searched for: max(depth, per_interest_k) + excluded
  Merge merge = Merge::kMaxScore;
  double lambda = 0;            // DIVERSITY's λ

  std::vector<int32_t> history;     // the known ids the tower reads (1..tower_items), oldest first
  std::vector<uint32_t> positions;  // each one's place in the request's history (events, explanations)
  std::vector<int64_t> excluded;    // sorted unique: the history's ids in the vocabulary and exclude_ids'
  bool filtered = false;            // allow_ids or a category given: only `allow` may be returned
  std::vector<int64_t> allow;       // sorted unique
  uint32_t unknown = 0;             // history ids the tower does not read

  bool return_interests = false;
  bool explain = false;
  std::vector<std::string> external;  // the request's history ids, for explanations

  bool events = false;  // side inputs for a tower reading side features
  std::vector<int64_t> timestamps;
  std::vector<std::string> actions;
  int64_t request_time = 0;

  bool rerank = false;
  std::string ranker;             // the rerank's ranker
  uint32_t num_unclicked = 0;     // unclicked items the ranker reads
  bool own_unclicked = false;     // the request sent them (`unclicked`), else computed
  std::vector<int64_t> unclicked;
  bool previous = false;          // they come from the previous request's answer (one more row)
};

}  // namespace mitt::native
