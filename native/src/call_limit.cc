#include "call_limit.h"

#include <algorithm>
#include <string>

#include "python_text.h"

namespace mitt::native {

bool CallLimit::Enter() {
  std::lock_guard<std::mutex> lock(mu_);
  if (held_ >= limit_) return false;
  ++held_;
  return true;
}

void CallLimit::Leave(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  --held_;
  seconds_ = 0.9 * seconds_ + 0.1 * seconds;
}

Refusal CallLimit::Refused() const {
  std::lock_guard<std::mutex> lock(mu_);
  const double retry_after = std::min(std::max(seconds_, 0.01), 1.0);
  return {"queue_full",
          "server busy: it holds " + std::to_string(limit_) + " calls already (--max-queued); retry in about " +
              Fixed(retry_after * 1000, 0) + " ms",
          retry_after};
}

uint32_t CallLimit::held() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_;
}

}  // namespace mitt::native
