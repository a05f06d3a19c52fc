// Test harness for PowerSGD codecs: W ranks' codecs on one backend (device staging through
// kernels::Buffer), the two allreduces played on the host (sums in rank order), so a test runs
// whole steps from host vectors.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "cupcake/kernels/powersgd.h"
#include "gpu_test.h"

namespace cupcake::kernels::testing {

// The typed suites' fixture: runs on the CPU, and on CUDA when a GPU is present (gpu_test.h:
// skipped only for absent hardware, failed for broken hardware).
template <typename B>
class PowerSgdBackend : public ::testing::Test {
 protected:
  static constexpr Backend kBackend = B::kBackend;
  void SetUp() override { CUPCAKE_GPU_OR_SKIP(BackendAvailable(kBackend)); }
};

class PowerSgdRanks {
 public:
  // One codec per rank with config.world_size = world_size; every state initialized.
  PowerSgdRanks(powersgd::Config config, int world_size, Backend backend) : backend_(backend) {
    config.world_size = world_size;
    for (int r = 0; r < world_size; ++r) {
      auto c = powersgd::MakeCodec(config, backend);
      EXPECT_TRUE(c.ok()) << c.status().ToString();
      if (!c.ok()) return;
      Rank rank;
      rank.codec = std::move(c).value();
      const powersgd::Layout& l = rank.codec->layout();
      rank.grad = Alloc(l.n);
      rank.state = Alloc(l.state_floats());
      rank.first = Alloc(l.first_floats());
      rank.second = Alloc(l.second_floats());
      rank.out = Alloc(l.n);
      EXPECT_TRUE(rank.codec->InitState(Span(rank.state)).ok());
      ranks_.push_back(std::move(rank));
    }
  }

  bool ok() const { return !ranks_.empty(); }
  const powersgd::Layout& layout() const { return ranks_[0].codec->layout(); }

  // One step of every rank on grads[r]; returns every rank's out.
  std::vector<std::vector<float>> Step(const std::vector<std::vector<float>>& grads) {
    const powersgd::Layout& l = layout();
    for (size_t r = 0; r < ranks_.size(); ++r) {
      Rank& k = ranks_[r];
      EXPECT_TRUE(k.grad.CopyFromHost(grads[r].data(), 4 * l.n).ok());
      Status s = k.codec->EncodeP(Span(k.grad), Span(k.state), Span(k.first));
      EXPECT_TRUE(s.ok()) << s.ToString();
    }
    AllreduceSum([](Rank& k) -> Buffer& { return k.first; }, l.first_floats());
    for (Rank& k : ranks_) {
      Status s = k.codec->ComputeQ(Span(k.first), Span(k.state), Span(k.second));
      EXPECT_TRUE(s.ok()) << s.ToString();
    }
    AllreduceSum([](Rank& k) -> Buffer& { return k.second; }, l.second_floats());
    std::vector<std::vector<float>> outs;
    for (Rank& k : ranks_) {
      Status s = k.codec->Decode(Span(k.first), Span(k.second), Span(k.state), Span(k.out));
      EXPECT_TRUE(s.ok()) << s.ToString();
      outs.push_back(Host(k.out, l.n));
    }
    return outs;
  }

  std::vector<float> State(int rank) { return Host(ranks_[rank].state, layout().state_floats()); }
  void SetState(int rank, const std::vector<float>& s) {
    EXPECT_TRUE(ranks_[rank].state.CopyFromHost(s.data(), 4 * layout().state_floats()).ok());
  }

 private:
  struct Rank {
    std::unique_ptr<powersgd::Codec> codec;
    Buffer grad, state, first, second, out;
  };

  Buffer Alloc(int64_t floats) {
    auto b = Buffer::Allocate(backend_, 4 * floats);
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    return b.ok() ? std::move(b).value() : Buffer();
  }
  static std::span<float> Span(const Buffer& b) { return {b.as<float>(), static_cast<size_t>(b.size_bytes() / 4)}; }
  std::vector<float> Host(const Buffer& b, int64_t floats) {
    EXPECT_TRUE(Synchronize(backend_).ok());
    std::vector<float> v(static_cast<size_t>(floats));
    EXPECT_TRUE(b.CopyToHost(v.data(), 4 * floats).ok());
    return v;
  }
  // Every rank's buffer becomes the sum over ranks, summed in rank order.
  template <typename Pick>
  void AllreduceSum(Pick pick, int64_t floats) {
    std::vector<float> sum(static_cast<size_t>(floats), 0.0f);
    for (Rank& k : ranks_) {
      const std::vector<float> v = Host(pick(k), floats);
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += v[i];
    }
    for (Rank& k : ranks_) EXPECT_TRUE(pick(k).CopyFromHost(sum.data(), 4 * floats).ok());
  }

  Backend backend_;
  std::vector<Rank> ranks_;
};

}  // namespace cupcake::kernels::testing
