#include "cupcake/runtime/session.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "cupcake/comm/zen.h"
#include "cupcake/kernels/compressor.h"
#include "cupcake/kernels/fusion.h"
#include "cupcake/kernels/zen.h"
#include "cupcake/proto/catalogue.h"
#include "cupcake/proto/fingerprint.h"
#include "cupcake/proto/names.h"
#include "cupcake/proto/plan_io.h"
#include "device_streams.h"
#include "plan_agreement.h"

namespace cupcake::runtime {

uint64_t GroupSeed(uint64_t plan_seed, int group, int rank, bool allreduce) {
  uint64_t seed = plan_seed + static_cast<uint64_t>(group) * 0x9E3779B97F4A7C15ull;
  return allreduce ? seed : seed + static_cast<uint64_t>(rank);
}

namespace {

// The longest a wait sleeps before it reads the clock again (real time), so a fake clock that
// advances on every read ends a wait after a few polls.
constexpr auto kPoll = std::chrono::milliseconds(1);

std::string Quoted(const std::string& s) { return "'" + s + "'"; }

std::string Seconds(double us) {
  std::ostringstream os;
  os << us / 1e6 << " s";
  return os.str();
}

enum class Stage { kIdle, kEncoded, kExchanged };

struct Tensor {
  std::string name;
  int64_t numel = 0;
  std::span<float> buffer;
  int group = 0;
  bool ready = false;  // this step; caller's thread only
};

struct Group {
  int first = 0, last = 0;
  int64_t numel = 0;
  bool allreduce = false;
  // Lossless and memoryless (fp32, or a group the plan leaves uncompressed): no encode and no
  // payload; the collective sums `work` in place and the decode is the divide by W.
  bool in_place = false;
  comm::DataType reduce_type = comm::DataType::kFloat32;
  int64_t reduce_count = 0;
  // Host: null for in-place groups. Device: always (an in-place group's fp32 Decode is the
  // divide, run in place: an elementwise kernel).
  std::unique_ptr<kernels::Compressor> compressor;
  // The group's floats, in plan order: the registered buffer itself when the group has one
  // tensor or its tensors' buffers are adjacent in plan order (a framework's flat gradient
  // buffer), else `fusion`, which GradientReady packs and Synchronize unpacks through
  // `fusion_table` (one kernel launch each on the device). Set when the last gradient is
  // registered.
  float* work = nullptr;
  kernels::Buffer fusion;  // numel floats, allocated at registration only when needed
  std::unique_ptr<kernels::FusionTable> fusion_table;  // with `fusion`
  kernels::Buffer state;  // error-feedback memory, momentum; kept across iterations
  kernels::Buffer payload;  // not for in-place groups
  kernels::Buffer received;
  // Hierarchical schemes (docs/MODEL.md, v2; host sessions): reduce-scatter in the node, the
  // codec across nodes on the shard (`shard` floats: this rank's 1/devices_per_node of the
  // group), allgather in the node. `padded` holds the group zero-padded to devices_per_node x
  // shard floats and, after the allgather, the sums; `compressor`, `state`, `payload` and
  // `received` then work on `shard_floats` (none for fp32). The decode divides by `divisor`
  // (on GPU memory with `divide`, fp32's decode over the group with W = divisor).
  const SchemeInfo* hierarchical = nullptr;
  int64_t shard = 0;
  kernels::Buffer padded, shard_floats;
  float divisor = 1;
  std::unique_ptr<kernels::Compressor> divide;
  // Zen (docs/ZEN.md; host sessions): the payload (topk's and dgc's layout: k values, then k
  // ascending indices) is summed over the ranks by comm::ZenAllreduce; `zen_sum` holds the union
  // and its sums from the collective to the decode. No `received` buffer.
  bool zen = false;
  uint32_t zen_seed = 0;
  kernels::zen::Sparse zen_sum;
  // zen_sparse (Codec::kNonzeros; host sessions): no compressor; the encode collects the group's
  // non-zero entries into `nonzeros` (capacity reserved for twice the plan's expected count, so
  // a step allocates only when it has more non-zeros than any before), which the zen collective
  // sums. Lossless: no error feedback.
  bool nonzero_codec = false;
  kernels::zen::Sparse nonzeros;
  // Offloaded (docs/MODEL.md v2: a cpu option in a session on GPU memory): the tensors are
  // copied one by one into `host` (pinned, numel floats) on the compute stream; the CPU worker
  // (OffloadLoop) encodes it with `compressor` (CPU kernels, `state` in host memory) into
  // `host_payload` (pinned); the collective copies that into `payload`, exchanges it into
  // `received` and copies that into `host_received` (pinned) on the communicator's stream;
  // Synchronize decodes it into `host` and copies the tensors back one by one.
  bool offloaded = false;
  float* host = nullptr;  // owned by the DeviceStreams, as the two below
  std::byte* host_payload = nullptr;
  std::byte* host_received = nullptr;
  GroupTimeline times;  // record_timeline: comm_* by the communication thread
  int pending = 0;  // tensors not yet ready this step; caller's thread only
  Stage stage = Stage::kIdle;  // guarded by Impl::mu_ (host sessions)
  bool packed() const { return fusion.data() != nullptr; }
  std::span<float> work_span() const { return {work, static_cast<size_t>(numel)}; }
};

// out[i] = in[i] / w: the fp32 decode (the kernels' arithmetic, so results match them
// bitwise); `in` may be `out`.
void DivideInto(const float* in, float* out, int64_t n, float w) {
  for (int64_t i = 0; i < n; ++i) out[i] = in[i] / w;
}

// out = 0 except out[i] = sum / w at the union's indices (strictly increasing, < out.size(),
// as ZenAllreduce returns them): the division the sparse compressors' decode makes, so a zen
// group's means equal the allgather scheme's bitwise whenever the sums do.
void ScatterMean(const kernels::zen::Sparse& sum, float w, std::span<float> out) {
  std::fill(out.begin(), out.end(), 0.0f);
  for (size_t j = 0; j < sum.indices.size(); ++j) out[sum.indices[j]] = sum.values[j] / w;
}

StatusOr<kernels::Buffer> AllocateZeroed(kernels::Backend backend, int64_t bytes) {
  CUPCAKE_ASSIGN_OR_RETURN(kernels::Buffer b, kernels::Buffer::Allocate(backend, bytes));
  CUPCAKE_RETURN_IF_ERROR(b.Zero());
  return b;
}

}  // namespace

class Session::Impl {
 public:
  Impl(std::string origin, std::unique_ptr<comm::Communicator> comm, const SessionOptions& options)
      : origin_(std::move(origin)),
        comm_(std::move(comm)),
        timeout_us_(options.ready_timeout_us),
        job_stream_(options.job_stream),
        record_timeline_(options.record_timeline),
        device_graphs_(options.device_graphs) {
    if (options.clock == nullptr) {
      owned_clock_ = std::make_unique<SteadyClock>();
      clock_ = owned_clock_.get();
    } else {
      clock_ = options.clock;
    }
  }

