#include "engine.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <map>
#include <numeric>
#include <stdexcept>

#include "explain.h"
#include "python_text.h"

namespace mitt::native {
namespace {

// The kernel's arrays must hold [batch, interests, n], the interests [batch, interests, dim] and
// the explained rows' weights, for the batch it was given.
void CheckShape(const SearchOutput& out, size_t batch, size_t explained) {
  const size_t cells = out.batch * out.interests * out.n;
  if (out.batch != batch || out.ids.size() != cells || out.scores.size() != cells || out.fetched.size() != batch) {
    throw std::runtime_error("the kernel answered " + std::to_string(out.batch) + " rows (" +
                             std::to_string(out.ids.size()) + " ids, " + std::to_string(out.scores.size()) +
                             " scores, " + std::to_string(out.fetched.size()) + " depths) for a batch of " +
                             std::to_string(batch));
  }
  if (out.vectors.size() != batch * out.interests * out.dim || out.dim == 0) {
    throw std::runtime_error("the kernel's interests must be [" + std::to_string(batch) + ", " +
                             std::to_string(out.interests) + ", d], got " + std::to_string(out.vectors.size()) +
                             " values");
  }
  if (!out.weights.empty() && out.weights.size() != explained * out.interests * out.weight_width) {
    throw std::runtime_error("the kernel's interest weights do not cover the explained rows");
  }
}

// Whether some interest's list of `row` holds fewer candidates than it was searched for: the
// index ran out (a narrow filter, an approximate index), as the Python engine's search checks.
bool SearchedShort(const SearchOutput& out, size_t row) {
  const auto fetched = static_cast<size_t>(out.fetched[row]);
  if (fetched == 0) return false;  // nothing searched: no active interest, or an empty index
  for (size_t interest = 0; interest < out.interests; ++interest) {
    const int64_t* ids = out.ids.data() + (row * out.interests + interest) * out.n;
    if (static_cast<size_t>(std::count_if(ids, ids + out.n, [](int64_t id) { return id >= 0; })) < fetched) return true;
  }
  return false;
}

}  // namespace

void Engine::Answer(Batch batch) {
  calls_ += batch.finished.size();
  // Each servable's rows, in the order of their first call: a swap between two calls' checks
  // leaves each answered by the version it was checked with.
  std::vector<std::pair<const Servable*, std::vector<Row>>> groups;
  std::vector<Deadline> deadlines;
  for (const Batch::Slice& slice : batch.slices) {
    PendingCall* call = slice.call;
    if (!call->status.ok()) continue;
    // A call cancelled while queued (its client left, the server stopped waiting for it) costs
    // the kernel nothing.
    if (call->context->IsCancelled()) {
      ++cancelled_;
      call->status = {grpc::StatusCode::CANCELLED, "cancelled before its batch was computed"};
      continue;
    }
    auto group = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == call->servable.get(); });
    if (group == groups.end()) {
      groups.emplace_back(call->servable.get(), std::vector<Row>{});
      deadlines.push_back(DeadlineOf(*call->context));
      group = groups.end() - 1;
    }
    // The group's work stops once every caller's deadline has passed (none: it never stops).
    Deadline& deadline = deadlines[static_cast<size_t>(group - groups.begin())];
    const Deadline own = DeadlineOf(*call->context);
    deadline = deadline && own ? Deadline(std::max(*deadline, *own)) : std::nullopt;
    for (size_t q = slice.begin; q < slice.end; ++q) group->second.push_back({call, q, &call->queries[q], {}, {}});
  }
  for (size_t g = 0; g < groups.size(); ++g) Compute(*groups[g].first, groups[g].second, deadlines[g]);
  for (auto& call : batch.finished) {
    if (call->status.ok()) {
      if (const Deadline deadline = DeadlineOf(*call->context); deadline && std::chrono::system_clock::now() > *deadline) {
        ++deadline_exceeded_;
        const double late = std::chrono::duration<double>(std::chrono::system_clock::now() - *deadline).count();
        call->status = DeadlinePassed(late, "the answer was ready");
      }
    }
    finish_(std::move(call));
  }
}

