// cupcake._runtime: the Python binding of libruntime (python/README in docs/PYTHON.md).
//
// A thin layer: how the ranks were launched (Launch: MPI's process state, comm::InitMpi or the
// job's own MPI when it initialized it first; or gloo over torch.distributed's store under
// torchrun), Session and Recorder, with every Status turned into a cupcake.Error carrying the
// runtime's message. Gradients are passed as raw addresses (a torch tensor's data_ptr()) and
// element counts, so the module does not link LibTorch and works with any framework's float32
// buffers; cupcake/torch.py does the PyTorch part. Blocking calls release the GIL.
//
// Ownership: Python holds each object; a Session or Recorder keeps a reference to the Launch object
// it was made from (py::keep_alive), so MPI is finalized only after the last of them is gone.
// Thread-safety: as the wrapped classes' (one thread at a time per object).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cupcake/comm/communicator.h"
#include "cupcake/comm/gloo.h"
#include "cupcake/comm/mpi.h"
#include "cupcake/comm/nccl.h"
#include "cupcake/comm/store.h"
#include "cupcake/comm/topology.h"
#include "cupcake/proto/activity.h"
#include "cupcake/proto/ladder_io.h"
#include "cupcake/proto/status.h"
#include "cupcake/runtime/checkpoint.h"
#include "cupcake/runtime/recorder.h"
#include "cupcake/runtime/session.h"

namespace py = pybind11;

namespace cupcake::python {
namespace {

// The Python exception every runtime error becomes (cupcake.Error, a RuntimeError); its `code`
// is the Status code's name, its `reporter` the rank that prints it when every rank of the job
// raises it alike (Status::reporter), else None. Set once when the module is imported.
struct ErrorTag {};
PyObject* error_type = nullptr;

[[noreturn]] void Raise(const Status& status) {
  py::object error = py::reinterpret_borrow<py::object>(error_type)(status.message());
  error.attr("code") = py::str(std::string(StatusCodeName(status.code())));
  error.attr("reporter") =
      status.reporter() == Status::kAnyRank ? py::object(py::none()) : py::object(py::int_(status.reporter()));
  PyErr_SetObject(error_type, error.ptr());
  throw py::error_already_set();
}

void Check(const Status& status) {
  if (!status.ok()) Raise(status);
}

// Runs a blocking call (a collective, a wait) without the GIL, so the job's other Python threads
// (autograd's) go on, then raises its error.
template <typename Call>
void CheckWithoutGil(Call call) {
  Status status;
  {
    py::gil_scoped_release release;
    status = call();
  }
  Check(status);
}

template <typename T>
T Take(StatusOr<T> value) {
  if (!value.ok()) Raise(value.status());
  return std::move(value).value();
}

// How the job's ranks were launched, and so where its host communicators come from.
class Launch {
 public:
  virtual ~Launch() = default;
  // Collective: a new host communicator over every rank, whose traffic never mixes with the
  // job's or another of ours.
  virtual std::unique_ptr<comm::Communicator> World() = 0;
};

// MPI for the job: initialized here (MPI_Init_thread, finalized by Close or destruction) unless
// the job (mpi4py, another library) initialized it first, in which case it stays the job's.
class Mpi final : public Launch {
 public:
  Mpi() {
    if (!comm::BuiltWithMpi())
      Raise(FailedPreconditionError("cupcake: this build has no MPI; expected CUPCAKE_WITH_MPI=ON"));
    if (!comm::MpiInitialized()) process_ = Take(comm::InitMpi(nullptr, nullptr));
  }
  // A new communicator on a duplicate of MPI_COMM_WORLD.
  std::unique_ptr<comm::Communicator> World() override {
    if (closed_) Raise(FailedPreconditionError("cupcake: MPI is finalized; expected a live Mpi object"));
    if (process_ != nullptr) return Take(process_->World());
    return Take(comm::MpiCommunicatorFromHandle(nullptr));
  }
  bool owns_mpi() const { return process_ != nullptr; }
  // Finalizes MPI when this object initialized it. Every session and recorder made from it must
  // be closed first (MPI_Comm_free of their duplicates precedes MPI_Finalize).
  void Close() {
    process_.reset();
    closed_ = true;
  }

 private:
  std::unique_ptr<comm::MpiProcess> process_;
  bool closed_ = false;
};

// A Python key-value store (torch.distributed's c10d Store: set, get, wait) as comm's
// KeyValueStore. Called from whichever thread makes a communicator; each call takes the GIL.
// Values are bytes.
class PyStore final : public comm::KeyValueStore {
 public:
  explicit PyStore(py::object store) : store_(std::move(store)) {}
  ~PyStore() override {
    if (Py_IsInitialized() == 0) {
      store_.release();  // the interpreter is gone: nothing left to release it to
      return;
    }
    py::gil_scoped_acquire gil;
    store_ = py::object();
  }
  Status Set(const std::string& key, const std::string& value) override {
    return Call("set", key, [&] { store_.attr("set")(key, py::bytes(value)); });
  }
  StatusOr<std::string> Get(const std::string& key) override {
    std::string value;
    CUPCAKE_RETURN_IF_ERROR(Call("get", key, [&] { value = store_.attr("get")(key).cast<std::string>(); }));
    return value;
  }
  Status Wait(std::span<const std::string> keys, std::chrono::milliseconds timeout) override {
    const std::string first = keys.empty() ? std::string() : keys.front();
    return Call("wait", first, [&] {
      py::list names;
      for (const std::string& k : keys) names.append(k);
      const py::object timedelta = py::module_::import("datetime").attr("timedelta");
      store_.attr("wait")(names, timedelta(py::arg("milliseconds") = timeout.count()));
    });
  }

