// Bad input is a Status with a message of the shape `<what>: <problem>; got <value>,
// expected <constraint>`, never a crash or an out-of-bounds access. The texts are pinned.
#include <limits>

#include "harness.h"

namespace cupcake::kernels::testing {
namespace {

CompressorConfig Config(const std::string& name, int64_t n, int world, double ratio = 0.01,
                        const std::string& memory = "") {
  CompressorConfig c;
  c.name = name;
  c.n = n;
  c.world_size = world;
  c.ratio = ratio;
  c.memory = memory;
  return c;
}

std::string ErrorOf(const CompressorConfig& c) {
  auto r = MakeCompressor(c, Backend::kCpu);
  EXPECT_FALSE(r.ok());
  return r.ok() ? "" : r.status().message();
}

TEST(CompressorConfig, RejectsZeroLengthGroup) {
  EXPECT_EQ(ErrorOf(Config("topk", 0, 2)),
            "compressor 'topk': n: out of range; got 0, expected 1 <= n <= 2147483647");
}

TEST(CompressorConfig, RejectsZeroWorldSize) {
  EXPECT_EQ(ErrorOf(Config("fp16", 10, 0)),
            "compressor 'fp16': world_size: out of range; got 0, expected world_size >= 1");
}

TEST(CompressorConfig, RejectsRatiosOutsideZeroOne) {
  EXPECT_EQ(ErrorOf(Config("topk", 10, 1, 0.0)),
            "compressor 'topk': ratio: ratio out of range; got 0, expected 0 < ratio <= 1");
  EXPECT_EQ(ErrorOf(Config("randk", 10, 1, 1.5)),
            "compressor 'randk': ratio: ratio out of range; got 1.5, expected 0 < ratio <= 1");
  EXPECT_EQ(ErrorOf(Config("dgc", 10, 1, std::numeric_limits<double>::quiet_NaN())),
            "compressor 'dgc': ratio: ratio out of range; got nan, expected 0 < ratio <= 1");
  // Compressors without a ratio ignore it.
  EXPECT_TRUE(MakeCompressor(Config("fp16", 10, 1, 0.0), Backend::kCpu).ok());
}

TEST(CompressorConfig, ReportsSeveralProblemsTogether) {
  EXPECT_EQ(ErrorOf(Config("topk", -1, 0, 2.0)),
            "compressor 'topk': n: out of range; got -1, expected 1 <= n <= 2147483647\n"
            "compressor 'topk': world_size: out of range; got 0, expected world_size >= 1\n"
            "compressor 'topk': ratio: ratio out of range; got 2, expected 0 < ratio <= 1");
}

TEST(CompressorConfig, RejectsUnknownCompressorAndMemory) {
  EXPECT_EQ(ErrorOf(Config("topkk", 10, 1)),
            "compressor: unknown compressor 'topkk' (did you mean 'topk'?); expected one of fp32, fp16, topk, "
            "randk, dgc, qsgd, signsgd, efsignsgd, signum, terngrad, onebit");
  EXPECT_EQ(ErrorOf(Config("topk", 10, 1, 0.1, "residue")),
            "compressor 'topk': memory: unknown memory 'residue'; expected one of residual, dgc, none");
  EXPECT_EQ(ErrorOf(Config("qsgd", 10, 1, 0.1, "dgc")),
            "compressor 'qsgd': memory: 'dgc' clears the entries it sent and needs a sparse compressor; got "
            "'qsgd', expected one of topk, randk, dgc");
}

TEST(CompressorConfig, LayoutUsesTheCatalogueDefaults) {
  auto l = ResolveLayout(Config("efsignsgd", 100, 4));
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->memory, MemoryKind::kResidual);
  EXPECT_EQ(l->state_floats, 100);
  EXPECT_EQ(l->payload_bytes, 13 + 4);
  EXPECT_EQ(l->decode_input_bytes, 4 * 17);
  auto d = ResolveLayout(Config("dgc", 100, 4, 0.05));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->memory, MemoryKind::kDgc);
  EXPECT_EQ(d->state_floats, 200);
  EXPECT_EQ(d->k, 5);
}

