// What the metrics endpoint exports of the engine's calls (retrieval.serving.metrics.Metrics'
// names): calls by method and status code with their latency histogram, refusals by method,
// code and reason, and the batches' sizes; read by Python (retrieval.serving.native_metrics),
// which moves what was added since its last read into its Prometheus metrics.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include <grpcpp/grpcpp.h>

namespace mitt::native {

enum class Method { kRetrieve, kBatchRetrieve, kGetModelInfo, kServerReflectionInfo };

// The gRPC method's name, the `method` label.
const char* MethodName(Method method);
// Its full name, "/package.Service/Method".
const char* FullMethodName(Method method);

// Counts in buckets with upper bounds `bounds` (then +inf), and their sum: a Prometheus
// histogram's values, an observation in the first bucket whose bound it does not exceed.
struct Histogram {
  std::vector<uint64_t> buckets;  // bounds.size() + 1, not cumulative
  double sum = 0;
};

class CallMetrics {
 public:
  CallMetrics(std::vector<double> latency_bounds, std::vector<double> batch_bounds)
      : latency_bounds_(std::move(latency_bounds)), batch_bounds_(std::move(batch_bounds)) {
    counted_.batches.buckets.assign(batch_bounds_.size() + 1, 0);
  }

  // A call of `method` ended with `code` after `seconds`; one not OK is also a refusal, for
  // `reason` ("": the code's name in lower case, as Python names it), by the caller's `identity`
  // (of the access file; "" when there is none or it is not known).
  void Answered(Method method, grpc::StatusCode code, double seconds, const std::string& reason = "",
                std::string_view identity = {});
  // A kernel call of `rows` queries.
  void Batch(size_t rows);

  struct Snapshot {
    std::map<std::pair<std::string, int>, Histogram> latency;                 // (method, code)
    // (method, code, reason, identity)
    std::map<std::tuple<std::string, int, std::string, std::string>, uint64_t> refusals;
    Histogram batches;
  };
  // Everything counted since the start.
  Snapshot Read() const;

 private:
  static void Observe(Histogram& histogram, const std::vector<double>& bounds, double value);

  const std::vector<double> latency_bounds_, batch_bounds_;
  mutable std::mutex mu_;
  Snapshot counted_;  // under mu_
};

}  // namespace mitt::native
