// Gives the heap's free memory back to the system after large requests, as
// retrieval.serving.memory.MemoryTrimmer does for the Python engine: Note() each request's size; a
// thread trims `delay` after the last large one (a burst is trimmed once).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

namespace mitt::native {

class MemoryTrimmer {
 public:
  // `large_bytes` 0: never trims.
  MemoryTrimmer(uint64_t large_bytes, std::chrono::milliseconds delay);
  ~MemoryTrimmer();
  MemoryTrimmer(const MemoryTrimmer&) = delete;
  MemoryTrimmer& operator=(const MemoryTrimmer&) = delete;

  // Records a request of `bytes` (cheap: a flag for the large ones).
  void Note(uint64_t bytes);
  // Trims done so far.
  uint64_t trims() const { return trims_.load(std::memory_order_relaxed); }

 private:
  void Run();

  const uint64_t large_bytes_;
  const std::chrono::milliseconds delay_;
  std::mutex mu_;
  std::condition_variable noted_;
  bool large_ = false;
  bool stopping_ = false;
  std::atomic<uint64_t> trims_{0};
  std::thread worker_;  // last: starts once everything it reads is constructed
};

}  // namespace mitt::native
