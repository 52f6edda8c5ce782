#include "cost.h"

#include <algorithm>

namespace mitt::native {

double RequestCost(const retrieval::v1::RetrieveRequest& request, const ModelSize& size, const CostUnits& units) {
  // The same operations in the same order as the Python formula, in doubles: the same value.
  const double history = request.history_size() > 0 ? request.history_size() : request.events_size();
  const double k = request.k();
  double reranked = 0;
  if (request.has_rerank()) {
    reranked = request.rerank().candidates() != 0 ? request.rerank().candidates()
                                                  : std::max(k, static_cast<double>(units.default_rerank_candidates));
  }
  const double ids = history + request.exclude_ids_size() + request.allow_ids_size() + request.rerank().unclicked_size();
  const double depth = std::max({k, static_cast<double>(request.per_interest_k()), reranked});
  const double excluded = history + request.exclude_ids_size();
  const double items = static_cast<double>(size.num_items);
  const double candidates = static_cast<double>(size.num_interests) * std::min(depth + excluded, items);
  double cost = 1 + ids / units.id_unit + candidates / units.candidate_unit + reranked / units.rerank_unit;
  if (request.merge() == retrieval::v1::DIVERSITY) {
    cost += k * (1 + std::min(candidates, items) / units.diversity_candidates) / units.diversity_steps;
  } else if (request.merge() == retrieval::v1::ROUND_ROBIN) {
    cost += k / units.round_robin_picks;
  }
  return cost + (request.explain() ? units.explain_units : 0.0);
}

}  // namespace mitt::native
