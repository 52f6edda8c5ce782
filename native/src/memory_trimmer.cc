#include "memory_trimmer.h"

#include <malloc.h>
#include <pthread.h>

namespace mitt::native {

MemoryTrimmer::MemoryTrimmer(uint64_t large_bytes, std::chrono::milliseconds delay)
    : large_bytes_(large_bytes), delay_(delay), worker_([this] { Run(); }) {}

MemoryTrimmer::~MemoryTrimmer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  noted_.notify_one();
  worker_.join();
}

void MemoryTrimmer::Note(uint64_t bytes) {
  if (large_bytes_ == 0 || bytes < large_bytes_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    large_ = true;
  }
  noted_.notify_one();
}

void MemoryTrimmer::Run() {
  pthread_setname_np(pthread_self(), "mitt-trimmer");
  std::unique_lock<std::mutex> lock(mu_);
  const auto noted = [this] { return stopping_ || large_; };
  while (true) {
    noted_.wait(lock, noted);
    // Still arriving: wait until none came for `delay_`, then trim once.
    while (!stopping_ && large_) {
      large_ = false;
      noted_.wait_for(lock, delay_, noted);
    }
    if (stopping_) return;
    lock.unlock();
    malloc_trim(0);
    trims_.fetch_add(1, std::memory_order_relaxed);
    lock.lock();
  }
}

}  // namespace mitt::native
