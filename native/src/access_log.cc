#include "access_log.h"

#include <cstdio>
#include <random>

namespace mitt::native {
namespace {

std::mt19937_64& Random() {
  thread_local std::mt19937_64 random{std::random_device{}()};
  return random;
}

uint64_t HistoryLength(const retrieval::v1::RetrieveRequest& request) {
  return static_cast<uint64_t>(request.history_size() > 0 ? request.history_size() : request.events_size());
}

}  // namespace

bool AccessLog::Sampled() const {
  return sample_ >= 1 || std::uniform_real_distribution<double>(0, 1)(Random()) < sample_;
}

std::string AccessLog::RequestId(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) {
  const auto [first, last] = metadata.equal_range("x-request-id");
  for (auto entry = first; entry != last; ++entry) {
    if (!entry->second.empty() && entry->second.size() <= kMaxRequestId) {
      return std::string(entry->second.data(), entry->second.size());
    }
  }
  char id[33];  // 128 random bits in hexadecimal, as Python's f"{getrandbits(128):032x}"
  std::snprintf(id, sizeof id, "%016llx%016llx", static_cast<unsigned long long>(Random()()),
                static_cast<unsigned long long>(Random()()));
  return id;
}

void AccessLog::Read(const retrieval::v1::RetrieveRequest& request, AccessRecord* record) const {
  record->read = true;
  record->history_len = HistoryLength(request);
  record->k = request.k();
  if (user_ids_) record->user_ids = {request.user_id()};
}

void AccessLog::Read(const retrieval::v1::BatchRetrieveRequest& request, AccessRecord* record) const {
  record->read = true;
  record->batch = static_cast<size_t>(request.requests_size());
  for (const auto& one : request.requests()) {
    record->history_len += HistoryLength(one);
    record->k += one.k();
    if (user_ids_) record->user_ids.push_back(one.user_id());
  }
}

void AccessLog::Write(AccessRecord record) {
  std::lock_guard<std::mutex> lock(mu_);
  if (records_.size() >= kMaxRecords) {
    ++dropped_;
    return;
  }
  records_.push_back(std::move(record));
}

std::pair<std::vector<AccessRecord>, uint64_t> AccessLog::Take() {
  std::lock_guard<std::mutex> lock(mu_);
  std::pair<std::vector<AccessRecord>, uint64_t> taken{std::move(records_), dropped_};
  records_.clear();
  dropped_ = 0;
  return taken;
}

}  // namespace mitt::native
