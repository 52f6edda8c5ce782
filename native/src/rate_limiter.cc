#include "rate_limiter.h"

#include <algorithm>
#include <chrono>

namespace mitt::native {

void TokenBucket::Refill(double now) {
  tokens = std::min(burst, tokens + (now - updated) * rate);
  updated = now;
}

double TokenBucket::Take(double now) {
  Refill(now);
  if (tokens >= 1) {
    tokens -= 1;
    return 0;
  }
  return (1 - tokens) / rate;
}

std::pair<double, double> RateLimiter::Limit(std::optional<double> rate, std::optional<double> burst) const {
  if (!rate) return {rate_, burst.value_or(burst_)};
  return {*rate, burst.value_or(std::max(1.0, *rate))};
}

double RateLimiter::Wait(const Key& key, std::optional<double> rate, std::optional<double> burst) {
  const auto [limit, depth] = Limit(rate, burst);
  if (limit == 0) return 0;  // an identity's rate 0: unlimited
  // Seconds of a monotonic clock, as Python's time.monotonic.
  const double now = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  std::lock_guard<std::mutex> lock(mu_);
  auto found = buckets_.find(key);
  if (found == buckets_.end()) {
    if (buckets_.size() >= kMaxBuckets) DropFull(now);
    found = buckets_.emplace(key, TokenBucket{limit, depth, depth, now}).first;
  } else if (found->second.rate != limit || found->second.burst != depth) {  // the identity's limit changed
    found->second.Refill(now);
    found->second.rate = limit;
    found->second.burst = depth;
  }
  return found->second.Take(now);
}

void RateLimiter::DropFull(double now) {
  for (auto it = buckets_.begin(); it != buckets_.end();) {
    it->second.Refill(now);
    it = it->second.tokens >= it->second.burst ? buckets_.erase(it) : std::next(it);
  }
}

}  // namespace mitt::native
