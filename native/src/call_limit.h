// At most `limit` calls held at once (retrieval.serving.admission.CallLimit, the server's
// --max-queued): checked when a call arrives, before its request is parsed.
#pragma once

#include <cstdint>
#include <mutex>

#include "admission.h"

namespace mitt::native {

class CallLimit {
 public:
  explicit CallLimit(uint32_t limit) : limit_(limit) {}

  // Holds one more call; false (nothing held) when `limit` are held already.
  bool Enter();
  // Releases a call Enter held, which took `seconds`.
  void Leave(double seconds);
  // The refusal of a call that found `limit` held: retry after about one call's time.
  Refusal Refused() const;
  uint32_t held() const;

 private:
  const uint32_t limit_;
  mutable std::mutex mu_;
  uint32_t held_ = 0;
  double seconds_ = 0.01;  // moving average of a call's time held
};

}  // namespace mitt::native