 private:
  // Runs `body` with the GIL; a Python exception becomes a Status naming the call and the key
  // (torch's timeouts say "Timeout" in their message, and become DeadlineExceeded).
  template <typename Body>
  Status Call(const char* call, const std::string& key, Body body) {
    py::gil_scoped_acquire gil;
    try {
      body();
      return Status::Ok();
    } catch (py::error_already_set& e) {
      const std::string what = e.what();
      const std::string message = std::string("torch.distributed store: ") + call + " '" + key + "': " + what;
      if (what.find("imeout") != std::string::npos || what.find("imed out") != std::string::npos)
        return DeadlineExceededError(message);
      return UnavailableError(message);
    } catch (const std::exception& e) {  // a value that is not bytes (py::cast_error)
      return InvalidArgumentError(std::string("torch.distributed store: ") + call + " '" + key + "': " + e.what());
    }
  }

  py::object store_;
};

// gloo for the job (torchrun): host communicators over gloo's TCP transport, the ranks meeting
// through a store the job's ranks share (torch.distributed's). Each World() meets under a
// prefix of its own ("world<n>/"), so every rank must make its communicators in the same order
// (as MPI_Comm_dup). Close drops the store; communicators already made keep working.
class Gloo final : public Launch {
 public:
  Gloo(py::object store, int rank, int size, const std::string& iface, const std::string& hostname,
       double timeout_s)
      : store_(std::make_shared<PyStore>(std::move(store))), rank_(rank), size_(size) {
    if (!(timeout_s > 0 && timeout_s <= 86400))
      Raise(InvalidArgumentError("cupcake: Gloo: timeout_s: out of range; got " + std::to_string(timeout_s) +
                                 ", expected 0 < timeout_s <= 86400"));
    options_.iface = iface;
    options_.hostname = hostname;
    options_.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  }
  std::unique_ptr<comm::Communicator> World() override {
    if (store_ == nullptr) Raise(FailedPreconditionError("cupcake: Gloo: closed; expected a live Gloo object"));
    auto store = comm::PrefixStore(store_, "world" + std::to_string(worlds_++) + "/");
    StatusOr<std::unique_ptr<comm::Communicator>> world = InternalError("not run");
    {
      py::gil_scoped_release release;  // the store's calls take it back; peers may be slow
      world = comm::MakeGlooCommunicator(store, rank_, size_, options_);
    }
    return Take(std::move(world));
  }
  int rank() const { return rank_; }
  int size() const { return size_; }
  void Close() { store_.reset(); }

 private:
  std::shared_ptr<comm::KeyValueStore> store_;
  int rank_, size_;
  comm::GlooOptions options_;
  int worlds_ = 0;
};

// A host-memory communicator for the job's own collectives (the initial broadcast of parameters
// and optimizer state), with where its ranks run. close() frees it; later calls raise.
class PyCommunicator {
 public:
  explicit PyCommunicator(std::unique_ptr<comm::Communicator> comm) : comm_(std::move(comm)) {
    topology_ = Take(comm::DiscoverTopology(*comm_));
  }
  comm::Communicator& Get() const {
    if (comm_ == nullptr) Raise(FailedPreconditionError("cupcake: Communicator: closed; expected an open one"));
    return *comm_;
  }
  const comm::Topology& topology() const {
    Get();
    return topology_;
  }
  // Collective: `bytes` bytes of host memory at `address` from rank `root` to every rank.
  void Broadcast(uintptr_t address, int64_t bytes, int root) {
    comm::Communicator& c = Get();
    if (bytes < 0 || root < 0 || root >= c.size())
      Raise(InvalidArgumentError("cupcake: broadcast: bad arguments; got " + std::to_string(bytes) + " bytes from root " +
                                 std::to_string(root) + ", expected bytes >= 0 and 0 <= root < " +
                                 std::to_string(c.size())));
    // NOLINTNEXTLINE: address is a tensor's data_ptr()
    CheckWithoutGil([&] { return c.Broadcast(reinterpret_cast<void*>(address), bytes, root); });
  }
  void Close() { comm_.reset(); }

