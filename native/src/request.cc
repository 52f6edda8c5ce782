#include "request.h"

#include <algorithm>
#include <cmath>
#include <iterator>

namespace mitt::native {
namespace {

using retrieval::v1::RetrieveRequest;

grpc::Status Invalid(const std::string& message) { return {grpc::StatusCode::INVALID_ARGUMENT, message}; }

int HistoryLength(const RetrieveRequest& request) {
  return request.history_size() > 0 ? request.history_size() : request.events_size();
}

// The request's history ids: its history, or its events' items.
template <class Visit>
void ForEachHistoryId(const RetrieveRequest& request, Visit visit) {
  if (request.history_size() > 0) {
    for (const std::string& id : request.history()) visit(id);
  } else {
    for (const auto& event : request.events()) visit(event.item_id());
  }
}

Merge MergeOf(const RetrieveRequest& request) {
  switch (request.merge()) {
    case retrieval::v1::ROUND_ROBIN:
      return Merge::kRoundRobin;
    case retrieval::v1::DIVERSITY:
      return Merge::kDiversity;
    default:
      return Merge::kMaxScore;
  }
}

struct MergeNames {
  const char* enum_name;  // the proto's
  const char* name;       // index.merge's
};

// Indexed by Merge.
constexpr MergeNames kMergeNames[] = {
    {"MAX_SCORE", "max_score"},
    {"ROUND_ROBIN", "round_robin"},
    {"DIVERSITY", "diversity"},
};
static_assert(std::size(kMergeNames) == static_cast<size_t>(Merge::kDiversity) + 1);

const char* MergeEnumName(Merge merge) { return kMergeNames[static_cast<size_t>(merge)].enum_name; }

void SortUnique(std::vector<int64_t>& ids) {
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
}

}  // namespace

const char* MergeName(Merge merge) { return kMergeNames[static_cast<size_t>(merge)].name; }

grpc::Status RequestChecker::CheckSizes(const RetrieveRequest& request) const {
  const std::pair<const char*, int> lists[] = {
      {"history", HistoryLength(request)},
      {"exclude_ids", request.exclude_ids_size()},
      {"allow_ids", request.allow_ids_size()},
      {"rerank.unclicked", request.rerank().unclicked_size()},
  };
  for (const auto& [name, size] : lists) {
    const uint32_t limit = name == std::string("history") ? limits_.max_history : limits_.max_filter_ids;
    if (static_cast<uint32_t>(size) > limit) {
      return Invalid(std::string(name) + " has " + std::to_string(size) + " ids, at most " + std::to_string(limit) +
                     " are accepted");
    }
  }
  const std::tuple<const char*, const std::string&, uint32_t> strings[] = {
      {"user_id", request.user_id(), limits_.max_user_id},
      {"category", request.category(), limits_.max_name},
      {"rerank.ranker", request.rerank().ranker(), limits_.max_name},
  };
  for (const auto& [name, text, limit] : strings) {
    if (const size_t length = CodePoints(text); length > limit) {
      return Invalid(std::string(name) + " has " + std::to_string(length) + " characters, at most " +
                     std::to_string(limit));
    }
  }
  return grpc::Status::OK;
}

grpc::Status RequestChecker::CheckConversion(const RetrieveRequest& request) const {
  if (request.events_size() > 0 && request.history_size() > 0) {
    return Invalid("send the history either as history or as events, not both");
  }
  if (!retrieval::v1::MergeStrategy_IsValid(request.merge())) {
    return Invalid("unknown merge strategy " + std::to_string(request.merge()) + "; use one of [0, 1, 2, 3]");
  }
  return grpc::Status::OK;
}

grpc::Status RequestChecker::Check(const RetrieveRequest& request) const {
  const uint32_t k = request.k();
  if (k < 1 || k > limits_.max_k) {
    return Invalid("k must be between 1 and " + std::to_string(limits_.max_k) + ", got " + std::to_string(k));
  }
  const int length = HistoryLength(request);
  if (length == 0) return Invalid("history is empty: send at least one item id");
  if (static_cast<uint32_t>(length) > limits_.max_history) {
    return Invalid("history has " + std::to_string(length) + " ids, at most " + std::to_string(limits_.max_history) +
                   " are accepted");
  }
  const double lambda = request.diversity_lambda();
  if (!std::isfinite(lambda) || lambda < 0) {
    return Invalid("diversity_lambda must be a finite number >= 0, got " + FloatRepr(lambda));
  }
  if (lambda != 0 && MergeOf(request) != Merge::kDiversity) {
    return Invalid(std::string("diversity_lambda is only used by the DIVERSITY merge, not ") +
                   MergeEnumName(MergeOf(request)));
  }
  const uint32_t per_interest_k = request.per_interest_k();
  if (per_interest_k != 0 && (per_interest_k < k || per_interest_k > limits_.max_per_interest_k)) {
    return Invalid("per_interest_k must be 0 (= k) or between k (" + std::to_string(k) + ") and " +
                   std::to_string(limits_.max_per_interest_k) + ", got " + std::to_string(per_interest_k));
  }
  return grpc::Status::OK;  // the filters' and names' lengths: CheckSizes, which every call passed first
}

grpc::Status RequestChecker::Ranker(const RetrieveRequest& request, const Servable& servable,
                                    const std::pair<const std::string, RankerInfo>** ranker, uint32_t* depth) const {
  const uint32_t k = request.k();
  *ranker = nullptr;
  *depth = k;
  if (!request.has_rerank()) return grpc::Status::OK;
  const auto& rerank = request.rerank();
  if (servable.rankers.empty()) {
    return Invalid("rerank asked for, but the server has no ranker (tools/serve.py --ranker DIR)");
  }
  std::vector<std::string> names;
  for (const auto& entry : servable.rankers) names.push_back(entry.first);  // sorted: a std::map
  if (rerank.ranker().empty() && servable.rankers.size() > 1) {
    return Invalid("name the ranker to rerank with, one of " + text_.ListRepr(names));
  }
  const auto found = rerank.ranker().empty() ? servable.rankers.begin() : servable.rankers.find(rerank.ranker());
  if (found == servable.rankers.end()) {
    return Invalid("unknown ranker " + text_.Shorten(rerank.ranker()) + "; the server has " + text_.ListRepr(names));
  }
  const uint32_t candidates = rerank.candidates() != 0 ? rerank.candidates()
                                                       : std::max(k, limits_.default_rerank_candidates);
  if (candidates < k || candidates > limits_.max_k) {
    return Invalid("rerank candidates must be 0 or between k (" + std::to_string(k) + ") and " +
                   std::to_string(limits_.max_k) + ", got " + std::to_string(rerank.candidates()));
  }
  if (static_cast<uint32_t>(rerank.unclicked_size()) > limits_.max_filter_ids) {
    return Invalid("rerank unclicked has " + std::to_string(rerank.unclicked_size()) + " ids, at most " +
                   std::to_string(limits_.max_filter_ids) + " are accepted");
  }
  *ranker = &*found;
  *depth = candidates;
  return grpc::Status::OK;
}

grpc::Status RequestChecker::Category(const RetrieveRequest& request, const Servable& servable,
                                      const std::vector<int64_t>** members) const {
  *members = nullptr;
  if (request.category().empty()) return grpc::Status::OK;
  *members = servable.categories->Members(request.category());
  if (*members == nullptr) {
    return Invalid("unknown category " + text_.Shorten(request.category()) + ": no item of the model has it");
  }
  return grpc::Status::OK;
}

grpc::Status RequestChecker::Validate(const RetrieveRequest& request, const Servable& servable) const {
  if (grpc::Status status = Check(request); !status.ok()) return status;
  const std::pair<const std::string, RankerInfo>* ranker;
  uint32_t depth;
  if (grpc::Status status = Ranker(request, servable, &ranker, &depth); !status.ok()) return status;
  const std::vector<int64_t>* members;
  return Category(request, servable, &members);
}

grpc::Status RequestChecker::Prepare(const RetrieveRequest& request, const Servable& servable, Query* query) const {
  if (grpc::Status status = Check(request); !status.ok()) return status;
  const std::pair<const std::string, RankerInfo>* ranker;
  uint32_t depth;
  if (grpc::Status status = Ranker(request, servable, &ranker, &depth); !status.ok()) return status;
  const Vocabulary& vocabulary = *servable.vocabulary;
  // Items added after training are in the vocabulary, not in the user tower's table: excluded,
  // never read as history.
  const int length = HistoryLength(request);
  uint32_t position = 0, added = 0;
  ForEachHistoryId(request, [&](const std::string& id) {
    if (const int32_t dense = vocabulary.Lookup(id); dense != 0) {
      query->excluded.push_back(dense);
      if (static_cast<uint32_t>(dense) <= servable.tower_items) {
        query->history.push_back(dense);
        query->positions.push_back(position);
      } else {
        ++added;
      }
    }
    ++position;
  });
  if (query->history.empty()) {
    return Invalid("none of the " + std::to_string(length) + " history ids is in the model's vocabulary" +
                   (added ? " (" + std::to_string(added) + " added after training, which it does not read as history)"
                          : std::string()));
  }
  const std::vector<int64_t>* members;
  if (grpc::Status status = Category(request, servable, &members); !status.ok()) return status;
  for (const std::string& id : request.exclude_ids()) {
    if (const int32_t dense = vocabulary.Lookup(id); dense != 0) query->excluded.push_back(dense);
  }
  SortUnique(query->excluded);
  query->filtered = request.allow_ids_size() > 0 || members != nullptr;
  if (request.allow_ids_size() > 0) {
    for (const std::string& id : request.allow_ids()) {
      if (const int32_t dense = vocabulary.Lookup(id); dense != 0) query->allow.push_back(dense);
    }
    SortUnique(query->allow);
    if (members != nullptr) {
      std::vector<int64_t> both;
      std::set_intersection(query->allow.begin(), query->allow.end(), members->begin(), members->end(),
                            std::back_inserter(both));
      query->allow.swap(both);
    }
  } else if (members != nullptr) {
    query->allow = *members;
  }
  query->k = request.k();
  query->depth = depth;
  query->merge = MergeOf(request);
  query->lambda = request.diversity_lambda();
  // Max-score top-k is a prefix of top-k' (k < k'); the other merges choose among each
  // interest's first candidates, so their depth is part of the search (Retriever._prepare).
  query->per_interest_k = request.per_interest_k();
  if (query->merge != Merge::kMaxScore) query->per_interest_k = std::max(depth, query->per_interest_k);
  query->fetch = std::max(depth, query->per_interest_k) + static_cast<uint32_t>(query->excluded.size());
  query->unknown = static_cast<uint32_t>(length) - static_cast<uint32_t>(query->history.size());
  query->return_interests = request.return_interests();
  if (request.explain()) {
    query->explain = true;
    ForEachHistoryId(request, [&](const std::string& id) { query->external.push_back(id); });
  }
  if (servable.side_features && request.events_size() > 0) {
    query->events = true;
    for (const auto& event : request.events()) {
      query->timestamps.push_back(event.timestamp());
      query->actions.push_back(event.action());
    }
    query->request_time = request.request_time();
  }
  if (ranker != nullptr) {
    query->rerank = true;
    query->ranker = ranker->first;
    query->num_unclicked = ranker->second.num_unclicked;
    if (query->num_unclicked > 0) {
      if (request.rerank().unclicked_size() > 0) {  // the caller's impressions replace the computed ones
        query->own_unclicked = true;
        for (const std::string& id : request.rerank().unclicked()) {
          if (query->unclicked.size() == query->num_unclicked) break;
          if (const int32_t dense = vocabulary.Lookup(id); dense != 0) query->unclicked.push_back(dense);
        }
      } else {
        query->previous = query->history.size() > 1;
      }
    }
  }
  return grpc::Status::OK;
}

}  // namespace mitt::native
