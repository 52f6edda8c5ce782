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
#include <utility>
#include <vector>

namespace mitt::native {

struct BatchOptions {
  size_t max_batch = 32;                  // rows (queries) per batch; a larger call forms a batch alone
  std::chrono::microseconds max_wait{0};  // how long a batch waits to fill from its first call's arrival
};

// Queues items (each `Item` has `size_t rows() const`) and hands them to `handler` in batches
// on its own worker thread: the calls queued while a batch computes form the next one, so
// batches grow exactly when the handler is the bottleneck.
template <class Item>
class MicroBatcher {
 public:
  using Batch = std::vector<std::unique_ptr<Item>>;
  using Handler = std::function<void(Batch)>;

  MicroBatcher(BatchOptions options, Handler handler)
      : options_(options), handler_(std::move(handler)), worker_([this] { Run(); }) {}
  ~MicroBatcher() { Stop(); }
  MicroBatcher(const MicroBatcher&) = delete;
  MicroBatcher& operator=(const MicroBatcher&) = delete;

  // Queues `item`: nullptr once queued, `item` itself back after Stop (the caller answers it).
  std::unique_ptr<Item> Submit(std::unique_ptr<Item> item) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return item;
      queued_rows_ += item->rows();
      queue_.push_back({std::move(item), std::chrono::steady_clock::now()});
    }
    ready_.notify_one();
    return nullptr;
  }

  // Rows queued and not yet handed to the handler.
  size_t queued_rows() const {
    std::lock_guard<std::mutex> lock(mu_);
    return queued_rows_;
  }

  // Answers what is queued, then ends the worker; later Submits are refused. Idempotent.
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    ready_.notify_one();
    std::lock_guard<std::mutex> join(join_mu_);
    if (worker_.joinable()) worker_.join();
  }

 private:
  struct Queued {
    std::unique_ptr<Item> item;
    std::chrono::steady_clock::time_point arrived;
  };

  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      ready_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything answered
      if (options_.max_wait.count() > 0) {
        ready_.wait_until(lock, queue_.front().arrived + options_.max_wait,
                          [this] { return stopping_ || queued_rows_ >= options_.max_batch; });
      }
      Batch batch;
      size_t rows = 0;
      while (!queue_.empty() && (batch.empty() || rows + queue_.front().item->rows() <= options_.max_batch)) {
        rows += queue_.front().item->rows();
        batch.push_back(std::move(queue_.front().item));
        queue_.pop_front();
      }
      queued_rows_ -= rows;
      lock.unlock();
      handler_(std::move(batch));
      lock.lock();
    }
  }

  const BatchOptions options_;
  const Handler handler_;
  mutable std::mutex mu_;
  std::condition_variable ready_;
  std::deque<Queued> queue_;
  size_t queued_rows_ = 0;
  bool stopping_ = false;
  std::mutex join_mu_;
  std::thread worker_;  // last: starts once everything it reads is constructed
};

}  // namespace mitt::native
