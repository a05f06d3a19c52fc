// The CUDA work of a Session on GPU memory, behind an interface so that session.cc has no CUDA
// (`#if CUPCAKE_HAVE_*` only in src/factory.cc). The one implementation is
// src/cuda/cuda_device_streams.cc, made by MakeDeviceStreams.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "cupcake/proto/status.h"

namespace cupcake::runtime::internal {

// A non-owning reference to work that queues on a stream, `Status work(void* stream)`; unlike
// std::function it never allocates (a step must not). The callable must outlive the reference.
class StreamWork {
 public:
  template <typename F>
  explicit StreamWork(F& work)
      : object_(&work), call_([](void* o, void* stream) { return (*static_cast<F*>(o))(stream); }) {}
  Status operator()(void* stream) const { return call_(object_, stream); }

 private:
  void* object_;
  Status (*call_)(void*, void*);
};

// DeviceStreams: a compute stream (pack, encode, decode, unpack) on the current CUDA device,
// `events` events (cudaEventDisableTiming) and room for `graphs` CUDA graphs, made at creation. Every call but Done and
// CheckDeviceMemory is asynchronous: it queues work on a stream and returns. Streams are
// cudaStream_t passed as void* (nullptr: the legacy default stream). Errors name the CUDA call, its
// message, and the rank and host given at creation.
// Ownership: owns its stream, events and pinned memory; the destructor waits for the compute
// stream first. Thread-safety: one thread at a time, except Wait.
class DeviceStreams {
 public:
  virtual ~DeviceStreams() = default;
  virtual void* compute() const = 0;
  // Event `event` marks the work queued so far on `stream`.
  virtual Status Record(int event, void* stream) = 0;
  // Work queued later on `stream` waits for event `event`.
  virtual Status StreamWait(void* stream, int event) = 0;
  // Queue on `stream` a copy of `bytes` bytes (device or pinned host memory, either way), or a
  // fill of device memory with zeros.
  virtual Status Copy(void* dst, const void* src, int64_t bytes, void* stream) = 0;
  virtual Status Zero(void* dst, int64_t bytes, void* stream) = 0;
  // Blocks until event `event`'s work is done (cudaEventSynchronize). Any thread.
  virtual Status Wait(int event) = 0;
  // `bytes` of pinned host memory (cudaHostAlloc), kept until this object is destroyed.
  virtual StatusOr<void*> PinnedHost(int64_t bytes) = 0;
  // Whether event `event`'s work is done (cudaEventQuery); does not block.
  virtual StatusOr<bool> Done(int event) = 0;
  // Queues on the compute stream: a wait for event `wait`, the work `enqueue` queues on the stream
  // it is given, a record of event `record` (-1: no wait, no record). With `graph` >= 0 the three
  // are captured into CUDA graph `graph` at the first call and that graph is launched (one launch
  // for them all) then and on every later call with that `graph`: valid only while `enqueue` would
  // queue the same work with the same arguments. `graph` -1 queues them directly every time.
  virtual Status Enqueue(int graph, int wait, int record, StreamWork enqueue) = 0;
  // Ok when `p` points to device (or managed) memory; otherwise says what it is.
  virtual Status CheckDeviceMemory(const void* p) const = 0;
};

// FailedPrecondition when the build has no CUDA or the machine no device ("no CUDA device
// found", naming `call`).
StatusOr<std::unique_ptr<DeviceStreams>> MakeDeviceStreams(int events, int graphs, int rank,
                                                           const std::string& host, const std::string& call);

}  // namespace cupcake::runtime::internal