  ~Impl() {
    if (device_ != nullptr) {
      // Collectives enqueued and not known to be finished may wait for a peer that never comes:
      // abort the communicator (NCCL: ncclCommAbort) so the streams drain, rather than hang.
      if (launched_ > 0) comm_->Abort("session destroyed during a step (rank " + std::to_string(comm_->rank()) + ")");
      if (thread_.joinable()) {  // the CPU worker: its waits are for local copies only
        {
          std::lock_guard lock(mu_);
          stop_ = true;
        }
        cv_.notify_all();
        thread_.join();
      }
      return;
    }
    if (!thread_.joinable()) return;
    bool abort = false;
    {
      std::lock_guard lock(mu_);
      stop_ = true;
      abort = in_collective_;
    }
    cv_.notify_all();
    // A collective still running at destruction waits for a peer that may never come: give up
    // on the group (MPI ends the job with a non-zero exit) rather than hang.
    if (abort) comm_->Abort("session destroyed during a collective (rank " + std::to_string(comm_->rank()) + ")");
    thread_.join();
  }

  Status Init(const pb::Plan& plan, const SessionOptions& options) {
    std::vector<std::string> problems;
    auto add = [&](const std::string& field, const std::string& text) {
      problems.push_back(origin_ + ": " + field + ": " + text);
    };
    const pb::Model& model = plan.model().model();
    const int world = comm_->size();
    if (plan.world_size() != world)
      add("world_size", "does not match the job; got " + std::to_string(plan.world_size()) + ", expected " +
                            std::to_string(world) + " (ranks in the communicator)");
    if (!options.compressor.empty() && plan.compressor().name() != options.compressor)
      add("compressor.name", "does not match the job; got " + Quoted(plan.compressor().name()) + ", expected " +
                                 Quoted(options.compressor));
    if (on_device() && plan.device() != pb::GPU)
      add("device", "does not match the communicator; got " + std::string(Name(plan.device())) +
                        ", expected gpu (the communicator works on GPU memory)");
    if (!options.model_fingerprint.empty() && plan.model().fingerprint() != options.model_fingerprint)
      add("model.fingerprint", "plan for another model; got " + plan.model().fingerprint() + " (model " + model.name() +
                                   "), expected " + options.model_fingerprint + " (the job's model)");
    for (int i = 0; i < model.tensors_size(); ++i) {
      const pb::Tensor& t = model.tensors(i);
      if (t.dtype() != pb::FLOAT32)
        add("model.model.tensors[" + std::to_string(i) + "].dtype",
            "not supported by the runtime; got " + std::string(Name(t.dtype())) + ", expected float32 (tensor " +
                Quoted(t.name()) + ")");
      tensors_.push_back(Tensor{t.name(), t.numel(), {}, 0, false});
    }
    const pb::CompressorSpec& spec = plan.compressor();
    std::vector<kernels::CompressorConfig> configs;
    std::vector<kernels::CompressorLayout> layouts;
    std::vector<const SchemeInfo*> schemes;  // options plans' groups' schemes, else nullptr
    std::vector<bool> offload;  // groups offloaded to the CPU (sessions on GPU memory)
    int hierarchical_devices = 0;  // devices_per_node when some group is hierarchical
    for (int k = 0; k < plan.groups_size(); ++k) {
      const pb::Group& g = plan.groups(k);
      const std::string f = "groups[" + std::to_string(k) + "]";
      // Options plans (docs/MODEL.md, v2): every scheme on the plan's device. Anything else is
      // refused rather than run as something the plan did not say.
      const std::string& scheme_name = g.options().scheme();
      const SchemeInfo* scheme = scheme_name.empty() ? nullptr : FindScheme(scheme_name);
      if (!scheme_name.empty() && scheme == nullptr) {
        add(f + ".options.scheme", "unknown scheme; got " + Quoted(scheme_name) + ", expected one of " + SchemeNames());
        continue;
      }
      // A v1 group (no scheme) runs on the plan's device, as before options existed. A group on
      // the cpu in a session on GPU memory is offloaded (flat schemes).
      const bool offloaded = scheme != nullptr && g.options().device() != plan.device();
      if (offloaded && !(on_device() && g.options().device() == pb::CPU)) {
        add(f + ".options.device", "offload to the CPU is not executed by this runtime yet; got " +
                                       std::string(Name(g.options().device())) + ", expected " +
                                       std::string(Name(plan.device())) +
                                       " (the plan's device; plan with --search-space fusion)");
        continue;
      }
      if (offloaded && (scheme->hierarchical || scheme->zen)) {
        add(f + ".options.device", "offload of a hierarchical or zen group is not executed by this runtime yet; got " +
                                       Quoted(scheme_name) + " on the cpu, expected a flat scheme");
        continue;
      }
      const CompressorInfo* plan_info = FindCompressor(spec.name());
      if (scheme != nullptr && plan_info == nullptr) {
        add("compressor.name", "unknown compressor; got " + Quoted(spec.name()));
        continue;
      }
      const int devices_per_node = scheme != nullptr && scheme->hierarchical ? plan.devices_per_node() : 1;
      if (devices_per_node < 1 || world % devices_per_node != 0) {
        add("devices_per_node",
            "does not divide the world; got " + std::to_string(devices_per_node) + ", world " + std::to_string(world));
        continue;
      }
      const bool nonzero_codec = scheme != nullptr && scheme->codec == Codec::kNonzeros;
      if (nonzero_codec && on_device()) {
        add(f + ".options.scheme", Quoted(scheme_name) +
                                       " runs on host memory only in this runtime; got a session on GPU memory "
                                       "(plan with --device cpu)");
        continue;
      }
      const bool compress =
          scheme != nullptr ? scheme->codec != Codec::kNone : g.options().compress() || spec.name() == "fp32";
      kernels::CompressorConfig c;
      // The non-zero codec is no compressor: its group is laid out as fp32 (no state, no payload).
      c.name = nonzero_codec       ? "fp32"
               : scheme != nullptr ? std::string(CodecCompressor(*scheme, *plan_info).name)
                                   : (compress ? spec.name() : "fp32");
      c.memory = scheme != nullptr ? (scheme->codec == Codec::kCompressor ? spec.memory() : "none")
                                   : (compress ? spec.memory() : "none");
      c.n = scheme != nullptr ? ShardElements(*scheme, g.numel(), devices_per_node) : g.numel();
      c.world_size = world / devices_per_node;
      c.ratio = spec.ratio() > 0 ? spec.ratio() : kDefaultRatio;
      const CompressorInfo* info = FindCompressor(c.name);
      const bool allreduce = info != nullptr && info->collective == pb::ALLREDUCE;
      c.seed = GroupSeed(spec.seed(), k, comm_->rank(), allreduce);
      auto layout = kernels::ResolveLayout(c);
      if (!layout.ok()) {
        add(f, layout.status().message());
        continue;
      }
      schemes.push_back(scheme);
      offload.push_back(offloaded);
      hierarchical_devices = scheme != nullptr && scheme->hierarchical ? devices_per_node : hierarchical_devices;
      // Payload sizes and collectives were checked against the catalogue by ValidatePlan.
      configs.push_back(c);
      layouts.push_back(*layout);
    }
    Status local = Status::Ok();
    if (!problems.empty()) {
      std::string text;
      for (const auto& line : problems) text += (text.empty() ? "" : "\n") + line;
      local = InvalidArgumentError(text);
    }
    // Before the first collective (Split below), also when this rank's checks failed.
    CUPCAKE_RETURN_IF_ERROR(internal::AgreeOnPlan(*comm_, {origin_, PlanFingerprint(plan), local}));
    // Everything below is allocated once (fusion buffers when the gradients are registered);
    // the step path reuses it.
    if (on_device()) {
      // Events: encoded[k] = k on the compute stream, exchanged[k] = K + k on the
      // communicator's, the step's end 2K, job_ready[k] = 2K + 1 + k on the job's stream, and
      // the hop 3K + 1 (Hop). Graphs: group k's pack and encode k, its decode and unpack K + k.
      CUPCAKE_ASSIGN_OR_RETURN(device_, internal::MakeDeviceStreams(3 * plan.groups_size() + 2, 2 * plan.groups_size(),
                                                                    comm_->rank(), comm_->host(), "Session"));
    }
    if (hierarchical_devices > 0) {
      // Ranks r of node r / devices_per_node (mpirun's default placement by slot): one
      // communicator per node (intra), one per local rank across the nodes (inter).
      const int rank = comm_->rank();
      CUPCAKE_ASSIGN_OR_RETURN(intra_, comm_->Split(rank / hierarchical_devices, rank % hierarchical_devices));
      CUPCAKE_ASSIGN_OR_RETURN(inter_, comm_->Split(rank % hierarchical_devices, rank / hierarchical_devices));
    }
    const kernels::Backend backend = on_device() ? kernels::Backend::kCuda : kernels::Backend::kCpu;
    for (int k = 0; k < plan.groups_size(); ++k) {
      const pb::Group& pg = plan.groups(k);
      const kernels::CompressorConfig& config = configs[static_cast<size_t>(k)];
      Group g;
      g.first = pg.first_tensor();
      g.last = pg.last_tensor();
      g.numel = pg.numel();
      const kernels::CompressorLayout& layout = layouts[static_cast<size_t>(k)];
      g.allreduce = layout.allreduce;
      g.in_place = layout.kind == kernels::CompressorKind::kFp32 && layout.state_floats == 0;
      g.reduce_type =
          layout.kind == kernels::CompressorKind::kFp16 ? comm::DataType::kFloat16 : comm::DataType::kFloat32;
      g.reduce_count = layout.payload_bytes / comm::DataTypeBytes(g.reduce_type);
      g.offloaded = offload[static_cast<size_t>(k)];
      if (g.offloaded) {  // CPU kernels and state; the payload and what is received on both sides
        g.in_place = false;
        CUPCAKE_ASSIGN_OR_RETURN(g.compressor, kernels::MakeCompressor(config, kernels::Backend::kCpu));
        CUPCAKE_ASSIGN_OR_RETURN(g.state, AllocateZeroed(kernels::Backend::kCpu, 4 * layout.state_floats));
        CUPCAKE_ASSIGN_OR_RETURN(void* host, device_->PinnedHost(4 * g.numel));
        CUPCAKE_ASSIGN_OR_RETURN(void* host_payload, device_->PinnedHost(layout.payload_bytes));
        CUPCAKE_ASSIGN_OR_RETURN(void* host_received, device_->PinnedHost(layout.decode_input_bytes));
        g.host = static_cast<float*>(host);
        g.host_payload = static_cast<std::byte*>(host_payload);
        g.host_received = static_cast<std::byte*>(host_received);
        CUPCAKE_ASSIGN_OR_RETURN(g.payload, AllocateZeroed(backend, layout.payload_bytes));
        CUPCAKE_ASSIGN_OR_RETURN(g.received, AllocateZeroed(backend, layout.decode_input_bytes));
        offloading_ = true;
      } else if (!g.in_place || on_device()) {
        CUPCAKE_ASSIGN_OR_RETURN(g.compressor, kernels::MakeCompressor(config, backend));
      }
      if (!g.in_place && !g.offloaded) {
        CUPCAKE_ASSIGN_OR_RETURN(g.state, AllocateZeroed(backend, 4 * layout.state_floats));
        CUPCAKE_ASSIGN_OR_RETURN(g.payload, AllocateZeroed(backend, layout.payload_bytes));
      }
      const SchemeInfo* scheme = schemes[static_cast<size_t>(k)];
      g.zen = scheme != nullptr && scheme->zen;
      if (g.zen && on_device() && zen_steps_ == nullptr) {
        CUPCAKE_ASSIGN_OR_RETURN(zen_steps_, kernels::zen::DeviceSteps::Create());
      }
      g.nonzero_codec = scheme != nullptr && scheme->codec == Codec::kNonzeros;
      if (g.nonzero_codec) {
        const auto expected =
            static_cast<size_t>(pg.payload_bytes() / static_cast<int64_t>(sizeof(kernels::zen::Pair)));
        const size_t capacity = std::min(static_cast<size_t>(g.numel), 2 * expected);
        g.nonzeros.indices.reserve(capacity);
        g.nonzeros.values.reserve(capacity);
      }
      if (g.zen) {
        // The owner hash's seed: GroupSeed's shared form, equal on every rank.
        g.zen_seed = static_cast<uint32_t>(GroupSeed(spec.seed(), k, comm_->rank(), /*allreduce=*/true));
      } else if (!g.in_place && !g.offloaded) {
        CUPCAKE_ASSIGN_OR_RETURN(g.received, AllocateZeroed(backend, layout.decode_input_bytes));
      }
      if (scheme != nullptr && scheme->hierarchical) {
        g.hierarchical = scheme;
        g.shard = config.n;
        g.in_place = false;
        g.divisor = static_cast<float>(scheme->codec == Codec::kNone ? comm_->size() : hierarchical_devices);
        CUPCAKE_ASSIGN_OR_RETURN(g.padded, AllocateZeroed(backend, 4 * g.shard * hierarchical_devices));
        CUPCAKE_ASSIGN_OR_RETURN(g.shard_floats, AllocateZeroed(backend, 4 * g.shard));
        if (on_device()) {
          kernels::CompressorConfig divide;
          divide.name = "fp32";
          divide.n = g.numel;
          divide.world_size = static_cast<int>(g.divisor);
          CUPCAKE_ASSIGN_OR_RETURN(g.divide, kernels::MakeCompressor(divide, backend));
        }
        if (scheme->codec == Codec::kNone) {
          g.compressor.reset();
          g.state = {};
          g.payload = {};
          g.received = {};
        }
      }
      g.pending = g.last - g.first + 1;
      for (int i = g.first; i <= g.last; ++i) tensors_[static_cast<size_t>(i)].group = k;
      groups_.push_back(std::move(g));
    }
    model_name_ = model.name();
    fingerprint_ = plan.model().fingerprint();
    if (!on_device()) thread_ = std::thread([this] { CommLoop(); });
    if (offloading_) thread_ = std::thread([this] { OffloadLoop(); });
    return Status::Ok();
  }

