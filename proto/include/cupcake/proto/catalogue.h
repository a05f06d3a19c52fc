// The compressor catalogue (kernels/README.md): each compressor's name, collective, payload
// size formula and default error-feedback memory. The planner, the kernels, the profiler and
// the runtime all read it from here, so a payload's size is defined once.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cupcake/cupcake.pb.h"
#include "cupcake/proto/status.h"

namespace cupcake {

enum class PayloadFormula {
  kDense32,  // 4n (fp32)
  kDense16,  // 2n (fp16)
  kSparse,  // 8k: values fp32 + indices int32 (topk, dgc)
  kValuesOnly,  // 4k: values at indices known to every rank (randk)
  kInt8Norm,  // n + 4 (qsgd)
  kSignScale,  // ceil(n/8) + 4 (signsgd, efsignsgd, signum)
  kTernaryScale,  // ceil(n/4) + 4 (terngrad)
  kSignTwoMeans,  // ceil(n/8) + 8 (onebit)
};

struct CompressorInfo {
  std::string_view name;
  pb::CommOp collective;  // allreduce or allgather
  PayloadFormula payload;
  bool uses_ratio;  // topk, randk, dgc: k = max(1, floor(ratio n))
  bool uses_seed;  // randk, qsgd, terngrad
  std::string_view default_memory;  // "residual", "dgc" or "none"
  std::string_view summary;
};

inline constexpr double kDefaultRatio = 0.01;
// The name kernel curves of Zen's host work carry in place of a compressor's (docs/MODEL.md,
// "The zen scheme"): "encode zen D ratio R" is one rank's work before the partitions are
// gathered (the pairs split by owner, the owner's merge-sum, its partition encoded), "decode zen
// D ratio R" the work after (the W partitions decoded and merged, the group zeroed and the sums
// scattered), for W ranks each selecting R n indices independently.
inline constexpr std::string_view kZenCurveName = "zen";
// The name of the zen_sparse scheme's codec and of its kernel curve: "encode nonzero cpu ratio
// R" is the scan that collects a group's non-zero entries when a share R of them is non-zero
// (docs/MODEL.md, "Naturally sparse gradients"). Not a compressor of the catalogue.
inline constexpr std::string_view kNonzeroCurveName = "nonzero";
inline constexpr int kQsgdLevels = 127;
inline constexpr double kSignumMomentum = 0.9;

// All compressors, fp32 first.
std::span<const CompressorInfo> Compressors();
std::span<const std::string_view> CompressorNames();
// nullptr when unknown.
const CompressorInfo* FindCompressor(std::string_view name);
// The memories: residual, dgc, none.
std::span<const std::string_view> MemoryNames();

// `<what>: unknown compressor 'x' (did you mean 'y'?); expected one of fp32, ...`
Status UnknownCompressorError(std::string_view what, std::string_view name);
// Ratio must lie in (0, 1]; `what` names the flag or field.
Status ValidateRatio(std::string_view what, double ratio);

// k = max(1, floor(ratio * n)) for n >= 1. The product gets a relative nudge of 1e-12 so
// that ratios such as 0.29 with n = 100 give 29, not 28 from binary rounding.
int64_t SelectedCount(int64_t n, double ratio);
// Payload bytes each rank sends for a group of n elements (kernels/README.md, Semantics).
int64_t PayloadBytes(const CompressorInfo& c, int64_t n, double ratio);

// ---------------------------------------------------------------- Schemes (docs/MODEL.md, v2)
// A group's communication scheme: a path in Espresso's decision tree above the device choice
// (how many collectives and in which scopes, which carry the encoded data, which ops). One row
// per scheme; a new scheme is one row. Read by the planner, the plan validator and the runtime.

enum class Codec {
  kNone,  // fp32 data throughout
  kFp16,  // the fp16 compressor
  kCompressor,  // the plan's compressor
  // The group's non-zero entries as (index, value) pairs, exact: naturally sparse gradients
  // (embedding tables) sent without compression or error feedback. Its "ratio" is the group's
  // expected non-zero share (SchemeRatio), its payload 8 bytes per non-zero.
  kNonzeros,
  // PowerSGD (cupcake/kernels/powersgd.h): each matrix-shaped tensor as rank-r factors P and Q,
  // allreduced one after the other with an orthogonalization between, the other tensors as
  // fp32 with P; error feedback; the rank is CompressorSpec.rank. Its step sizes come from the
  // group's tensor shapes (PowerSgdSizes), not from its element count.
  kLowRank,
};

// What a step's bytes per rank are (StepBytes).
enum class StepSize {
  kInput,  // the codec's payload of the step's input (payload steps), else 4 bytes per input element
  kZenCounts,  // Zen: one int64 pair count per rank, 8 W (the alltoall's whole send buffer)
  kZenSizes,  // Zen: this rank's encoded partition size, one int64
  kZenPartition,  // Zen: one owner's expected encoded partition (ZenExpectedPartitionBytes)
  kLowRankP,  // PowerSGD: 4 x (P's floats + the uncompressed tensors' floats)
  kLowRankQ,  // PowerSGD: 4 x Q's floats
};

struct SchemeStep {
  pb::CommOp op;  // COMM_OP_UNSPECIFIED: the codec's collective (CodecCompressor)
  pb::Scope scope;
  bool payload;  // carries the codec's payload; otherwise fp32 data or Zen's metadata
  bool shard;  // its input is the shard (1/devices_per_node of the group) rather than the group
  StepSize size;
};

inline constexpr int kMaxSchemeSteps = 4;

struct SchemeInfo {
  std::string_view name;
  Codec codec;
  int step_count;  // 1..kMaxSchemeSteps
  SchemeStep steps[kMaxSchemeSteps];
  int encode_before;  // the step the encode precedes (0: before the network); unused for kNone
  int decode_after;  // the step the decode follows (step_count - 1: after the network)
  bool hierarchical;  // needs nodes >= 2 and devices_per_node >= 2 (intra and inter scopes)
  // Zen (cupcake/comm/zen.h, docs/ZEN.md): the steps are ZenAllreduce's collectives, the payload
  // step carries the pairs to their owners; offered only for compressors whose payload is sparse
  // pairs (PayloadFormula::kSparse). The owners' merge-sum runs in the network block after the
  // payload step; the decode writes the mean from the summed union. With Codec::kNonzeros the
  // pairs are the group's non-zero entries (naturally sparse gradients, any plan compressor).
  bool zen;
  std::string_view summary;
  // Codec::kLowRank: the group as one square matrix (DDP's batched_powerSGD_hook) rather than
  // one matrix per tensor.
  bool batched;
};

// Every scheme, in the order the planner offers them.
std::span<const SchemeInfo> Schemes();
// nullptr when unknown.
const SchemeInfo* FindScheme(std::string_view name);
// "flat_fp32, flat_fp16, ..."
std::string SchemeNames();
// The compressor a scheme's codec means in a plan of `plan_compressor`: fp32, fp16, it, or for
// Codec::kNonzeros the catalogue-external "nonzero" codec (sparse pairs, ratio = the group's
// non-zero share; its kernel curve "encode nonzero" is the scan that collects them).
const CompressorInfo& CodecCompressor(const SchemeInfo& s, const CompressorInfo& plan_compressor);
// Why `s` cannot run with `plan_compressor`'s payload, or "" when it can: a Zen scheme needs
// sparse pairs ("zen needs a compressor whose payload is sparse pairs; got efsignsgd, expected
// topk or dgc").
std::string SchemeCodecProblem(const SchemeInfo& s, const CompressorInfo& plan_compressor);
// The op of a step: its own, or the codec's collective.
pb::CommOp StepOp(const SchemeInfo& s, const SchemeStep& step, const CompressorInfo& plan_compressor);

// The ranks a group is synchronized over: the plan's world size and, for hierarchical schemes,
// the ranks per node.
struct RankLayout {
  int world_size = 1;
  int devices_per_node = 1;
};

// ---------------------------------------------------------------- PowerSGD (Codec::kLowRank)
// The rules of DDP's powerSGD_hook (cupcake/kernels/powersgd.h applies them; defined here so
// that the kernels, the plan checks and the planner share them).
inline constexpr std::string_view kPowerSgdName = "powersgd";
inline constexpr double kPowerSgdMinCompressionRate = 2.0;  // the hook's min_compression_rate
inline constexpr int kMaxPowerSgdRank = 1 << 16;  // CompressorSpec.rank's bound (plans, --rank)
struct LowRankMatrix {
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t rank = 0;  // min(rows, cols, rank)
  bool compressed = false;  // (rows + cols) rank min_rate < rows cols
};
// A tensor of `shape` (d0 x the product of the rest; empty: not recorded, a numel x 1 vector).
LowRankMatrix PowerSgdMatrix(std::span<const int64_t> shape, int64_t numel, int rank, double min_rate);
// The side of the batched square: the least s with s^2 >= n.
int64_t PowerSgdSide(int64_t n);
// Floats per rank of a PowerSGD group's two allreduces: P's (per compressed matrix rows x r)
// plus the uncompressed tensors' floats, then Q's (cols x r); batched: side x min(rank, side)
// each. `shapes`: the group's tensors' shapes (empty ones: vectors), `numels` their sizes.
// `work` is what PowerSGD's kernel curves are read at (docs/MODEL.md, "PowerSGD"): the
// multiply-adds of one of its matrix products, sum of rows x cols x rank over the compressed
// matrices (batched: side^2 x rank), plus the group's n elements (its elementwise passes).
struct LowRankSizes {
  int64_t first_floats = 0;
  int64_t second_floats = 0;
  int64_t work = 0;
};
LowRankSizes PowerSgdSizes(std::span<const std::vector<int64_t>> shapes, std::span<const int64_t> numels, int rank,
                           bool batched);
// The same for tensors [first, last] of `model`.
LowRankSizes PowerSgdGroupSizes(const pb::Model& model, int first, int last, int rank, bool batched);

// m = ceil(n / devices_per_node): the shard's elements (n when the scheme is flat).
int64_t ShardElements(const SchemeInfo& s, int64_t n, int devices_per_node);
// Bytes per rank a step sends (the size its comm curve is read at), by step.size:
//   kInput: the codec's payload of the step's input elements for a payload step; 4 x input
//     elements for an fp32 step, where a hierarchical scheme's unsharded input is the group
//     padded to devices_per_node x m elements;
//   kZenCounts: 8 W; kZenSizes: 8;
//   kZenPartition: ZenExpectedPartitionBytes(n, k, W, zen_union), k = SelectedCount(n, ratio);
//   kLowRankP, kLowRankQ: 4 x low_rank's first_floats, second_floats (0 without low_rank).
int64_t StepBytes(const SchemeInfo& s, const SchemeStep& step, const CompressorInfo& plan_compressor, int64_t n,
                  double ratio, const RankLayout& ranks, double zen_union, const LowRankSizes* low_rank = nullptr);
// Naturally sparse gradients (Tensor.density): a tensor's expected non-zero count,
// round(density x numel) clamped to [1, numel]; numel when its density is not recorded.
int64_t ExpectedNonzeros(const pb::Tensor& t);
// "" when t's density is absent or in (0, 1], else the problem for its `density` field
// ("out of range; got 1.5, expected 0 < density <= 1 (...)"); the model and plan checks share it.
std::string DensityProblem(const pb::Tensor& t);
// "" when t's shape is empty (not recorded) or has dimensions >= 1 whose product is its numel,
// else the problem for its `shape` field ("wrong size; got [3, 4] (12 elements), expected
// numel 10"); the model and plan checks share it.
std::string ShapeProblem(const pb::Tensor& t);
// The ratio StepBytes and ApplyScheme take for a group of tensors [first, last] of `model`: the
// plan's `ratio`, or for a Codec::kNonzeros scheme the group's expected non-zero share, the sum
// of ExpectedNonzeros over its tensors divided by its elements.
double SchemeRatio(const SchemeInfo& s, double ratio, const pb::Model& model, int first, int last);
// A gradient counts as sparse for zen_sparse up to this density: above it its (index, value)
// pairs, 8 bytes per non-zero, outweigh the dense group's 4 bytes per element.
inline constexpr double kSparseDensityLimit = 0.5;
// True when t records a density <= kSparseDensityLimit.
bool IsSparseGradient(const pb::Tensor& t);
// True when some tensor of `model` is a sparse gradient (the zen_sparse scheme is offered).
bool HasSparseGradients(const pb::Model& model);
// The step that carries the payload (the plan's payload_bytes and collective describe it).
int PayloadStep(const SchemeInfo& s);
// Group `g` (its numel set) on scheme `s` on `device`: its options (scheme, compress,
// collective, device), payload_bytes (the payload step's StepBytes at the plan's ratio and
// zen_union) and one step per scheme step with its op, scope and bytes (StepBytes); the steps'
// times are left to the caller.
void ApplyScheme(const SchemeInfo& s, const CompressorInfo& plan_compressor, pb::Device device, double ratio,
                 double zen_union, const RankLayout& ranks, pb::Group& g, const LowRankSizes* low_rank = nullptr);

// ---------------------------------------------------------------- Zen's encoded partition
// One owner's partition on the wire (cupcake/kernels/zen.h, Encoding; defined here so that the
// kernels' encoder and the catalogue's step sizes share one formula): an 8-byte header, then
// either count x uint32 row numbers (row list) or a bitmap of ceil(rows / 8) bytes over the
// partition's rows, then count x f32 values.
inline constexpr int64_t kZenPartitionHeaderBytes = 8;
int64_t ZenPartitionBytes(bool bitmap, int64_t count, int64_t rows);

// The expected encoded partition of one owner when each of W ranks sends k of n indices
// (docs/MODEL.md, "The zen scheme"). With the ranks' selections independent and uniform, an
// index is in none of them with probability (1 - k/n)^W, so the union holds
//   U = n (1 - (1 - k/n)^W)
// indices in expectation; the owner hash gives each owner a 1/W share of the rows, so an owner
// holds count = round(U / W) entries over rows = ceil(n / W) rows, encoded as the smaller of
// the row list and the bitmap (ZenPartitionBytes). Real top-k selections overlap across ranks,
// which only shrinks the union: for them this is an upper bound. k is clamped to [0, n].
// With `zen_union` > 0 (a measured share: the union's size over the W k pairs, as the plan's
// CompressorSpec.zen_union) the union is zen_union W k instead, clamped to [k, min(n, W k)];
// 0 means independent selections (the formula above).
int64_t ZenExpectedPartitionBytes(int64_t n, int64_t k, int world_size, double zen_union);
// InvalidArgument naming `what` unless 0 <= zen_union <= 1 (0: independent selections).
Status ValidateZenUnion(std::string_view what, double zen_union);

}  // namespace cupcake
