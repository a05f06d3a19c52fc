// PowerSGD on device memory (cupcake/kernels/powersgd.h), step for step the host codec's
// (kernels/src/cpu/powersgd_cpu.cc): the matrix products through cuBLAS (sgemm, default math, so
// no TF32), the Gram-Schmidt orthogonalization as one block per matrix (the column norms and
// dots summed in double by a block reduction), the elementwise steps as grid-stride kernels.
// Results equal the host codec's within float rounding: sgemm and the reductions sum in another
// order.
//
// Row-major buffers are column-major transposes, so each product is issued transposed:
//   P = M Q     (rows x r)  as  P^T = Q^T M^T:  sgemm(N, N, r, rows, cols; Q, r; M, cols; P, r)
//   Q = M^T P   (cols x r)  as  Q^T = P^T M:    sgemm(N, T, r, cols, rows; P, r; M, cols; Q, r)
//   A = P Q^T   (rows x cols) as A^T = Q P^T:   sgemm(T, N, cols, rows, r; Q, r; P, r; A, cols)
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>
#include <memory>
#include <string>
#include <vector>

#include "../src/backends.h"
#include "cupcake/internal/cuda_status.h"
#include "cupcake/kernels/buffer.h"

// Returns an Internal status naming the cuBLAS call and its status when it fails.
#define CUPCAKE_CUBLAS_RETURN_IF_ERROR(call)                                                                \
  do {                                                                                                      \
    if (const cublasStatus_t cupcake_cublas_st_ = (call); cupcake_cublas_st_ != CUBLAS_STATUS_SUCCESS)      \
      return ::cupcake::InternalError(std::string("cublas: ") + #call + ": " +                              \
                                      cublasGetStatusName(cupcake_cublas_st_) + ": " +                      \
                                      cublasGetStatusString(cupcake_cublas_st_));                           \
  } while (0)

namespace cupcake::kernels::cuda {
namespace {

using powersgd::Layout;
using powersgd::Matrix;

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 4096;

int Blocks(int64_t n) { return static_cast<int>(std::min<int64_t>(kMaxBlocks, (n + kThreads - 1) / kThreads)); }
cudaStream_t S(void* stream) { return static_cast<cudaStream_t>(stream); }
int I(int64_t v) { return static_cast<int>(v); }

// One matrix to orthogonalize: `len` x `r` row-major at base + offset.
struct Panel {
  int64_t offset;
  int64_t len;
  int64_t r;
};

using Reduce = cub::BlockReduce<double, kThreads>;

// Sum over the block of v, broadcast to every thread.
__device__ double BlockSum(double v, typename Reduce::TempStorage& tmp, double& shared) {
  const double s = Reduce(tmp).Sum(v);
  if (threadIdx.x == 0) shared = s;
  __syncthreads();
  const double out = shared;
  __syncthreads();
  return out;
}

// The host codec's Orthogonalize, one block per panel.
__global__ void OrthogonalizeKernel(float* base, const Panel* panels) {
  __shared__ typename Reduce::TempStorage tmp;
  __shared__ double shared;
  const Panel p = panels[blockIdx.x];
  float* a = base + p.offset;
  for (int64_t i = 0; i < p.r; ++i) {
    double sq = 0;
    for (int64_t k = threadIdx.x; k < p.len; k += blockDim.x) sq += static_cast<double>(a[k * p.r + i]) * a[k * p.r + i];
    const auto norm = static_cast<float>(sqrt(BlockSum(sq, tmp, shared)));
    if (norm > 0) {
      for (int64_t k = threadIdx.x; k < p.len; k += blockDim.x) a[k * p.r + i] /= norm;
    }
    __syncthreads();
    for (int64_t j = i + 1; j < p.r; ++j) {
      double dot = 0;
      for (int64_t k = threadIdx.x; k < p.len; k += blockDim.x) dot += static_cast<double>(a[k * p.r + i]) * a[k * p.r + j];
      const auto d = static_cast<float>(BlockSum(dot, tmp, shared));
      for (int64_t k = threadIdx.x; k < p.len; k += blockDim.x) a[k * p.r + j] -= d * a[k * p.r + i];
      __syncthreads();
    }
  }
}

__global__ void AddKernel(float* x, const float* g, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) x[i] += g[i];
}
__global__ void SubtractKernel(float* e, const float* a, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) e[i] -= a[i];
}
__global__ void DivideKernel(float* dst, const float* src, int64_t n, float w) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    dst[i] = src[i] / w;
}
// packed[j] = x[index[j]]
__global__ void GatherKernel(float* packed, const float* x, const int32_t* index, int64_t n) {
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < n; j += int64_t{gridDim.x} * blockDim.x)
    packed[j] = x[index[j]];
}
// out[index[j]] = packed[j] / w
__global__ void ScatterKernel(float* out, const float* packed, const int32_t* index, int64_t n, float w) {
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < n; j += int64_t{gridDim.x} * blockDim.x)
    out[index[j]] = packed[j] / w;
}