 private:
  std::unique_ptr<comm::Communicator> comm_;
  comm::Topology topology_;
};

void BindCommunicator(py::module_& m) {
  py::class_<PyCommunicator>(m, "Communicator",
                             "A host-memory communicator over the job's ranks (made by Mpi.world()).")
      .def_property_readonly("rank", [](const PyCommunicator& c) { return c.Get().rank(); })
      .def_property_readonly("size", [](const PyCommunicator& c) { return c.Get().size(); })
      .def_property_readonly("host", [](const PyCommunicator& c) { return c.Get().host(); })
      .def_property_readonly("local_rank", [](const PyCommunicator& c) { return c.topology().local_rank; })
      .def_property_readonly("local_size", [](const PyCommunicator& c) { return c.topology().local_size; })
      .def("broadcast", &PyCommunicator::Broadcast, py::arg("address"), py::arg("nbytes"), py::arg("root"),
           "Collective: `nbytes` bytes of host memory at `address` (e.g. a CPU tensor's data_ptr()) from rank "
           "`root` to every rank.")
      .def("close", &PyCommunicator::Close, "Frees the communicator; later calls raise.");
}

// SessionOptions in Python: the fields of runtime::SessionOptions a job sets, in the same units
// (the timeout in microseconds, as in C++ and C).
struct SessionArgs {
  std::string compressor;
  std::string model_fingerprint;
  double ready_timeout_us = 60e6;
  std::string origin;
  int drift_window = runtime::SessionOptions{}.drift_window;
  double drift_threshold = runtime::SessionOptions{}.drift_threshold;
};

// A DeprecationWarning naming the replacement; raises when warnings are errors.
void WarnDeprecated(const char* message) {
  if (PyErr_WarnEx(PyExc_DeprecationWarning, message, 1) != 0) throw py::error_already_set();
}

runtime::SessionOptions ToOptions(const SessionArgs& args, void* job_stream) {
  runtime::SessionOptions options;
  options.compressor = args.compressor;
  options.model_fingerprint = args.model_fingerprint;
  options.ready_timeout_us = args.ready_timeout_us;
  options.origin = args.origin;
  options.drift_window = args.drift_window;
  options.drift_threshold = args.drift_threshold;
  options.job_stream = job_stream;
  return options;
}

// A Session with Python's calling conventions: close() ends it early (the communication
// thread stops, the MPI duplicate is freed); every later call raises.
class PySession {
 public:
  // Host memory over the launch's communicator (MPI or gloo) behind the session's own
  // NetworkGate (`gate`), which a Checkpointer with replicas shares (docs/CHECKPOINT.md): the
  // Python session is made inside DistributedOptimizer, before any Checkpointer, so its
  // communicator is always gated; with no transfer in flight a collective passes at the cost of
  // a mutex. Creation is collective; it runs without the GIL (a gloo split meets through a
  // Python store, which takes it).
  static std::unique_ptr<PySession> Create(const std::string& plan, Launch& launch, const SessionArgs& args) {
    std::unique_ptr<comm::Communicator> world = launch.World();
    auto gate = std::make_shared<runtime::NetworkGate>();
    StatusOr<std::unique_ptr<runtime::Session>> session = InternalError("not run");
    {
      py::gil_scoped_release release;
      session =
          runtime::Session::Create(plan, runtime::GateCommunicator(gate, std::move(world)), ToOptions(args, nullptr));
    }
    return std::make_unique<PySession>(Take(std::move(session)), std::move(gate));
  }
  // Device memory over NCCL, bootstrapped through the launch's host communicator (rank 0's
  // ncclUniqueId broadcast over MPI or gloo), on the current CUDA device.
  static std::unique_ptr<PySession> CreateNccl(const std::string& plan, Launch& launch, const SessionArgs& args,
                                               uintptr_t job_stream) {
    std::unique_ptr<comm::Communicator> world = launch.World();
    StatusOr<std::unique_ptr<runtime::Session>> session = InternalError("not run");
    {
      py::gil_scoped_release release;
      auto nccl = comm::MakeNcclCommunicator(world.get());
      session = nccl.ok() ? runtime::Session::Create(plan, std::move(nccl).value(),
                                                     ToOptions(args, reinterpret_cast<void*>(job_stream)))  // NOLINT
                          : StatusOr<std::unique_ptr<runtime::Session>>(nccl.status());
    }
    return std::make_unique<PySession>(Take(std::move(session)));
  }
  explicit PySession(std::unique_ptr<runtime::Session> session, std::shared_ptr<runtime::NetworkGate> gate = nullptr)
      : session_(std::move(session)), gate_(std::move(gate)) {}

  runtime::Session& Get() const {
    if (session_ == nullptr) Raise(FailedPreconditionError("cupcake: Session: closed; expected an open session"));
    return *session_;
  }
  void Close() { session_.reset(); }
  bool closed() const { return session_ == nullptr; }
  // The gate in front of a host session's communicator; nullptr for NCCL (its collectives run
  // on the device's stream, not at the call).
  const std::shared_ptr<runtime::NetworkGate>& gate() const { return gate_; }