void Engine::Fail(std::vector<Row>& rows, const grpc::Status& status) {
  for (Row& row : rows) {
    if (row.call != nullptr && row.call->status.ok()) row.call->status = status;
  }
}

bool Engine::Late(std::vector<Row>& rows, Deadline deadline, const char* stage) {
  if (!deadline) return false;
  const auto now = std::chrono::system_clock::now();
  if (now <= *deadline) return false;
  for (Row& row : rows) {
    if (row.call != nullptr && row.call->status.ok()) ++deadline_exceeded_;
  }
  Fail(rows, DeadlinePassed(std::chrono::duration<double>(now - *deadline).count(), stage));
  return true;
}

void Engine::Compute(const Servable& servable, std::vector<Row>& rows, Deadline deadline) {
  if (Late(rows, deadline, "looking up the histories")) return;
  // A rerank reading unclicked items it did not send computes them from its previous request
  // (the history without its last event), one more row of the same kernel call.
  const size_t queries = rows.size();
  std::vector<Query> previous;
  previous.reserve(queries);  // stable addresses: rows point into it
  for (size_t i = 0; i < queries; ++i) {
    const Query& query = *rows[i].query;
    if (!query.previous) continue;
    Query& before = previous.emplace_back();
    before.history.assign(query.history.begin(), query.history.end() - 1);
    before.excluded.assign(before.history.begin(), before.history.end());
    std::sort(before.excluded.begin(), before.excluded.end());
    before.excluded.erase(std::unique(before.excluded.begin(), before.excluded.end()), before.excluded.end());
    before.depth = before.k = query.num_unclicked + 1;  // + the one clicked at it
    before.fetch = before.depth + static_cast<uint32_t>(before.excluded.size());
  }
  for (size_t i = 0, p = 0; i < queries; ++i) {
    if (rows[i].query->previous) rows.push_back({nullptr, i, &previous[p++], {}, {}});
  }
  const auto searching = Stages::Clock::now();

  SearchInput in;
  in.batch = rows.size();
  in.width = servable.max_len;
  in.histories.assign(in.batch * in.width, 0);
  in.want_interests = true;  // DIVERSITY, return_interests and a short row's own search read them
  for (size_t r = 0; r < rows.size(); ++r) {
    const Query& query = *rows[r].query;
    const size_t used = std::min(query.history.size(), in.width);
    std::copy(query.history.end() - static_cast<std::ptrdiff_t>(used), query.history.end(),
              in.histories.begin() + static_cast<std::ptrdiff_t>((r + 1) * in.width - used));
    in.fetch.push_back(static_cast<int32_t>(query.fetch));
    int32_t group = -1;
    if (query.filtered) {
      const auto same = std::find_if(in.allows.begin(), in.allows.end(),
                                     [&](const std::vector<int64_t>* allow) { return *allow == query.allow; });
      group = static_cast<int32_t>(same - in.allows.begin());
      if (same == in.allows.end()) in.allows.push_back(&query.allow);
    }
    in.allow_group.push_back(group);
    in.rows.push_back(&query);
    if (query.explain) in.explain_rows.push_back(static_cast<int32_t>(r));
  }
  const std::vector<int32_t> explain_rows = in.explain_rows;
  SearchOutput out;
  try {
    out = servable.kernel->Search(std::move(in));
    CheckShape(out, rows.size(), explain_rows.size());
  } catch (const std::exception& e) {
    ++kernel_errors_;
    Fail(rows, {grpc::StatusCode::INTERNAL, e.what()});
    return;
  }
  ++batches_;
  rows_ += rows.size();
  metrics_.Batch(rows.size());
  for (uint64_t seen = max_batch_rows_; rows.size() > seen && !max_batch_rows_.compare_exchange_weak(seen, rows.size());) {
  }
  stages_.Add(Stage::kKernel, searching);
  if (Late(rows, deadline, "the index search")) return;
  const auto merging = Stages::Clock::now();
  Merge(servable, out, rows);
  Rerank(servable, rows, queries);
  stages_.Add(Stage::kMerge, merging);
  if (Late(rows, deadline, "the rerank")) return;
  const auto responding = Stages::Clock::now();
  Respond(servable, out, explain_rows, rows, queries);
  stages_.Add(Stage::kResponse, responding);
}

