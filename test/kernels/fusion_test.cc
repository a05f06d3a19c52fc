// FusionTable on the CPU and, when a GPU is present, on CUDA: Pack, Unpack and UnpackDivided
// are bit-exact against a host reference, across chunk boundaries (the CUDA table cuts tensors
// into chunks of 8192 floats), empty tensors and tensors that are not 16-byte aligned (the
// kernel's scalar path); bad segments are refused with pinned messages.
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "cupcake/kernels/fusion.h"
#include "gpu_test.h"
#include "harness.h"

namespace cupcake::kernels::testing {
namespace {

// Tensors at these float offsets in one backing buffer: offsets 1 and 3 are 4-byte but not
// 16-byte aligned; 8192 and 8193 straddle a chunk; 0-size tensors get no chunk.
struct Layout {
  int64_t offset;
  int64_t numel;
};
const std::vector<Layout> kLayout = {{0, 5}, {5, 0}, {9, 8192}, {8201, 8193}, {16397, 1}, {16400, 20001}, {36403, 3}};
constexpr int64_t kBackingFloats = 36406;

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

template <typename B>
class FusionSuite : public ::testing::Test {
 protected:
  static constexpr Backend kBackend = B::kBackend;
  void SetUp() override {
    CUPCAKE_GPU_OR_SKIP(BackendAvailable(kBackend));
    backing_ = MustAllocate(kBackend, 4 * kBackingFloats);
    for (const Layout& l : kLayout) {
      segments_.push_back({backing_.as<float>() + l.offset, l.numel});
      numel_ += l.numel;
    }
    fusion_ = MustAllocate(kBackend, 4 * numel_);
    auto t = MakeFusionTable(kBackend, segments_, fusion_.as<float>());
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    table_ = std::move(t).value();
  }

  std::vector<float> Read(const Buffer& b, int64_t floats) {
    std::vector<float> v(static_cast<size_t>(floats));
    EXPECT_TRUE(Synchronize(kBackend).ok());
    EXPECT_TRUE(b.CopyToHost(v.data(), 4 * floats).ok());
    return v;
  }
  // The tensors' floats, concatenated in segment order.
  std::vector<float> Gather(const std::vector<float>& backing) {
    std::vector<float> out;
    for (const Layout& l : kLayout) out.insert(out.end(), backing.begin() + l.offset, backing.begin() + l.offset + l.numel);
    return out;
  }

  Buffer backing_, fusion_;
  std::vector<FusionSegment> segments_;
  int64_t numel_ = 0;
  std::unique_ptr<FusionTable> table_;
};

TYPED_TEST_SUITE(FusionSuite, Backends, BackendNames);

TYPED_TEST(FusionSuite, PackGathersEveryTensorInOrder) {
  std::vector<float> backing = RandomVector(kBackingFloats, 1);
  backing[9] = std::numeric_limits<float>::quiet_NaN();
  backing[8201] = -0.0f;
  ASSERT_TRUE(this->backing_.CopyFromHost(backing.data(), 4 * kBackingFloats).ok());
  EXPECT_EQ(this->table_->numel(), this->numel_);
  ASSERT_TRUE(this->table_->Pack().ok());
  EXPECT_TRUE(BitEqual(this->Read(this->fusion_, this->numel_), this->Gather(backing)));
}

TYPED_TEST(FusionSuite, UnpackScattersAndLeavesTheGapsAlone) {
  const std::vector<float> before = RandomVector(kBackingFloats, 2);
  const std::vector<float> fused = RandomVector(this->numel_, 3);
  ASSERT_TRUE(this->backing_.CopyFromHost(before.data(), 4 * kBackingFloats).ok());
  ASSERT_TRUE(this->fusion_.CopyFromHost(fused.data(), 4 * this->numel_).ok());
  ASSERT_TRUE(this->table_->Unpack().ok());
  const std::vector<float> after = this->Read(this->backing_, kBackingFloats);
  EXPECT_TRUE(BitEqual(this->Gather(after), fused));
  for (int64_t gap : {5, 6, 7, 8, 16398, 16399}) EXPECT_EQ(after[gap], before[gap]) << "float " << gap;
}

TYPED_TEST(FusionSuite, UnpackDividedIsTheFp32DecodesDivision) {
  std::vector<float> fused = RandomVector(this->numel_, 4, 1e30f);
  fused[0] = std::numeric_limits<float>::denorm_min();
  fused[1] = std::numeric_limits<float>::infinity();
  ASSERT_TRUE(this->fusion_.CopyFromHost(fused.data(), 4 * this->numel_).ok());
  ASSERT_TRUE(this->table_->UnpackDivided(3).ok());
  std::vector<float> expected = fused;
  for (float& x : expected) x = x / 3.0f;
  EXPECT_TRUE(BitEqual(this->Gather(this->Read(this->backing_, kBackingFloats)), expected));
}

TYPED_TEST(FusionSuite, EmptyTableDoesNothing) {
  auto t = MakeFusionTable(this->kBackend, {}, nullptr);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ((*t)->numel(), 0);
  EXPECT_TRUE((*t)->Pack().ok());
  EXPECT_TRUE((*t)->UnpackDivided(2).ok());
}

TEST(FusionTableErrors, NamesEveryBadSegment) {
  float a[4] = {};
  const std::vector<FusionSegment> bad = {{a, 4}, {a, -2}, {nullptr, 3}, {nullptr, 0}};
  auto t = MakeFusionTable(Backend::kCpu, bad, a);
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(t.status().message(),
            "fusion table: segments[1].numel: out of range; got -2, expected >= 0\n"
            "fusion table: segments[2].data: null; got nullptr with 3 elements, expected a buffer");
  EXPECT_EQ(MakeFusionTable(Backend::kCpu, std::vector<FusionSegment>{{a, 4}}, nullptr).status().message(),
            "fusion table: fusion: null; got nullptr, expected a buffer of 4 floats");
}

TEST(FusionTableErrors, UnpackDividedNeedsAWorldSize) {
  float a[2] = {}, f[2] = {};
  auto t = MakeFusionTable(Backend::kCpu, std::vector<FusionSegment>{{a, 2}}, f);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*t)->UnpackDivided(0).message(),
            "fusion table: UnpackDivided: world_size out of range; got 0, expected >= 1");
}

}  // namespace
}  // namespace cupcake::kernels::testing