 private:
  std::unique_ptr<runtime::Session> session_;
  std::shared_ptr<runtime::NetworkGate> gate_;
};

// One GraVAC window as a dict, the keys GravacDecision's fields.
py::dict DecisionDict(const runtime::GravacDecision& d) {
  py::dict out;
  out["step"] = d.step;
  out["steps"] = d.steps;
  out["ratio"] = d.ratio;
  out["ratio_min"] = d.ratio_min;
  out["ratio_c"] = d.ratio_c;
  out["gain_min"] = d.gain_min;
  out["gain_c"] = d.gain_c;
  out["groups_skipped"] = d.groups_skipped;
  out["predicted_ms"] = d.predicted_ms;
  out["measured_ms"] = d.measured_ms;
  out["bytes_sent"] = d.bytes_sent;
  out["probe_ms"] = d.probe_ms;
  out["next_ratio"] = d.next_ratio;
  return out;
}

float* FloatPointer(uintptr_t address) { return reinterpret_cast<float*>(address); }  // NOLINT

void BindSession(py::module_& m) {
  py::class_<SessionArgs>(m, "SessionOptions")
      .def(py::init<>())
      .def_readwrite("compressor", &SessionArgs::compressor)
      .def_readwrite("model_fingerprint", &SessionArgs::model_fingerprint)
      .def_readwrite("ready_timeout_us", &SessionArgs::ready_timeout_us,
                     "Microseconds synchronize() waits for missing gradients (default 60e6).")
      // Kept one release: the same timeout in seconds.
      .def_property(
          "ready_timeout_s",
          [](const SessionArgs& a) {
            WarnDeprecated("SessionOptions.ready_timeout_s is deprecated; use ready_timeout_us (microseconds)");
            return a.ready_timeout_us / 1e6;
          },
          [](SessionArgs& a, double seconds) {
            WarnDeprecated("SessionOptions.ready_timeout_s is deprecated; use ready_timeout_us (microseconds)");
            a.ready_timeout_us = seconds * 1e6;
          },
          "Deprecated: ready_timeout_us / 1e6.")
      .def_readwrite("origin", &SessionArgs::origin)
      .def_readwrite("drift_window", &SessionArgs::drift_window,
                     "Steps per window of the self-check (the plan's predicted span against the measured one).")
      .def_readwrite("drift_threshold", &SessionArgs::drift_threshold,
                     "The fraction by which the measured span may differ before the session warns once; 0: never.");

  py::class_<PySession>(m, "Session")
      .def(py::init(&PySession::Create), py::arg("plan"), py::arg("mpi"), py::arg("options") = SessionArgs{},
           py::keep_alive<1, 3>(),
           "A session on host memory over a new communicator of `mpi` (the Launch: Mpi or Gloo).")
      .def_static(
          "create_nccl", &PySession::CreateNccl, py::arg("plan"), py::arg("mpi"), py::arg("options") = SessionArgs{},
          py::arg("job_stream") = 0, py::keep_alive<0, 2>(),
          "A session on the current CUDA device over NCCL, bootstrapped through `mpi` (the Launch: Mpi or Gloo).")
      .def(
          "register",
          [](PySession& s, const std::string& name, uintptr_t address, int64_t numel) {
            Check(s.Get().Register(name, std::span<float>(FloatPointer(address), static_cast<size_t>(numel))));
          },
          py::arg("name"), py::arg("address"), py::arg("numel"),
          "Registers the next gradient (float32 host memory at `address`, `numel` elements) in plan order.")
      .def(
          "register_device",
          [](PySession& s, const std::string& name, uintptr_t address, int64_t numel) {
            Check(s.Get().RegisterDevice(name, FloatPointer(address), numel));
          },
          py::arg("name"), py::arg("address"), py::arg("numel"))
      .def(
          "register_all",
          [](PySession& s, const std::vector<std::tuple<std::string, uintptr_t, int64_t>>& gradients) {
            std::vector<runtime::GradientBuffer> buffers;
            for (const auto& [name, address, numel] : gradients)
              buffers.push_back({name, FloatPointer(address), numel});
            runtime::Session& session = s.Get();
            CheckWithoutGil([&] { return session.RegisterAll(buffers); });
          },
          py::arg("gradients"),
          "Collective: registers every gradient, (name, address, numel) in plan order (host or device memory, as "
          "the session's), then agrees with the other ranks: a failure every rank finds alike is raised on every "
          "rank, with Error.reporter the rank that prints it.")
      .def(
          "gradient_ready",
          [](PySession& s, int i) {
            runtime::Session& session = s.Get();
            CheckWithoutGil([&] { return session.GradientReady(i); });
          },
          py::arg("i"))
      .def("synchronize",
           [](PySession& s) {
             runtime::Session& session = s.Get();
             CheckWithoutGil([&] { return session.Synchronize(); });
           })
      .def(
          "set_accumulating", [](PySession& s, bool on) { Check(s.Get().SetAccumulating(on)); }, py::arg("on"))
      .def(
          "switch_plan",
          [](PySession& s, int index) {
            runtime::Session& session = s.Get();
            CheckWithoutGil([&] { return session.SwitchPlan(index); });
          },
          py::arg("index"),
          "Collective, between steps: plan `index` (a ladder's rung) runs from the next step; per-element "
          "error feedback carries over.")
      .def(
          "enable_gravac",
          [](PySession& s, int window, double epsilon, double omega, double measured_tolerance, int probe_every) {
            runtime::Session& session = s.Get();
            const runtime::GravacOptions options{window, epsilon, omega, measured_tolerance, probe_every};
            CheckWithoutGil([&] { return session.EnableGravac(options); });
          },
          py::arg("window") = runtime::GravacOptions{}.window, py::arg("epsilon") = runtime::GravacOptions{}.epsilon,
          py::arg("omega") = runtime::GravacOptions{}.omega,
          py::arg("measured_tolerance") = runtime::GravacOptions{}.measured_tolerance,
          py::arg("probe_every") = runtime::GravacOptions{}.probe_every,
          "Collective, between steps: GraVAC chooses the ladder's rung per window (docs/ADAPTIVE.md).")
      .def_property_readonly("decisions",
                             [](const PySession& s) {
                               py::list out;
                               for (const runtime::GravacDecision& d : s.Get().decisions()) out.append(DecisionDict(d));
                               return out;
                             })
      .def_property_readonly("warnings", [](const PySession& s) { return s.Get().warnings(); })
      .def_property_readonly("plan_count", [](const PySession& s) { return s.Get().plan_count(); })
      .def_property_readonly("active_plan", [](const PySession& s) { return s.Get().active_plan(); })
      .def(
          "read_state",
          [](PySession& s, uintptr_t address, int64_t numel, bool momentum) {
            // Copies the active plan's per-element state (model element order) into float32
            // host memory of `numel` elements, which must be the model's element count.
            runtime::Session& session = s.Get();
            auto values = Take(session.ReadState(momentum ? runtime::CompressorState::kMomentum
                                                          : runtime::CompressorState::kErrorFeedback));
            if (static_cast<int64_t>(values.size()) != numel)
              Raise(InvalidArgumentError("read_state: numel: wrong size; got " + std::to_string(numel) + ", expected " +
                                         std::to_string(values.size()) + " (elements of the model)"));
            std::copy(values.begin(), values.end(), FloatPointer(address));
          },
          py::arg("address"), py::arg("numel"), py::arg("momentum") = false,
          "Between steps: the error-feedback memory (or momentum) in model element order into float32 host memory.")
      .def(
          "write_state",
          [](PySession& s, uintptr_t address, int64_t numel, bool momentum) {
            Check(s.Get().WriteState(
                std::span<const float>(FloatPointer(address), static_cast<size_t>(numel)),
                momentum ? runtime::CompressorState::kMomentum : runtime::CompressorState::kErrorFeedback));
          },
          py::arg("address"), py::arg("numel"), py::arg("momentum") = false,
          "Between steps: sets the error-feedback memory (or momentum) from float32 host memory, model element order.")
      .def("close", &PySession::Close, "Stops the session (its thread, its MPI duplicate); later calls raise.")
      .def_property_readonly("closed", &PySession::closed)
      .def_property_readonly("registered", [](const PySession& s) { return s.Get().registered(); })
      .def_property_readonly("tensor_count", [](const PySession& s) { return s.Get().tensor_count(); })
      .def_property_readonly("group_count", [](const PySession& s) { return s.Get().group_count(); })
      .def_property_readonly("rank", [](const PySession& s) { return s.Get().rank(); })
      .def_property_readonly("world_size", [](const PySession& s) { return s.Get().world_size(); })
      .def_property_readonly("fusion_bytes", [](const PySession& s) { return s.Get().fusion_bytes(); })
      .def_property_readonly("iteration", [](const PySession& s) { return s.Get().iteration(); })
      .def_property_readonly("gate", &PySession::gate,
                             "The NetworkGate in front of this host session's communicator, for "
                             "Checkpointer(..., gate=); None for a session over NCCL.");
}

void BindRecorder(py::module_& m) {
  using runtime::Recorder;
  // The CUPTI source of kernel time (runtime::OpenKernelTimeSource): one per process; a Recorder
  // made with it keeps it alive (py::keep_alive).
  py::class_<ActivitySource>(m, "KernelTimeSource",
                             "Device kernel time between gradient-ready marks (CUPTI), for a Recorder on a GPU.");
  m.def(
      "open_kernel_time_source", [] { return Take(runtime::OpenKernelTimeSource()); },
      "Opens the CUPTI kernel-time source (one per process). Raises when the build has no CUPTI.");
  py::class_<Recorder>(m, "Recorder")
      .def(py::init([](const std::string& model_name, ActivitySource* activity) {
             runtime::RecorderOptions options;
             options.activity = activity;
             return Take(Recorder::Create(model_name, options));
           }),
           py::arg("model_name"), py::arg("activity") = nullptr, py::keep_alive<1, 3>(),
           "Record mode (libruntime's Recorder): gaps on the steady clock, or with `activity` (a "
           "KernelTimeSource) the device's kernel time between gradient-ready marks.")
      .def(
          "register",
          [](Recorder& r, const std::string& name, int64_t numel, const std::vector<int64_t>& shape) {
            Check(r.Register(name, numel, shape));
          },
          py::arg("name"), py::arg("numel"), py::arg("shape") = std::vector<int64_t>{})
      .def_property_readonly("registered", &Recorder::registered)
      .def("begin_forward", [](Recorder& r) { Check(r.BeginForward()); })
      .def("begin_backward", [](Recorder& r) { Check(r.BeginBackward()); })
      .def(
          "gradient_ready", [](Recorder& r, int i) { Check(r.GradientReady(i)); }, py::arg("i"))
      .def("end_iteration", [](Recorder& r) { Check(r.EndIteration()); })
      .def(
          "sample_density",
          [](Recorder& r, int i, uintptr_t address, int64_t numel) {
            Check(r.SampleDensity(i, std::span<const float>(FloatPointer(address), static_cast<size_t>(numel))));
          },
          py::arg("i"), py::arg("address"), py::arg("numel"),
          "One sample of gradient i's share of non-zeros (float32 host memory at `address`, `numel` elements).")
      .def_property_readonly("completed_iterations", &Recorder::completed_iterations)
      .def(
          "merge_ranks",
          [](Recorder& r, Launch& mpi) {
            std::unique_ptr<comm::Communicator> world = mpi.World();
            CheckWithoutGil([&] { return r.MergeRanks(*world); });
            return world->rank();
          },
          py::arg("mpi"), "Merges over a new communicator of `mpi` (the Launch; collective); returns this rank.")
      .def_property_readonly("merged_ranks", &Recorder::merged_ranks)
      .def("backward_us", [](const Recorder& r) { return Take(r.BackwardUs()); })
      .def_property_readonly("forward_us", &Recorder::ForwardUs)
      .def_property_readonly("update_us", &Recorder::UpdateUs)
      .def("to_json", [](const Recorder& r) { return Take(r.ToJson()); })
      .def(
          "write", [](const Recorder& r, const std::string& path) { Check(r.Write(path)); }, py::arg("path"));
}

// A Checkpointer (runtime/checkpoint.h) over a new communicator of the launch's. Entries are
// raw host addresses and byte counts (a tensor's data_ptr()), as sessions take gradients. An
// attached session is held by reference (py::keep_alive) and checked open at each call.
class PyCheckpointer {
 public:
  PyCheckpointer(Launch& mpi, const std::string& name, const std::string& persist_dir, int persist_every,
                 bool replicate, int64_t replica_chunk_bytes, int replica_group_hosts,
                 std::shared_ptr<runtime::NetworkGate> gate, const std::vector<std::pair<int, int64_t>>& replica_gaps,
                 int replica_max_commits, int64_t persist_chunk_bytes)
      : comm_(mpi.World()) {
    runtime::CheckpointOptions options;
    options.name = name;
    options.persist_dir = persist_dir;
    options.persist_every = persist_every;
    options.replicate = replicate;
    options.replica_chunk_bytes = replica_chunk_bytes;
    options.replica_group_hosts = replica_group_hosts;
    options.replica_max_commits = replica_max_commits;
    options.persist_chunk_bytes = persist_chunk_bytes;
    options.gate = std::move(gate);
    for (const auto& [after_group, bytes] : replica_gaps) options.replica_gaps.push_back({after_group, bytes});
    ckpt_ = Take(runtime::Checkpointer::Create(options, comm_.get()));
  }
  runtime::Checkpointer& Get() {
    if (ckpt_ == nullptr) Raise(FailedPreconditionError("cupcake: Checkpointer: closed; expected an open one"));
    if (session_ != nullptr && session_->closed())
      Raise(
          FailedPreconditionError("cupcake: Checkpointer: the attached session is closed; expected it open "
                                  "(attach_session(None) to go on without its state)"));
    return *ckpt_;
  }
  void Add(const std::string& name, uintptr_t address, int64_t nbytes, bool at_commit, bool shared) {
    if (nbytes < 0) Raise(InvalidArgumentError("Checkpointer.add: nbytes: negative; got " + std::to_string(nbytes)));
    auto* bytes = reinterpret_cast<std::byte*>(address);  // NOLINT: a tensor's data_ptr()
    Check(Get().Add(name, std::span<std::byte>(bytes, static_cast<size_t>(nbytes)),
                    at_commit ? runtime::Capture::kAtCommit : runtime::Capture::kInBackground,
                    shared ? runtime::Scope::kShared : runtime::Scope::kRank));
  }
  void Attach(PySession* session) {
    runtime::Checkpointer& c = Get();
    Check(c.AttachSession(session != nullptr ? &session->Get() : nullptr));
    session_ = session;
  }
  void Close() {
    if (ckpt_ != nullptr) {
      Status s = ckpt_->WaitForPersist();
      ckpt_.reset();
      comm_.reset();
      Check(s);
    }
  }
  bool closed() const { return ckpt_ == nullptr; }

