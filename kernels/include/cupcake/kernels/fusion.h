// Multi-tensor pack and unpack: the tensors of one group, each in a buffer of its own, gathered
// into one contiguous fusion buffer before the encode (Pack) and scattered back after the decode
// (Unpack), on the CPU or on the GPU in one kernel launch each (the multi-tensor copy of PyTorch's
// multi_tensor_apply and apex).
//
// Layout: tensor j occupies fusion[offset_j, offset_j + numel_j) with offset_j the sum of the
// numels before it, in the order given.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "cupcake/kernels/compressor.h"
#include "cupcake/proto/status.h"

namespace cupcake::kernels {

// One tensor of a group: `numel` floats at `data` (host memory for kCpu, device memory for kCuda).
struct FusionSegment {
  float* data = nullptr;
  int64_t numel = 0;
};

// FusionTable: a group's tensors and the fusion buffer they are packed into, fixed at creation.
// The CUDA table (each tensor cut into chunks of at most 8192 floats, one thread block per
// chunk) is built on the host and copied to device memory once, at creation; Pack and Unpack
// allocate nothing and are one kernel launch each, asynchronous on `stream` (a cudaStream_t,
// nullptr = the default stream). For kCpu they are memcpy and a loop, synchronous; `stream` is
// ignored.
// Ownership: owns its table; not the tensors nor the fusion buffer, which must outlive it and
// the work queued on it.
// Thread-safety: calls on one object from one thread at a time; distinct objects independent.
class FusionTable {
 public:
  virtual ~FusionTable();
  FusionTable(const FusionTable&) = delete;
  FusionTable& operator=(const FusionTable&) = delete;

  Backend backend() const { return backend_; }
  int64_t numel() const { return numel_; }  // the fusion buffer's floats: the sum of the numels

  // fusion <- the tensors, bit for bit.
  Status Pack(void* stream = nullptr);
  // The tensors <- fusion, bit for bit.
  Status Unpack(void* stream = nullptr);
  // The tensors <- fusion / W elementwise: x / static_cast<float>(world_size), IEEE division,
  // the fp32 decode's arithmetic (bitwise equal to Decode of an fp32 compressor then Unpack).
  // world_size >= 1.
  Status UnpackDivided(int world_size, void* stream = nullptr);

 protected:
  FusionTable(Backend backend, int64_t numel) : backend_(backend), numel_(numel) {}

 private:
  virtual Status PackImpl(void* stream) = 0;
  // divide_by 0: a copy; >= 1: the divide.
  virtual Status UnpackImpl(int divide_by, void* stream) = 0;

  Backend backend_;
  int64_t numel_;
};

// Creates the table of `segments` (in order) over `fusion` (their total numel floats). Errors:
// a negative numel, a null pointer with a positive numel (naming the segment), or a backend this
// build or machine does not have.
StatusOr<std::unique_ptr<FusionTable>> MakeFusionTable(Backend backend, std::span<const FusionSegment> segments,
                                                       float* fusion);

}  // namespace cupcake::kernels
