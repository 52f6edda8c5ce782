// The data plane's work on one batch: one kernel call for every query of the batch's calls,
// then per query the merge and the response, then each call finished.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "merge.h"
#include "request.h"
#include "retrieval.pb.h"
#include "vocabulary.h"

namespace mitt::native {

// The kernel's input: the batch's histories, cut to their last `width` known ids and
// left-padded with 0 (as retrieval.artifacts.model.pad_left), and the candidates per interest
// each query needs.
struct KernelInput {
  size_t batch = 0;
  size_t width = 0;
  std::vector<int32_t> histories;  // int32 [batch, width]
  std::vector<int32_t> fetch;      // int32 [batch]
};

// The kernel's answer: per query and interest, candidates best first (id -1 = empty slot).
struct KernelOutput {
  size_t batch = 0;
  size_t interests = 0;
  size_t n = 0;
  std::vector<int64_t> ids;   // int64 [batch, interests, n], dense ids
  std::vector<float> scores;  // float32 [batch, interests, n]
};

// Called once per batch on the batcher's thread; throws std::exception to fail the batch.
using Kernel = std::function<KernelOutput(KernelInput)>;

// One RPC waiting for its answer: a Retrieve (one query) or a BatchRetrieve (several).
struct PendingCall {
  grpc::CallbackServerContext* context;
  grpc::ServerUnaryReactor* reactor;
  std::vector<Query> queries;
  std::vector<retrieval::v1::RetrieveResponse*> responses;  // one per query, owned by gRPC
  size_t rows() const { return queries.size(); }
};

struct EngineOptions {
  size_t max_len = 50;  // history width handed to the kernel
  std::string model_version;
  Limits limits;
};

struct Counters {
  uint64_t calls = 0;           // RPCs answered by a batch (cancelled ones included)
  uint64_t rows = 0;            // queries handed to the kernel
  uint64_t batches = 0;         // kernel calls
  uint64_t max_batch_rows = 0;  // the largest batch's queries
  uint64_t kernel_errors = 0;   // batches failed by their kernel call
  uint64_t cancelled = 0;       // calls cancelled before their batch (deadline, client gone, stop)
  uint64_t queued = 0;          // queries waiting for a batch now (filled by NativeServer)
};

class Engine {
 public:
  Engine(std::shared_ptr<const Vocabulary> vocabulary, Kernel kernel, EngineOptions options);

  const Vocabulary& vocabulary() const { return *vocabulary_; }
  const EngineOptions& options() const { return options_; }

  // Answers and finishes every call of `batch` (each exactly once).
  void Answer(std::vector<std::unique_ptr<PendingCall>> batch);

  Counters counters() const;

 private:
  KernelInput Input(const std::vector<const Query*>& rows) const;
  // Fills `response` from its query's kernel output; INTERNAL when the kernel named an id
  // outside the vocabulary.
  grpc::Status Respond(const Query& query, const KernelOutput& out, size_t row,
                       retrieval::v1::RetrieveResponse* response);

  const std::shared_ptr<const Vocabulary> vocabulary_;
  const Kernel kernel_;
  const EngineOptions options_;
  MaxScoreMerge merge_;  // Answer's, on the batcher's thread
  std::atomic<uint64_t> calls_{0}, rows_{0}, batches_{0}, max_batch_rows_{0}, kernel_errors_{0}, cancelled_{0};
};

}  // namespace mitt::native
