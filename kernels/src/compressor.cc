#include "cupcake/kernels/compressor.h"

#include <sstream>
#include <utility>

#include "check_span.h"
#include "common.h"
#include "cupcake/proto/catalogue.h"

namespace cupcake::kernels {

const char* BackendName(Backend backend) { return backend == Backend::kCpu ? "cpu" : "cuda"; }

namespace {

constexpr int64_t kMaxElements = 2147483647;  // int32 indices in sparse payloads

CompressorKind KindOf(std::string_view name) {
  static constexpr std::pair<std::string_view, CompressorKind> kKinds[] = {
      {"fp32", CompressorKind::kFp32},       {"fp16", CompressorKind::kFp16},
      {"topk", CompressorKind::kTopk},       {"randk", CompressorKind::kRandk},
      {"dgc", CompressorKind::kDgc},         {"qsgd", CompressorKind::kQsgd},
      {"signsgd", CompressorKind::kSignsgd}, {"efsignsgd", CompressorKind::kEfsignsgd},
      {"signum", CompressorKind::kSignum},   {"terngrad", CompressorKind::kTerngrad},
      {"onebit", CompressorKind::kOnebit},
  };
  for (const auto& [n, k] : kKinds)
    if (n == name) return k;
  return CompressorKind::kFp32;  // unreachable: callers checked the catalogue
}

bool IsSparse(CompressorKind k) {
  return k == CompressorKind::kTopk || k == CompressorKind::kRandk || k == CompressorKind::kDgc;
}

}  // namespace

StatusOr<CompressorLayout> ResolveLayout(const CompressorConfig& config) {
  const CompressorInfo* info = FindCompressor(config.name);
  if (info == nullptr) return UnknownCompressorError("compressor", config.name);
  const std::string what = "compressor '" + config.name + "'";
  std::ostringstream errors;
  int problems = 0;
  auto add = [&](const std::string& m) { errors << (problems++ ? "\n" : "") << what << ": " << m; };

  if (config.n < 1 || config.n > kMaxElements) {
    add("n: out of range; got " + std::to_string(config.n) + ", expected 1 <= n <= " + std::to_string(kMaxElements));
  }
  if (config.world_size < 1) {
    add("world_size: out of range; got " + std::to_string(config.world_size) + ", expected world_size >= 1");
  }
  if (info->uses_ratio) {
    Status s = ValidateRatio("ratio", config.ratio);
    if (!s.ok()) add(s.message());
  }
  std::string memory = config.memory.empty() ? std::string(info->default_memory) : config.memory;
  MemoryKind mem = MemoryKind::kNone;
  if (memory == "residual") {
    mem = MemoryKind::kResidual;
  } else if (memory == "dgc") {
    mem = MemoryKind::kDgc;
  } else if (memory != "none") {
    add("memory: unknown memory '" + memory + "'; expected one of residual, dgc, none");
  }
  const CompressorKind kind = KindOf(info->name);
  if (mem == MemoryKind::kDgc && !IsSparse(kind)) {
    add("memory: 'dgc' clears the entries it sent and needs a sparse compressor; got '" + config.name +
        "', expected one of topk, randk, dgc");
  }
  if (problems) return InvalidArgumentError(errors.str());

  CompressorLayout l;
  l.name = config.name;
  l.kind = kind;
  l.memory = mem;
  l.n = config.n;
  l.world_size = config.world_size;
  l.ratio = config.ratio;
  l.k = info->uses_ratio ? SelectedCount(config.n, config.ratio) : 0;
  l.seed = config.seed;
  l.allreduce = info->collective == pb::ALLREDUCE;
  l.payload_bytes = PayloadBytes(*info, config.n, config.ratio);
  l.state_floats = (mem == MemoryKind::kResidual ? l.n
                    : mem == MemoryKind::kDgc    ? 2 * l.n
                                                 : 0) +
                   (kind == CompressorKind::kSignum ? l.n : 0);
  l.decode_input_bytes = l.allreduce ? l.payload_bytes : l.payload_bytes * l.world_size;
  return l;
}

Compressor::Compressor(CompressorLayout layout, Backend backend) : layout_(std::move(layout)), backend_(backend) {}

Compressor::~Compressor() = default;

using detail::CheckSpan;

Status Compressor::Encode(std::span<const float> grad, std::span<float> state, uint64_t iteration,
                          std::span<std::byte> payload, void* stream) {
  CUPCAKE_RETURN_IF_ERROR(CheckSpan(layout_.name, "encode", "grad", "floats", grad, layout_.n));
  CUPCAKE_RETURN_IF_ERROR(CheckSpan(layout_.name, "encode", "state", "floats", state, layout_.state_floats));
  CUPCAKE_RETURN_IF_ERROR(CheckSpan(layout_.name, "encode", "payload", "bytes", payload, layout_.payload_bytes));
  return EncodeImpl(grad.data(), state.data(), iteration, payload.data(), stream);
}

Status Compressor::Decode(std::span<const std::byte> payloads, std::span<float> out, uint64_t iteration, void* stream) {
  if (static_cast<int64_t>(payloads.size()) != layout_.decode_input_bytes) {
    std::string expected = std::to_string(layout_.decode_input_bytes);
    if (!layout_.allreduce) {
      expected += " (" + std::to_string(layout_.world_size) + " payloads of " + std::to_string(layout_.payload_bytes) +
                  " bytes)";
    }
    return InvalidArgumentError(layout_.name + " decode: payloads: wrong length; got " +
                                std::to_string(payloads.size()) + " bytes, expected " + expected);
  }
  CUPCAKE_RETURN_IF_ERROR(CheckSpan(layout_.name, "decode", "payloads", "bytes", payloads, layout_.decode_input_bytes));
  CUPCAKE_RETURN_IF_ERROR(CheckSpan(layout_.name, "decode", "out", "floats", out, layout_.n));
  return DecodeImpl(payloads.data(), out.data(), iteration, stream);
}

void SumFp16Payloads(const std::byte* in, std::byte* inout, int64_t count) {
  const auto* a = reinterpret_cast<const unsigned char*>(in);
  auto* b = reinterpret_cast<unsigned char*>(inout);
  for (int64_t i = 0; i < count; ++i) {
    uint16_t x, y;
    std::memcpy(&x, a + 2 * i, 2);
    std::memcpy(&y, b + 2 * i, 2);
    const uint16_t s = detail::FloatToHalf(detail::HalfToFloat(x) + detail::HalfToFloat(y));
    std::memcpy(b + 2 * i, &s, 2);
  }
}

void SumFp32Payloads(const float* in, float* inout, int64_t count) {
  for (int64_t i = 0; i < count; ++i) inout[i] += in[i];
}

uint32_t RandkIndex(uint64_t seed, uint64_t iteration, uint32_t n, uint32_t j) {
  const detail::Feistel f = detail::MakeFeistel(seed, iteration, n);
  return detail::FeistelPermute(f, n, j);
}

}  // namespace cupcake::kernels
