#include "cupcake/kernels/fusion.h"

#include <string>

#include "backends.h"

namespace cupcake::kernels {

FusionTable::~FusionTable() = default;

Status FusionTable::Pack(void* stream) { return PackImpl(stream); }
Status FusionTable::Unpack(void* stream) { return UnpackImpl(0, stream); }
Status FusionTable::UnpackDivided(int world_size, void* stream) {
  if (world_size < 1)
    return InvalidArgumentError("fusion table: UnpackDivided: world_size out of range; got " +
                                std::to_string(world_size) + ", expected >= 1");
  return UnpackImpl(world_size, stream);
}

StatusOr<int64_t> CheckFusionSegments(std::span<const FusionSegment> segments, const float* fusion) {
  std::string problems;
  int64_t total = 0;
  for (size_t j = 0; j < segments.size(); ++j) {
    const FusionSegment& s = segments[j];
    const std::string f = "fusion table: segments[" + std::to_string(j) + "]";
    if (s.numel < 0) {
      problems += (problems.empty() ? "" : "\n") + f + ".numel: out of range; got " + std::to_string(s.numel) +
                  ", expected >= 0";
      continue;
    }
    if (s.data == nullptr && s.numel > 0)
      problems += (problems.empty() ? "" : "\n") + f + ".data: null; got nullptr with " + std::to_string(s.numel) +
                  " elements, expected a buffer";
    total += s.numel;
  }
  if (fusion == nullptr && total > 0)
    problems += (problems.empty() ? "" : "\n") +
                std::string("fusion table: fusion: null; got nullptr, expected a buffer of ") + std::to_string(total) +
                " floats";
  if (!problems.empty()) return InvalidArgumentError(problems);
  return total;
}

}  // namespace cupcake::kernels
