#include "cupcake/proto/catalogue.h"

#include <array>
#include <cmath>

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

}  // namespace

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