  // Register (host memory) and RegisterDevice (device memory) in one; `call` names which.
  Status Register(const char* call, const std::string& name, std::span<float> gradient, comm::MemoryKind memory) {
    CUPCAKE_RETURN_IF_ERROR(CheckNotFailed());
    const int i = registered_;
    if (i >= tensor_count())
      return InvalidArgumentError(
          origin_ + ": model.model.tensors: the job registers more gradients than the plan has; got " +
          std::to_string(tensor_count()) + " tensors, expected at least " + std::to_string(i + 1) + " (gradient " +
          Quoted(name) + ", model " + model_name_ + ")");
    Tensor& t = tensors_[static_cast<size_t>(i)];
    if (t.name != name || t.numel != static_cast<int64_t>(gradient.size()))
      return InvalidArgumentError(
          origin_ + ": model.model.tensors[" + std::to_string(i) + "]: does not match the job's gradient " +
          std::to_string(i) + "; got " + Quoted(t.name) + " with " + std::to_string(t.numel) + " elements, expected " +
          Quoted(name) + " with " + std::to_string(gradient.size()) + " elements (model " + model_name_ + ")");
    if (memory != comm_->memory())
      return InvalidArgumentError(std::string(call) + ": gradient " + std::to_string(i) + " (" + Quoted(name) + "): " +
                                  (on_device() ? "host memory for a session on GPU memory; expected RegisterDevice"
                                               : "device memory for a session on host memory; expected Register") +
                                  " (the communicator works on " + (on_device() ? "GPU" : "host") + " memory)");
    if (on_device())
      CUPCAKE_RETURN_IF_ERROR(
          device_->CheckDeviceMemory(gradient.data())
              .WithPrefix(std::string(call) + ": gradient " + std::to_string(i) + " (" + Quoted(name) + ")"));
    t.buffer = gradient;
    ++registered_;
    if (registered_ == tensor_count()) {
      CUPCAKE_RETURN_IF_ERROR(SetWorkBuffers());
      pb::Model job;
      for (const Tensor& r : tensors_) {
        pb::Tensor* pt = job.add_tensors();
        pt->set_name(r.name);
        pt->set_numel(r.numel);
        pt->set_dtype(pb::FLOAT32);
      }
      const std::string fp = ModelFingerprint(job);
      if (fp != fingerprint_)
        return InvalidArgumentError(origin_ + ": model.fingerprint: does not match the registered gradients; got " +
                                    fingerprint_ + ", expected " + fp + " (model " + model_name_ + ")");
    }
    return Status::Ok();
  }