void Engine::Merge(const Servable& servable, const SearchOutput& out, std::vector<Row>& rows) {
  const auto max_id = static_cast<int64_t>(servable.vocabulary->size());
  for (size_t r = 0; r < rows.size(); ++r) {
    Row& row = rows[r];
    PendingCall* call = row.call != nullptr ? row.call : rows[row.index].call;
    if (!call->status.ok()) continue;
    const Query& query = *row.query;
    const size_t offset = r * out.interests * out.n;
    const Lists lists{out.ids.data() + offset, out.scores.data() + offset, out.interests, out.n};
    const float* interests = out.vectors.data() + r * out.interests * out.dim;
    // Round-robin and diversity choose among each interest's first candidates (those kept).
    const size_t cut = std::max(query.depth, query.per_interest_k);
    try {
      switch (query.merge) {
        case Merge::kMaxScore:
          row.found = merger_.MaxScore(lists, query.excluded, query.depth, max_id);
          break;
        case Merge::kRoundRobin:
          row.found = merger_.RoundRobin(lists, query.excluded, query.depth, cut, max_id);
          break;
        case Merge::kDiversity: {
          std::vector<size_t> active;  // the interests searched (an all-zero one is masked)
          for (size_t i = 0; i < out.interests; ++i) {
            const float* vector = interests + i * out.dim;
            if (std::any_of(vector, vector + out.dim, [](float v) { return v != 0; })) active.push_back(i);
          }
          const Merger::Scorer score = [&](const std::vector<size_t>& rows, const std::vector<int64_t>& ids) {
            std::vector<float> queries;
            for (size_t i : rows) queries.insert(queries.end(), interests + i * out.dim, interests + (i + 1) * out.dim);
            return servable.kernel->Rescore(queries.data(), rows.size(), out.dim, ids);
          };
          row.found = merger_.Diversity(lists, query.excluded, query.depth, cut, max_id, active, score,
                                        *servable.categories, query.lambda);
          break;
        }
      }
      // The index ran out before the row had its items: the Python engine would search it
      // again alone, with its filters inside the index. Its own search answers it.
      if (row.found.size() < query.depth && SearchedShort(out, r)) {
        ++alone_;
        row.found = servable.kernel->Alone({interests, out.interests, out.dim, &query});
      }
    } catch (const std::exception& e) {
      call->status = {grpc::StatusCode::INTERNAL, e.what()};
    }
  }
}

