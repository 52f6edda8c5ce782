#include "admission.h"

#include <algorithm>
#include <cstdio>
#include <pthread.h>
#include <unistd.h>

#include "python_text.h"

namespace mitt::native {

size_t Admission::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waiting_.size();
}

uint64_t ResidentBytes() {
  FILE* statm = std::fopen("/proc/self/statm", "r");
  if (statm == nullptr) return 0;
  unsigned long long size = 0, resident = 0;
  const int read = std::fscanf(statm, "%llu %llu", &size, &resident);
  std::fclose(statm);
  return read == 2 ? resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE)) : 0;
}

Admission::Admission(AdmissionLimits limits) : limits_(limits), timer_([this] { Expire(); }) {}

void Admission::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  std::lock_guard<std::mutex> join(join_mu_);
  if (timer_.joinable()) timer_.join();
}

Refusal Admission::Busy(const std::string& reason, double cost, const std::string& call) const {
  const double retry_after = std::max(0.01, (heavy_cost_ + cost - limits_.max_cost) * seconds_per_unit_);
  return {reason,
          "server busy: heavy calls hold " + Fixed(heavy_cost_, 0) + " of " + Fixed(limits_.max_cost, 0) +
              " cost units and " + call + "; retry in about " + Fixed(retry_after * 1000, 0) + " ms",
          retry_after};
}

void Admission::Enter(double cost, std::chrono::steady_clock::time_point wait_until, Done done) {
  if (limits_.max_memory_bytes > 0) {
    if (const uint64_t memory = ResidentBytes(); memory > limits_.max_memory_bytes) {
      done(Refusal{"memory",
                   "server memory " + Fixed(static_cast<double>(memory) / (1 << 20), 0) + " MiB is over its " +
                       Fixed(static_cast<double>(limits_.max_memory_bytes) / (1 << 20), 0) +
                       " MiB ceiling: heavy calls (cost " + Fixed(cost, 0) + ") are refused until it falls; retry later",
                   limits_.heavy_wait});
      return;
    }
  }
  const auto now = std::chrono::steady_clock::now();
  std::optional<Refusal> refused;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || Fits(cost)) {
      ++heavy_;
      heavy_cost_ += cost;
    } else if (waiting_.size() >= limits_.max_waiting) {
      refused = Busy("heavy_capacity", cost, "this call costs " + Fixed(cost, 0) + " (no room to wait)");
    } else {
      const double wait = std::max(0.0, std::chrono::duration<double>(wait_until - now).count());
      waiting_.push_back({cost, wait_until, wait, std::move(done)});
      changed_.notify_all();
      return;
    }
  }
  done(refused);
}

void Admission::Leave(double cost, double seconds) {
  std::vector<std::function<void()>> ready;
  {
    std::lock_guard<std::mutex> lock(mu_);
    --heavy_;
    heavy_cost_ -= cost;
    seconds_per_unit_ = 0.8 * seconds_per_unit_ + 0.2 * seconds / cost;
    ready = Settle(std::chrono::steady_clock::now());
  }
  for (auto& run : ready) run();
}

std::optional<Refusal> Admission::Screen(uint64_t bytes) const {
  if (bytes <= limits_.cheap_bytes) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  if (heavy_ == 0 || waiting_.size() < limits_.max_waiting) return std::nullopt;
  return Busy("unread_large", 0.0,
              std::to_string(waiting_.size()) + " calls wait: this one (" +
                  Fixed(static_cast<double>(bytes) / (1 << 20), 1) + " MiB) was not read");
}

std::vector<std::function<void()>> Admission::Settle(std::chrono::steady_clock::time_point now) {
  std::vector<std::function<void()>> ready;
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (Fits(it->cost)) {
      ++heavy_;
      heavy_cost_ += it->cost;
      ready.push_back([done = std::move(it->done)] { done(std::nullopt); });
    } else if (stopping_ || it->until <= now) {
      Refusal refusal =
          Busy("heavy_capacity", it->cost, "this call costs " + Fixed(it->cost, 0) + " (waited " + Fixed(it->wait_seconds, 2) + " s)");
      ready.push_back([done = std::move(it->done), refusal = std::move(refusal)] { done(refusal); });
    } else {
      ++it;
      continue;
    }
    it = waiting_.erase(it);
  }
  return ready;
}

void Admission::Expire() {
  pthread_setname_np(pthread_self(), "mitt-admission");
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    auto ready = Settle(std::chrono::steady_clock::now());
    if (!ready.empty()) {
      lock.unlock();
      for (auto& run : ready) run();
      lock.lock();
      continue;
    }
    if (stopping_) return;
    if (waiting_.empty()) {
      changed_.wait(lock);
    } else {
      auto first = std::min_element(waiting_.begin(), waiting_.end(),
                                    [](const Waiting& a, const Waiting& b) { return a.until < b.until; });
      changed_.wait_until(lock, first->until);
    }
  }
}

}  // namespace mitt::native
