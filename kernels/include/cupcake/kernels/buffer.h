// The one memory API: bytes on a backend (host memory or CUDA device memory), and the backends
// themselves. Kept apart from the compressors (compressor.h) so that code that only moves bytes,
// the communicator above all, does not see the compressor API.
#pragma once

#include <cstdint>

#include "cupcake/proto/status.h"

namespace cupcake::kernels {

enum class Backend { kCpu, kCuda };
const char* BackendName(Backend backend);  // "cpu", "cuda"

// Ok when the backend can run here; otherwise says why (no CUDA in this build, no device).
Status BackendAvailable(Backend backend);

// Bytes on a backend (host memory for kCpu, device memory for kCuda), for callers that
// stage data for a compressor or a collective: the communicators, the profiler, the tests, the
// benchmarks. Move-only, owning. Thread-safety: none; distinct buffers are independent.
class Buffer {
 public:
  static StatusOr<Buffer> Allocate(Backend backend, int64_t size_bytes);
  Buffer() = default;
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  ~Buffer();

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  int64_t size_bytes() const { return size_bytes_; }
  Backend backend() const { return backend_; }
  // Synchronous copies and fill; size_bytes must not exceed size_bytes().
  Status CopyFromHost(const void* src, int64_t size_bytes);
  Status CopyToHost(void* dst, int64_t size_bytes) const;
  Status Zero();

 private:
  Backend backend_ = Backend::kCpu;
  void* data_ = nullptr;
  int64_t size_bytes_ = 0;
};

// Waits for the work queued on `stream` (kCuda: a cudaStream_t, nullptr = the default stream);
// no-op for kCpu.
Status Synchronize(Backend backend, void* stream = nullptr);

}  // namespace cupcake::kernels
