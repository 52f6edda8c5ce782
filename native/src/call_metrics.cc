#include "call_metrics.h"

#include <algorithm>

namespace mitt::native {

const char* MethodName(Method method) {
  switch (method) {
    case Method::kRetrieve:
      return "Retrieve";
    case Method::kBatchRetrieve:
      return "BatchRetrieve";
    case Method::kGetModelInfo:
      return "GetModelInfo";
    case Method::kServerReflectionInfo:
      return "ServerReflectionInfo";
  }
  return "";
}

const char* FullMethodName(Method method) {
  switch (method) {
    case Method::kRetrieve:
      return "/retrieval.v1.RetrievalService/Retrieve";
    case Method::kBatchRetrieve:
      return "/retrieval.v1.RetrievalService/BatchRetrieve";
    case Method::kGetModelInfo:
      return "/retrieval.v1.RetrievalService/GetModelInfo";
    case Method::kServerReflectionInfo:  // the only version gRPC 1.51's plugin serves
      return "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";
  }
  return "";
}

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
