// Micro-batching: calls queued by gRPC's threads, answered in batches by one worker thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "pending_call.h"

namespace mitt::native {

struct BatchOptions {
  size_t max_batch = 32;                  // queries per batch; a larger call forms a batch alone
  std::chrono::microseconds max_wait{0};  // how long a batch waits to fill from its first call's arrival
  double batch_cost = 64;                 // cost units per batch: its queries times the costliest one's
  size_t max_queue = 1024;                // cheap queries waiting beyond which calls are refused
};

// Hands queued calls to `handler` in batches on its own worker thread: the cheap calls queued
// while a batch computes form the next one (bounded in queries and cost), so batches grow exactly
// when the handler is the bottleneck; a heavy call is computed alone, one chunk at a time, and
// the cheap calls queued meanwhile are answered between two of its chunks.
class MicroBatcher {
 public:
  using Handler = std::function<void(Batch)>;
  enum class Queued { kYes, kStopping, kFull };

  MicroBatcher(BatchOptions options, Handler handler);
  ~MicroBatcher() { Stop(); }
  MicroBatcher(const MicroBatcher&) = delete;
  MicroBatcher& operator=(const MicroBatcher&) = delete;

  // Queues `call` (emptied) or leaves it with the caller, who answers it: the batcher stops, or
  // max_queue cheap queries wait (then `retry_after` is about when there will be room, seconds).
  Queued Submit(std::unique_ptr<PendingCall>& call, double* retry_after);

  size_t max_queue() const { return options_.max_queue; }
  // Queries queued and not yet handed to the handler.
  size_t queued_rows() const;

  // Answers what is queued, then ends the worker; later Submits are refused. Idempotent.
  void Stop();

 private:
  void Run();
  Batch TakeCheap();  // under mu_
  Batch TakeChunk();  // under mu_

  const BatchOptions options_;
  const Handler handler_;
  mutable std::mutex mu_;
  std::condition_variable ready_;
  std::deque<std::unique_ptr<PendingCall>> cheap_, heavy_;
  size_t cheap_rows_ = 0, heavy_rows_ = 0;
  double batch_seconds_ = 0.01;  // moving average of a batch's time, for retry hints
  bool stopping_ = false;
  std::mutex join_mu_;
  std::thread worker_;  // last: starts once everything it reads is constructed
};

}  // namespace mitt::native