 private:
  std::unique_ptr<comm::Communicator> comm_;
  std::unique_ptr<runtime::Checkpointer> ckpt_;
  PySession* session_ = nullptr;
};

py::dict PointDict(const runtime::RestorePoint& p) {
  py::dict out;
  out["step"] = p.step;
  out["metadata"] = py::bytes(p.metadata);
  out["source"] = p.source;
  out["refused"] = p.refused;
  py::list entries;
  for (const auto& [name, bytes] : p.entries) entries.append(py::make_tuple(name, bytes));
  out["entries"] = entries;
  return out;
}

void BindCheckpointer(py::module_& m) {
  py::class_<runtime::NetworkGate, std::shared_ptr<runtime::NetworkGate>>(
      m, "NetworkGate",
      "One rank's network shared by a session's collectives and a Checkpointer's replica exchanges and "
      "persist pieces (runtime::NetworkGate): a collective waits while one is in flight. A host Session's "
      "`gate`; counters only.")
      .def_property_readonly("transfers", &runtime::NetworkGate::transfers, "Replica exchanges started.")
      .def_property_readonly("idle_transfers", &runtime::NetworkGate::idle_transfers,
                             "Persist pieces written (each when no collective was in flight or waiting).")
      .def_property_readonly("collectives", &runtime::NetworkGate::collectives, "Collectives that entered the gate.")
      .def_property_readonly("collectives_waited", &runtime::NetworkGate::collectives_waited,
                             "Collectives that waited for an exchange or a piece.")
      .def_property_readonly("transfers_during_collectives", &runtime::NetworkGate::transfers_during_collectives,
                             "Exchanges started while a collective was in flight (0 when commits follow the "
                             "session's synchronize).");
  py::class_<PyCheckpointer>(m, "Checkpointer",
                             "Every-iteration snapshots in host memory (runtime::Checkpointer, docs/CHECKPOINT.md).")
      .def(py::init<Launch&, const std::string&, const std::string&, int, bool, int64_t, int,
                    std::shared_ptr<runtime::NetworkGate>, const std::vector<std::pair<int, int64_t>>&, int, int64_t>(),
           py::arg("mpi"), py::arg("name"), py::arg("persist_dir") = "", py::arg("persist_every") = 0,
           py::arg("replicate") = false, py::arg("replica_chunk_bytes") = 0, py::arg("replica_group_hosts") = 2,
           py::arg("gate").none(true) = nullptr, py::arg("replica_gaps") = std::vector<std::pair<int, int64_t>>{},
           py::arg("replica_max_commits") = 0, py::arg("persist_chunk_bytes") = 0, py::keep_alive<1, 2>(),
           "gate: a host Session's `gate`, so that replica exchanges and that session's collectives never overlap "
           "(None: not coordinated). replica_gaps: (after_group, bytes) per idle gap of the attached session's "
           "plan, the chunks sent between its collectives (CheckpointOptions::replica_gaps). persist_chunk_bytes: "
           "each persist in pieces of that many bytes, in the gate's idle time "
           "(CheckpointOptions::persist_chunk_bytes).")
      .def("add", &PyCheckpointer::Add, py::arg("name"), py::arg("address"), py::arg("nbytes"),
           py::arg("at_commit") = false, py::arg("shared") = false,
           "Registers the next entry: `nbytes` bytes of host memory at `address`; at_commit: copied inside "
           "commit() (memory the next iteration writes before its optimizer step), else in the background; "
           "shared: the same bytes on every rank (Scope::kShared: replicas leave it out), else this rank's own.")
      .def("clear", [](PyCheckpointer& c) { c.Get().Clear(); })
      .def("attach_session", &PyCheckpointer::Attach, py::arg("session").none(true), py::keep_alive<1, 2>(),
           "Includes the session's error-feedback memory and momentum in every snapshot.")
      .def(
          "commit",
          [](PyCheckpointer& c, int64_t step, const py::bytes& metadata) {
            runtime::Checkpointer& ckpt = c.Get();
            std::string meta = metadata;
            CheckWithoutGil([&] { return ckpt.Commit(step, meta); });
          },
          py::arg("step"), py::arg("metadata") = py::bytes(),
          "Collective: snapshot of step `step` (>= 1, increasing, the same on every rank).")
      .def("wait_for_copy",
           [](PyCheckpointer& c) {
             runtime::Checkpointer& ckpt = c.Get();
             CheckWithoutGil([&] { return ckpt.WaitForCopy(); });
           })
      .def("wait_for_persist",
           [](PyCheckpointer& c) {
             runtime::Checkpointer& ckpt = c.Get();
             CheckWithoutGil([&] { return ckpt.WaitForPersist(); });
           })
      .def("find",
           [](PyCheckpointer& c) {
             runtime::Checkpointer& ckpt = c.Get();
             StatusOr<runtime::RestorePoint> point = InternalError("not run");
             {
               py::gil_scoped_release release;
               point = ckpt.Find();
             }
             return PointDict(Take(std::move(point)));
           })
      .def(
          "apply",
          [](PyCheckpointer& c, const std::string& job_error) {
            runtime::Checkpointer& ckpt = c.Get();
            const Status job = job_error.empty() ? Status::Ok() : InvalidArgumentError(job_error);
            CheckWithoutGil([&] { return ckpt.Apply(job); });
          },
          py::arg("job_error") = "",
          "Collective, after find(): the snapshot into the entries. job_error: this rank could not prepare its "
          "entries (every rank then fails, nothing is written).")
      .def_property_readonly("agreed_step", [](PyCheckpointer& c) { return c.Get().agreed_step(); })
      .def_property_readonly("local_step", [](PyCheckpointer& c) { return c.Get().local_step(); })
      .def_property_readonly("persisted_step", [](PyCheckpointer& c) { return c.Get().persisted_step(); })
      .def_property_readonly("replicated_step", [](PyCheckpointer& c) { return c.Get().replicated_step(); })
      .def_property_readonly("replica_gaps_skipped", [](PyCheckpointer& c) { return c.Get().replica_gaps_skipped(); })
      .def("close", &PyCheckpointer::Close,
           "Waits for the copy and the persist in progress and frees the checkpointer.")
      .def_property_readonly("closed", &PyCheckpointer::closed)
      .def_static("segment_name", &runtime::Checkpointer::SegmentName, py::arg("name"), py::arg("rank"))
      .def_static("replica_segment_name", &runtime::Checkpointer::ReplicaSegmentName, py::arg("name"), py::arg("rank"),
                  "The prefix of the segments in which rank `rank` keeps other ranks' snapshots (replicate=True); "
                  "each is the prefix followed by the source rank.")
      .def_static(
          "remove_segment",
          [](const std::string& name, int rank) { Check(runtime::Checkpointer::RemoveSegment(name, rank)); },
          py::arg("name"), py::arg("rank"), "Deletes rank `rank`'s shared-memory segment of job `name`.");
}

}  // namespace
}  // namespace cupcake::python

