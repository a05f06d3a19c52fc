// The compressor catalogue (kernels/README.md): each compressor's name, collective, payload
// size formula and default error-feedback memory. The planner, the kernels, the profiler and
// the runtime all read it from here, so a payload's size is defined once.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

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

}  // namespace cupcake