class BadBuffers : public ::testing::Test {
 protected:
  void SetUp() override { c_ = std::move(MakeCompressor(Config("topk", 10, 2, 0.2), Backend::kCpu)).value(); }
  std::unique_ptr<Compressor> c_;
  std::vector<float> grad_ = std::vector<float>(10, 1.0f), state_ = std::vector<float>(10, 0.0f);
  std::vector<std::byte> payload_ = std::vector<std::byte>(16);
  std::vector<float> out_ = std::vector<float>(10);
};

TEST_F(BadBuffers, EncodeRejectsWrongLengths) {
  EXPECT_EQ(c_->Encode({grad_.data(), 9}, state_, 0, payload_).message(),
            "topk encode: grad: wrong length; got 9 floats, expected 10");
  EXPECT_EQ(c_->Encode(grad_, {state_.data(), 0}, 0, payload_).message(),
            "topk encode: state: wrong length; got 0 floats, expected 10");
  EXPECT_EQ(c_->Encode(grad_, state_, 0, {payload_.data(), 15}).message(),
            "topk encode: payload: wrong length; got 15 bytes, expected 16");
  EXPECT_EQ(c_->Encode({static_cast<const float*>(nullptr), 10}, state_, 0, payload_).message(),
            "topk encode: grad: null pointer; got nullptr, expected 10 floats");
}

TEST_F(BadBuffers, DecodeRejectsWrongLengths) {
  std::vector<std::byte> two(32);
  EXPECT_EQ(c_->Decode({two.data(), 16}, out_, 0).message(),
            "topk decode: payloads: wrong length; got 16 bytes, expected 32 (2 payloads of 16 bytes)");
  EXPECT_EQ(c_->Decode(two, {out_.data(), 0}, 0).message(),
            "topk decode: out: wrong length; got 0 floats, expected 10");
  EXPECT_EQ(c_->Decode({}, out_, 0).message(),
            "topk decode: payloads: wrong length; got 0 bytes, expected 32 (2 payloads of 16 bytes)");
}

TEST_F(BadBuffers, DecodeRejectsIndicesOutOfRangeAndLeavesOutUntouched) {
  std::vector<std::byte> two(32);
  const int32_t idx[2] = {1, 10};
  std::memcpy(two.data() + 16 + 8, idx, 8);  // second rank's indices
  std::vector<float> out(10, 42.0f);
  EXPECT_EQ(c_->Decode(two, out, 0).message(),
            "topk decode: payload 1: index 1: out of range; got 10, expected 0 <= index < 10");
  EXPECT_EQ(out, std::vector<float>(10, 42.0f));
  const int32_t neg[2] = {-1, 2};
  std::memcpy(two.data() + 8, neg, 8);
  EXPECT_EQ(c_->Decode(two, out, 0).message(),
            "topk decode: payload 0: index 0: out of range; got -1, expected 0 <= index < 10");
}

// Where CUDA is available the compressor is made (no skip: a GPU run checks that side);
// elsewhere making one fails with the availability check's own message.
TEST(Backends, CudaUnavailableIsAStatusThatSaysWhy) {
  Status s = BackendAvailable(Backend::kCuda);
  auto c = MakeCompressor(Config("fp16", 10, 1), Backend::kCuda);
  if (s.ok()) {
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return;
  }
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), s.message());
  EXPECT_NE(s.message().find("backend cuda: "), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("; got "), std::string::npos) << s.message();
}

TEST(Buffers, RejectOversizedCopies) {
  auto b = Buffer::Allocate(Backend::kCpu, 8);
  ASSERT_TRUE(b.ok());
  char src[16] = {};
  EXPECT_EQ(b->CopyFromHost(src, 16).message(),
            "buffer: copy size out of range; got 16 bytes, expected 0 <= size <= 8");
  EXPECT_EQ(Buffer::Allocate(Backend::kCpu, -1).status().message(),
            "buffer: size out of range; got -1 bytes, expected >= 0");
}

}  // namespace
}  // namespace cupcake::kernels::testing
