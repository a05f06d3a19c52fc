// Gradient compressors over raw buffers (kernels/README.md), one interface for the CPU
// reference and the CUDA kernels, used by the profiler and the runtime.
//
// A group is a contiguous float32 buffer of n elements. Per step a rank calls
//   Encode(grad, state, iteration, payload)   -> exactly payload_bytes() bytes
// then the collective moves the payloads (allgather: W payloads side by side; allreduce:
// the elementwise sum of the W payloads, see SumFp16Payloads / SumFp32Payloads), then
//   Decode(payloads, out)                      -> out = the average over the W ranks.
// Encode includes the error-feedback update and the 1/W scaling (fp16); Decode sums the W
// payloads (allgather) or reads the one reduced buffer (allreduce) and divides by W.
//
// Payload layouts (little-endian; metadata after the main data; byte sizes are the
// catalogue's PayloadBytes, see cupcake/proto/catalogue.h):
//   fp32      n x f32 (the compressed value c)
//   fp16      n x binary16 of c / W (round to nearest even)
//   topk, dgc k x f32 values, then k x int32 indices, ascending indices
//   randk     k x f32 values at the shared indices RandkIndex(seed, iteration, j), j < k
//   qsgd      n x int8 levels in [-127, 127] (-128 marks a non-finite input), then f32 norm
//   signsgd, efsignsgd, signum
//             ceil(n/8) bytes of sign bits (bit j of byte b is element 8b+j; 1 = negative),
//             then f32 scale (mean magnitude)
//   terngrad  ceil(n/4) bytes of 2-bit codes (bits 2j..2j+1 of byte b are element 4b+j;
//             0 = 0, 1 = +max, 2 = -max, 3 = non-finite input), then f32 max magnitude
//   onebit    ceil(n/8) bytes of sign bits as above, then f32 mean of the non-negative
//             entries, then f32 mean of the negative entries
// The full semantics, the random generator and the treatment of NaN/Inf are in
// kernels/README.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "cupcake/kernels/buffer.h"
#include "cupcake/proto/status.h"

namespace cupcake::kernels {

enum class CompressorKind {
  kFp32,
  kFp16,
  kTopk,
  kRandk,
  kDgc,
  kQsgd,
  kSignsgd,
  kEfsignsgd,
  kSignum,
  kTerngrad,
  kOnebit,
};
enum class MemoryKind { kNone, kResidual, kDgc };

// What the caller chooses. Validated once by ResolveLayout / MakeCompressor.
struct CompressorConfig {
  std::string name;  // catalogue name: fp32, fp16, topk, ...
  std::string memory;  // residual, dgc, none; empty = the catalogue's default for `name`
  int64_t n = 0;  // group size in elements, 1 <= n <= 2^31 - 1
  int world_size = 1;  // W >= 1
  double ratio = 0.01;  // topk, randk, dgc: k = max(1, floor(ratio n)); must lie in (0, 1]
  uint64_t seed = 0;  // randk (same on every rank), qsgd and terngrad (differ per rank
                      // for independent rounding, e.g. base seed + rank)
};

// Everything derived from a valid config.
struct CompressorLayout {
  std::string name;
  CompressorKind kind = CompressorKind::kFp32;
  MemoryKind memory = MemoryKind::kNone;
  int64_t n = 0;
  int world_size = 1;
  int64_t k = 0;  // selected count (topk, randk, dgc), else 0
  double ratio = 0.01;
  uint64_t seed = 0;
  bool allreduce = false;  // collective: allreduce (else allgather)
  int64_t payload_bytes = 0;  // bytes each rank sends
  int64_t state_floats = 0;  // floats of per-group state (memory, momentum) the caller owns
  int64_t decode_input_bytes = 0;  // allgather: W * payload_bytes; allreduce: payload_bytes
};

// Validates the config; errors name the field: `compressor 'topk': world_size: out of range;
// got 0, expected world_size >= 1`.
StatusOr<CompressorLayout> ResolveLayout(const CompressorConfig& config);

// A compressor for one group shape (n, W, ratio, seed), on one backend.
//
// Ownership: owns its workspace (host memory for kCpu, device memory for kCuda), allocated
// once at creation, so Encode and Decode never allocate. It does not own the buffers passed
// in. Pointers are host memory for kCpu and device memory for kCuda.
// State: the caller owns `state_floats()` floats per group (error-feedback memory, momentum),
// zero-filled before the first Encode, and passes the same buffer every step; layout:
// residual: e[n]; dgc: u[n] (momentum) then v[n] (accumulator); signum appends its momentum m[n].
// Streams: for kCuda, `stream` is a cudaStream_t (nullptr = the default stream); calls are
// asynchronous on it. For kCpu it is ignored and calls are synchronous.
// Thread-safety: one call at a time per object (the workspace is shared); distinct objects
// are independent.
class Compressor {
 public:
  virtual ~Compressor();
  Compressor(const Compressor&) = delete;
  Compressor& operator=(const Compressor&) = delete;

  const CompressorLayout& layout() const { return layout_; }
  Backend backend() const { return backend_; }
  int64_t n() const { return layout_.n; }
  int64_t payload_bytes() const { return layout_.payload_bytes; }
  int64_t state_floats() const { return layout_.state_floats; }
  int64_t decode_input_bytes() const { return layout_.decode_input_bytes; }

  // Compresses grad (n floats) plus the memory into payload (payload_bytes()), updating state.
  // `iteration` keys the random choices (randk, qsgd, terngrad) with the seed.
  Status Encode(std::span<const float> grad, std::span<float> state, uint64_t iteration, std::span<std::byte> payload,
                void* stream = nullptr);
  // Writes the average over ranks into out (n floats). payloads: decode_input_bytes() bytes,
  // the W payloads side by side for allgather compressors, the one reduced buffer for
  // allreduce ones. `iteration` must be the encode's (randk's indices); others ignore it.
  Status Decode(std::span<const std::byte> payloads, std::span<float> out, uint64_t iteration, void* stream = nullptr);

 protected:
  Compressor(CompressorLayout layout, Backend backend);

 private:
  // Sizes are checked; the implementation trusts them.
  virtual Status EncodeImpl(const float* grad, float* state, uint64_t iteration, std::byte* payload, void* stream) = 0;
  virtual Status DecodeImpl(const std::byte* payloads, float* out, uint64_t iteration, void* stream) = 0;

  CompressorLayout layout_;
  Backend backend_;
};

// Creates a compressor. Errors: an invalid config (see ResolveLayout), or a backend that
// this build or machine does not have (see BackendAvailable).
StatusOr<std::unique_ptr<Compressor>> MakeCompressor(const CompressorConfig& config, Backend backend);

// Elementwise sums of allreduce payloads on the host, for the MPI reduction the runtime
// defines (MPI has no half type): inout[i] = in[i] + inout[i].
// fp16: `count` binary16 values; the sum is computed in float and rounded to nearest even,
// which equals the correctly rounded half sum (float has >= 2 * 11 + 2 bits).
void SumFp16Payloads(const std::byte* in, std::byte* inout, int64_t count);
// fp32 and randk payloads: `count` floats.
void SumFp32Payloads(const float* in, float* inout, int64_t count);

// The shared random index j < k of randk at (seed, iteration): a keyed permutation of
// [0, n), so the k indices are distinct. Exposed for tests and tools.
uint32_t RandkIndex(uint64_t seed, uint64_t iteration, uint32_t n, uint32_t j);

}  // namespace cupcake::kernels
