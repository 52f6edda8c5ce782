// The data plane's work on one batch: one kernel call (user tower and index search) for every
// query of the batch, the merges, the short rows, the reranks and the explanations, the answers.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "call_metrics.h"
#include "merge.h"
#include "pending_call.h"
#include "stages.h"

namespace mitt::native {

struct Counters {
  uint64_t calls = 0;           // RPCs a batch finished (cancelled ones included)
  uint64_t rows = 0;            // queries handed to the kernel (a rerank's previous requests included)
  uint64_t batches = 0;         // kernel calls
  uint64_t max_batch_rows = 0;  // the largest batch's rows
  uint64_t kernel_errors = 0;   // batches failed by a kernel call
  uint64_t cancelled = 0;       // calls cancelled before their batch (client gone, stop)
  uint64_t alone = 0;           // rows answered by the Python engine's own search (theirs came back short)
  uint64_t deadline_exceeded = 0;  // calls whose deadline passed while computing
  uint64_t queued = 0;          // queries waiting for a batch now (filled by NativeServer)
  uint64_t trims = 0;           // heap trims after large requests (filled by NativeServer)
};

class Engine {
 public:
  // Sends a finished call's answers (or its status) and releases what it held.
  using Finish = std::function<void(std::unique_ptr<PendingCall>)>;

  Engine(size_t explain_top, CallMetrics& metrics, Stages& stages, Finish finish)
      : explain_top_(explain_top), metrics_(metrics), stages_(stages), finish_(std::move(finish)) {}

  // Computes the batch's slices, then finishes its finished calls (each exactly once).
  void Answer(Batch batch);

  Counters counters() const;

 private:
  struct Row {
    PendingCall* call;  // nullptr: a rerank's previous request
    size_t index;       // the query's place in its call; a previous request's: its rerank's row
    const Query* query;
    std::vector<ScoredItem> found;
    std::vector<float> rank_scores;
  };
  using Deadline = std::optional<std::chrono::system_clock::time_point>;

  // The rows of one servable: the kernel's search, the merges, reranks and answers.
  void Compute(const Servable& servable, std::vector<Row>& rows, Deadline deadline);
  // Per row its items (the merge of its lists, or the Python engine's own answer when short).
  void Merge(const Servable& servable, const SearchOutput& out, std::vector<Row>& rows);
  void Rerank(const Servable& servable, std::vector<Row>& rows, size_t queries);
  void Respond(const Servable& servable, const SearchOutput& out, const std::vector<int32_t>& explain_rows,
               std::vector<Row>& rows, size_t queries);
  // Fails the calls of `rows` that have not failed yet.
  void Fail(std::vector<Row>& rows, const grpc::Status& status);
  // DEADLINE_EXCEEDED for every call of `rows` when `deadline` has passed (after `stage`).
  bool Late(std::vector<Row>& rows, Deadline deadline, const char* stage);

  const size_t explain_top_;
  CallMetrics& metrics_;
  Stages& stages_;
  const Finish finish_;
  Merger merger_;  // Answer's, on the batcher's thread
  std::atomic<uint64_t> calls_{0}, rows_{0}, batches_{0}, max_batch_rows_{0}, kernel_errors_{0}, cancelled_{0},
      alone_{0}, deadline_exceeded_{0};
};

}  // namespace mitt::native
