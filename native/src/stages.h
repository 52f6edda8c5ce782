// Where a call's time goes on the native path (bench.native_echo --stages reads it): the time
// spent in each stage, summed over every call and batch, as wall time on the thread that ran it
// (std::chrono::steady_clock, ~50 ns a read: cheap enough to keep on; a thread's CPU clock costs
// ~330 ns a read here).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

namespace mitt::native {

enum class Stage {
  kParse,     // the request screened and parsed
  kChecks,    // its sizes, cost, conversion, checks and vocabulary lookups
  kKernel,    // a batch's kernel call: its inputs, the Python call (tower, index search), its arrays
  kMerge,     // a batch's exclusions, merges, short rows and reranks
  kResponse,  // a batch's answers built, then each call's serialised
  kCount
};

class Stages {
 public:
  using Clock = std::chrono::steady_clock;

  void Add(Stage stage, Clock::time_point since) {
    const auto elapsed = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - since).count();
    ns_[static_cast<size_t>(stage)].fetch_add(static_cast<uint64_t>(elapsed), std::memory_order_relaxed);
  }
  uint64_t nanoseconds(Stage stage) const { return ns_[static_cast<size_t>(stage)].load(std::memory_order_relaxed); }

 private:
  std::array<std::atomic<uint64_t>, static_cast<size_t>(Stage::kCount)> ns_{};
};

}  // namespace mitt::native
