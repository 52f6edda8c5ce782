#include "batcher.h"

#include <pthread.h>

#include <algorithm>

namespace mitt::native {

MicroBatcher::MicroBatcher(BatchOptions options, Handler handler)
    : options_(options), handler_(std::move(handler)), worker_([this] { Run(); }) {}

MicroBatcher::Queued MicroBatcher::Submit(std::unique_ptr<PendingCall>& call, double* retry_after) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return Queued::kStopping;
    if (call->heavy) {
      heavy_rows_ += call->rows();
      heavy_.push_back(std::move(call));
    } else {
      if (cheap_rows_ >= options_.max_queue) {
        *retry_after = batch_seconds_ * static_cast<double>(cheap_rows_) / static_cast<double>(options_.max_batch);
        return Queued::kFull;
      }
      cheap_rows_ += call->rows();
      cheap_.push_back(std::move(call));
    }
  }
  ready_.notify_one();
  return Queued::kYes;
}

size_t MicroBatcher::queued_rows() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cheap_rows_ + heavy_rows_;
}

void MicroBatcher::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  ready_.notify_one();
  std::lock_guard<std::mutex> join(join_mu_);
  if (worker_.joinable()) worker_.join();
}

Batch MicroBatcher::TakeCheap() {
  Batch batch;
  size_t rows = 0;
  double costliest = 0;
  while (!cheap_.empty()) {
    const PendingCall& next = *cheap_.front();
    const double cost = std::max(costliest, next.costliest);
    if (!batch.finished.empty() && (rows + next.rows() > options_.max_batch ||
                                    static_cast<double>(rows + next.rows()) * cost > options_.batch_cost)) {
      break;
    }
    rows += next.rows();
    costliest = cost;
    batch.slices.push_back({cheap_.front().get(), 0, next.rows()});
    batch.finished.push_back(std::move(cheap_.front()));
    cheap_.pop_front();
  }
  cheap_rows_ -= rows;
  return batch;
}

Batch MicroBatcher::TakeChunk() {
  Batch batch;
  PendingCall* call = heavy_.front().get();
  const size_t begin = call->next_chunk == 0 ? 0 : call->chunks[call->next_chunk - 1];
  const size_t end = call->chunks[call->next_chunk++];
  batch.slices.push_back({call, begin, end});
  heavy_rows_ -= end - begin;
  if (call->next_chunk == call->chunks.size()) {
    batch.finished.push_back(std::move(heavy_.front()));
    heavy_.pop_front();
  }
  return batch;
}

void MicroBatcher::Run() {
  pthread_setname_np(pthread_self(), "mitt-batcher");  // as top -H and /proc/PID/task/*/comm show it
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    ready_.wait(lock, [this] { return stopping_ || !cheap_.empty() || !heavy_.empty(); });
    if (cheap_.empty() && heavy_.empty()) return;  // stopping, and everything answered
    Batch batch;
    if (!cheap_.empty()) {
      if (options_.max_wait.count() > 0) {
        ready_.wait_until(lock, cheap_.front()->arrived + options_.max_wait,
                          [this] { return stopping_ || cheap_rows_ >= options_.max_batch; });
      }
      batch = TakeCheap();
    } else {
      batch = TakeChunk();
    }
    lock.unlock();
    const auto started = std::chrono::steady_clock::now();
    handler_(std::move(batch));
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    lock.lock();
    batch_seconds_ = 0.8 * batch_seconds_ + 0.2 * seconds;
  }
}

}  // namespace mitt::native
