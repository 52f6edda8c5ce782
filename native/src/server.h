// The native server: the gRPC server (retrieval service, health, reflection), the batcher and
// the engine, owned together, started once and stopped once.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include <grpcpp/grpcpp.h>

#include "batcher.h"
#include "engine.h"
#include "service.h"
#include "vocabulary.h"

namespace mitt::native {

class NativeServer {
 public:
  NativeServer(std::shared_ptr<const Vocabulary> vocabulary, Kernel kernel, EngineOptions engine,
               BatchOptions batching);
  // Stops without grace if still running.
  ~NativeServer();
  NativeServer(const NativeServer&) = delete;
  NativeServer& operator=(const NativeServer&) = delete;

  // Binds `address` ("127.0.0.1:0" picks a free port), starts serving and reports SERVING on
  // the health service; returns the bound port. Throws std::runtime_error when it cannot bind,
  // std::logic_error when called twice.
  int Start(const std::string& address);
  // NOT_SERVING on the health service, no new calls; the calls in flight get `grace_seconds` to
  // finish, then are cancelled; returns when every call is finished. Idempotent.
  void Stop(double grace_seconds);

  int port() const { return port_; }
  Counters counters() const {
    Counters counters = engine_.counters();
    counters.queued = batcher_.queued_rows();
    return counters;
  }

 private:
  Engine engine_;
  MicroBatcher<PendingCall> batcher_;
  RetrievalService service_;
  std::mutex lifecycle_mu_;
  bool started_ = false;
  bool stopped_ = false;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace mitt::native
