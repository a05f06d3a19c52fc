// The PowerSGD codec (cupcake/kernels/powersgd.h): its layout by hand-worked cases, its steps
// on the CPU and, when a GPU is present, on CUDA against the scalar restatement of
// powersgd_reference.h over several steps (warm start, error feedback), a low-rank average
// recovered exactly, and the texts of bad configs and buffers. The match with torch's own hook
// is powersgd_hook_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "cupcake/kernels/powersgd.h"
#include "gpu_test.h"
#include "harness.h"
#include "powersgd_harness.h"
#include "powersgd_reference.h"

namespace cupcake::kernels::testing {
namespace {

namespace ref = ::cupcake::kernels::reference::powersgd;
using powersgd::Config;

Config MakeConfig(std::vector<std::vector<int64_t>> shapes, int rank, bool batched = false) {
  Config c;
  c.shapes = std::move(shapes);
  c.rank = rank;
  c.batched = batched;
  c.seed = 11;
  return c;
}

TEST(PowerSgdLayout, FollowsTheHooksRulesAndOrder) {
  // 6x4 (r 1: 10 x 2 < 24), [5] (5x1: 6 x 2 >= 5), 3x(2*2*2) (11 x 2 < 24), 6x4 again,
  // 2x2 (4 x 2 >= 4), 7x9 (16 x 2 < 63). The hook groups equal shapes: 6x4, 6x4, 3x8, 7x9.
  auto l = powersgd::ResolveLayout(MakeConfig({{6, 4}, {5}, {3, 2, 2, 2}, {6, 4}, {2, 2}, {7, 9}}, 1));
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->n, 24 + 5 + 24 + 24 + 4 + 63);
  EXPECT_EQ(l->matrix_floats, l->n);
  ASSERT_EQ(l->matrices.size(), 4u);
  const int64_t want[4][6] = {
      // offset, rows, cols, rank, p_offset, q_offset
      {0, 6, 4, 1, 0, 0},
      {53, 6, 4, 1, 6, 4},
      {29, 3, 8, 1, 12, 8},
      {81, 7, 9, 1, 15, 16},
  };
  for (int i = 0; i < 4; ++i) {
    const powersgd::Matrix& m = l->matrices[i];
    EXPECT_EQ((std::vector<int64_t>{m.offset, m.rows, m.cols, m.rank, m.p_offset, m.q_offset}),
              std::vector<int64_t>(want[i], want[i] + 6))
        << "matrix " << i;
  }
  EXPECT_EQ(l->p_floats, 22);
  EXPECT_EQ(l->q_floats, 25);
  ASSERT_EQ(l->uncompressed.size(), 2u);
  EXPECT_EQ(l->uncompressed[0].offset, 24);
  EXPECT_EQ(l->uncompressed[0].numel, 5);
  EXPECT_EQ(l->uncompressed[1].offset, 77);
  EXPECT_EQ(l->uncompressed[1].packed_offset, 5);
  EXPECT_EQ(l->first_floats(), 22 + 9);
  EXPECT_EQ(l->state_floats(), l->n + 25);
}

TEST(PowerSgdLayout, RankIsClippedAndRateDecides) {
  // 40 x 3 at rank 4: r = 3, (43 x 3) x 2 = 258 >= 120, so uncompressed; at rate 0.5, 64.5 < 120.
  auto dense = powersgd::ResolveLayout(MakeConfig({{40, 3}}, 4));
  ASSERT_TRUE(dense.ok());
  EXPECT_TRUE(dense->matrices.empty());
  Config c = MakeConfig({{40, 3}}, 4);
  c.min_compression_rate = 0.5;
  auto low = powersgd::ResolveLayout(c);
  ASSERT_TRUE(low.ok());
  ASSERT_EQ(low->matrices.size(), 1u);
  EXPECT_EQ(low->matrices[0].rank, 3);
}

TEST(PowerSgdLayout, BatchedIsOnePaddedSquare) {
  auto l = powersgd::ResolveLayout(MakeConfig({{6, 4}, {5}, {3, 2, 2, 2}}, 2, true));  // 53 floats: side 8
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->n, 53);
  EXPECT_EQ(l->matrix_floats, 64);
  ASSERT_EQ(l->matrices.size(), 1u);
  EXPECT_EQ(l->matrices[0].rows, 8);
  EXPECT_EQ(l->matrices[0].cols, 8);
  EXPECT_TRUE(l->uncompressed.empty());
  EXPECT_EQ(l->first_floats(), 16);
  auto exact = powersgd::ResolveLayout(MakeConfig({{7, 7}}, 9, true));  // a perfect square; rank clipped to 7
  ASSERT_TRUE(exact.ok());
  EXPECT_EQ(exact->matrix_floats, 49);
  EXPECT_EQ(exact->matrices[0].rank, 7);
}

