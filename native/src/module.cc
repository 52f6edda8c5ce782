// The Python module `retrieval.serving._native`: NativeServer with a Python batch kernel.
//
// The kernel is called once per batch on the batcher's thread, which holds the GIL only for
// that call (and to wrap and copy its arrays); every other step runs without it.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "server.h"

namespace nb = nanobind;

namespace mitt::native {
namespace {

using Ids = nb::ndarray<const int64_t, nb::ndim<3>, nb::c_contig, nb::device::cpu>;
using Scores = nb::ndarray<const float, nb::ndim<3>, nb::c_contig, nb::device::cpu>;

// A NumPy array viewing `values`, which it owns from then on (freed with the array).
template <class T>
nb::object Wrap(std::vector<T> values, std::initializer_list<size_t> shape) {
  auto* owned = new std::vector<T>(std::move(values));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::cast(nb::ndarray<nb::numpy, T>(owned->data(), shape, owner));
}

// "TypeError: message" of the Python exception being handled.
std::string Describe(const nb::python_error& e) {
  return nb::cast<std::string>(nb::str(e.type().attr("__name__"))) + ": " +
         nb::cast<std::string>(nb::str(e.value()));
}

// The GIL for the batcher's thread, with one Python thread state kept from its first kernel
// call to its end: PyGILState_Ensure/Release around each call would make and free one per
// batch, and with it the kernel's thread-local state (threading.local, TensorFlow's eager
// context per thread).
class BatcherGil {
 public:
  BatcherGil() : kept_(Kept()) {
    if (kept_.state == nullptr) {
      kept_.gil = PyGILState_Ensure();
      kept_.state = PyThreadState_Get();
    } else {
      PyEval_RestoreThread(kept_.state);
    }
  }
  ~BatcherGil() { PyEval_SaveThread(); }
  BatcherGil(const BatcherGil&) = delete;
  BatcherGil& operator=(const BatcherGil&) = delete;

 private:
  struct ThreadState {
    PyThreadState* state = nullptr;
    PyGILState_STATE gil = PyGILState_UNLOCKED;
    ~ThreadState() {  // the batcher's thread ends (its server stops, before the interpreter does)
      if (state != nullptr && !_Py_IsFinalizing()) {
        PyEval_RestoreThread(state);
        PyGILState_Release(gil);
      }
    }
  };
  static ThreadState& Kept() {
    thread_local ThreadState kept;
    return kept;
  }
  ThreadState& kept_;
};

// Calls `kernel(histories int32 [B, L], fetch int32 [B]) -> (ids int64 [B, K, n], scores
// float32 [B, K, n])` with the GIL held; a Python exception or a bad answer becomes
// std::runtime_error (the batch's calls fail INTERNAL with its message).
KernelOutput CallPython(const nb::callable& kernel, KernelInput in) {
  BatcherGil gil;
  try {
    const size_t batch = in.batch;
    nb::object histories = Wrap(std::move(in.histories), {in.batch, in.width});
    nb::object fetch = Wrap(std::move(in.fetch), {in.batch});
    nb::object answer = kernel(histories, fetch);
    Ids ids;
    Scores scores;
    nb::tuple pair;
    if (!nb::try_cast(answer, pair) || pair.size() != 2 || !nb::try_cast(pair[0], ids) ||
        !nb::try_cast(pair[1], scores)) {
      throw std::runtime_error("the kernel must return (ids int64 [B, K, n], scores float32 [B, K, n]), got " +
                               nb::cast<std::string>(nb::repr(answer)).substr(0, 200));
    }
    KernelOutput out{ids.shape(0), ids.shape(1), ids.shape(2), {}, {}};
    if (scores.shape(0) != out.batch || scores.shape(1) != out.interests || scores.shape(2) != out.n ||
        out.batch != batch) {
      throw std::runtime_error("the kernel's ids [" + std::to_string(out.batch) + ", " + std::to_string(out.interests) +
                               ", " + std::to_string(out.n) + "] and scores [" + std::to_string(scores.shape(0)) +
                               ", " + std::to_string(scores.shape(1)) + ", " + std::to_string(scores.shape(2)) +
                               "] must both be [" + std::to_string(batch) + ", K, n]");
    }
    out.ids.assign(ids.data(), ids.data() + ids.size());
    out.scores.assign(scores.data(), scores.data() + scores.size());
    return out;
  } catch (const nb::python_error& e) {
    throw std::runtime_error("the kernel raised " + Describe(e));
  }
}

// NativeServer as Python owns it: the kernel lives as long as the server, and is released
// (with the GIL) only after the server's threads have stopped.
class PyNativeServer {
 public:
  PyNativeServer(nb::callable kernel, std::vector<std::string> vocabulary, EngineOptions engine, size_t max_batch,
                 int64_t max_wait_us)
      : kernel_(std::move(kernel)) {
    if (max_batch < 1) throw std::invalid_argument("max_batch must be >= 1");
    if (max_wait_us < 0) throw std::invalid_argument("max_wait_us must be >= 0");
    if (engine.max_len < 1) throw std::invalid_argument("max_len must be >= 1");
    auto table = std::make_shared<const Vocabulary>(std::move(vocabulary));
    // The server never outlives kernel_ (a member declared before it), so a reference will do.
    Kernel call = [fn = &kernel_](KernelInput in) { return CallPython(*fn, std::move(in)); };
    server_ = std::make_unique<NativeServer>(std::move(table), std::move(call), std::move(engine),
                                             BatchOptions{max_batch, std::chrono::microseconds(max_wait_us)});
  }