  Status GradientReady(int i) {
    CUPCAKE_RETURN_IF_ERROR(CheckNotFailed());
    CUPCAKE_RETURN_IF_ERROR(CheckRegistered("GradientReady"));
    if (i < 0 || i >= tensor_count())
      return InvalidArgumentError("GradientReady: tensor index out of range; got " + std::to_string(i) +
                                  ", expected 0 <= i < " + std::to_string(tensor_count()) + " (model " + model_name_ +
                                  ")");
    if (accumulating_) return Status::Ok();
    Tensor& t = tensors_[static_cast<size_t>(i)];
    if (t.ready)
      return InvalidArgumentError("GradientReady: tensor " + std::to_string(i) + " (" + Quoted(t.name) +
                                  ") reported twice in one step; got a second call, expected one per step (iteration " +
                                  std::to_string(iteration_) + ")");
    t.ready = true;
    Group& g = groups_[static_cast<size_t>(t.group)];
    if (--g.pending > 0) return Status::Ok();
    // The group is complete: pack and encode on this (the compute) thread, or on the compute
    // stream for a session on GPU memory.
    const int k = t.group;
    if (record_timeline_) g.times.encode_start_us = clock_->NowUs();
    if (on_device()) {  // after the job's work on its stream (the gradients' last kernels)
      std::lock_guard lock(mu_);  // the CPU worker launches collectives too
      const int job_ready = 2 * group_count() + 1 + k;
      auto where = [k] { return "GradientReady: groups[" + std::to_string(k) + "]"; };  // built on failure only
      if (Status s = device_->Record(job_ready, job_stream_); !s.ok()) return Fail(s.WithPrefix(where()));
      bool work_failed = false;
      auto work = [&](void* stream) {
        Status w = g.offloaded ? CopyTensors(g, /*to_host=*/true, stream) : PackAndEncode(g, k, stream);
        work_failed = !w.ok();
        return w;
      };
      Status s = device_->Enqueue(DeviceGraph(g, k, /*decode=*/false), job_ready, k, internal::StreamWork(work));
      if (!s.ok()) return Fail(work_failed ? s : s.WithPrefix(where()));
      if (g.offloaded) {  // the CPU worker encodes it once the copies are done (event k)
        offload_queue_.push_back(k);
        cv_.notify_all();
        return Status::Ok();
      }
      g.stage = Stage::kEncoded;
      if (Status l = LaunchInOrder(); !l.ok()) return Fail(l);
      return Status::Ok();
    }
    if (Status s = PackAndEncode(g, k, nullptr); !s.ok()) return Fail(s);
    if (record_timeline_) g.times.encode_end_us = clock_->NowUs();
    {
      std::lock_guard lock(mu_);
      g.stage = Stage::kEncoded;
    }
    cv_.notify_all();
    return Status::Ok();
  }

  Status Synchronize() {
    CUPCAKE_RETURN_IF_ERROR(CheckNotFailed());
    CUPCAKE_RETURN_IF_ERROR(CheckRegistered("Synchronize"));
    if (accumulating_) return Status::Ok();
    if (on_device()) {
      CUPCAKE_RETURN_IF_ERROR(SynchronizeDevice());
    } else {
      const double start_us = clock_->NowUs();
      for (size_t k = 0; k < groups_.size(); ++k) {
        std::unique_lock lock(mu_);
        while (groups_[k].stage != Stage::kExchanged && comm_status_.ok()) {
          if (clock_->NowUs() - start_us >= timeout_us_) {
            lock.unlock();
            return Fail(TimeoutError(static_cast<int>(k)));
          }
          cv_.wait_for(lock, kPoll);
        }
        if (!comm_status_.ok()) return Fail(comm_status_.WithPrefix("Synchronize"));
        lock.unlock();
        if (record_timeline_) groups_[k].times.decode_start_us = clock_->NowUs();
        if (Status s = Decode(static_cast<int>(k), nullptr); !s.ok()) return Fail(s);
        if (record_timeline_) groups_[k].times.decode_end_us = clock_->NowUs();
      }
    }
    for (Tensor& t : tensors_) t.ready = false;
    {
      std::lock_guard lock(mu_);
      for (Group& g : groups_) {
        g.pending = g.last - g.first + 1;
        g.stage = Stage::kIdle;
      }
    }
    launched_ = 0;
    ++iteration_;
    return Status::Ok();
  }