TEST(PowerSgdLayout, BadConfigsNameEveryField) {
  Config c = MakeConfig({{3, 0}, {}}, 0);
  c.world_size = 0;
  c.min_compression_rate = -1;
  auto l = powersgd::ResolveLayout(c);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().message(),
            "powersgd: rank: out of range; got 0, expected rank >= 1; world_size: out of range; got 0, expected "
            "world_size >= 1; min_compression_rate: out of range; got -1.000000, expected a finite rate > 0; "
            "shapes[0][1]: out of range; got 0, expected >= 1; shapes[1]: empty; got [], expected >= 1 dimension "
            "(a vector is [numel])");
  auto none = powersgd::ResolveLayout(MakeConfig({}, 1));
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().message(), "powersgd: shapes: empty; got 0 tensors, expected >= 1");
  auto huge = powersgd::ResolveLayout(MakeConfig({{65536, 32768}, {1}}, 1));
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().message(),
            "powersgd: shapes: too many elements; got more than 2147483647, expected <= 2147483647");
}

TEST(PowerSgdCodec, WrongBufferLengthsAreNamed) {
  auto c = powersgd::MakeCodec(MakeConfig({{6, 4}}, 1), Backend::kCpu);
  ASSERT_TRUE(c.ok());
  std::vector<float> grad(24), state(24 + 4), first(5), second(4), out(24);
  EXPECT_EQ((*c)->EncodeP(grad, state, first).message(),
            "powersgd encode: first: wrong length; got 5 floats, expected 6");
  first.resize(6);
  EXPECT_EQ((*c)->Decode(first, second, state, {out.data(), 23}).message(),
            "powersgd decode: out: wrong length; got 23 floats, expected 24");
  EXPECT_EQ((*c)->InitState({state.data(), 3}).message(),
            "powersgd init: state: wrong length; got 3 floats, expected 28");
}

TEST(PowerSgdCodec, InitialQIsStandardNormalAndSeeded) {
  auto l = powersgd::ResolveLayout(MakeConfig({{1000, 1000}}, 20));
  ASSERT_TRUE(l.ok());
  const std::vector<float> q = powersgd::InitialQ(*l);
  ASSERT_EQ(q.size(), 20000u);
  double sum = 0, sq = 0;
  for (float v : q) {
    sum += v;
    sq += static_cast<double>(v) * v;
  }
  const double mean = sum / q.size(), var = sq / q.size() - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.03);  // 4 standard errors of the mean (1 / sqrt(20000) = 0.007)
  EXPECT_NEAR(var, 1.0, 0.04);  // 4 standard errors of the variance (sqrt(2 / 20000) = 0.01)
  Config other = MakeConfig({{1000, 1000}}, 20);
  other.seed = 12;
  EXPECT_NE(powersgd::InitialQ(*powersgd::ResolveLayout(other)), q);
}

template <typename B>
class PowerSgdSuite : public PowerSgdBackend<B> {};
TYPED_TEST_SUITE(PowerSgdSuite, Backends, BackendNames);

// The codec's initial Q in the reference's per-matrix form (matched by offset).
std::vector<ref::Rank> ReferenceRanks(const ref::Group& g, const powersgd::Layout& l, const std::vector<float>& state,
                                      int world) {
  ref::Rank r;
  r.e.assign(g.padded, 0.0);
  for (const ref::Matrix& m : g.matrices) {
    for (const powersgd::Matrix& c : l.matrices) {
      if (c.offset != m.offset) continue;
      const float* q = state.data() + l.matrix_floats + c.q_offset;
      r.q.emplace_back(q, q + c.cols * c.rank);
    }
  }
  EXPECT_EQ(r.q.size(), g.matrices.size());
  return std::vector<ref::Rank>(world, r);
}

