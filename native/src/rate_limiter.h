// Per-client rate limits (retrieval.serving.ratelimit): a token bucket per identity (or per client
// address), with the Python engine's arithmetic, so both engines refuse the same calls.
#pragma once

#include <cstddef>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

namespace mitt::native {

// ratelimit.MAX_BUCKETS: buckets kept before the full ones are dropped.
inline constexpr size_t kMaxBuckets = 10000;

// `tokens` of at most `burst`, refilled at `rate` a second since `updated` (seconds).
struct TokenBucket {
  double rate, burst, tokens, updated;

  // Adds the tokens earned since the last update, up to `burst`.
  void Refill(double now);
  // Takes a token if there is one: 0 when taken, else the seconds until one is available.
  double Take(double now);
};

class RateLimiter {
 public:
  // (anonymous, name): an anonymous client's address is kept apart from an identity of that name.
  using Key = std::pair<bool, std::string>;

  // `rate` requests a second with bursts of `burst` (both checked by Python).
  RateLimiter(double rate, double burst) : rate_(rate), burst_(burst) {}

  // The (rate, burst) that applies: an identity's own values, else the defaults.
  std::pair<double, double> Limit(std::optional<double> rate, std::optional<double> burst) const;
  // Takes a token from `key`'s bucket: 0 when the call may go ahead, else the seconds until it may.
  double Wait(const Key& key, std::optional<double> rate, std::optional<double> burst);

 private:
  void DropFull(double now);  // under mu_

  const double rate_, burst_;
  std::mutex mu_;
  std::map<Key, TokenBucket> buckets_;
};

}  // namespace mitt::native
