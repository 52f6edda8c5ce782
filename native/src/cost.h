// A request's estimated cost in admission units (retrieval.serving.admission.cost; docs/serving.md,
// "Admission", has the formula and the measurements behind each term).
#pragma once

#include <cstdint>

#include "retrieval.pb.h"

namespace mitt::native {

// The formula's constants, handed over from retrieval.serving.admission (their one definition).
struct CostUnits {
  double id_unit = 1000;             // ids looked up per unit
  double candidate_unit = 1000;      // candidates searched and merged per unit
  double diversity_steps = 16;       // DIVERSITY picks per unit...
  double diversity_candidates = 10000;  // ...and the candidates that double a pick's cost
  double round_robin_picks = 200;    // ROUND_ROBIN picks per unit
  double rerank_unit = 40;           // candidates a ranker scores per unit
  double explain_units = 3;          // one more call of the tower's weights
  uint32_t default_rerank_candidates = 200;
};

// What a request's cost depends on besides itself (admission.ModelSize).
struct ModelSize {
  uint64_t num_interests = 0;
  uint64_t num_items = 0;
};

// admission.request_cost: the cost of a parsed request, from its fields' lengths.
double RequestCost(const retrieval::v1::RetrieveRequest& request, const ModelSize& size, const CostUnits& units);

}  // namespace mitt::native
