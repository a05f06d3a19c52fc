// The CPU FusionTable: memcpy per tensor; the divided unpack is the fp32 decode's loop
// (x / W per element), so a host session's results match its compressors' bitwise.
#include <cstring>
#include <memory>
#include <vector>

#include "../backends.h"
#include "cupcake/kernels/fusion.h"

namespace cupcake::kernels {
namespace {

class CpuFusionTable final : public FusionTable {
 public:
  CpuFusionTable(std::span<const FusionSegment> segments, float* fusion, int64_t numel)
      : FusionTable(Backend::kCpu, numel), segments_(segments.begin(), segments.end()), fusion_(fusion) {}

 private:
  Status PackImpl(void*) override {
    float* at = fusion_;
    for (const FusionSegment& s : segments_) {
      if (s.numel > 0) std::memcpy(at, s.data, static_cast<size_t>(s.numel) * sizeof(float));
      at += s.numel;
    }
    return Status::Ok();
  }
  Status UnpackImpl(int divide_by, void*) override {
    const float* at = fusion_;
    const float w = static_cast<float>(divide_by);
    for (const FusionSegment& s : segments_) {
      if (divide_by == 0) {
        if (s.numel > 0) std::memcpy(s.data, at, static_cast<size_t>(s.numel) * sizeof(float));
      } else {
        for (int64_t i = 0; i < s.numel; ++i) s.data[i] = at[i] / w;
      }
      at += s.numel;
    }
    return Status::Ok();
  }

  std::vector<FusionSegment> segments_;
  float* fusion_;
};

}  // namespace

std::unique_ptr<FusionTable> MakeCpuFusionTable(std::span<const FusionSegment> segments, float* fusion, int64_t numel) {
  return std::make_unique<CpuFusionTable>(segments, fusion, numel);
}

}  // namespace cupcake::kernels
