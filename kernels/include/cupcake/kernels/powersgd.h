// PowerSGD (Vogels et al., "PowerSGD: Practical Low-Rank Gradient Compression for Distributed
// Optimization", NeurIPS 2019) as PyTorch's DDP hooks compute it
// (torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook: powerSGD_hook and
// batched_powerSGD_hook), for one group: a contiguous float32 buffer of tensors of known shapes.
//
// One step, W ranks, the caller running the two allreduces (sums) between the calls:
//   1. EncodeP: x = grad + e (error feedback); per matrix M (a view of x): orthogonalize the
//      kept Q, P = M Q; the uncompressed tensors' x copied after the P's -> `first`.
//   -- allreduce `first` (sum over ranks) --
//   2. ComputeQ: per matrix, orthogonalize the summed P in place, Q = M^T P -> `second`.
//   -- allreduce `second` (sum over ranks) --
//   3. Decode: Q = second / W is kept (warm start of the next step); out = P Q^T for each
//      matrix, out = first / W for the uncompressed tensors; e = x - out.
// Every rank computes out from the same summed buffers, so out is bitwise equal across ranks.
//
// Matrices (the hook's rules, cupcake/proto/catalogue.h PowerSgdMatrix): a tensor of shape (d0, d1, ..., dk) is the d0 x (d1...dk)
// row-major matrix M (a vector of length d0 is d0 x 1); its rank is r = min(d0, cols, rank), and
// it is compressed when (d0 + cols) r min_compression_rate < d0 cols, else sent as is (so
// vectors and small tensors go uncompressed). The compressed matrices are ordered as the hook
// orders them: by shape, in the order each shape first appears, then in buffer order; P and Q
// are the concatenation of their row-major P_i (rows x r) and Q_i (cols x r) in that order.
// Batched (batched_powerSGD_hook): the whole group is one side x side matrix, side =
// ceil(sqrt(n)), zero-padded, with r = min(rank, side); there are no uncompressed tensors and the
// error-feedback memory covers the padding too (side^2 floats), as the hook's does.
//
// Orthogonalization: the hook's Gram-Schmidt (_orthogonalize_gram_schmidt with epsilon 0): for
// each column i in order, divide it by its norm, then subtract its projection from every later
// column. A column of zeros stays zero (the hook would divide by zero). For r > 2 the hook calls
// torch.linalg.qr instead, which gives the same Q up to rounding and the signs of its columns;
// P Q^T is the same for either sign.
// Error feedback covers the whole group, as in the hook: an uncompressed tensor's memory is
// x - (the average of x over the ranks).
// Q's first value: InitState draws it from N(0, 1) keyed by the seed (the same on every rank).
//
// State (the caller owns it, state_floats() floats): e[matrix_floats] then Q[q_floats].
// `first` holds first_floats() = p_floats + uncompressed_floats floats, `second` q_floats.
// Ownership: the codec owns its workspace (allocated at creation; the steps never allocate).
// Pointers are host memory for kCpu and device memory for kCuda; `stream` is a cudaStream_t
// (nullptr: the default stream) on which kCuda calls are asynchronous; kCpu ignores it.
// Thread-safety: one call at a time per object; distinct objects are independent.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "cupcake/kernels/buffer.h"
#include "cupcake/proto/status.h"

namespace cupcake::kernels::powersgd {

// The hook's default: compress only when it saves at least half the floats.
inline constexpr double kDefaultMinCompressionRate = 2.0;

struct Config {
  // The group's tensors in buffer order; every dimension >= 1. A tensor whose shape is unknown
  // is given as {numel} (a vector: sent uncompressed).
  std::vector<std::vector<int64_t>> shapes;
  int rank = 1;  // >= 1
  bool batched = false;
  double min_compression_rate = kDefaultMinCompressionRate;  // > 0
  int world_size = 1;  // >= 1
  uint64_t seed = 0;  // Q's first draw; must be the same on every rank
};

// One compressed matrix: rows x cols at `offset` in the group (batched: the padded square).
struct Matrix {
  int64_t offset = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t rank = 0;
  int64_t p_offset = 0;  // floats into P (first)
  int64_t q_offset = 0;  // floats into Q (second, and the state's Q)
};

// One uncompressed tensor: numel floats at `offset` in the group, at `packed_offset` in `first`.
struct Segment {
  int64_t offset = 0;
  int64_t numel = 0;
  int64_t packed_offset = 0;
};

struct Layout {
  int64_t n = 0;  // the group's floats (sum of numel)
  int rank = 1;
  bool batched = false;
  int world_size = 1;
  uint64_t seed = 0;
  int64_t matrix_floats = 0;  // n, or side^2 when batched
  std::vector<Matrix> matrices;  // hook order
  std::vector<Segment> uncompressed;  // buffer order
  int64_t p_floats = 0;
  int64_t q_floats = 0;
  int64_t uncompressed_floats = 0;
  int64_t first_floats() const { return p_floats + uncompressed_floats; }
  int64_t second_floats() const { return q_floats; }
  int64_t state_floats() const { return matrix_floats + q_floats; }
};

// Validates the config; errors name the field: `powersgd: shapes[2][1]: out of range; got 0,
// expected >= 1`. n must not exceed 2^31 - 1.
StatusOr<Layout> ResolveLayout(const Config& config);

class Codec {
 public:
  virtual ~Codec() = default;
  Codec(const Codec&) = delete;
  Codec& operator=(const Codec&) = delete;

  const Layout& layout() const { return layout_; }
  Backend backend() const { return backend_; }

  // e = 0, Q = the seeded N(0, 1) draw (the same on every backend). Before the first step.
  Status InitState(std::span<float> state, void* stream = nullptr);
  Status EncodeP(std::span<const float> grad, std::span<float> state, std::span<float> first,
                 void* stream = nullptr);
  // `first`: the allreduced sum; its P part is orthogonalized in place.
  Status ComputeQ(std::span<float> first, std::span<const float> state, std::span<float> second,
                  void* stream = nullptr);
  // `second`: the allreduced sum. Writes out (n floats) and updates the state.
  Status Decode(std::span<const float> first, std::span<const float> second, std::span<float> state,
                std::span<float> out, void* stream = nullptr);

 protected:
  Codec(Layout layout, Backend backend) : layout_(std::move(layout)), backend_(backend) {}

 private:
  // Sizes are checked; the implementation trusts them. InitImpl gets Q's host draw.
  virtual Status InitImpl(const std::vector<float>& q, float* state, void* stream) = 0;
  virtual Status EncodePImpl(const float* grad, float* state, float* first, void* stream) = 0;
  virtual Status ComputeQImpl(float* first, const float* state, float* second, void* stream) = 0;
  virtual Status DecodeImpl(const float* first, const float* second, float* state, float* out,
                            void* stream) = 0;

  Layout layout_;
  Backend backend_;
};

// Errors: an invalid config (ResolveLayout), or a backend this build or machine lacks.
StatusOr<std::unique_ptr<Codec>> MakeCodec(const Config& config, Backend backend);

// Q's first value for `layout` (q_floats normals keyed by the seed; Box-Muller on the kernels'
// counter-based generator). Exposed for tests.
std::vector<float> InitialQ(const Layout& layout);

}  // namespace cupcake::kernels::powersgd