  ~PyNativeServer() {
    nb::gil_scoped_release release;  // the batcher's thread may be waiting for the GIL
    server_.reset();
  }

  NativeServer& server() { return *server_; }

 private:
  nb::callable kernel_;
  std::unique_ptr<NativeServer> server_;
};

}  // namespace
}  // namespace mitt::native

NB_MODULE(_native, m) {
  using mitt::native::Counters;
  using mitt::native::EngineOptions;
  using mitt::native::Limits;
  using mitt::native::PyNativeServer;
  m.doc() = "The native engine (native/): a C++ gRPC data plane calling a Python kernel once per batch.";
  // A server still referenced when the interpreter exits (retrieval.serving.native stops it at
  // exit) is reported by nanobind as a leak: noise, not a bug.
  nb::set_leak_warnings(false);

  nb::class_<PyNativeServer>(m, "NativeServer")
      .def(
          "__init__",
          [](PyNativeServer* self, nb::callable kernel, std::vector<std::string> vocabulary, size_t max_len,
             std::string model_version, nb::dict limits, size_t max_batch, int64_t max_wait_us) {
            Limits parsed{nb::cast<uint32_t>(limits["max_k"]),          nb::cast<uint32_t>(limits["max_history"]),
                          nb::cast<uint32_t>(limits["max_per_interest_k"]), nb::cast<uint32_t>(limits["max_filter_ids"]),
                          nb::cast<uint32_t>(limits["max_batch"]),      nb::cast<uint32_t>(limits["max_user_id"])};
            new (self) PyNativeServer(std::move(kernel), std::move(vocabulary),
                                      EngineOptions{max_len, std::move(model_version), parsed}, max_batch, max_wait_us);
          },
          nb::arg("kernel"), nb::arg("vocabulary"), nb::arg("max_len"), nb::arg("model_version"), nb::arg("limits"),
          nb::arg("max_batch"), nb::arg("max_wait_us"))
      .def(
          "start", [](PyNativeServer& self, const std::string& address) { return self.server().Start(address); },
          nb::arg("address"), nb::call_guard<nb::gil_scoped_release>())
      .def(
          "stop", [](PyNativeServer& self, double grace) { self.server().Stop(grace); }, nb::arg("grace"),
          nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("port", [](PyNativeServer& self) { return self.server().port(); })
      .def("counters", [](PyNativeServer& self) {
        const Counters c = self.server().counters();
        nb::dict out;
        out["calls"] = c.calls;
        out["rows"] = c.rows;
        out["batches"] = c.batches;
        out["max_batch_rows"] = c.max_batch_rows;
        out["kernel_errors"] = c.kernel_errors;
        out["cancelled"] = c.cancelled;
        out["queued"] = c.queued;
        return out;
      });
}
