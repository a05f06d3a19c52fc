// Test harness: runs a compressor on any backend from host vectors (device staging through
// cupcake::kernels::Buffer), so one typed suite covers the CPU reference and CUDA.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cupcake/kernels/compressor.h"

namespace cupcake::kernels::testing {

struct CpuBackend {
  static constexpr Backend kBackend = Backend::kCpu;
};
struct CudaBackend {
  static constexpr Backend kBackend = Backend::kCuda;
};
// For typed suites over both backends: TYPED_TEST_SUITE(Suite, Backends, BackendNames).
using Backends = ::testing::Types<CpuBackend, CudaBackend>;
class BackendNames {
 public:
  template <typename T>
  static std::string GetName(int) {
    return T::kBackend == Backend::kCpu ? "Cpu" : "Cuda";
  }
};

inline Buffer MustAllocate(Backend b, int64_t bytes) {
  auto r = Buffer::Allocate(b, bytes);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return std::move(r).value();
}

// One compressor plus device copies of its inputs and outputs.
class Runner {
 public:
  Runner(const CompressorConfig& config, Backend backend) : backend_(backend) {
    auto c = MakeCompressor(config, backend);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    c_ = std::move(c).value();
    grad_ = MustAllocate(backend, 4 * c_->n());
    state_ = MustAllocate(backend, 4 * c_->state_floats());
    EXPECT_TRUE(state_.Zero().ok());
    payload_ = MustAllocate(backend, c_->payload_bytes());
    decode_in_ = MustAllocate(backend, c_->decode_input_bytes());
    out_ = MustAllocate(backend, 4 * c_->n());
  }

  Compressor& compressor() { return *c_; }
  int64_t n() const { return c_->n(); }

  std::vector<std::byte> Encode(const std::vector<float>& grad, uint64_t iteration) {
    EXPECT_TRUE(grad_.CopyFromHost(grad.data(), 4 * n()).ok());
    Status s = c_->Encode({grad_.as<const float>(), static_cast<size_t>(n())},
                          {state_.as<float>(), static_cast<size_t>(c_->state_floats())}, iteration,
                          {payload_.as<std::byte>(), static_cast<size_t>(c_->payload_bytes())});
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_TRUE(Synchronize(backend_).ok());
    std::vector<std::byte> p(static_cast<size_t>(c_->payload_bytes()));
    EXPECT_TRUE(payload_.CopyToHost(p.data(), c_->payload_bytes()).ok());
    return p;
  }

  std::vector<float> Decode(const std::vector<std::byte>& payloads, uint64_t iteration) {
    EXPECT_EQ(static_cast<int64_t>(payloads.size()), c_->decode_input_bytes());
    EXPECT_TRUE(decode_in_.CopyFromHost(payloads.data(), c_->decode_input_bytes()).ok());
    Status s = c_->Decode({decode_in_.as<const std::byte>(), static_cast<size_t>(c_->decode_input_bytes())},
                          {out_.as<float>(), static_cast<size_t>(n())}, iteration);
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_TRUE(Synchronize(backend_).ok());
    std::vector<float> out(static_cast<size_t>(n()));
    EXPECT_TRUE(out_.CopyToHost(out.data(), 4 * n()).ok());
    return out;
  }

  std::vector<float> State() {
    std::vector<float> s(static_cast<size_t>(c_->state_floats()));
    EXPECT_TRUE(state_.CopyToHost(s.data(), 4 * c_->state_floats()).ok());
    return s;
  }
  void SetState(const std::vector<float>& s) { EXPECT_TRUE(state_.CopyFromHost(s.data(), 4 * c_->state_floats()).ok()); }

 private:
  Backend backend_;
  std::unique_ptr<Compressor> c_;
  Buffer grad_, state_, payload_, decode_in_, out_;
};

inline std::vector<float> RandomVector(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

inline float LoadF(const std::vector<std::byte>& p, int64_t offset) {
  float f;
  std::memcpy(&f, p.data() + offset, 4);
  return f;
}
inline int32_t LoadI(const std::vector<std::byte>& p, int64_t offset) {
  int32_t v;
  std::memcpy(&v, p.data() + offset, 4);
  return v;
}

// Concatenates per-rank payloads (allgather).
inline std::vector<std::byte> Concat(const std::vector<std::vector<std::byte>>& ps) {
  std::vector<std::byte> all;
  for (const auto& p : ps) all.insert(all.end(), p.begin(), p.end());
  return all;
}

}  // namespace cupcake::kernels::testing