  Status SetAccumulating(bool accumulating) {
    CUPCAKE_RETURN_IF_ERROR(CheckNotFailed());
    for (const Tensor& t : tensors_)
      if (t.ready)
        return FailedPreconditionError("SetAccumulating: called in the middle of a step; tensor " + Quoted(t.name) +
                                       " is already ready, expected a call between Synchronize() and the next "
                                       "GradientReady");
    accumulating_ = accumulating;
    return Status::Ok();
  }

  int tensor_count() const { return static_cast<int>(tensors_.size()); }
  int group_count() const { return static_cast<int>(groups_.size()); }
  int registered() const { return registered_; }
  int rank() const { return comm_->rank(); }
  int world_size() const { return comm_->size(); }
  int64_t fusion_bytes() const {
    int64_t bytes = 0;
    for (const Group& g : groups_) bytes += g.fusion.size_bytes();
    return bytes;
  }
  uint64_t iteration() const { return iteration_; }
  StatusOr<std::vector<GroupTimeline>> Timeline() const {
    if (!record_timeline_)
      return FailedPreconditionError("Timeline: not recorded; expected SessionOptions::record_timeline = true");
    if (on_device())
      return FailedPreconditionError("Timeline: not recorded on GPU memory yet; expected a session on host memory");
    if (iteration_ == 0) return FailedPreconditionError("Timeline: no step synchronized yet");
    std::vector<GroupTimeline> out;
    out.reserve(groups_.size());
    for (const Group& g : groups_) out.push_back(g.times);  // complete: the last Synchronize saw every group exchanged
    return out;
  }

 private:
  // The communication thread: the groups' collectives in group order, one step after another.
  void CommLoop() {
    std::unique_lock lock(mu_);
    size_t k = 0;
    while (true) {
      cv_.wait(lock, [&] { return stop_ || groups_[k].stage == Stage::kEncoded; });
      if (stop_) return;
      Group& g = groups_[k];
      in_collective_ = true;
      lock.unlock();
      if (record_timeline_) g.times.comm_start_us = clock_->NowUs();
      Status s = Collective(g);
      if (record_timeline_) g.times.comm_end_us = clock_->NowUs();
      lock.lock();
      in_collective_ = false;
      if (!s.ok()) {
        comm_status_ = s.WithPrefix(CollectiveName(static_cast<int>(k)));
        cv_.notify_all();
        return;
      }
      g.stage = Stage::kExchanged;
      cv_.notify_all();
      k = (k + 1) % groups_.size();
    }
  }

  bool on_device() const { return comm_->memory() == comm::MemoryKind::kDevice; }

  // Once every gradient is registered: each group works on its registered memory when that is
  // one buffer (one tensor, or buffers adjacent in plan order), else on a fusion buffer.
  Status SetWorkBuffers() {
    const kernels::Backend backend = on_device() ? kernels::Backend::kCuda : kernels::Backend::kCpu;
    for (Group& g : groups_) {
      const Tensor& head = tensors_[static_cast<size_t>(g.first)];
      bool adjacent = true;
      for (int j = g.first + 1; j <= g.last && adjacent; ++j)
        adjacent = tensors_[static_cast<size_t>(j)].buffer.data() ==
                   tensors_[static_cast<size_t>(j - 1)].buffer.data() + tensors_[static_cast<size_t>(j - 1)].numel;
      if (!adjacent) {
        CUPCAKE_ASSIGN_OR_RETURN(g.fusion, AllocateZeroed(backend, 4 * g.numel));
        std::vector<kernels::FusionSegment> segments;
        for (int j = g.first; j <= g.last; ++j) {
          const Tensor& member = tensors_[static_cast<size_t>(j)];
          segments.push_back({member.buffer.data(), member.numel});
        }
        CUPCAKE_ASSIGN_OR_RETURN(g.fusion_table, kernels::MakeFusionTable(backend, segments, g.fusion.as<float>()));
      }
      g.work = adjacent ? head.buffer.data() : g.fusion.as<float>();
    }
    return Status::Ok();
  }

  std::string CollectiveName(int k) const {
    const Group& g = groups_[static_cast<size_t>(k)];
    return "groups[" + std::to_string(k) + "] " + (g.zen ? "zen" : g.allreduce ? "allreduce" : "allgather");
  }

  // Group k's collective: in place on its floats (lossless groups), else payload -> received.
  // Host communicators finish it here; device ones enqueue it on their stream.
  Status Collective(Group& g) {
    if (g.hierarchical != nullptr) return HierarchicalCollective(g);
    if (g.zen) return ZenCollective(g);
    if (g.in_place) return comm_->Allreduce(g.work, g.work, g.numel, comm::DataType::kFloat32, comm::ReduceOp::kSum);
    if (g.allreduce)
      return comm_->Allreduce(g.payload.data(), g.received.data(), g.reduce_count, g.reduce_type, comm::ReduceOp::kSum);
    return comm_->Allgather(g.payload.data(), g.received.data(), g.payload.size_bytes());
  }

  // A zen group on host memory: the encoded payload viewed as a sparse vector (no copy) and
  // summed over the ranks into `zen_sum`. ZenAllreduce allocates its buffers on every call.
  // On GPU memory: ZenAllreduceDevice writes the mean straight into the group's floats (after
  // the encode, on the communicator's stream) and returns when it is there: the sizes of its
  // exchanges reach the host, so this call waits for the encode and the exchange.
  Status ZenCollective(Group& g) {
    if (on_device()) {
      const int64_t k = g.payload.size_bytes() / static_cast<int64_t>(sizeof(kernels::zen::Pair));
      const std::byte* payload = g.payload.as<std::byte>();
      CUPCAKE_ASSIGN_OR_RETURN(
          const int64_t union_size,
          comm::ZenAllreduceDevice(*comm_, reinterpret_cast<const uint32_t*>(payload + 4 * k),
                                   reinterpret_cast<const float*>(payload), k, {g.numel, g.zen_seed},
                                   static_cast<float>(comm_->size()), g.work, *zen_steps_));
      if (record_timeline_) g.times.zen_union = union_size;
      return Status::Ok();
    }
    kernels::zen::SparseView view = g.nonzeros.view();
    if (!g.nonzero_codec) {
      CUPCAKE_ASSIGN_OR_RETURN(view, kernels::zen::TopkPayloadView(
                                         {g.payload.as<std::byte>(), static_cast<size_t>(g.payload.size_bytes())},
                                         g.payload.size_bytes() / static_cast<int64_t>(sizeof(kernels::zen::Pair))));
    }
    CUPCAKE_ASSIGN_OR_RETURN(g.zen_sum, comm::ZenAllreduce(*comm_, view, {g.numel, g.zen_seed}));
    if (record_timeline_) g.times.zen_union = static_cast<int64_t>(g.zen_sum.indices.size());
    return Status::Ok();
  }