TYPED_TEST(PowerSgdSuite, StepsMatchTheScalarDefinition) {
  const std::vector<Config> configs = {
      MakeConfig({{6, 4}, {5}, {3, 2, 2, 2}, {6, 4}, {2, 2}, {7, 9}}, 1),
      MakeConfig({{30, 20}, {7}, {12, 3, 3, 2}, {30, 20}, {1, 50}, {50, 1}}, 3),
      MakeConfig({{6, 4}, {5}, {3, 2, 2, 2}}, 2, true),
  };
  const int world = 3;
  for (size_t ci = 0; ci < configs.size(); ++ci) {
    SCOPED_TRACE("config " + std::to_string(ci));
    const Config& c = configs[ci];
    PowerSgdRanks ranks(c, world, this->kBackend);
    ASSERT_TRUE(ranks.ok());
    const ref::Group g = ref::Plan(c.shapes, c.rank, c.batched, c.min_compression_rate);
    std::vector<ref::Rank> want_ranks = ReferenceRanks(g, ranks.layout(), ranks.State(0), world);
    for (int step = 0; step < 3; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      std::vector<std::vector<float>> grads;
      for (int r = 0; r < world; ++r) grads.push_back(RandomVector(g.n, 100 * step + r + 1));
      const std::vector<std::vector<float>> got = ranks.Step(grads);
      const std::vector<double> want = ref::Step(g, want_ranks, grads);
      for (int r = 0; r < world; ++r) {
        ASSERT_EQ(got[r], got[0]) << "rank " << r << " differs from rank 0";
        const std::vector<float> state = ranks.State(r);
        for (int64_t i = 0; i < g.n; ++i) ASSERT_NEAR(got[r][i], want[i], 1e-4 * (1 + std::fabs(want[i]))) << i;
        for (int64_t i = 0; i < g.padded; ++i) {
          ASSERT_NEAR(state[i], want_ranks[r].e[i], 1e-4 * (1 + std::fabs(want_ranks[r].e[i]))) << "e " << i;
        }
      }
    }
  }
}

// With r at least the rank of the average, one power step recovers it: P spans its columns,
// so P P^T M = M. Rank 0 holds u1 v1^T, rank 1 holds u2 v2^T; their average has rank 2.
TYPED_TEST(PowerSgdSuite, RecoversALowRankAverageExactly) {
  const int64_t rows = 16, cols = 12;
  Config c = MakeConfig({{rows, cols}, {3}}, 2);
  PowerSgdRanks ranks(c, 2, this->kBackend);
  ASSERT_TRUE(ranks.ok());
  std::vector<std::vector<float>> grads(2, std::vector<float>(rows * cols + 3));
  for (int r = 0; r < 2; ++r) {
    const std::vector<float> u = RandomVector(rows, 10 + r), v = RandomVector(cols, 20 + r), b = RandomVector(3, 30 + r);
    for (int64_t a = 0; a < rows; ++a)
      for (int64_t k = 0; k < cols; ++k) grads[r][a * cols + k] = u[a] * v[k];
    for (int k = 0; k < 3; ++k) grads[r][rows * cols + k] = b[k];
  }
  const std::vector<std::vector<float>> out = ranks.Step(grads);
  for (size_t i = 0; i < grads[0].size(); ++i) {
    const float mean = (grads[0][i] + grads[1][i]) / 2;
    ASSERT_NEAR(out[0][i], mean, 1e-5 * (1 + std::fabs(mean))) << i;
  }
}

// InitState writes e = 0 and the seeded draw on every backend alike.
TYPED_TEST(PowerSgdSuite, InitStateIsZerosThenTheSeededDraw) {
  PowerSgdRanks ranks(MakeConfig({{6, 4}, {5}, {7, 9}}, 2), 1, this->kBackend);
  ASSERT_TRUE(ranks.ok());
  const powersgd::Layout& l = ranks.layout();
  std::vector<float> want(static_cast<size_t>(l.matrix_floats), 0.0f);
  const std::vector<float> q = powersgd::InitialQ(l);
  want.insert(want.end(), q.begin(), q.end());
  EXPECT_EQ(ranks.State(0), want);
}

}  // namespace
}  // namespace cupcake::kernels::testing
