// PowerSGD's layout (which tensors are matrices, where P, Q and the uncompressed floats go), its
// first Q and the size checks of the steps; the backends' arithmetic is in
// cpu/powersgd_cpu.cc and ../cuda/cuda_powersgd.cu.
#include "cupcake/kernels/powersgd.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numbers>
#include <string>
#include <utility>

#include "check_span.h"
#include "common.h"
#include "cupcake/proto/catalogue.h"

namespace cupcake::kernels::powersgd {
namespace {

constexpr int64_t kMaxElements = 2147483647;
constexpr const char* kWhat = "powersgd";

// The problems of the scalar fields, each as "<field>: out of range; got v, expected c".
void CheckScalars(const Config& c, std::vector<std::string>& problems) {
  if (c.rank < 1) problems.push_back("rank: out of range; got " + std::to_string(c.rank) + ", expected rank >= 1");
  if (c.world_size < 1) {
    problems.push_back("world_size: out of range; got " + std::to_string(c.world_size) +
                       ", expected world_size >= 1");
  }
  if (!(c.min_compression_rate > 0) || !std::isfinite(c.min_compression_rate)) {
    problems.push_back("min_compression_rate: out of range; got " + std::to_string(c.min_compression_rate) +
                       ", expected a finite rate > 0");
  }
}

// The numel of each shape, or problems naming shapes[i][j].
std::vector<int64_t> Numels(const Config& c, std::vector<std::string>& problems) {
  std::vector<int64_t> numel;
  if (c.shapes.empty()) problems.push_back("shapes: empty; got 0 tensors, expected >= 1");
  int64_t total = 0;
  for (size_t i = 0; i < c.shapes.size(); ++i) {
    const auto& s = c.shapes[i];
    const std::string at = "shapes[" + std::to_string(i) + "]";
    if (s.empty()) problems.push_back(at + ": empty; got [], expected >= 1 dimension (a vector is [numel])");
    int64_t n = 1;
    for (size_t j = 0; j < s.size(); ++j) {
      if (s[j] < 1) {
        problems.push_back(at + "[" + std::to_string(j) + "]: out of range; got " + std::to_string(s[j]) +
                           ", expected >= 1");
        n = 0;
        break;
      }
      n = s[j] > kMaxElements / n ? kMaxElements + 1 : n * s[j];
    }
    numel.push_back(n);
    total = std::min(total + n, kMaxElements + 1);
  }
  if (total > kMaxElements) {
    problems.push_back("shapes: too many elements; got more than " + std::to_string(kMaxElements) + ", expected <= " +
                       std::to_string(kMaxElements));
  }
  return numel;
}

void PlaceBatched(Layout& l) {
  const int64_t side = PowerSgdSide(l.n);
  l.matrix_floats = side * side;
  Matrix m;
  m.rows = m.cols = side;
  m.rank = std::min<int64_t>(side, l.rank);
  l.matrices.push_back(m);
  l.p_floats = l.q_floats = side * m.rank;
}

// The hook's order: compressed matrices grouped by (rows, cols) in order of first appearance.
void PlacePerTensor(const Config& c, const std::vector<int64_t>& numel, Layout& l) {
  l.matrix_floats = l.n;
  std::vector<std::vector<Matrix>> by_shape;
  std::map<std::pair<int64_t, int64_t>, size_t> index;
  int64_t offset = 0;
  for (size_t i = 0; i < c.shapes.size(); ++i) {
    const LowRankMatrix s = PowerSgdMatrix(c.shapes[i], numel[i], c.rank, c.min_compression_rate);
    if (s.compressed) {
      auto [it, fresh] = index.try_emplace({s.rows, s.cols}, by_shape.size());
      if (fresh) by_shape.push_back({});
      by_shape[it->second].push_back(Matrix{offset, s.rows, s.cols, s.rank, 0, 0});
    } else {
      l.uncompressed.push_back(Segment{offset, numel[i], l.uncompressed_floats});
      l.uncompressed_floats += numel[i];
    }
    offset += numel[i];
  }
  for (auto& ms : by_shape) {
    for (Matrix& m : ms) {
      m.p_offset = l.p_floats;
      m.q_offset = l.q_floats;
      l.p_floats += m.rows * m.rank;
      l.q_floats += m.cols * m.rank;
      l.matrices.push_back(m);
    }
  }
}

}  // namespace

StatusOr<Layout> ResolveLayout(const Config& config) {
  std::vector<std::string> problems;
  CheckScalars(config, problems);
  const std::vector<int64_t> numel = Numels(config, problems);
  if (!problems.empty()) {
    std::string m = kWhat;
    for (size_t i = 0; i < problems.size(); ++i) m += (i ? "; " : ": ") + problems[i];
    return InvalidArgumentError(m);
  }
  Layout l;
  l.rank = config.rank;
  l.batched = config.batched;
  l.world_size = config.world_size;
  l.seed = config.seed;
  for (int64_t n : numel) l.n += n;
  if (config.batched) {
    PlaceBatched(l);
  } else {
    PlacePerTensor(config, numel, l);
  }
  return l;
}

std::vector<float> InitialQ(const Layout& layout) {
  // Box-Muller on pairs of the counter-based generator's 24-bit uniforms; u1 in (0, 1].
  const uint64_t key = detail::StreamKey(layout.seed ^ 0x706f77657273ull /* "powers" */, 0);
  std::vector<float> q(static_cast<size_t>(layout.q_floats));
  for (int64_t j = 0; j < layout.q_floats; j += 2) {
    const auto pair = static_cast<uint32_t>(j / 2);
    const double u1 = (static_cast<double>(detail::RandomBits(key, 2 * pair) >> 8) + 1.0) / 16777216.0;
    const double u2 = static_cast<double>(detail::Uniform01(detail::RandomBits(key, 2 * pair + 1)));
    const double radius = std::sqrt(-2.0 * std::log(u1)), angle = 2.0 * std::numbers::pi * u2;
    q[static_cast<size_t>(j)] = static_cast<float>(radius * std::cos(angle));
    if (j + 1 < layout.q_floats) q[static_cast<size_t>(j + 1)] = static_cast<float>(radius * std::sin(angle));
  }
  return q;
}

using detail::CheckSpan;

Status Codec::InitState(std::span<float> state, void* stream) {
  CUPCAKE_RETURN_IF_ERROR(CheckSpan(kWhat, "init", "state", "floats", state, layout_.state_floats()));
  return InitImpl(InitialQ(layout_), state.data(), stream);
}

Status Codec::EncodeP(std::span<const float> grad, std::span<float> state, std::span<float> first, void* stream) {
  CUPCAKE_RETURN_IF_ERROR(CheckSpan(kWhat, "encode", "grad", "floats", grad, layout_.n));
  CUPCAKE_RETURN_IF_ERROR(CheckSpan(kWhat, "encode", "state", "floats", state, layout_.state_floats()));
  CUPCAKE_RETURN_IF_ERROR(CheckSpan(kWhat, "encode", "first", "floats", first, layout_.first_floats()));
  return EncodePImpl(grad.data(), state.data(), first.data(), stream);
}

Status Codec::ComputeQ(std::span<float> first, std::span<const float> state, std::span<float> second, void* stream) {
  CUPCAKE_RETURN_IF_ERROR(CheckSpan(kWhat, "compute_q", "first", "floats", first, layout_.first_floats()));
  CUPCAKE_RETURN_IF_ERROR(CheckSpan(kWhat, "compute_q", "state", "floats", state, layout_.state_floats()));
  CUPCAKE_RETURN_IF_ERROR(CheckSpan(kWhat, "compute_q", "second", "floats", second, layout_.second_floats()));
  return ComputeQImpl(first.data(), state.data(), second.data(), stream);
}

Status Codec::Decode(std::span<const float> first, std::span<const float> second, std::span<float> state,
                     std::span<float> out, void* stream) {
  CUPCAKE_RETURN_IF_ERROR(CheckSpan(kWhat, "decode", "first", "floats", first, layout_.first_floats()));
  CUPCAKE_RETURN_IF_ERROR(CheckSpan(kWhat, "decode", "second", "floats", second, layout_.second_floats()));
  CUPCAKE_RETURN_IF_ERROR(CheckSpan(kWhat, "decode", "state", "floats", state, layout_.state_floats()));
  CUPCAKE_RETURN_IF_ERROR(CheckSpan(kWhat, "decode", "out", "floats", out, layout_.n));
  return DecodeImpl(first.data(), second.data(), state.data(), out.data(), stream);
}

}  // namespace cupcake::kernels::powersgd