  // A hierarchical group (docs/MODEL.md, v2): 1. the group, zero-padded, is reduce-scattered
  // in the node (each rank gets the node's sum of its shard); 2. the shard crosses the nodes:
  // summed as fp32, or encoded, exchanged with the codec's collective and decoded (the mean over
  // the nodes); 3. the shards are allgathered in the node into `padded`. On GPU memory each step
  // is queued on its communicator's stream (the intra and inter communicators have their own)
  // after the previous step's (Hop), the codec on the inter one's; it starts after the encode
  // event on the session communicator's stream and ends there.
  Status HierarchicalCollective(Group& g) {
    const int devices = intra_->size();
    float* padded = g.padded.as<float>();
    float* shard = g.shard_floats.as<float>();
    void* main = comm_->stream();  // nullptr on host memory, as the others
    void* in_node = intra_->stream();
    void* across = inter_->stream();
    if (on_device()) {
      CUPCAKE_RETURN_IF_ERROR(device_->Copy(padded, g.work, 4 * g.numel, main));
      CUPCAKE_RETURN_IF_ERROR(device_->Zero(padded + g.numel, 4 * (g.shard * devices - g.numel), main));
    } else {
      std::copy(g.work, g.work + g.numel, padded);
      std::fill(padded + g.numel, padded + g.shard * devices, 0.0f);
    }
    CUPCAKE_RETURN_IF_ERROR(Hop(main, in_node));
    CUPCAKE_RETURN_IF_ERROR(
        intra_->ReduceScatter(padded, shard, g.shard, comm::DataType::kFloat32, comm::ReduceOp::kSum));
    CUPCAKE_RETURN_IF_ERROR(Hop(in_node, across));
    const std::span<float> shard_span(shard, static_cast<size_t>(g.shard));
    if (g.compressor == nullptr) {
      CUPCAKE_RETURN_IF_ERROR(inter_->Allreduce(shard, shard, g.shard, comm::DataType::kFloat32, comm::ReduceOp::kSum));
    } else {
      CUPCAKE_RETURN_IF_ERROR(g.compressor->Encode(
          shard_span, {g.state.as<float>(), static_cast<size_t>(g.state.size_bytes() / 4)}, iteration_,
          {g.payload.as<std::byte>(), static_cast<size_t>(g.payload.size_bytes())}, across));
      if (g.allreduce)
        CUPCAKE_RETURN_IF_ERROR(inter_->Allreduce(g.payload.data(), g.received.data(), g.reduce_count, g.reduce_type,
                                                  comm::ReduceOp::kSum));
      else
        CUPCAKE_RETURN_IF_ERROR(inter_->Allgather(g.payload.data(), g.received.data(), g.payload.size_bytes()));
      CUPCAKE_RETURN_IF_ERROR(g.compressor->Decode(
          std::span<const std::byte>(g.received.as<std::byte>(), static_cast<size_t>(g.received.size_bytes())),
          shard_span, iteration_, across));
    }
    CUPCAKE_RETURN_IF_ERROR(Hop(across, in_node));
    CUPCAKE_RETURN_IF_ERROR(intra_->Allgather(shard, padded, 4 * g.shard));
    return Hop(in_node, main);
  }

  // Work queued later on stream `to` waits for the work queued so far on `from` (GPU memory;
  // nothing when they are one stream, as on host memory). One event serves every hop: a wait
  // holds the record it was queued after, so the event can be recorded again at once.
  Status Hop(void* from, void* to) {
    if (from == to) return Status::Ok();
    const int hop = 3 * group_count() + 1;
    CUPCAKE_RETURN_IF_ERROR(device_->Record(hop, from));
    return device_->StreamWait(to, hop);
  }

  // Group k's pack (when packed) and encode (unless in place or hierarchical, which encodes the
  // shard in Collective) on `stream` (nullptr: host memory).
  Status PackAndEncode(Group& g, int k, void* stream) {
    if (g.packed()) {
      if (Status s = g.fusion_table->Pack(stream); !s.ok())
        return s.WithPrefix("GradientReady: groups[" + std::to_string(k) + "] pack");
    }
    if (g.nonzero_codec) {
      kernels::zen::CollectNonzeros(g.work_span(), g.nonzeros);
      return Status::Ok();
    }
    if (g.in_place || g.hierarchical != nullptr) return Status::Ok();
    Status s = g.compressor->Encode(g.work_span(), {g.state.as<float>(), static_cast<size_t>(g.state.size_bytes() / 4)},
                                    iteration_,
                                    {g.payload.as<std::byte>(), static_cast<size_t>(g.payload.size_bytes())}, stream);
    if (!s.ok()) return s.WithPrefix("GradientReady: groups[" + std::to_string(k) + "] encode");
    return Status::Ok();
  }

  // Device sessions: the graph that holds group k's encode (or decode), or -1 to queue it
  // directly: graphs off, or kernels that take the iteration (their arguments change each step).
  int DeviceGraph(const Group& g, int k, bool decode) const {
    // A zen group's decode is at most an unpack; a hierarchical group's encode only a pack; an
    // offloaded group's copies are queued directly.
    if (!device_graphs_ || (decode && g.zen) || g.hierarchical != nullptr || g.offloaded) return -1;
    const kernels::CompressorKind kind = g.compressor->layout().kind;
    const bool keyed =
        kind == kernels::CompressorKind::kRandk ||
        (!decode && (kind == kernels::CompressorKind::kQsgd || kind == kernels::CompressorKind::kTerngrad));
    if (keyed) return -1;
    return decode ? group_count() + k : k;
  }

  // Group k's decode after its collective, into the registered buffers (on the compute stream
  // for a device session). Lossless groups: the divide by W, fused with the unpack when packed
  // (one kernel on the device), else in place (host: a loop; device: fp32's Decode, the same
  // divide as an elementwise kernel). Otherwise the compressor's Decode into the group's floats,
  // then the unpack. `stream`: the compute stream (device sessions) or nullptr.
  Status Decode(int k, void* stream) {
    Group& g = groups_[static_cast<size_t>(k)];
    // Messages are built only on failure: the step path allocates nothing.
    auto where = [k](const char* stage) { return "Synchronize: groups[" + std::to_string(k) + "] " + stage; };
    if (g.hierarchical != nullptr) {  // the sums (fp32) or the means over the nodes, to the mean over all ranks
      if (!on_device()) {
        DivideInto(g.padded.as<float>(), g.work, g.numel, g.divisor);
      } else if (Status d = g.divide->Decode({g.padded.as<std::byte>(), static_cast<size_t>(4 * g.numel)},
                                             g.work_span(), iteration_, stream);
                 !d.ok()) {
        return d.WithPrefix(where("decode"));
      }
      if (g.packed()) {
        if (Status c = g.fusion_table->Unpack(stream); !c.ok()) return c.WithPrefix(where("unpack"));
      }
      return Status::Ok();
    }
    if (g.zen) {  // the mean at the union's indices, zeros elsewhere (on GPU memory: already there)
      if (!on_device()) ScatterMean(g.zen_sum, static_cast<float>(comm_->size()), g.work_span());
      if (g.packed()) {
        if (Status c = g.fusion_table->Unpack(stream); !c.ok()) return c.WithPrefix(where("unpack"));
      }
      return Status::Ok();
    }
    if (g.in_place && g.packed()) {
      if (Status s = g.fusion_table->UnpackDivided(comm_->size(), stream); !s.ok())
        return s.WithPrefix(where("unpack"));
      return Status::Ok();
    }
    if (g.in_place && !on_device()) {
      DivideInto(g.work, g.work, g.numel, static_cast<float>(comm_->size()));
      return Status::Ok();
    }
    const std::span<const std::byte> input =
        g.in_place
            ? std::span<const std::byte>(reinterpret_cast<const std::byte*>(g.work), static_cast<size_t>(4 * g.numel))
            : std::span<const std::byte>(g.received.as<std::byte>(), static_cast<size_t>(g.received.size_bytes()));
    Status s = g.compressor->Decode(input, g.work_span(), iteration_, stream);
    if (!s.ok()) return s.WithPrefix(where("decode"));
    if (g.packed()) {
      if (Status c = g.fusion_table->Unpack(stream); !c.ok()) return c.WithPrefix(where("unpack"));
    }
    return Status::Ok();
  }