void Engine::Rerank(const Servable& servable, std::vector<Row>& rows, size_t queries) {
  // The unclicked items computed from the previous requests: their answer in order, without the
  // item clicked at it (the history's last event), the first num_unclicked.
  std::vector<std::vector<int64_t>> computed(queries);
  for (size_t r = queries; r < rows.size(); ++r) {
    const Query& query = *rows[rows[r].index].query;
    for (const ScoredItem& item : rows[r].found) {
      if (computed[rows[r].index].size() == query.num_unclicked) break;
      if (item.id > 0 && item.id != query.history.back()) computed[rows[r].index].push_back(item.id);
    }
  }
  std::map<std::string, std::vector<size_t>> by_ranker;
  for (size_t r = 0; r < queries; ++r) {
    if (rows[r].query->rerank && rows[r].call->status.ok()) by_ranker[rows[r].query->ranker].push_back(r);
  }
  for (const auto& [name, members] : by_ranker) {
    RerankInput in;
    in.ranker = name;
    in.rows = members.size();
    in.width = 1;
    for (size_t r : members) in.width = std::max(in.width, rows[r].found.size());
    in.candidates.assign(in.rows * in.width, 0);
    in.scores.assign(in.rows * in.width, 0);
    in.with_unclicked = servable.rankers.at(name).num_unclicked > 0;
    static const std::vector<int64_t> none;
    for (size_t m = 0; m < members.size(); ++m) {
      const Row& row = rows[members[m]];
      for (size_t j = 0; j < row.found.size(); ++j) {
        in.candidates[m * in.width + j] = row.found[j].id;
        in.scores[m * in.width + j] = row.found[j].score;
      }
      in.histories.push_back(&row.query->history);
      if (in.with_unclicked) {
        in.unclicked.push_back(row.query->own_unclicked ? &row.query->unclicked
                               : row.query->previous    ? &computed[members[m]]
                                                        : &none);
      }
    }
    std::vector<float> logits;
    try {
      logits = servable.kernel->Rerank(in);
      if (logits.size() != in.rows * in.width) {
        throw std::runtime_error("the ranker answered " + std::to_string(logits.size()) + " logits for [" +
                                 std::to_string(in.rows) + ", " + std::to_string(in.width) + "] candidates");
      }
    } catch (const std::exception& e) {
      for (size_t r : members) rows[r].call->status = {grpc::StatusCode::INTERNAL, e.what()};
      continue;
    }
    for (size_t m = 0; m < members.size(); ++m) {
      Row& row = rows[members[m]];
      const float* logit = logits.data() + m * in.width;
      std::vector<size_t> order(row.found.size());
      std::iota(order.begin(), order.end(), 0);
      // Best logit first; ties keep the retrieval order (numpy's stable argsort of -logits, NaN last).
      std::stable_sort(order.begin(), order.end(), [logit](size_t a, size_t b) {
        const float x = -logit[a], y = -logit[b];
        return std::isnan(y) ? !std::isnan(x) : x < y;
      });
      order.resize(std::min<size_t>(order.size(), row.query->k));
      std::vector<ScoredItem> kept;
      for (size_t j : order) {
        kept.push_back(row.found[j]);
        row.rank_scores.push_back(logit[j]);
      }
      row.found.swap(kept);
    }
  }
}

void Engine::Respond(const Servable& servable, const SearchOutput& out, const std::vector<int32_t>& explain_rows,
                     std::vector<Row>& rows, size_t queries) {
  const retrieval::v1::ExplanationKind kind = ExplanationKindOf(servable.explanation);
  for (size_t r = 0; r < queries; ++r) {
    Row& row = rows[r];
    if (!row.call->status.ok()) continue;
    const Query& query = *row.query;
    retrieval::v1::RetrieveResponse& answer = row.call->answers[row.index];
    for (size_t j = 0; j < row.found.size(); ++j) {
      const ScoredItem& item = row.found[j];
      retrieval::v1::ScoredItem* scored = answer.add_items();
      const std::string_view id = servable.vocabulary->External(item.id);
      scored->set_item_id(id.data(), id.size());
      scored->set_score(item.score);
      scored->set_interest(static_cast<uint32_t>(item.interest));
      if (query.rerank) scored->set_rank_score(row.rank_scores[j]);
    }
    answer.set_model_version(servable.model_version);
    answer.set_unknown_items(query.unknown);
    if (query.return_interests) {
      const float* vectors = out.vectors.data() + r * out.interests * out.dim;
      for (size_t i = 0; i < out.interests; ++i) {
        answer.add_interests()->mutable_values()->Add(vectors + i * out.dim, vectors + (i + 1) * out.dim);
      }
    }
    if (query.rerank) answer.set_ranker_version(servable.rankers.at(query.ranker).version);
    if (query.explain) {
      retrieval::v1::Explanations* explanations = answer.mutable_explanations();
      explanations->set_kind(kind);
      if (!out.weights.empty()) {
        const auto e = static_cast<size_t>(std::find(explain_rows.begin(), explain_rows.end(), static_cast<int32_t>(r)) -
                                           explain_rows.begin());
        TopEvents(out.weights.data() + e * out.interests * out.weight_width, out.interests, out.weight_width,
                  query.external, query.positions, explain_top_, explanations);
      }
    }
  }
}

Counters Engine::counters() const {
  return {calls_.load(),         rows_.load(),      batches_.load(), max_batch_rows_.load(), kernel_errors_.load(),
          cancelled_.load(),     alone_.load(),     deadline_exceeded_.load(), 0};
}

}  // namespace mitt::native
