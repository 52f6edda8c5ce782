#include "call_metrics.h"

#include <algorithm>
#include <iterator>

namespace mitt::native {

namespace {

struct MethodNames {
  const char* name;       // the `method` label
  const char* full_name;  // "/package.Service/Method"
};

// Indexed by Method.
constexpr MethodNames kMethodNames[] = {
    {"Retrieve", "/retrieval.v1.RetrievalService/Retrieve"},
    {"BatchRetrieve", "/retrieval.v1.RetrievalService/BatchRetrieve"},
    {"GetModelInfo", "/retrieval.v1.RetrievalService/GetModelInfo"},
    // v1alpha: the only version gRPC 1.51's plugin serves
    {"ServerReflectionInfo", "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"},
};
static_assert(std::size(kMethodNames) == static_cast<size_t>(Method::kServerReflectionInfo) + 1);

}  // namespace

const char* MethodName(Method method) { return kMethodNames[static_cast<size_t>(method)].name; }

const char* FullMethodName(Method method) { return kMethodNames[static_cast<size_t>(method)].full_name; }

void CallMetrics::Observe(Histogram& histogram, const std::vector<double>& bounds, double value) {
  if (histogram.buckets.empty()) histogram.buckets.assign(bounds.size() + 1, 0);
  const auto bucket = std::lower_bound(bounds.begin(), bounds.end(), value) - bounds.begin();  // first >= value
  ++histogram.buckets[static_cast<size_t>(bucket)];
  histogram.sum += value;
}

void CallMetrics::Answered(Method method, grpc::StatusCode code, double seconds, const std::string& reason,
                           std::string_view identity) {
  const std::string name = MethodName(method);
  std::lock_guard<std::mutex> lock(mu_);
  Observe(counted_.latency[{name, static_cast<int>(code)}], latency_bounds_, seconds);
  if (code != grpc::StatusCode::OK) ++counted_.refusals[{name, static_cast<int>(code), reason, std::string(identity)}];
}

void CallMetrics::Batch(size_t rows) {
  std::lock_guard<std::mutex> lock(mu_);
  Observe(counted_.batches, batch_bounds_, static_cast<double>(rows));
}

CallMetrics::Snapshot CallMetrics::Read() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counted_;
}

}  // namespace mitt::native