  // Device sessions: enqueue the collectives of the encoded groups in group order (every rank
  // launches the same sequence), each after its encode (event k) and marked by event K + k; an
  // offloaded group's payload is copied in from the host before and what it receives out after.
  // With mu_ held (the job's thread and the CPU worker both call it).
  Status LaunchInOrder() {
    const int count = group_count();
    void* stream = comm_->stream();
    while (launched_ < count && groups_[static_cast<size_t>(launched_)].stage == Stage::kEncoded) {
      const int k = launched_;
      Group& g = groups_[static_cast<size_t>(k)];
      Status s = device_->StreamWait(stream, k);
      if (s.ok() && g.offloaded) s = device_->Copy(g.payload.data(), g.host_payload, g.payload.size_bytes(), stream);
      if (s.ok()) s = Collective(g);
      if (s.ok() && g.offloaded) s = device_->Copy(g.host_received, g.received.data(), g.received.size_bytes(), stream);
      if (s.ok()) s = device_->Record(count + k, stream);
      if (!s.ok()) return s.WithPrefix("GradientReady: " + CollectiveName(k));
      g.stage = Stage::kExchanged;  // enqueued; event K + k says when it is done
      ++launched_;
    }
    return Status::Ok();
  }

  // Device sessions: 1. wait until every collective is enqueued (every tensor ready, every
  // offloaded encode done); 2. queue each on-device group's decode and unpack on the compute
  // stream after its collective's event; 3. decode the offloaded groups on this thread in group
  // order, each once its exchange is done, queueing the copies back; 4. wait, polling events
  // against the clock so a missing peer gives DeadlineExceeded.
  Status SynchronizeDevice() {
    const double start_us = clock_->NowUs();
    const int count = group_count();
    auto timed_out = [&] { return clock_->NowUs() - start_us >= timeout_us_; };
    while (true) {
      {
        std::lock_guard lock(mu_);
        if (!offload_status_.ok()) return Fail(offload_status_);
        if (launched_ == count) break;
        if (timed_out()) return Fail(TimeoutError(launched_));
      }
      std::this_thread::sleep_for(kPoll);
    }
    // A lost peer never completes the collectives: NCCL's asynchronous error ends the wait.
    auto peer_failed = [&] { return comm_->AsyncError().WithPrefix("Synchronize"); };
    // Until event `event` is done: Ok, or the session's failure.
    auto wait_for = [&](int event) -> Status {
      while (true) {
        StatusOr<bool> done = device_->Done(event);
        if (!done.ok()) return Fail(done.status().WithPrefix("Synchronize"));
        if (*done) return Status::Ok();
        if (Status s = peer_failed(); !s.ok()) return Fail(s);
        if (timed_out()) {
          int stuck = 0;
          while (stuck < count - 1) {
            StatusOr<bool> d = device_->Done(count + stuck);
            if (!d.ok() || !*d) break;
            ++stuck;
          }
          return Fail(TimeoutError(stuck));
        }
        std::this_thread::yield();
      }
    };
    for (int k = 0; k < count; ++k) {
      if (groups_[static_cast<size_t>(k)].offloaded) continue;
      bool work_failed = false;
      auto work = [&](void* stream) {
        Status w = Decode(k, stream);
        work_failed = !w.ok();
        return w;
      };
      Status s = device_->Enqueue(DeviceGraph(groups_[static_cast<size_t>(k)], k, /*decode=*/true), count + k, -1,
                                  internal::StreamWork(work));
      if (!s.ok()) return Fail(work_failed ? s : s.WithPrefix("Synchronize"));
    }
    for (int k = 0; k < count; ++k) {
      Group& g = groups_[static_cast<size_t>(k)];
      if (!g.offloaded) continue;
      CUPCAKE_RETURN_IF_ERROR(wait_for(count + k));
      Status s = g.compressor->Decode({g.host_received, static_cast<size_t>(g.received.size_bytes())},
                                      {g.host, static_cast<size_t>(g.numel)}, iteration_, nullptr);
      if (!s.ok()) return Fail(s.WithPrefix("Synchronize: groups[" + std::to_string(k) + "] decode"));
      auto work = [&](void* stream) { return CopyTensors(g, /*to_host=*/false, stream); };
      s = device_->Enqueue(-1, -1, -1, internal::StreamWork(work));
      if (!s.ok()) return Fail(s.WithPrefix("Synchronize"));
    }
    if (Status s = device_->Record(2 * count, device_->compute()); !s.ok()) return Fail(s.WithPrefix("Synchronize"));
    return wait_for(2 * count);
  }

  // An offloaded group's tensors, one copy each, between their buffers and the group's pinned
  // `host` floats (to_host: into it), on `stream`.
  Status CopyTensors(Group& g, bool to_host, void* stream) {
    int64_t at = 0;
    for (int i = g.first; i <= g.last; ++i) {
      const Tensor& t = tensors_[static_cast<size_t>(i)];
      float* host = g.host + at;
      CUPCAKE_RETURN_IF_ERROR(to_host ? device_->Copy(host, t.buffer.data(), 4 * t.numel, stream)
                                      : device_->Copy(t.buffer.data(), host, 4 * t.numel, stream));
      at += t.numel;
    }
    return Status::Ok();
  }

