// The CUDA work of a Session on GPU memory, behind an interface so that session.cc has no CUDA
// (`#if CUPCAKE_HAVE_*` only in src/factory.cc). The one implementation is
// src/cuda/cuda_device_streams.cc, made by MakeDeviceStreams.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "cupcake/proto/status.h"

namespace cupcake::runtime::internal {

// DeviceStreams: a compute stream (pack, encode, decode, unpack) on the current CUDA device and
// `events` events (cudaEventDisableTiming), all made at creation. Every call but Done and
// CheckDeviceMemory is asynchronous: it queues work on a stream and returns. Streams are
// cudaStream_t passed as void* (nullptr: the legacy default stream). Errors name the CUDA call, its
// message, and the rank and host given at creation.
// Ownership: owns its stream and events; the destructor waits for the compute stream first.
// Thread-safety: one thread at a time.
class DeviceStreams {
 public:
  virtual ~DeviceStreams() = default;
  virtual void* compute() const = 0;
  // Event `event` marks the work queued so far on `stream`.
  virtual Status Record(int event, void* stream) = 0;
  // Work queued later on `stream` waits for event `event`.
  virtual Status StreamWait(void* stream, int event) = 0;
  // Whether event `event`'s work is done (cudaEventQuery); does not block.
  virtual StatusOr<bool> Done(int event) = 0;
  // Ok when `p` points to device (or managed) memory; otherwise says what it is.
  virtual Status CheckDeviceMemory(const void* p) const = 0;
};

// FailedPrecondition when the build has no CUDA or the machine no device ("no CUDA device
// found", naming `call`).
StatusOr<std::unique_ptr<DeviceStreams>> MakeDeviceStreams(int events, int rank, const std::string& host,
                                                           const std::string& call);

}  // namespace cupcake::runtime::internal
