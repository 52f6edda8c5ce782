#include "engine.h"

#include <algorithm>
#include <exception>
#include <stdexcept>

namespace mitt::native {
namespace {

// The kernel's arrays must hold [batch, interests, n] for the batch it was given.
void CheckShape(const KernelOutput& out, size_t batch) {
  const size_t cells = out.batch * out.interests * out.n;
  if (out.batch != batch || out.ids.size() != cells || out.scores.size() != cells) {
    throw std::runtime_error("the kernel answered " + std::to_string(out.batch) + " rows (" +
                             std::to_string(out.ids.size()) + " ids, " + std::to_string(out.scores.size()) +
                             " scores) for a batch of " + std::to_string(batch));
  }
}

}  // namespace

Engine::Engine(std::shared_ptr<const Vocabulary> vocabulary, Kernel kernel, EngineOptions options)
    : vocabulary_(std::move(vocabulary)),
      kernel_(std::move(kernel)),
      options_(std::move(options)),
      merge_(vocabulary_->size()) {}

KernelInput Engine::Input(const std::vector<const Query*>& rows) const {
  KernelInput in;
  in.batch = rows.size();
  in.width = options_.max_len;
  in.histories.assign(in.batch * in.width, 0);
  in.fetch.reserve(in.batch);
  for (size_t r = 0; r < rows.size(); ++r) {
    const std::vector<int32_t>& history = rows[r]->history;
    const size_t used = std::min(history.size(), in.width);
    std::copy(history.end() - static_cast<std::ptrdiff_t>(used), history.end(),
              in.histories.begin() + static_cast<std::ptrdiff_t>((r + 1) * in.width - used));
    in.fetch.push_back(static_cast<int32_t>(rows[r]->fetch));
  }
  return in;
}

grpc::Status Engine::Respond(const Query& query, const KernelOutput& out, size_t row,
                             retrieval::v1::RetrieveResponse* response) {
  const size_t offset = row * out.interests * out.n;
  std::vector<ScoredItem> merged;
  try {
    merged = merge_(out.ids.data() + offset, out.scores.data() + offset, out.interests, out.n, query.excluded, query.k);
  } catch (const std::logic_error& e) {  // an id outside the vocabulary, a NaN score
    return {grpc::StatusCode::INTERNAL, e.what()};
  }
  for (const ScoredItem& item : merged) {
    retrieval::v1::ScoredItem* scored = response->add_items();
    scored->set_item_id(vocabulary_->External(item.id));
    scored->set_score(item.score);
    scored->set_interest(static_cast<uint32_t>(item.interest));
  }
  response->set_model_version(options_.model_version);
  response->set_unknown_items(query.unknown);
  return grpc::Status::OK;
}

void Engine::Answer(std::vector<std::unique_ptr<PendingCall>> batch) {
  calls_ += batch.size();
  // A call cancelled while queued (its deadline passed, its client left, the server stopped
  // waiting for it) costs the kernel nothing.
  std::vector<std::unique_ptr<PendingCall>> live;
  for (auto& call : batch) {
    if (call->context->IsCancelled()) {
      ++cancelled_;
      call->reactor->Finish({grpc::StatusCode::CANCELLED, "cancelled before its batch was computed"});
    } else {
      live.push_back(std::move(call));
    }
  }
  std::vector<const Query*> rows;
  for (const auto& call : live) {
    for (const Query& query : call->queries) rows.push_back(&query);
  }
  if (rows.empty()) return;
  ++batches_;
  rows_ += rows.size();
  for (uint64_t seen = max_batch_rows_; rows.size() > seen && !max_batch_rows_.compare_exchange_weak(seen, rows.size());) {
  }
  KernelOutput out;
  try {
    out = kernel_(Input(rows));
    CheckShape(out, rows.size());
  } catch (const std::exception& e) {
    ++kernel_errors_;
    for (const auto& call : live) call->reactor->Finish({grpc::StatusCode::INTERNAL, e.what()});
    return;
  }
  size_t row = 0;
  for (const auto& call : live) {
    grpc::Status status = grpc::Status::OK;
    for (size_t q = 0; q < call->queries.size(); ++q, ++row) {
      if (status.ok()) status = Respond(call->queries[q], out, row, call->responses[q]);
    }
    call->reactor->Finish(status);
  }
}

Counters Engine::counters() const {
  return {calls_.load(), rows_.load(), batches_.load(), max_batch_rows_.load(), kernel_errors_.load(),
          cancelled_.load(), 0};
}

}  // namespace mitt::native
