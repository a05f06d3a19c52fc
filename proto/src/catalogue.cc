#include "cupcake/proto/catalogue.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <sstream>

#include "cupcake/proto/names.h"

namespace cupcake {
namespace {

constexpr std::array<CompressorInfo, 11> kCatalogue{{
    {"fp32", pb::ALLREDUCE, PayloadFormula::kDense32, false, false, "none", "no compression"},
    {"fp16", pb::ALLREDUCE, PayloadFormula::kDense16, false, false, "none", "scale by 1/W, cast to half"},
    {"topk", pb::ALLGATHER, PayloadFormula::kSparse, true, false, "residual", "k largest magnitudes"},
    {"randk", pb::ALLREDUCE, PayloadFormula::kValuesOnly, true, true, "residual", "k shared random indices"},
    {"dgc", pb::ALLGATHER, PayloadFormula::kSparse, true, false, "dgc", "sampled threshold, exactly k"},
    {"qsgd", pb::ALLGATHER, PayloadFormula::kInt8Norm, false, true, "none", "127 levels, stochastic"},
    {"signsgd", pb::ALLGATHER, PayloadFormula::kSignScale, false, false, "none", "sign bits + mean magnitude"},
    {"efsignsgd", pb::ALLGATHER, PayloadFormula::kSignScale, false, false, "residual", "signsgd with error feedback"},
    {"signum", pb::ALLGATHER, PayloadFormula::kSignScale, false, false, "none", "sign of momentum 0.9"},
    {"terngrad", pb::ALLGATHER, PayloadFormula::kTernaryScale, false, true, "none", "{-1,0,1} + max, stochastic"},
    {"onebit", pb::ALLGATHER, PayloadFormula::kSignTwoMeans, false, false, "residual", "sign bits + two means"},
}};

constexpr std::array<std::string_view, 11> kNames{"fp32",    "fp16",      "topk",   "randk",    "dgc",   "qsgd",
                                                  "signsgd", "efsignsgd", "signum", "terngrad", "onebit"};
constexpr std::array<std::string_view, 3> kMemories{"residual", "dgc", "none"};

std::string JoinNames() {
  std::string out;
  for (auto n : kNames) out += (out.empty() ? "" : ", ") + std::string(n);
  return out;
}

constexpr StepSize kInput = StepSize::kInput;
constexpr SchemeStep kGlobalPayload{pb::COMM_OP_UNSPECIFIED, pb::GLOBAL, true, false, kInput};
constexpr SchemeStep kIntraReduceScatter{pb::REDUCE_SCATTER, pb::INTRA, false, false, kInput};
constexpr SchemeStep kInterPayload{pb::COMM_OP_UNSPECIFIED, pb::INTER, true, true, kInput};
constexpr SchemeStep kIntraAllgather{pb::ALLGATHER, pb::INTRA, false, true, kInput};
// PowerSGD's two allreduces: P (with the uncompressed tensors), then Q.
constexpr SchemeStep kLowRankP{pb::ALLREDUCE, pb::GLOBAL, true, false, StepSize::kLowRankP};
constexpr SchemeStep kLowRankQ{pb::ALLREDUCE, pb::GLOBAL, false, false, StepSize::kLowRankQ};
constexpr SchemeStep kNoStep{pb::COMM_OP_UNSPECIFIED, pb::SCOPE_UNSPECIFIED, false, false, kInput};
// ZenAllreduce's collectives, in order (libcomm/src/zen.cc).
constexpr SchemeStep kZenCounts{pb::ALLTOALL, pb::GLOBAL, false, false, StepSize::kZenCounts};
constexpr SchemeStep kZenPairs{pb::ALLTOALL, pb::GLOBAL, true, false, kInput};
constexpr SchemeStep kZenSizes{pb::ALLGATHER, pb::GLOBAL, false, false, StepSize::kZenSizes};
constexpr SchemeStep kZenPartitions{pb::ALLGATHER, pb::GLOBAL, false, false, StepSize::kZenPartition};

// Codec::kNonzeros: not a compressor of the catalogue (a plan cannot name it), the codec of the
// zen_sparse scheme. Its payload is sparse pairs; "ratio" is the group's non-zero share.
constexpr CompressorInfo kNonzeroCodec{
    kNonzeroCurveName, pb::ALLTOALL, PayloadFormula::kSparse, true, false, "none", "the non-zero entries, exact"};

// Codec::kLowRank: PowerSGD, the codec of the powersgd schemes (any plan compressor); its sizes
// are PowerSgdSizes'. Its memory is the error feedback over the whole group, as the hook's.
constexpr CompressorInfo kPowerSgdCodec{kPowerSgdName, pb::ALLREDUCE, PayloadFormula::kDense32, false, true,
                                        "residual", "PowerSGD: rank-r factors of each matrix, error feedback"};

constexpr std::array<SchemeInfo, 10> kSchemes{{
    {"flat_fp32", Codec::kNone, 1, {kGlobalPayload, kNoStep, kNoStep, kNoStep}, 0, 0, false, false, "fp32 allreduce", false},
    {"flat_fp16", Codec::kFp16, 1, {kGlobalPayload, kNoStep, kNoStep, kNoStep}, 0, 0, false, false, "fp16 allreduce", false},
    {"flat",
     Codec::kCompressor,
     1,
     {kGlobalPayload, kNoStep, kNoStep, kNoStep},
     0,
     0,
     false,
     false,
     "the compressor, flat", false},
    {"hier_fp32",
     Codec::kNone,
     3,
     {kIntraReduceScatter, kInterPayload, kIntraAllgather, kNoStep},
     1,
     1,
     true,
     false,
     "reduce-scatter in the node, fp32 allreduce across nodes, allgather in the node", false},
    {"hier_fp16",
     Codec::kFp16,
     3,
     {kIntraReduceScatter, kInterPayload, kIntraAllgather, kNoStep},
     1,
     1,
     true,
     false,
     "reduce-scatter in the node, fp16 allreduce across nodes, allgather in the node", false},
    {"hier",
     Codec::kCompressor,
     3,
     {kIntraReduceScatter, kInterPayload, kIntraAllgather, kNoStep},
     1,
     1,
     true,
     false,
     "reduce-scatter in the node, the compressor across nodes on the shard, allgather in the node", false},
    {"zen",
     Codec::kCompressor,
     4,
     {kZenCounts, kZenPairs, kZenSizes, kZenPartitions},
     0,
     3,
     false,
     true,
     "Zen: the compressor's pairs to their owner ranks, summed there, the owners' sums gathered", false},
    {"zen_sparse",
     Codec::kNonzeros,
     4,
     {kZenCounts, kZenPairs, kZenSizes, kZenPartitions},
     0,
     3,
     false,
     true,
     "Zen on the group's non-zero entries, uncompressed (naturally sparse gradients)", false},
    {"powersgd",
     Codec::kLowRank,
     2,
     {kLowRankP, kLowRankQ, kNoStep, kNoStep},
     0,
     1,
     false,
     false,
     "PowerSGD per tensor: P = M Q allreduced with the uncompressed tensors, orthogonalized, Q = M^T P allreduced",
     false},
    {"powersgd_batched",
     Codec::kLowRank,
     2,
     {kLowRankP, kLowRankQ, kNoStep, kNoStep},
     0,
     1,
     false,
     false,
     "PowerSGD on the group as one zero-padded square matrix",
     true},
}};

}  // namespace

std::span<const SchemeInfo> Schemes() { return kSchemes; }

const SchemeInfo* FindScheme(std::string_view name) {
  for (const auto& s : kSchemes)
    if (s.name == name) return &s;
  return nullptr;
}

std::string SchemeNames() {
  std::string out;
  for (const auto& s : kSchemes) out += (out.empty() ? "" : ", ") + std::string(s.name);
  return out;
}

const CompressorInfo& CodecCompressor(const SchemeInfo& s, const CompressorInfo& plan_compressor) {
  switch (s.codec) {
    case Codec::kNone: return kCatalogue[0];
    case Codec::kFp16: return kCatalogue[1];
    case Codec::kCompressor: return plan_compressor;
    case Codec::kNonzeros: return kNonzeroCodec;
    case Codec::kLowRank: return kPowerSgdCodec;
  }
  return kCatalogue[0];
}

pb::CommOp StepOp(const SchemeInfo& s, const SchemeStep& step, const CompressorInfo& plan_compressor) {
  return step.op != pb::COMM_OP_UNSPECIFIED ? step.op : CodecCompressor(s, plan_compressor).collective;
}

std::string SchemeCodecProblem(const SchemeInfo& s, const CompressorInfo& plan_compressor) {
  if (!s.zen || CodecCompressor(s, plan_compressor).payload == PayloadFormula::kSparse) return "";
  std::string sparse;
  for (const CompressorInfo& c : kCatalogue)
    if (c.payload == PayloadFormula::kSparse) sparse += (sparse.empty() ? "" : " or ") + std::string(c.name);
  return std::string(s.name) + " needs a compressor whose payload is sparse pairs; got " +
         std::string(plan_compressor.name) + ", expected " + sparse;
}

int64_t ShardElements(const SchemeInfo& s, int64_t n, int devices_per_node) {
  if (!s.hierarchical || devices_per_node <= 1) return n;
  return (n + devices_per_node - 1) / devices_per_node;
}

int64_t StepBytes(const SchemeInfo& s, const SchemeStep& step, const CompressorInfo& plan_compressor, int64_t n,
                  double ratio, const RankLayout& ranks, double zen_union, const LowRankSizes* low_rank) {
  switch (step.size) {
    case StepSize::kLowRankP: return low_rank != nullptr ? 4 * low_rank->first_floats : 0;
    case StepSize::kLowRankQ: return low_rank != nullptr ? 4 * low_rank->second_floats : 0;
    case StepSize::kZenCounts: return 8 * static_cast<int64_t>(ranks.world_size);
    case StepSize::kZenSizes: return 8;
    case StepSize::kZenPartition:
      return ZenExpectedPartitionBytes(n, SelectedCount(n, ratio), ranks.world_size, zen_union);
    case StepSize::kInput: break;
  }
  const int64_t m = ShardElements(s, n, ranks.devices_per_node);
  const int64_t input = step.shard ? m : (s.hierarchical ? m * ranks.devices_per_node : n);
  if (step.payload) return PayloadBytes(CodecCompressor(s, plan_compressor), input, ratio);
  return 4 * input;
}

int64_t ExpectedNonzeros(const pb::Tensor& t) {
  if (!t.has_density() || t.numel() < 1) return t.numel();
  return std::clamp<int64_t>(std::llround(t.density() * static_cast<double>(t.numel())), 1, t.numel());
}

std::string DensityProblem(const pb::Tensor& t) {
  if (!t.has_density() || (t.density() > 0.0 && t.density() <= 1.0)) return "";
  std::ostringstream os;
  os << "out of range; got " << t.density() << ", expected 0 < density <= 1 (the share of non-zero elements)";
  return os.str();
}

std::string ShapeProblem(const pb::Tensor& t) {
  if (t.shape().empty()) return "";
  std::string dims;
  int64_t numel = 1;
  bool overflow = false;
  for (int i = 0; i < t.shape_size(); ++i) {
    const int64_t d = t.shape(i);
    dims += (i ? ", " : "") + std::to_string(d);
    if (d < 1) return "out of range; got dimension " + std::to_string(i) + " = " + std::to_string(d) + ", expected >= 1";
    overflow = overflow || numel > std::numeric_limits<int64_t>::max() / d;
    if (!overflow) numel *= d;
  }
  if (!overflow && numel == t.numel()) return "";
  return "wrong size; got [" + dims + "] (" + (overflow ? std::string("too many") : std::to_string(numel)) +
         " elements), expected numel " + std::to_string(t.numel());
}

LowRankMatrix PowerSgdMatrix(std::span<const int64_t> shape, int64_t numel, int rank, double min_rate) {
  LowRankMatrix m;
  m.rows = shape.empty() ? numel : shape[0];
  m.cols = m.rows > 0 ? numel / m.rows : 0;
  m.rank = std::min<int64_t>({m.rows, m.cols, static_cast<int64_t>(rank)});
  m.compressed = static_cast<double>((m.rows + m.cols) * m.rank) * min_rate < static_cast<double>(m.rows * m.cols);
  return m;
}

int64_t PowerSgdSide(int64_t n) {
  auto side = static_cast<int64_t>(std::sqrt(static_cast<double>(n)));
  while (side * side < n) ++side;
  while (side > 1 && (side - 1) * (side - 1) >= n) --side;
  return side;
}

LowRankSizes PowerSgdSizes(std::span<const std::vector<int64_t>> shapes, std::span<const int64_t> numels, int rank,
                           bool batched) {
  LowRankSizes sizes;
  for (int64_t numel : numels) sizes.work += numel;
  if (batched) {
    const int64_t side = PowerSgdSide(sizes.work);
    const int64_t r = std::min<int64_t>(side, rank);
    sizes.first_floats = sizes.second_floats = side * r;
    sizes.work += side * side * r;
    return sizes;
  }
  for (size_t i = 0; i < numels.size(); ++i) {
    const LowRankMatrix m = PowerSgdMatrix(shapes[i], numels[i], rank, kPowerSgdMinCompressionRate);
    sizes.first_floats += m.compressed ? m.rows * m.rank : numels[i];
    sizes.second_floats += m.compressed ? m.cols * m.rank : 0;
    sizes.work += m.compressed ? numels[i] * m.rank : 0;
  }
  return sizes;
}

LowRankSizes PowerSgdGroupSizes(const pb::Model& model, int first, int last, int rank, bool batched) {
  std::vector<std::vector<int64_t>> shapes;
  std::vector<int64_t> numels;
  for (int i = first; i <= last; ++i) {
    const pb::Tensor& t = model.tensors(i);
    shapes.emplace_back(t.shape().begin(), t.shape().end());
    numels.push_back(t.numel());
  }
  return PowerSgdSizes(shapes, numels, rank, batched);
}

double SchemeRatio(const SchemeInfo& s, double ratio, const pb::Model& model, int first, int last) {
  if (s.codec != Codec::kNonzeros) return ratio;
  int64_t n = 0, nonzeros = 0;
  for (int i = first; i <= last; ++i) {
    n += model.tensors(i).numel();
    nonzeros += ExpectedNonzeros(model.tensors(i));
  }
  return n > 0 ? static_cast<double>(nonzeros) / static_cast<double>(n) : 1.0;
}

bool IsSparseGradient(const pb::Tensor& t) { return t.has_density() && t.density() <= kSparseDensityLimit; }

bool HasSparseGradients(const pb::Model& model) {
  return std::any_of(model.tensors().begin(), model.tensors().end(), IsSparseGradient);
}

int PayloadStep(const SchemeInfo& s) {
  for (int i = 0; i < s.step_count; ++i)
    if (s.steps[i].payload) return i;
  return 0;
}

void ApplyScheme(const SchemeInfo& s, const CompressorInfo& plan_compressor, pb::Device device, double ratio,
                 double zen_union, const RankLayout& ranks, pb::Group& g, const LowRankSizes* low_rank) {
  const SchemeStep& payload = s.steps[PayloadStep(s)];
  pb::GroupOptions* opt = g.mutable_options();
  opt->set_scheme(std::string(s.name));
  opt->set_compress(s.codec != Codec::kNone);
  opt->set_device(device);
  opt->set_collective(StepOp(s, payload, plan_compressor));
  g.set_payload_bytes(StepBytes(s, payload, plan_compressor, g.numel(), ratio, ranks, zen_union, low_rank));
  g.clear_steps();
  for (int i = 0; i < s.step_count; ++i) {
    pb::Step* step = g.add_steps();
    step->set_op(StepOp(s, s.steps[i], plan_compressor));
    step->set_scope(s.steps[i].scope);
    step->set_bytes(StepBytes(s, s.steps[i], plan_compressor, g.numel(), ratio, ranks, zen_union, low_rank));
  }
}

std::span<const CompressorInfo> Compressors() { return kCatalogue; }
std::span<const std::string_view> CompressorNames() { return kNames; }
std::span<const std::string_view> MemoryNames() { return kMemories; }

const CompressorInfo* FindCompressor(std::string_view name) {
  for (const auto& c : kCatalogue)
    if (c.name == name) return &c;
  return nullptr;
}

Status UnknownCompressorError(std::string_view what, std::string_view name) {
  return InvalidArgumentError(std::string(what) + ": unknown compressor '" + std::string(name) + "'" +
                              DidYouMean(name, kNames) + "; expected one of " + JoinNames());
}

Status ValidateRatio(std::string_view what, double ratio) {
  if (!(ratio > 0.0 && ratio <= 1.0)) {
    std::ostringstream os;
    os << what << ": ratio out of range; got " << ratio << ", expected 0 < ratio <= 1";
    return InvalidArgumentError(os.str());
  }
  return Status::Ok();
}

int64_t SelectedCount(int64_t n, double ratio) {
  double x = ratio * static_cast<double>(n);
  int64_t k = static_cast<int64_t>(std::floor(x + x * 1e-12));
  if (k > n) k = n;
  return k < 1 ? 1 : k;
}

Status ValidateZenUnion(std::string_view what, double zen_union) {
  if (!(zen_union >= 0.0 && zen_union <= 1.0)) {
    std::ostringstream os;
    os << what << ": out of range; got " << zen_union
       << ", expected in [0, 1] (the ranks' union of selected indices over their W k pairs; 0: independent "
          "selections)";
    return InvalidArgumentError(os.str());
  }
  return Status::Ok();
}

int64_t ZenPartitionBytes(bool bitmap, int64_t count, int64_t rows) {
  return kZenPartitionHeaderBytes + (bitmap ? (rows + 7) / 8 : 4 * count) + 4 * count;
}

int64_t ZenExpectedPartitionBytes(int64_t n, int64_t k, int world_size, double zen_union) {
  const double w = static_cast<double>(world_size < 1 ? 1 : world_size);
  const double dn = static_cast<double>(n);
  const double selected = static_cast<double>(std::clamp<int64_t>(k, 0, n));
  const double union_size = zen_union > 0 ? std::clamp(zen_union * w * selected, selected, std::min(dn, w * selected))
                                          : (n > 0 ? dn * (1.0 - std::pow(1.0 - selected / dn, w)) : 0.0);
  const auto count = static_cast<int64_t>(std::llround(union_size / w));
  const int64_t rows = (n + static_cast<int64_t>(w) - 1) / static_cast<int64_t>(w);
  return std::min(ZenPartitionBytes(false, count, rows), ZenPartitionBytes(true, count, rows));
}

int64_t PayloadBytes(const CompressorInfo& c, int64_t n, double ratio) {
  switch (c.payload) {
    case PayloadFormula::kDense32: return 4 * n;
    case PayloadFormula::kDense16: return 2 * n;
    case PayloadFormula::kSparse: return 8 * SelectedCount(n, ratio);
    case PayloadFormula::kValuesOnly: return 4 * SelectedCount(n, ratio);
    case PayloadFormula::kInt8Norm: return n + 4;
    case PayloadFormula::kSignScale: return (n + 7) / 8 + 4;
    case PayloadFormula::kTernaryScale: return (n + 3) / 4 + 4;
    case PayloadFormula::kSignTwoMeans: return (n + 7) / 8 + 8;
  }
  return 0;
}

}  // namespace cupcake
