// Internal: the instruction-set variants of the CPU compressors' hot loops.
//
// The portable baseline is the scalar reference in cpu_compressor.cc (x86-64 baseline ISA,
// auto-vectorized where the compiler can). On x86-64 machines with AVX2 and F16C, the
// elementwise compressors (fp16, qsgd, the sign family, terngrad, onebit) run the fused,
// hand-vectorized loops of avx2_loops.cc instead. The variant is picked once, when the
// compressor is made (`BestIsa`, from __builtin_cpu_supports), and every variant writes the
// same bytes as the baseline: same float operations in the same order per element and per
// reduction lane, same generator (8 lanes of detail::RandomBits at a time), no FMA
// contraction. Tested in test/kernels/isa_variants_test.cc.
#pragma once

#include <cstdint>
#include <memory>

#include "cupcake/kernels/compressor.h"

namespace cupcake::kernels::cpu {

// kAvx512: kAvx2, plus AVX-512 (F, BW, VL) for the generator-bound quantize loops of qsgd and
// terngrad encode.
enum class Isa { kBaseline, kAvx2, kAvx512 };
const char* IsaName(Isa isa);  // "baseline", "avx2", "avx512"
// True when this build has the variant and this machine can run it.
bool IsaSupported(Isa isa);
// The fastest supported variant.
Isa BestIsa();

// A CPU compressor that runs the given variant; requires IsaSupported(isa).
std::unique_ptr<Compressor> MakeCpuCompressor(const CompressorLayout& layout, Isa isa);

// AVX2 + F16C loops (avx2_loops.cc). Call only when IsaSupported(Isa::kAvx2); `avx512`
// only when IsaSupported(Isa::kAvx512). `resid` is the
// residual memory (null for memory none): it holds e_old on entry, is updated to g + e_old by
// the first pass and ends as what was not sent, exactly like the baseline.
namespace avx2 {
using u8 = unsigned char;
// fp16: payload = half((g + e) / W); e = (g + e) - W half(...), 0 where not finite.
void EncodeFp16(const float* g, float* resid, int64_t n, int world_size, u8* payload);
void DecodeFp16(const u8* payload, float* out, int64_t n);
// signsgd, efsignsgd, signum (mom != null: the signum momentum), whole payload.
void EncodeSign(const float* g, float* resid, float* mom, int64_t n, u8* payload);
void EncodeOnebit(const float* g, float* resid, int64_t n, u8* payload);
// Sign family and onebit: W payloads of payload_bytes each, side by side.
void DecodeSign(const u8* payloads, int64_t payload_bytes, int world_size, bool onebit, int64_t n, float* out);
void EncodeQsgd(const float* g, float* resid, int64_t n, uint64_t key, u8* payload, bool avx512);
void DecodeQsgd(const u8* payloads, int64_t payload_bytes, int world_size, int64_t n, float* out);
void EncodeTerngrad(const float* g, float* resid, int64_t n, uint64_t key, u8* payload, bool avx512);
void DecodeTerngrad(const u8* payloads, int64_t payload_bytes, int world_size, int64_t n, float* out);
}  // namespace avx2

}  // namespace cupcake::kernels::cpu
