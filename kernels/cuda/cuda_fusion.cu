// The CUDA FusionTable: one launch packs or unpacks every tensor of a group (the multi-tensor
// copy of PyTorch's multi_tensor_apply and apex's multi_tensor_scale).
//   1. At creation, each tensor is cut into chunks of at most kChunk floats; a chunk is
//      (tensor pointer, fusion pointer, count), both pointers already offset to its start. The
//      table goes to device memory once (cudaMalloc + cudaMemcpy); zero-size tensors get no chunk.
//   2. Pack and Unpack launch one block per chunk. A block copies its chunk with 16-byte loads and
//      stores when both pointers are 16-byte aligned (then a scalar tail), else with 4-byte ones;
//      chunk starts are multiples of kChunk floats inside a tensor, so a tensor whose buffer and
//      fusion offset are aligned is aligned in every chunk.
//   3. The divided unpack computes x / float(W) per element, the fp32 decode's division
//      (Fp32DecodeKernel; IEEE division, no fast math), so it is bitwise Decode then Unpack.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../src/backends.h"
#include "cupcake/internal/cuda_status.h"

namespace cupcake::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunk = 8192;  // floats per block: 8 float4 per thread

struct Chunk {
  float* tensor;
  float* fused;
  int64_t count;
};

template <bool kPack, bool kDivide>
__global__ void FusionKernel(const Chunk* __restrict__ chunks, float w) {
  const Chunk c = chunks[blockIdx.x];
  const float* __restrict__ src = kPack ? c.tensor : c.fused;
  float* __restrict__ dst = kPack ? c.fused : c.tensor;
  const int n = static_cast<int>(c.count);
  int start = 0;
  if (((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) & 15) == 0) {
    const int n4 = n / 4;
    const float4* __restrict__ s4 = reinterpret_cast<const float4*>(src);
    float4* __restrict__ d4 = reinterpret_cast<float4*>(dst);
#pragma unroll 4
    for (int i = threadIdx.x; i < n4; i += kThreads) {
      float4 v = s4[i];
      if (kDivide) {
        v.x = v.x / w;
        v.y = v.y / w;
        v.z = v.z / w;
        v.w = v.w / w;
      }
      d4[i] = v;
    }
    start = 4 * n4;
  }
  for (int i = start + threadIdx.x; i < n; i += kThreads) dst[i] = kDivide ? src[i] / w : src[i];
}

class CudaFusionTable final : public FusionTable {
 public:
  explicit CudaFusionTable(int64_t numel) : FusionTable(Backend::kCuda, numel) {}
  ~CudaFusionTable() override {
    if (chunks_ != nullptr) (void)cudaFree(chunks_);
  }

  Status Init(std::span<const FusionSegment> segments, float* fusion) {
    std::vector<Chunk> chunks;
    float* at = fusion;
    for (const FusionSegment& s : segments) {
      for (int64_t i = 0; i < s.numel; i += kChunk)
        chunks.push_back(Chunk{s.data + i, at + i, s.numel - i < kChunk ? s.numel - i : kChunk});
      at += s.numel;
    }
    if (chunks.size() > static_cast<size_t>(INT_MAX))
      return InvalidArgumentError("fusion table: too many chunks; got " + std::to_string(chunks.size()) +
                                  ", expected <= " + std::to_string(INT_MAX) + " (" + std::to_string(kChunk) +
                                  " floats each)");
    count_ = static_cast<unsigned>(chunks.size());
    if (count_ == 0) return Status::Ok();
    const size_t bytes = sizeof(Chunk) * chunks.size();
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMalloc(&chunks_, bytes));
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMemcpy(chunks_, chunks.data(), bytes, cudaMemcpyHostToDevice));
    return Status::Ok();
  }

 private:
  Status PackImpl(void* stream) override {
    if (count_ == 0) return Status::Ok();
    FusionKernel<true, false><<<count_, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(chunks_, 1.0f);
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::Ok();
  }
  Status UnpackImpl(int divide_by, void* stream) override {
    if (count_ == 0) return Status::Ok();
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (divide_by == 0)
      FusionKernel<false, false><<<count_, kThreads, 0, s>>>(chunks_, 1.0f);
    else
      FusionKernel<false, true><<<count_, kThreads, 0, s>>>(chunks_, static_cast<float>(divide_by));
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::Ok();
  }

  Chunk* chunks_ = nullptr;
  unsigned count_ = 0;
};

}  // namespace

StatusOr<std::unique_ptr<FusionTable>> MakeCudaFusionTable(std::span<const FusionSegment> segments, float* fusion,
                                                           int64_t numel) {
  CUPCAKE_RETURN_IF_ERROR(DeviceAvailable());
  auto table = std::make_unique<CudaFusionTable>(numel);
  CUPCAKE_RETURN_IF_ERROR(table->Init(segments, fusion));
  return std::unique_ptr<FusionTable>(std::move(table));
}

}  // namespace cupcake::kernels::cuda
