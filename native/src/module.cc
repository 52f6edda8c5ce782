// The Python module `retrieval.serving._native`: NativeServer serving a Python servable
// (retrieval.serving.native_kernel.NativeServable), whose kernel it calls once per batch.
//
// The kernel is called on the batcher's thread, which holds the GIL only for that call (and to
// wrap and copy its arrays); every other step runs without it.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include <google/protobuf/stubs/logging.h>

#include "server.h"

namespace nb = nanobind;

namespace mitt::native {
namespace {

template <class T, size_t Dims>
using Array = nb::ndarray<const T, nb::ndim<Dims>, nb::c_contig, nb::device::cpu>;

// A NumPy array viewing `values`, which it owns from then on (freed with the array).
template <class T>
nb::object Wrap(std::vector<T> values, std::initializer_list<size_t> shape) {
  auto* owned = new std::vector<T>(std::move(values));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::cast(nb::ndarray<nb::numpy, T>(owned->data(), shape, owner));
}

// A NumPy copy of `values`.
template <class T>
nb::object Copy(const std::vector<T>& values) {
  return Wrap(std::vector<T>(values), {values.size()});
}

// "TypeError: message" of the Python exception being handled.
std::string Describe(const nb::python_error& e) {
  return nb::cast<std::string>(nb::str(e.type().attr("__name__"))) + ": " + nb::cast<std::string>(nb::str(e.value()));
}

// `answer` as an array of T with `dims` dimensions, or std::runtime_error naming `what`.
template <class T, size_t Dims>
Array<T, Dims> Cast(nb::handle answer, const char* what) {
  Array<T, Dims> array;
  if (!nb::try_cast(answer, array)) {
    throw std::runtime_error(std::string("the kernel's ") + what + " must be a " + std::to_string(Dims) +
                             "-d array, got " + nb::cast<std::string>(nb::repr(answer)).substr(0, 200));
  }
  return array;
}

// A copy of an array's values.
template <class A>
auto Values(const A& array) {
  using T = std::remove_const_t<std::remove_pointer_t<decltype(array.data())>>;
  return std::vector<T>(array.data(), array.data() + array.size());
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

// A Python servable's kernel (NativeKernel); its reference is dropped with the GIL, wherever the
// last call using it ends.
class PythonKernel final : public Kernel {
 public:
  PythonKernel(nb::object kernel, bool side_features) : kernel_(std::move(kernel)), side_features_(side_features) {}

  ~PythonKernel() override {
    if (_Py_IsFinalizing()) {  // the interpreter is going away with its objects: let them be
      kernel_.release();
      return;
    }
    nb::gil_scoped_acquire gil;
    kernel_.reset();
  }

  SearchOutput Search(SearchInput in) override {
    BatcherGil gil;
    try {
      const size_t batch = in.batch;
      nb::list allows;
      for (const std::vector<int64_t>* allow : in.allows) allows.append(Copy(*allow));
      nb::object events = nb::none();
      if (side_features_) {
        nb::list rows;
        for (const Query* query : in.rows) {
          if (!query->events) {
            rows.append(nb::none());
            continue;
          }
          std::vector<int64_t> positions(query->positions.begin(), query->positions.end());
          rows.append(nb::make_tuple(Copy(query->timestamps), nb::cast(query->actions), query->request_time,
                                     Copy(positions)));
        }
        events = rows;
      }
      const size_t explained = in.explain_rows.size();
      nb::object answer = kernel_.attr("search")(
          Wrap(std::move(in.histories), {in.batch, in.width}), Wrap(std::move(in.fetch), {batch}),
          Wrap(std::move(in.allow_group), {batch}), allows, events, in.want_interests,
          Wrap(std::move(in.explain_rows), {explained}));
      nb::tuple parts;
      if (!nb::try_cast(answer, parts) || parts.size() != 5) {
        throw std::runtime_error("the kernel's search must return (ids, scores, fetched, interests, weights), got " +
                                 nb::cast<std::string>(nb::repr(answer)).substr(0, 200));
      }
      const auto ids = Cast<int64_t, 3>(parts[0], "ids");
      const auto scores = Cast<float, 3>(parts[1], "scores");
      SearchOutput out;
      out.batch = ids.shape(0);
      out.interests = ids.shape(1);
      out.n = ids.shape(2);
      if (scores.shape(0) != out.batch || scores.shape(1) != out.interests || scores.shape(2) != out.n) {
        throw std::runtime_error("the kernel's ids [" + std::to_string(out.batch) + ", " +
                                 std::to_string(out.interests) + ", " + std::to_string(out.n) + "] and scores [" +
                                 std::to_string(scores.shape(0)) + ", " + std::to_string(scores.shape(1)) + ", " +
                                 std::to_string(scores.shape(2)) + "] must both be [" + std::to_string(batch) +
                                 ", K, n]");
      }
      out.ids = Values(ids);
      out.scores = Values(scores);
      out.fetched = Values(Cast<int32_t, 1>(parts[2], "fetched"));
      if (!parts[3].is_none()) {
        const auto vectors = Cast<float, 3>(parts[3], "interests");
        out.dim = vectors.shape(2);
        out.vectors = Values(vectors);
      }
      if (!parts[4].is_none()) {
        const auto weights = Cast<float, 3>(parts[4], "weights");
        out.weight_width = weights.shape(2);
        out.weights = Values(weights);
      }
      return out;
    } catch (const nb::python_error& e) {
      throw std::runtime_error("the kernel raised " + Describe(e));
    }
  }

  std::vector<ScoredItem> Alone(const AloneInput& in) override {
    BatcherGil gil;
    try {
      const Query& query = *in.query;
      std::vector<float> interests(in.interests, in.interests + in.num_interests * in.dim);
      nb::object allow = query.filtered ? Copy(query.allow) : nb::none();
      nb::object answer =
          kernel_.attr("alone")(Wrap(std::move(interests), {in.num_interests, in.dim}), query.depth,
                                nb::make_tuple(MergeName(query.merge), query.lambda, query.per_interest_k),
                                Copy(query.excluded), allow);
      nb::tuple parts;
      if (!nb::try_cast(answer, parts) || parts.size() != 3) {
        throw std::runtime_error("the kernel's alone must return (ids, scores, interests)");
      }
      const auto ids = Cast<int64_t, 1>(parts[0], "ids");
      const auto scores = Cast<float, 1>(parts[1], "scores");
      const auto slots = Cast<int32_t, 1>(parts[2], "interests");
      if (scores.shape(0) != ids.shape(0) || slots.shape(0) != ids.shape(0)) {
        throw std::runtime_error("the kernel's alone returned ids, scores and interests of different lengths");
      }
      std::vector<ScoredItem> items;
      for (size_t i = 0; i < ids.shape(0); ++i) items.push_back({ids.data()[i], scores.data()[i], slots.data()[i]});
      return items;
    } catch (const nb::python_error& e) {
      throw std::runtime_error("the kernel raised " + Describe(e));
    }
  }

  std::vector<float> Rescore(const float* interests, size_t rows, size_t dim, const std::vector<int64_t>& ids) override {
    BatcherGil gil;
    try {
      nb::object answer = kernel_.attr("rescore")(Wrap(std::vector<float>(interests, interests + rows * dim), {rows, dim}),
                                                  Copy(ids));
      return Values(Cast<float, 2>(answer, "rescored scores"));
    } catch (const nb::python_error& e) {
      throw std::runtime_error("the kernel raised " + Describe(e));
    }
  }

  std::vector<float> Rerank(const RerankInput& in) override {
    BatcherGil gil;
    try {
      nb::list histories;
      for (const std::vector<int32_t>* history : in.histories) {
        histories.append(Copy(std::vector<int64_t>(history->begin(), history->end())));
      }
      nb::object unclicked = nb::none();
      if (in.with_unclicked) {
        nb::list shown;
        for (const std::vector<int64_t>* ids : in.unclicked) shown.append(Copy(*ids));
        unclicked = shown;
      }
      nb::object answer = kernel_.attr("rerank")(in.ranker, histories,
                                                 Wrap(std::vector<int64_t>(in.candidates), {in.rows, in.width}),
                                                 Wrap(std::vector<float>(in.scores), {in.rows, in.width}), unclicked);
      return Values(Cast<float, 2>(answer, "logits"));
    } catch (const nb::python_error& e) {
      throw std::runtime_error("the kernel raised " + Describe(e));
    }
  }

 private:
  nb::object kernel_;
  const bool side_features_;
};

// The C++ servable of a Python NativeServable (the GIL held: it reads Python objects).
std::shared_ptr<const Servable> MakeServable(nb::handle py) {
  auto servable = std::make_shared<Servable>();
  servable->side_features = nb::cast<bool>(py.attr("side_features"));
  servable->kernel = std::make_shared<PythonKernel>(nb::borrow(py.attr("kernel")), servable->side_features);
  servable->vocabulary = std::make_unique<const Vocabulary>(nb::cast<std::vector<std::string>>(py.attr("vocabulary")));
  servable->tower_items = nb::cast<uint32_t>(py.attr("tower_items"));
  servable->model_version = nb::cast<std::string>(py.attr("model_version"));
  servable->max_len = nb::cast<uint32_t>(py.attr("max_len"));
  servable->num_interests = nb::cast<uint32_t>(py.attr("num_interests"));
  servable->num_items = nb::cast<uint64_t>(py.attr("num_items"));
  std::unordered_map<std::string, std::vector<int64_t>> members;
  for (auto [name, ids] : nb::cast<nb::dict>(py.attr("category_members"))) {
    members.emplace(nb::cast<std::string>(name), Values(Cast<int64_t, 1>(ids, "category members")));
  }
  auto codes = Values(Cast<int64_t, 1>(py.attr("category_codes"), "category codes"));
  const size_t rows = servable->vocabulary->size() + 1;
  if (servable->max_len < 1 || codes.size() < rows) {
    throw std::invalid_argument("the servable's max_len must be >= 1, and its category codes (" +
                                std::to_string(codes.size()) + ") must cover its " + std::to_string(rows) +
                                " dense ids");
  }
  servable->categories = std::make_unique<const Categories>(std::move(members), std::move(codes));
  servable->explanation = nb::cast<std::string>(py.attr("explanation"));
  for (auto [name, info] : nb::cast<nb::dict>(py.attr("rankers"))) {
    const auto pair = nb::cast<nb::tuple>(info);
    servable->rankers[nb::cast<std::string>(name)] = {nb::cast<std::string>(pair[0]), nb::cast<uint32_t>(pair[1])};
  }
  return servable;
}


// NativeServer as Python owns it.
class PyNativeServer {
 public:
  PyNativeServer(nb::handle servable, ServerOptions options)
      : server_(std::make_unique<NativeServer>(MakeServable(servable), WholeInfo(servable), std::move(options))) {}

  ~PyNativeServer() {
    nb::gil_scoped_release release;  // the batcher's thread may be waiting for the GIL
    server_.reset();
  }

  NativeServer& server() { return *server_; }

  static std::string Bytes(nb::handle bytes) {
    const auto view = nb::cast<nb::bytes>(bytes);
    return std::string(view.c_str(), view.size());
  }

  // The servable's ModelInfo to every caller (Python sets what callers without `admin` see
  // before it serves).
  static ModelInfos WholeInfo(nb::handle servable) {
    std::string info = Bytes(servable.attr("model_info"));
    return {info, info};
  }

 private:
  std::unique_ptr<NativeServer> server_;
};

template <class T>
T Field(const nb::dict& values, const char* name) {
  if (!values.contains(name)) throw std::invalid_argument(std::string("the engine's options lack ") + name);
  return nb::cast<T>(values[name]);
}

// An access file's identities as Python hands them over (retrieval.serving.native.identity_table):
// (name, permissions, rate or None, burst or None, token SHA-256 digests, certificate names) each;
// None for no access file.
std::shared_ptr<const Identities> IdentitiesOf(nb::handle table) {
  if (table.is_none()) return nullptr;
  auto identities = std::make_shared<Identities>();
  for (nb::handle entry : table) {
    const auto fields = nb::cast<nb::tuple>(entry);
    auto identity = std::make_shared<const Identity>(Identity{
        nb::cast<std::string>(fields[0]), nb::cast<std::vector<std::string>>(fields[1]),
        fields[2].is_none() ? std::nullopt : std::optional<double>(nb::cast<double>(fields[2])),
        fields[3].is_none() ? std::nullopt : std::optional<double>(nb::cast<double>(fields[3])), false});
    for (nb::handle digest : fields[4]) identities->by_token.emplace(PyNativeServer::Bytes(digest), identity);
    for (nb::handle name : fields[5]) identities->by_certificate.emplace(nb::cast<std::string>(name), identity);
  }
  return identities;
}

ServerOptions OptionsOf(const nb::dict& py) {
  ServerOptions options;
  const auto access = Field<nb::dict>(py, "access");
  if (!access["rate_limit"].is_none()) {
    const auto limit = nb::cast<nb::tuple>(access["rate_limit"]);
    options.access.rate_limit.emplace(nb::cast<double>(limit[0]), nb::cast<double>(limit[1]));
  }
  for (auto [method, permission] : Field<nb::dict>(access, "method_permissions")) {
    options.access.method_permissions.emplace(nb::cast<std::string>(method), nb::cast<std::string>(permission));
  }
  const auto limits = Field<nb::dict>(py, "limits");
  options.limits = {Field<uint32_t>(limits, "max_k"),          Field<uint32_t>(limits, "max_history"),
                    Field<uint32_t>(limits, "max_per_interest_k"), Field<uint32_t>(limits, "max_filter_ids"),
                    Field<uint32_t>(limits, "max_batch"),      Field<uint32_t>(limits, "max_user_id"),
                    Field<uint32_t>(limits, "max_name"),       Field<uint32_t>(limits, "default_rerank_candidates")};
  const auto units = Field<nb::dict>(py, "cost");
  options.units = {Field<double>(units, "id_unit"),          Field<double>(units, "candidate_unit"),
                   Field<double>(units, "diversity_steps"),  Field<double>(units, "diversity_candidates"),
                   Field<double>(units, "round_robin_picks"), Field<double>(units, "rerank_unit"),
                   Field<double>(units, "explain_units"),    options.limits.default_rerank_candidates};
  const auto admission = Field<nb::dict>(py, "admission");
  options.admission = {Field<double>(admission, "cheap_cost"),   Field<double>(admission, "batch_cost"),
                       Field<uint64_t>(admission, "cheap_bytes"), Field<double>(admission, "max_cost"),
                       Field<uint32_t>(admission, "max_waiting"), Field<double>(admission, "heavy_wait"),
                       Field<double>(admission, "chunk_cost"),   Field<uint64_t>(admission, "max_memory_bytes")};
  options.batching = {Field<size_t>(py, "max_batch"), std::chrono::microseconds(Field<int64_t>(py, "max_wait_us")),
                      options.admission.batch_cost, Field<size_t>(py, "max_queue")};
  options.max_queued = Field<uint32_t>(py, "max_queued");
  options.reflection = Field<bool>(py, "reflection");
  if (const auto log = Field<nb::object>(py, "access_log"); !log.is_none()) {
    const auto settings = nb::cast<nb::tuple>(log);  // (sample, user_ids)
    options.log_sample = nb::cast<double>(settings[0]);
    options.log_user_ids = nb::cast<bool>(settings[1]);
  }
  if (const auto tls = Field<nb::object>(py, "tls"); !tls.is_none()) {
    const auto files = nb::cast<nb::tuple>(tls);  // (cert, key, ca or ""), paths
    options.tls = TlsFiles{nb::cast<std::string>(files[0]), nb::cast<std::string>(files[1]),
                           nb::cast<std::string>(files[2])};
  }
  options.large_request_bytes = Field<uint64_t>(py, "large_request_bytes");
  options.max_request_bytes = Field<int>(py, "max_request_bytes");
  options.max_response_bytes = Field<int>(py, "max_response_bytes");
  options.explain_top = Field<size_t>(py, "explain_top");
  options.latency_bounds = Field<std::vector<double>>(py, "latency_buckets");
  options.batch_bounds = Field<std::vector<double>>(py, "batch_buckets");
  const auto printable = Field<nb::bytes>(py, "printable");
  options.printable.assign(static_cast<const uint8_t*>(printable.data()),
                           static_cast<const uint8_t*>(printable.data()) + printable.size());
  if (options.batching.max_batch < 1 || options.batching.max_wait.count() < 0 || options.max_queued < 1 ||
      options.batching.max_queue < 1 || options.max_request_bytes < 1) {
    throw std::invalid_argument(
        "max_batch, max_queued, max_queue and max_request_bytes must be >= 1 and max_wait_us >= 0");
  }
  return options;
}

// A histogram as Python reads it: (bucket counts, sum).
nb::tuple HistogramOf(const Histogram& histogram) {
  return nb::make_tuple(nb::cast(histogram.buckets), histogram.sum);
}

// The engine's metrics (retrieval.serving.native_metrics reads them): "latency" (method, code) ->
// histogram, "refusals" (method, code, reason) -> count, "batches" a histogram, "queues" name -> depth.
nb::dict MetricsOf(const NativeServer& server) {
  const CallMetrics::Snapshot snapshot = server.metrics();
  nb::dict latency, refusals, queues;
  for (const auto& [key, histogram] : snapshot.latency) latency[nb::make_tuple(key.first, key.second)] = HistogramOf(histogram);
  for (const auto& [key, count] : snapshot.refusals) {
    refusals[nb::make_tuple(std::get<0>(key), std::get<1>(key), std::get<2>(key), std::get<3>(key))] = count;
  }
  const Queues depth = server.queues();
  queues["calls"] = depth.calls;
  queues["batch"] = depth.batch;
  queues["heavy"] = depth.heavy;
  nb::dict out;
  out["latency"] = latency;
  out["refusals"] = refusals;
  out["batches"] = HistogramOf(snapshot.batches);
  out["queues"] = queues;
  return out;
}

// The access log's records as Python writes them (retrieval.serving.native): ([(request_id,
// identity or None, method, read, history_len, k, batch or None, user_ids, code number, seconds,
// model_version or None)], dropped).
nb::tuple AccessRecordsOf(NativeServer& server) {
  auto [records, dropped] = server.TakeAccessRecords();
  nb::list out;
  for (const AccessRecord& r : records) {
    out.append(nb::make_tuple(r.request_id, r.identity ? nb::cast(*r.identity) : nb::none(), MethodName(r.method),
                              r.read, r.history_len, r.k, r.batch ? nb::cast(*r.batch) : nb::none(),
                              nb::cast(r.user_ids), static_cast<int>(r.code), r.seconds,
                              r.model_version ? nb::cast(*r.model_version) : nb::none()));
  }
  return nb::make_tuple(out, dropped);
}

// protobuf's log, without its line for each request holding invalid UTF-8: such a request is
// refused INVALID_ARGUMENT (as the Python engine refuses it, silently), and one line per request
// would let any client fill the server's stderr.
void ProtobufLog(google::protobuf::LogLevel level, const char* file, int line, const std::string& message) {
  if (message.find("invalid UTF-8") != std::string::npos) return;
  static const char* const kLevels[] = {"INFO", "WARNING", "ERROR", "FATAL"};
  std::fprintf(stderr, "[libprotobuf %s %s:%d] %s\n", kLevels[level], file, line, message.c_str());
}

}  // namespace
}  // namespace mitt::native

NB_MODULE(_native, m) {
  using mitt::native::Counters;
  using mitt::native::PyNativeServer;
  m.doc() = "The native engine (native/): a C++ gRPC data plane calling a Python kernel once per batch.";
  // A server still referenced when the interpreter exits (retrieval.serving.native stops it at
  // exit) is reported by nanobind as a leak: noise, not a bug.
  nb::set_leak_warnings(false);
  // The protobuf library is this module's own (Debian's, bound with RTLD_DEEPBIND): its log
  // handler is set for this module alone.
  google::protobuf::SetLogHandler(mitt::native::ProtobufLog);

  nb::class_<PyNativeServer>(m, "NativeServer")
      .def(
          "__init__",
          [](PyNativeServer* self, nb::handle servable, nb::dict options) {
            new (self) PyNativeServer(servable, mitt::native::OptionsOf(options));
          },
          nb::arg("servable"), nb::arg("options"))
      .def(
          "start",
          [](PyNativeServer& self, const std::vector<std::string>& addresses, bool serving, bool reuse_port) {
            return self.server().Start(addresses, serving, reuse_port);
          },
          nb::arg("addresses"), nb::arg("serving"), nb::arg("reuse_port"), nb::call_guard<nb::gil_scoped_release>())
      .def(
          "start_health",
          [](PyNativeServer& self, const std::vector<std::string>& addresses, bool reuse_port) {
            return self.server().StartHealth(addresses, reuse_port);
          },
          nb::arg("addresses"), nb::arg("reuse_port"), nb::call_guard<nb::gil_scoped_release>())
      .def(
          "set_serving", [](PyNativeServer& self, bool serving) { self.server().SetServing(serving); },
          nb::arg("serving"), nb::call_guard<nb::gil_scoped_release>())
      .def(
          "stop", [](PyNativeServer& self, double grace) { self.server().Stop(grace); }, nb::arg("grace"),
          nb::call_guard<nb::gil_scoped_release>())
      .def(
          "swap",
          [](PyNativeServer& self, nb::handle servable, nb::bytes whole, nb::bytes cut) {
            auto next = mitt::native::MakeServable(servable);
            self.server().Swap(std::move(next), {PyNativeServer::Bytes(whole), PyNativeServer::Bytes(cut)});
          },
          nb::arg("servable"), nb::arg("model_info"), nb::arg("public_model_info"))
      .def(
          "set_model_info",
          [](PyNativeServer& self, nb::bytes whole, nb::bytes cut) {
            self.server().SetModelInfo({PyNativeServer::Bytes(whole), PyNativeServer::Bytes(cut)});
          },
          nb::arg("model_info"), nb::arg("public_model_info"))
      .def(
          "set_identities",
          [](PyNativeServer& self, nb::handle table) { self.server().SetIdentities(mitt::native::IdentitiesOf(table)); },
          nb::arg("identities").none())
      .def_prop_ro("port", [](PyNativeServer& self) { return self.server().port(); })
      .def_prop_ro("health_port", [](PyNativeServer& self) { return self.server().health_port(); })
      .def("metrics", [](PyNativeServer& self) { return mitt::native::MetricsOf(self.server()); })
      .def("access_records", [](PyNativeServer& self) { return mitt::native::AccessRecordsOf(self.server()); })
      .def("counters", [](PyNativeServer& self) {
        const Counters c = self.server().counters();
        nb::dict out;
        out["calls"] = c.calls;
        out["rows"] = c.rows;
        out["batches"] = c.batches;
        out["max_batch_rows"] = c.max_batch_rows;
        out["kernel_errors"] = c.kernel_errors;
        out["cancelled"] = c.cancelled;
        out["alone"] = c.alone;
        out["deadline_exceeded"] = c.deadline_exceeded;
        out["queued"] = c.queued;
        out["trims"] = c.trims;
        const mitt::native::Stages& stages = self.server().stages();
        using mitt::native::Stage;
        out["parse_ns"] = stages.nanoseconds(Stage::kParse);
        out["checks_ns"] = stages.nanoseconds(Stage::kChecks);
        out["kernel_ns"] = stages.nanoseconds(Stage::kKernel);
        out["merge_ns"] = stages.nanoseconds(Stage::kMerge);
        out["response_ns"] = stages.nanoseconds(Stage::kResponse);
        return out;
      });
}