class CudaCodec final : public powersgd::Codec {
 public:
  explicit CudaCodec(const Layout& layout) : Codec(layout, Backend::kCuda) {}
  ~CudaCodec() override {
    if (handle_ != nullptr) cublasDestroy(handle_);
  }

  // Device tables (panels of P and of Q, the uncompressed floats' indices), the batched
  // workspace and the cuBLAS handle.
  Status Init() {
    const Layout& l = layout();
    std::vector<Panel> p, q;
    for (const Matrix& m : l.matrices) {
      p.push_back({m.p_offset, m.rows, m.rank});
      q.push_back({m.q_offset, m.cols, m.rank});
    }
    std::vector<int32_t> index;
    for (const powersgd::Segment& s : l.uncompressed)
      for (int64_t i = 0; i < s.numel; ++i) index.push_back(static_cast<int32_t>(s.offset + i));
    CUPCAKE_RETURN_IF_ERROR(Upload(p, p_panels_));
    CUPCAKE_RETURN_IF_ERROR(Upload(q, q_panels_));
    CUPCAKE_RETURN_IF_ERROR(Upload(index, index_));
    if (l.batched) {
      CUPCAKE_ASSIGN_OR_RETURN(square_, Buffer::Allocate(Backend::kCuda, 4 * l.matrix_floats));
    }
    CUPCAKE_CUBLAS_RETURN_IF_ERROR(cublasCreate(&handle_));
    CUPCAKE_CUBLAS_RETURN_IF_ERROR(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH));
    return Status::Ok();
  }

 private:
  template <typename T>
  static Status Upload(const std::vector<T>& host, Buffer& device) {
    CUPCAKE_ASSIGN_OR_RETURN(device, Buffer::Allocate(Backend::kCuda, static_cast<int64_t>(host.size() * sizeof(T))));
    return device.CopyFromHost(host.data(), device.size_bytes());
  }

  Status Orthogonalize(float* base, const Buffer& panels, void* stream) {
    if (layout().matrices.empty()) return Status::Ok();
    OrthogonalizeKernel<<<I(layout().matrices.size()), kThreads, 0, S(stream)>>>(base, panels.as<const Panel>());
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::Ok();
  }

  Status InitImpl(const std::vector<float>& q, float* state, void* stream) override {
    const Layout& l = layout();
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(state, 0, 4 * l.matrix_floats, S(stream)));
    CUPCAKE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(state + l.matrix_floats, q.data(), 4 * q.size(), cudaMemcpyHostToDevice, S(stream)));
    // q is the caller's temporary: the copy from pageable memory is staged before this returns,
    // but wait anyway so the contract does not rest on that.
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(S(stream)));
    return Status::Ok();
  }

  Status EncodePImpl(const float* grad, float* state, float* first, void* stream) override {
    const Layout& l = layout();
    float* x = state;
    float* q = state + l.matrix_floats;
    AddKernel<<<Blocks(l.n), kThreads, 0, S(stream)>>>(x, grad, l.n);
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    CUPCAKE_RETURN_IF_ERROR(Orthogonalize(q, q_panels_, stream));
    CUPCAKE_CUBLAS_RETURN_IF_ERROR(cublasSetStream(handle_, S(stream)));
    const float one = 1.0f, zero = 0.0f;
    for (const Matrix& m : l.matrices) {
      CUPCAKE_CUBLAS_RETURN_IF_ERROR(cublasSgemm(handle_, CUBLAS_OP_N, CUBLAS_OP_N, I(m.rank), I(m.rows), I(m.cols),
                                                 &one, q + m.q_offset, I(m.rank), x + m.offset, I(m.cols), &zero,
                                                 first + m.p_offset, I(m.rank)));
    }
    if (l.uncompressed_floats > 0) {
      GatherKernel<<<Blocks(l.uncompressed_floats), kThreads, 0, S(stream)>>>(first + l.p_floats, x,
                                                                              index_.as<const int32_t>(),
                                                                              l.uncompressed_floats);
      CUPCAKE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    }
    return Status::Ok();
  }

  Status ComputeQImpl(float* first, const float* state, float* second, void* stream) override {
    CUPCAKE_RETURN_IF_ERROR(Orthogonalize(first, p_panels_, stream));
    CUPCAKE_CUBLAS_RETURN_IF_ERROR(cublasSetStream(handle_, S(stream)));
    const float one = 1.0f, zero = 0.0f;
    for (const Matrix& m : layout().matrices) {
      CUPCAKE_CUBLAS_RETURN_IF_ERROR(cublasSgemm(handle_, CUBLAS_OP_N, CUBLAS_OP_T, I(m.rank), I(m.cols), I(m.rows),
                                                 &one, first + m.p_offset, I(m.rank), state + m.offset, I(m.cols),
                                                 &zero, second + m.q_offset, I(m.rank)));
    }
    return Status::Ok();
  }

  Status DecodeImpl(const float* first, const float* second, float* state, float* out, void* stream) override {
    const Layout& l = layout();
    float* e = state;
    float* q = state + l.matrix_floats;
    const auto w = static_cast<float>(l.world_size);
    if (l.q_floats > 0) {
      DivideKernel<<<Blocks(l.q_floats), kThreads, 0, S(stream)>>>(q, second, l.q_floats, w);
      CUPCAKE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    }
    float* approx = l.batched ? square_.as<float>() : out;
    CUPCAKE_CUBLAS_RETURN_IF_ERROR(cublasSetStream(handle_, S(stream)));
    const float one = 1.0f, zero = 0.0f;
    for (const Matrix& m : l.matrices) {
      CUPCAKE_CUBLAS_RETURN_IF_ERROR(cublasSgemm(handle_, CUBLAS_OP_T, CUBLAS_OP_N, I(m.cols), I(m.rows), I(m.rank),
                                                 &one, q + m.q_offset, I(m.rank), first + m.p_offset, I(m.rank),
                                                 &zero, approx + m.offset, I(m.cols)));
    }
    if (l.uncompressed_floats > 0) {
      ScatterKernel<<<Blocks(l.uncompressed_floats), kThreads, 0, S(stream)>>>(
          out, first + l.p_floats, index_.as<const int32_t>(), l.uncompressed_floats, w);
      CUPCAKE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    }
    SubtractKernel<<<Blocks(l.matrix_floats), kThreads, 0, S(stream)>>>(e, approx, l.matrix_floats);
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    if (l.batched) {
      CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out, approx, 4 * l.n, cudaMemcpyDeviceToDevice, S(stream)));
    }
    return Status::Ok();
  }

  cublasHandle_t handle_ = nullptr;
  Buffer p_panels_, q_panels_, index_, square_;
};

}  // namespace

StatusOr<std::unique_ptr<powersgd::Codec>> MakePowerSgdCodec(const powersgd::Layout& layout) {
  CUPCAKE_RETURN_IF_ERROR(DeviceAvailable());
  auto c = std::make_unique<CudaCodec>(layout);
  CUPCAKE_RETURN_IF_ERROR(c->Init());
  return std::unique_ptr<powersgd::Codec>(std::move(c));
}

}  // namespace cupcake::kernels::cuda
