#include "layout.h"

#include <algorithm>

#include "cupcake/kernels/zen.h"
#include "cupcake/proto/catalogue.h"
#include "cupcake/proto/fingerprint.h"
#include "cupcake/proto/ladder_io.h"
#include "cupcake/proto/names.h"
#include "cupcake/runtime/session.h"

namespace cupcake::runtime::internal {
namespace {

std::string Quoted(const std::string& s) { return "'" + s + "'"; }

class Problems {
 public:
  explicit Problems(std::string origin) : origin_(std::move(origin)) {}
  void Add(const std::string& field, const std::string& text) {
    lines_.push_back(origin_ + ": " + field + ": " + text);
  }
  Status ToStatus() const {
    if (lines_.empty()) return Status::Ok();
    std::string text;
    for (const auto& line : lines_) text += (text.empty() ? "" : "\n") + line;
    return InvalidArgumentError(text);
  }

 private:
  std::string origin_;
  std::vector<std::string> lines_;
};

// The plan against the job: world size, compressor, device, model fingerprint, dtypes.
void CheckPlanAgainstJob(const pb::Plan& plan, const LayoutContext& c, Problems& problems, SessionLayout& out) {
  const pb::Model& model = plan.model().model();
  if (plan.world_size() != c.world_size)
    problems.Add("world_size", "does not match the job; got " + std::to_string(plan.world_size()) + ", expected " +
                                   std::to_string(c.world_size) + " (ranks in the communicator)");
  if (!c.compressor.empty() && plan.compressor().name() != c.compressor)
    problems.Add("compressor.name", "does not match the job; got " + Quoted(plan.compressor().name()) + ", expected " +
                                        Quoted(c.compressor));
  if (c.device_memory && plan.device() != pb::GPU)
    problems.Add("device", "does not match the communicator; got " + std::string(Name(plan.device())) +
                               ", expected gpu (the communicator works on GPU memory)");
  if (!c.model_fingerprint.empty() && plan.model().fingerprint() != c.model_fingerprint)
    problems.Add("model.fingerprint", "plan for another model; got " + plan.model().fingerprint() + " (model " +
                                          model.name() + "), expected " + c.model_fingerprint + " (the job's model)");
  int64_t offset = 0;
  for (int i = 0; i < model.tensors_size(); ++i) {
    const pb::Tensor& t = model.tensors(i);
    if (t.dtype() != pb::FLOAT32)
      problems.Add("model.model.tensors[" + std::to_string(i) + "].dtype",
                   "not supported by the runtime; got " + std::string(Name(t.dtype())) + ", expected float32 (tensor " +
                       Quoted(t.name()) + ")");
    out.tensors.push_back(
        TensorLayout{t.name(), t.numel(), offset, 0, std::vector<int64_t>(t.shape().begin(), t.shape().end())});
    offset += t.numel();
  }
  out.total_elements = offset;
}

// The scheme of group k and where it runs; false (with a problem added) when this runtime does
// not execute it.
bool ResolveScheme(const pb::Plan& plan, int k, const LayoutContext& c, Problems& problems, const SchemeInfo*& scheme,
                   bool& offloaded) {
  const pb::Group& g = plan.groups(k);
  const std::string f = "groups[" + std::to_string(k) + "]";
  // Options plans (docs/MODEL.md, v2): every scheme on the plan's device. Anything else is
  // refused rather than run as something the plan did not say.
  const std::string& scheme_name = g.options().scheme();
  scheme = scheme_name.empty() ? nullptr : FindScheme(scheme_name);
  if (!scheme_name.empty() && scheme == nullptr) {
    problems.Add(f + ".options.scheme",
                 "unknown scheme; got " + Quoted(scheme_name) + ", expected one of " + SchemeNames());
    return false;
  }
  // A v1 group (no scheme) runs on the plan's device. A group on the cpu in a session on GPU
  // memory is offloaded (flat schemes).
  offloaded = scheme != nullptr && g.options().device() != plan.device();
  if (offloaded && !(c.device_memory && g.options().device() == pb::CPU)) {
    problems.Add(f + ".options.device", "offload to the CPU is not executed by this runtime yet; got " +
                                            std::string(Name(g.options().device())) + ", expected " +
                                            std::string(Name(plan.device())) +
                                            " (the plan's device; plan with --search-space fusion)");
    return false;
  }
  if (offloaded && (scheme->hierarchical || scheme->zen || scheme->codec == Codec::kLowRank)) {
    problems.Add(f + ".options.device",
                 "offload of a hierarchical, zen or powersgd group is not executed by this runtime yet; got " +
                     Quoted(scheme_name) + " on the cpu, expected a flat scheme");
    return false;
  }
  if (scheme != nullptr && FindCompressor(plan.compressor().name()) == nullptr) {
    problems.Add("compressor.name", "unknown compressor; got " + Quoted(plan.compressor().name()));
    return false;
  }
  return true;
}

// The compressor config of group k (the shard's for hierarchical schemes).
kernels::CompressorConfig GroupConfig(const pb::Plan& plan, int k, const SchemeInfo* scheme, int devices_per_node,
                                      const LayoutContext& c) {
  const pb::CompressorSpec& spec = plan.compressor();
  const pb::Group& g = plan.groups(k);
  // The non-zero and PowerSGD codecs are no compressors: their groups are laid out as fp32 (no
  // compressor state, no single payload).
  const bool nonzero_codec =
      scheme != nullptr && (scheme->codec == Codec::kNonzeros || scheme->codec == Codec::kLowRank);
  const bool compress =
      scheme != nullptr ? scheme->codec != Codec::kNone : g.options().compress() || spec.name() == "fp32";
  kernels::CompressorConfig config;
  // The non-zero codec is no compressor: its group is laid out as fp32 (no state, no payload).
  config.name = nonzero_codec       ? "fp32"
                : scheme != nullptr ? std::string(CodecCompressor(*scheme, *FindCompressor(spec.name())).name)
                                    : (compress ? spec.name() : "fp32");
  config.memory = scheme != nullptr ? (scheme->codec == Codec::kCompressor ? spec.memory() : "none")
                                    : (compress ? spec.memory() : "none");
  config.n = scheme != nullptr ? ShardElements(*scheme, g.numel(), devices_per_node) : g.numel();
  config.world_size = c.world_size / devices_per_node;
  config.ratio = spec.ratio() > 0 ? spec.ratio() : kDefaultRatio;
  const CompressorInfo* info = FindCompressor(config.name);
  const bool allreduce = info != nullptr && info->collective == pb::ALLREDUCE;
  config.seed = GroupSeed(spec.seed(), k, c.rank, allreduce);
  return config;
}

// The PowerSGD codec of group k: its tensors' shapes, the plan's rank, one seed for every rank.
kernels::powersgd::Config PowerSgdConfig(const pb::Plan& plan, int k, const SchemeInfo& scheme,
                                         const LayoutContext& c) {
  const pb::Group& g = plan.groups(k);
  kernels::powersgd::Config config;
  for (int i = g.first_tensor(); i <= g.last_tensor(); ++i) {
    const pb::Tensor& t = plan.model().model().tensors(i);
    config.shapes.push_back(t.shape().empty() ? std::vector<int64_t>{t.numel()}
                                              : std::vector<int64_t>(t.shape().begin(), t.shape().end()));
  }
  config.rank = plan.compressor().rank();
  config.batched = scheme.batched;
  config.world_size = c.world_size;
  config.seed = GroupSeed(plan.compressor().seed(), k, c.rank, /*allreduce=*/true);
  return config;
}

// Everything about group k once its scheme and codec are known.
GroupLayout MakeGroup(const pb::Plan& plan, int k, const SchemeInfo* scheme, bool offloaded, int devices_per_node,
                      const kernels::CompressorConfig& config, const kernels::CompressorLayout& codec,
                      const LayoutContext& c) {
  const pb::Group& pg = plan.groups(k);
  GroupLayout g;
  g.index = k;
  g.first = pg.first_tensor();
  g.last = pg.last_tensor();
  g.numel = pg.numel();
  g.scheme = scheme == nullptr                   ? SchemeKind::kFlat
             : scheme->hierarchical              ? SchemeKind::kHierarchical
             : scheme->codec == Codec::kLowRank  ? SchemeKind::kPowerSgd
             : !scheme->zen                      ? SchemeKind::kFlat
             : scheme->codec == Codec::kNonzeros ? SchemeKind::kZenSparse
             : scheme->codec == Codec::kLowRank  ? SchemeKind::kPowerSgd
                                                 : SchemeKind::kZen;
  g.place = offloaded ? CodecPlace::kOffloaded : c.device_memory ? CodecPlace::kDevice : CodecPlace::kHost;
  g.config = config;
  g.codec = codec;
  g.in_place = g.scheme == SchemeKind::kFlat && !offloaded && codec.kind == kernels::CompressorKind::kFp32 &&
               codec.state_floats == 0;
  g.reduce_type = codec.kind == kernels::CompressorKind::kFp16 ? comm::DataType::kFloat16 : comm::DataType::kFloat32;
  g.reduce_count = codec.payload_bytes / comm::DataTypeBytes(g.reduce_type);
  if (g.scheme == SchemeKind::kHierarchical) {
    g.devices_per_node = devices_per_node;
    g.shard = config.n;
    g.shard_codec = scheme->codec != Codec::kNone;
    g.divisor = static_cast<float>(g.shard_codec ? devices_per_node : c.world_size);
  }
  if (g.scheme == SchemeKind::kZen || g.scheme == SchemeKind::kZenSparse)
    g.zen_seed = static_cast<uint32_t>(GroupSeed(plan.compressor().seed(), k, c.rank, /*allreduce=*/true));
  if (g.scheme == SchemeKind::kPowerSgd) g.powersgd = PowerSgdConfig(plan, k, *scheme, c);
  if (g.scheme == SchemeKind::kZenSparse) {
    const int64_t expected = pg.payload_bytes() / static_cast<int64_t>(sizeof(kernels::zen::Pair));
    g.nonzero_capacity = std::min(g.numel, 2 * expected);
  }
  return g;
}

// Group k's layout appended to `out`, or a problem.
void AddGroup(const pb::Plan& plan, int k, const LayoutContext& c, Problems& problems, SessionLayout& out) {
  const std::string f = "groups[" + std::to_string(k) + "]";
  const SchemeInfo* scheme = nullptr;
  bool offloaded = false;
  if (!ResolveScheme(plan, k, c, problems, scheme, offloaded)) return;
  const int devices_per_node = scheme != nullptr && scheme->hierarchical ? plan.devices_per_node() : 1;
  if (devices_per_node < 1 || c.world_size % devices_per_node != 0) {
    problems.Add("devices_per_node", "does not divide the world; got " + std::to_string(devices_per_node) + ", world " +
                                         std::to_string(c.world_size));
    return;
  }
  if (scheme != nullptr && scheme->codec == Codec::kNonzeros && c.device_memory) {
    problems.Add(f + ".options.scheme", Quoted(std::string(scheme->name)) +
                                            " runs on host memory only in this runtime; got a session on GPU memory "
                                            "(plan with --device cpu)");
    return;
  }
  const kernels::CompressorConfig config = GroupConfig(plan, k, scheme, devices_per_node, c);
  auto codec = kernels::ResolveLayout(config);
  if (!codec.ok()) {
    problems.Add(f, codec.status().message());
    return;
  }
  // Payload sizes and collectives were checked against the catalogue by ValidatePlan.
  out.groups.push_back(MakeGroup(plan, k, scheme, offloaded, devices_per_node, config, *codec, c));
  if (out.groups.back().scheme == SchemeKind::kPowerSgd) {
    auto l = kernels::powersgd::ResolveLayout(out.groups.back().powersgd);
    if (!l.ok()) {
      problems.Add(f, l.status().message());
      out.groups.pop_back();
      return;
    }
    out.groups.back().powersgd_floats = l->first_floats() + l->second_floats();
  }
  if (out.groups.back().scheme == SchemeKind::kHierarchical) out.hierarchical_devices = devices_per_node;
}

}  // namespace

const char* SchemeKindName(SchemeKind kind) {
  switch (kind) {
    case SchemeKind::kFlat: return "flat";
    case SchemeKind::kHierarchical: return "hierarchical";
    case SchemeKind::kZen: return "zen";
    case SchemeKind::kZenSparse: return "zen_sparse";
    case SchemeKind::kPowerSgd: return "powersgd";
  }
  return "?";
}

bool GroupLayout::has_compressor() const {
  switch (scheme) {
    case SchemeKind::kFlat: return !in_place || place == CodecPlace::kDevice;
    case SchemeKind::kHierarchical: return shard_codec;
    case SchemeKind::kZen: return true;
    case SchemeKind::kZenSparse: return false;
    case SchemeKind::kPowerSgd: return false;  // its codec is the runner's own
  }
  return false;
}

bool SessionLayout::has_zen_on_device() const {
  return device_memory &&
         std::any_of(groups.begin(), groups.end(), [](const GroupLayout& g) { return g.scheme == SchemeKind::kZen; });
}
bool SessionLayout::has_offloaded() const {
  return std::any_of(groups.begin(), groups.end(),
                     [](const GroupLayout& g) { return g.place == CodecPlace::kOffloaded; });
}
int64_t SessionLayout::payload_bytes() const {
  int64_t bytes = 0;
  for (const GroupLayout& g : groups)
    bytes += g.scheme == SchemeKind::kPowerSgd ? 4 * g.powersgd_floats
             : g.in_place                      ? 4 * g.numel
                                               : g.codec.payload_bytes;
  return bytes;
}

int64_t SessionLayout::fusion_bytes() const {
  int64_t bytes = 0;
  for (const GroupLayout& g : groups) bytes += g.fused ? 4 * g.numel : 0;
  return bytes;
}

StatusOr<SessionLayout> PlanLayout(const pb::Plan& plan, const LayoutContext& context) {
  Problems problems(context.origin);
  SessionLayout out;
  out.device_memory = context.device_memory;
  out.model_name = plan.model().model().name();
  out.model_fingerprint = plan.model().fingerprint();
  out.plan_fingerprint = PlanFingerprint(plan);
  out.compressor = plan.compressor().name();
  out.ratio = IsPowerSgdRung(plan) ? PowerSgdRungRatio(plan) : out.compressor == "fp32" ? 1 : plan.compressor().ratio();
  out.powersgd_rank = plan.compressor().rank();
  out.seed = plan.compressor().seed();
  out.predicted_iteration_us = plan.predicted().iteration_us();
  // Backward starts at 0 in the plan's timeline and tensor 0 is ready first (docs/MODEL.md).
  double end_us = 0;
  for (const pb::Group& g : plan.groups()) end_us = std::max(end_us, g.decode_end_us());
  const double first_ready_us = plan.model().model().tensors_size() > 0 ? plan.model().model().tensors(0).backward_us() : 0;
  out.predicted_span_us = end_us - first_ready_us;
  CheckPlanAgainstJob(plan, context, problems, out);
  for (int k = 0; k < plan.groups_size(); ++k) AddGroup(plan, k, context, problems, out);
  CUPCAKE_RETURN_IF_ERROR(problems.ToStatus());
  int64_t offset = 0;
  for (GroupLayout& g : out.groups) {
    g.offset = offset;
    offset += g.numel;
    for (int i = g.first; i <= g.last; ++i) out.tensors[static_cast<size_t>(i)].group = g.index;
  }
  return out;
}

void PlaceBuffers(SessionLayout& layout, std::span<const float* const> buffers) {
  for (GroupLayout& g : layout.groups) {
    bool adjacent = true;
    for (int j = g.first + 1; j <= g.last && adjacent; ++j)
      adjacent = buffers[static_cast<size_t>(j)] ==
                 buffers[static_cast<size_t>(j - 1)] + layout.tensors[static_cast<size_t>(j - 1)].numel;
    g.fused = !adjacent;
  }
}

Status CheckSameModel(const SessionLayout& first, const SessionLayout& other, const std::string& origin) {
  if (other.model_fingerprint != first.model_fingerprint)
    return InvalidArgumentError(origin + ": model.fingerprint: plan for another model; got " + other.model_fingerprint +
                                " (model " + other.model_name + "), expected " + first.model_fingerprint +
                                " (the session's model " + first.model_name + ")");
  bool same = other.tensors.size() == first.tensors.size();
  for (size_t i = 0; same && i < first.tensors.size(); ++i)
    same = other.tensors[i].name == first.tensors[i].name && other.tensors[i].numel == first.tensors[i].numel;
  if (!same)
    return InvalidArgumentError(origin + ": model.model.tensors: do not match the session's model " + first.model_name +
                                "; expected the same tensors in the same order");
  return Status::Ok();
}

}  // namespace cupcake::runtime::internal
