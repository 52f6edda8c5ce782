// The native server: the gRPC server (retrieval service, health, reflection), the admission, the
// batcher and the engine, owned together, started once and stopped once; the version in service
// swapped whole while it serves.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include "access.h"
#include "access_log.h"
#include "admission.h"
#include "batcher.h"
#include "call_limit.h"
#include "call_metrics.h"
#include "cost.h"
#include "engine.h"
#include "memory_trimmer.h"
#include "python_text.h"
#include "request.h"
#include "servable_slot.h"
#include "service.h"

namespace mitt::native {

// The PEM files of TLS, re-read when they change.
struct TlsFiles {
  std::string cert, key;
  std::string ca;  // mutual TLS: client certificates signed by it required; "": none asked
  unsigned refresh_seconds = 1;
};

struct ServerOptions {
  Limits limits;
  AccessOptions access;
  CostUnits units;
  AdmissionLimits admission;
  BatchOptions batching;
  uint32_t max_queued = 128;  // calls held at once
  uint64_t large_request_bytes = 0;  // the heap is trimmed after requests this large (0: never)
  int max_request_bytes = 0;  // the engine refuses larger requests (RESOURCE_EXHAUSTED, message_size)
  int max_response_bytes = 0;
  size_t explain_top = 3;     // events an explanation lists per interest
  std::vector<uint8_t> printable;  // PythonText's table
  std::vector<double> latency_bounds, batch_bounds;  // the metrics' histograms (Python's buckets)
  bool reflection = true;  // serve gRPC server reflection (--no-reflection: false)
  std::optional<TlsFiles> tls;  // nullopt: plaintext
  double log_sample = 0;        // the access log's share of calls; 0: no access log
  bool log_user_ids = false;
};

// What the metrics' queue depths read: calls held (of max_queued), queries waiting for a batch,
// heavy calls waiting for room.
struct Queues {
  size_t calls = 0, batch = 0, heavy = 0;
};

class NativeServer {
 public:
  NativeServer(std::shared_ptr<const Servable> servable, ModelInfos model_info, ServerOptions options);
  // Stops without grace if still running.
  ~NativeServer();
  NativeServer(const NativeServer&) = delete;
  NativeServer& operator=(const NativeServer&) = delete;

  // Binds every one of `addresses` ("127.0.0.1:0" picks a free port), all or none, and starts
  // serving, SERVING on the health service if `serving` (else NOT_SERVING until SetServing);
  // `reuse_port` lets other servers setting it share the port (a serving group's workers).
  // Returns the bound port. Throws std::runtime_error when an address cannot be bound,
  // std::logic_error when called twice.
  int Start(const std::vector<std::string>& addresses, bool serving, bool reuse_port);
  // Also serves the health service alone, in plaintext, on every one of `addresses` (probes that
  // cannot present a client certificate), with the main port's status, until Stop; returns its
  // port. Throws std::runtime_error when an address cannot be bound (the server keeps serving),
  // std::logic_error before Start, after Stop or when called twice.
  int StartHealth(const std::vector<std::string>& addresses, bool reuse_port);
  // The health service's status of the server and of the retrieval service; ignored once stopping.
  void SetServing(bool serving);
  // NOT_SERVING on the health service, no new calls; heavy calls still waiting for room are
  // refused; the calls in flight get `grace_seconds` to finish, then are cancelled; returns when
  // every call is finished. Idempotent.
  void Stop(double grace_seconds);
  // Serves `servable` from the next call on; calls already checked finish on the previous one.
  void Swap(std::shared_ptr<const Servable> servable, ModelInfos model_info) {
    slot_.Swap(std::move(servable), std::move(model_info));
  }
  void SetModelInfo(ModelInfos model_info) { slot_.SetModelInfo(std::move(model_info)); }
  // The access file's identities from the next call on (nullptr: none); Python hands them over
  // at the start and again on each reload of the file.
  void SetIdentities(std::shared_ptr<const Identities> identities) { access_.SetIdentities(std::move(identities)); }

  int port() const { return port_; }
  int health_port() const { return health_port_; }
  Counters counters() const {
    Counters counters = engine_.counters();
    counters.queued = batcher_.queued_rows();
    counters.trims = trimmer_.trims();
    return counters;
  }
  CallMetrics::Snapshot metrics() const { return metrics_.Read(); }
  const Stages& stages() const { return stages_; }
  // The access log's records since the last call, and how many were dropped meanwhile.
  std::pair<std::vector<AccessRecord>, uint64_t> TakeAccessRecords() { return access_log_.Take(); }
  Queues queues() const { return {calls_.held(), batcher_.queued_rows(), admission_.waiting()}; }

 private:
  void SetStatus(bool serving);  // under lifecycle_mu_, server_ running
  std::shared_ptr<grpc::ServerCredentials> Credentials() const;  // of the main port

  const ServerOptions options_;
  const PythonText text_;
  const RequestChecker checker_;
  ServableSlot slot_;
  AccessControl access_;
  AccessLog access_log_;
  Admission admission_;
  CallLimit calls_;
  CallMetrics metrics_;
  Stages stages_;
  MemoryTrimmer trimmer_;
  Engine engine_;
  MicroBatcher batcher_;
  RetrievalService service_;
  std::mutex lifecycle_mu_;
  bool started_ = false;
  bool stopped_ = false;
  bool serving_ = false;
  int port_ = 0, health_port_ = 0;
  // The health port's only service but gRPC's health (gRPC's: UNIMPLEMENTED for every method);
  // a server needs one of its own to start.
  grpc::CallbackGenericService unimplemented_;
  std::unique_ptr<grpc::Server> server_, health_server_;
};

}  // namespace mitt::native