  // The CPU worker of a session on GPU memory with offloaded groups (docs/MODEL.md v2: one
  // thread, serialized with itself): encodes each offloaded group once its copy to the host is
  // done (event k), then launches the collectives next in group order. The first error ends it
  // into offload_status_, which Synchronize reports.
  void OffloadLoop() {
    std::unique_lock lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || !offload_queue_.empty(); });
      if (stop_) return;
      const int k = offload_queue_.front();
      offload_queue_.pop_front();
      Group& g = groups_[static_cast<size_t>(k)];
      const uint64_t iteration = iteration_;
      lock.unlock();
      Status s = device_->Wait(k);
      if (s.ok()) {
        s = g.compressor->Encode({g.host, static_cast<size_t>(g.numel)},
                                 {g.state.as<float>(), static_cast<size_t>(g.state.size_bytes() / 4)}, iteration,
                                 {g.host_payload, static_cast<size_t>(g.payload.size_bytes())}, nullptr);
      }
      lock.lock();
      if (stop_) return;
      if (s.ok()) {
        g.stage = Stage::kEncoded;
        s = LaunchInOrder();
      } else {
        s = s.WithPrefix("GradientReady: groups[" + std::to_string(k) + "] encode (offloaded)");
      }
      if (!s.ok()) {
        offload_status_ = s;
        return;
      }
    }
  }

  Status TimeoutError(int group) const {
    std::string missing;
    int count = 0;
    for (int i = 0; i < tensor_count(); ++i) {
      if (tensors_[static_cast<size_t>(i)].ready) continue;
      if (count < 10)
        missing += (count ? ", " : "") + std::to_string(i) + " (" + Quoted(tensors_[static_cast<size_t>(i)].name) + ")";
      ++count;
    }
    if (count > 10) missing += " and " + std::to_string(count - 10) + " more";
    const std::string where = " (iteration " + std::to_string(iteration_) + ", rank " + std::to_string(comm_->rank()) +
                              " on " + comm_->host() + ")";
    if (count > 0)
      return DeadlineExceededError("Synchronize: gradients never became ready; got no GradientReady within " +
                                   Seconds(timeout_us_) + " for " + std::to_string(count) + " of " +
                                   std::to_string(tensor_count()) + " tensors: " + missing + where);
    return DeadlineExceededError(
        "Synchronize: " + CollectiveName(group) + " did not finish within " + Seconds(timeout_us_) +
        "; every gradient of this rank is ready, so a peer is missing gradients or has died" + where);
  }

  Status Fail(Status s) {
    failed_ = s;
    return s;
  }
  Status CheckNotFailed() const {
    if (failed_.ok()) return Status::Ok();
    return FailedPreconditionError("session failed earlier: " + failed_.message());
  }
  Status CheckRegistered(const char* call) const {
    if (registered_ == tensor_count()) return Status::Ok();
    return FailedPreconditionError(std::string(call) + ": gradients not all registered; got " +
                                   std::to_string(registered_) + ", expected " + std::to_string(tensor_count()) +
                                   " (model " + model_name_ + ")");
  }

  std::string origin_;
  std::unique_ptr<comm::Communicator> comm_;
  // Hierarchical groups: the ranks of this rank's node, and this local rank across the nodes.
  std::unique_ptr<comm::Communicator> intra_, inter_;
  std::unique_ptr<kernels::zen::DeviceSteps> zen_steps_;  // zen groups on GPU memory, one at a time
  std::unique_ptr<Clock> owned_clock_;
  Clock* clock_ = nullptr;
  double timeout_us_;
  std::string model_name_;
  std::string fingerprint_;
  std::vector<Tensor> tensors_;
  std::vector<Group> groups_;
  // Device sessions only (declared after the groups, so destroyed before their buffers: its
  // destructor waits for the compute stream).
  std::unique_ptr<internal::DeviceStreams> device_;
  int launched_ = 0;  // device sessions: collectives enqueued this step, in group order
  void* job_stream_;  // device sessions: where the job computes its gradients
  const bool record_timeline_;
  const bool device_graphs_;
  int registered_ = 0;
  uint64_t iteration_ = 0;
  bool accumulating_ = false;
  Status failed_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by mu_
  bool in_collective_ = false;  // guarded by mu_
  Status comm_status_;  // guarded by mu_
  // Device sessions with offloaded groups: the CPU worker's queue and its first error.
  bool offloading_ = false;
  std::deque<int> offload_queue_;  // guarded by mu_
  Status offload_status_;  // guarded by mu_
  std::thread thread_;
};

Session::Session(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Session::~Session() = default;

StatusOr<std::unique_ptr<Session>> Session::Create(const std::string& plan_path,
                                                   std::unique_ptr<comm::Communicator> communicator,
                                                   const SessionOptions& options) {
  SessionOptions o = options;
  if (o.origin.empty()) o.origin = plan_path;
  StatusOr<pb::Plan> plan = ReadPlanFile(plan_path);
  if (!plan.ok()) {
    if (communicator == nullptr) return plan.status();
    return internal::AgreeOnPlan(*communicator, {o.origin, "", plan.status()});
  }
  return Create(*plan, std::move(communicator), o);
}

StatusOr<std::unique_ptr<Session>> Session::Create(const pb::Plan& plan,
                                                   std::unique_ptr<comm::Communicator> communicator,
                                                   const SessionOptions& options) {
  const std::string origin = options.origin.empty() ? "plan" : options.origin;
  if (communicator == nullptr) return InvalidArgumentError(origin + ": no communicator; expected one");
  // Every rank takes part in the plan agreement, also one whose plan is invalid (AgreeOnPlan).
  if (Status valid = ValidatePlan(plan, origin); !valid.ok())
    return internal::AgreeOnPlan(*communicator, {origin, "", valid});
  auto impl = std::make_unique<Impl>(origin, std::move(communicator), options);
  CUPCAKE_RETURN_IF_ERROR(impl->Init(plan, options));
  return std::unique_ptr<Session>(new Session(std::move(impl)));
}

Status Session::Register(const std::string& name, std::span<float> gradient) {
  return impl_->Register("Register", name, gradient, comm::MemoryKind::kHost);
}
Status Session::RegisterDevice(const std::string& name, float* device_gradient, int64_t numel) {
  if (numel < 0 || (device_gradient == nullptr && numel > 0))
    return InvalidArgumentError("RegisterDevice: gradient " + std::to_string(impl_->registered()) + " ('" + name +
                                "'): bad arguments; got numel " + std::to_string(numel) +
                                ", expected a device buffer and numel >= 0");
  return impl_->Register("RegisterDevice", name, std::span<float>(device_gradient, static_cast<size_t>(numel)),
                         comm::MemoryKind::kDevice);
}
int Session::registered() const { return impl_->registered(); }
int Session::tensor_count() const { return impl_->tensor_count(); }
int Session::group_count() const { return impl_->group_count(); }
int Session::rank() const { return impl_->rank(); }
int Session::world_size() const { return impl_->world_size(); }
int64_t Session::fusion_bytes() const { return impl_->fusion_bytes(); }
Status Session::GradientReady(int i) { return impl_->GradientReady(i); }
Status Session::Synchronize() { return impl_->Synchronize(); }
Status Session::SetAccumulating(bool accumulating) { return impl_->SetAccumulating(accumulating); }
uint64_t Session::iteration() const { return impl_->iteration(); }
StatusOr<std::vector<GroupTimeline>> Session::Timeline() const { return impl_->Timeline(); }

}  // namespace cupcake::runtime