PYBIND11_MODULE(_runtime, m) {
  using namespace cupcake::python;  // NOLINT: the module body only
  m.doc() = "Cupcake's runtime (libruntime): sessions that execute a plan, record mode, MPI.";
  static py::exception<ErrorTag> error(m, "Error", PyExc_RuntimeError);  // NOLINT: pybind11's idiom
  error_type = error.ptr();
  error.attr("reporter") = py::none();  // an Error raised in Python: printed by the rank that raises it

  py::class_<Launch>(m, "Launch", "How the ranks were launched: Mpi or Gloo; makes host communicators.")
      .def(
          "world", [](Launch& launch) { return std::make_unique<PyCommunicator>(launch.World()); },
          py::keep_alive<0, 1>(), "Collective: a new host communicator over every rank.")
      .def("world_rank_and_size", [](Launch& launch) {
        auto world = launch.World();
        return std::make_pair(world->rank(), world->size());
      });
  py::class_<Mpi, Launch>(m, "Mpi")
      .def(py::init<>(), "Initializes MPI (MPI_THREAD_MULTIPLE) unless the job already did.")
      .def_property_readonly("owns_mpi", &Mpi::owns_mpi)
      .def("close", &Mpi::Close, "Finalizes MPI when this object initialized it.");
  py::class_<Gloo, Launch>(m, "Gloo")
      .def(py::init<py::object, int, int, const std::string&, const std::string&, double>(), py::arg("store"),
           py::arg("rank"), py::arg("size"), py::arg("iface") = "", py::arg("hostname") = "",
           py::arg("timeout_s") = 60.0,
           "gloo over TCP for ranks that meet through `store` (torch.distributed's Store: set, get, wait); "
           "iface or hostname: where this rank listens (default: this host's name); timeout_s bounds every "
           "set-up wait and collective.")
      .def_property_readonly("rank", &Gloo::rank)
      .def_property_readonly("size", &Gloo::size)
      .def_property_readonly("owns_mpi", [](const Gloo&) { return false; })
      .def("close", &Gloo::Close, "Drops the store; communicators already made keep working.");
  m.def("built_with_gloo", &cupcake::comm::BuiltWithGloo);
  m.def("built_with_nccl", &cupcake::comm::BuiltWithNccl);
  m.def(
      "plan_ratios",
      [](const std::string& path) {
        const cupcake::Plans plans = Take(cupcake::ReadPlansFile(path));
        std::vector<double> ratios;
        for (const auto& rung : plans.ladder.rungs()) ratios.push_back(rung.ratio());
        return ratios;
      },
      py::arg("path"),
      "The ratios of a plan file's rungs in order: a ladder's (the fp32 rung's 1 first), or a single plan's one "
      "(its compressor's ratio, 1 when it keeps every element).");
  BindCommunicator(m);
  BindSession(m);
  BindRecorder(m);
  BindCheckpointer(m);
}
