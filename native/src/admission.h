// Cost-based admission of heavy calls (retrieval.serving.admission.Admission): one runs whenever
// no other does, more while they fit `max_cost` units, up to `max_waiting` wait for room (at most
// `heavy_wait`, or their deadline), the others are refused at once with a retry hint. Cheap calls
// (cost <= cheap_cost) are always admitted and micro-batched.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <grpcpp/support/status.h>

namespace mitt::native {

// admission.AdmissionLimits, handed over from Python.
struct AdmissionLimits {
  double cheap_cost = 16;
  double batch_cost = 64;
  uint64_t cheap_bytes = 64 * 1024;
  double max_cost = 64;
  uint32_t max_waiting = 2;
  double heavy_wait = 1.0;  // seconds a heavy call waits for room at most
  double chunk_cost = 64;
  uint64_t max_memory_bytes = 0;  // 0 = no ceiling
};

// Why a call was refused, for want of capacity (RESOURCE_EXHAUSTED) or by access control: `code`
// with `message` and, when known, the grpc-retry-pushback-ms trailer.
struct Refusal {
  std::string reason;  // retrieval_refusals_total's label: heavy_capacity, memory, rate_limit, permission...
  std::string message;
  std::optional<double> retry_after;  // seconds
  grpc::StatusCode code = grpc::StatusCode::RESOURCE_EXHAUSTED;
};

class Admission {
 public:
  // Called once per heavy call: admitted (nullopt) or refused; maybe on another thread.
  using Done = std::function<void(std::optional<Refusal>)>;

  explicit Admission(AdmissionLimits limits);
  ~Admission() { Close(); }
  Admission(const Admission&) = delete;
  Admission& operator=(const Admission&) = delete;

  const AdmissionLimits& limits() const { return limits_; }
  bool IsCheap(double cost) const { return cost <= limits_.cheap_cost; }

  // Admits a heavy call of `cost` now, or once it fits (waiting until `wait_until` at most), or
  // refuses it; calls `done` exactly once.
  void Enter(double cost, std::chrono::steady_clock::time_point wait_until, Done done);
  // Releases an admitted heavy call that took `seconds`; admits the waiting calls that now fit.
  void Leave(double cost, double seconds);
  // Refuses the calls still waiting (as after their wait) and ends the timer thread; later calls
  // are admitted at once (the server is stopping: its batcher refuses them). Idempotent.
  void Close();
  // Heavy calls waiting for room now.
  size_t waiting() const;
  // admission.screen: a request of `bytes` over cheap_bytes while heavy calls leave no room to
  // wait is refused unread.
  std::optional<Refusal> Screen(uint64_t bytes) const;

 private:
  struct Waiting {
    double cost;
    std::chrono::steady_clock::time_point until;
    double wait_seconds;
    Done done;
  };

  bool Fits(double cost) const { return heavy_ == 0 || heavy_cost_ + cost <= limits_.max_cost; }
  Refusal Busy(const std::string& reason, double cost, const std::string& call) const;
  // Admits the waiting calls that fit and takes out those whose wait is over (under mu_); the
  // caller runs the returned callbacks once it has let mu_ go.
  std::vector<std::function<void()>> Settle(std::chrono::steady_clock::time_point now);
  void Expire();  // the timer thread

  const AdmissionLimits limits_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::deque<Waiting> waiting_;
  uint32_t heavy_ = 0;
  double heavy_cost_ = 0;
  double seconds_per_unit_ = 0.001;  // moving average of heavy calls' time per cost unit
  bool stopping_ = false;
  std::mutex join_mu_;
  std::thread timer_;  // last: starts once everything it reads is constructed
};

// The process's resident memory in bytes (/proc/self/statm), 0 when unknown.
uint64_t ResidentBytes();

}  // namespace mitt::native
