// The device engine (GPU memory). Events, for K groups: encoded[k] = k on the compute stream,
// exchanged[k] = K + k on the communicator's, the step's end 2K, job_ready[k] = 2K + 1 + k on
// the job's stream, and the hop 3K + 1 (hierarchical runners). Graphs: group k's pack and
// encode k, its decode and unpack K + k.
//   GradientReady: the group's encode (an offloaded group: its copies to pinned host memory)
//     is queued on the compute stream after the job's stream; the collectives of the encoded
//     groups are then enqueued in group order on the communicator's stream (no communication
//     thread: nothing blocks). The CPU worker encodes offloaded groups once their copies are
//     done and launches the collectives next in order.
//   Synchronize: waits until every collective is enqueued; queues each on-device group's decode
//     and unpack behind its collective's event; decodes offloaded groups on this thread in
//     group order, each once its exchange is done, queueing the copies back; waits for the last
//     event, polling against the clock so a missing peer gives DeadlineExceeded.
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "engine.h"

namespace cupcake::runtime::internal {

int DeviceEventCount(int groups) { return 3 * groups + 2; }
int DeviceGraphCount(int groups) { return 2 * groups; }
int DeviceHopEvent(int groups) { return 3 * groups + 1; }

namespace {

constexpr auto kPoll = std::chrono::milliseconds(1);

class DeviceEngine final : public Engine {
 public:
  DeviceEngine(StepState state, std::unique_ptr<DeviceStreams> device)
      : state_(state), device_(std::move(device)), count_(state.group_count()) {
    state_.context.device = device_.get();
    for (const Group& g : *state_.groups) offloading_ |= g.runner->offload() != nullptr;
    if (offloading_) thread_ = std::thread([this] { OffloadLoop(); });
  }

  // Collectives enqueued and not known to be finished may wait for a peer that never comes:
  // abort the communicator (NCCL: ncclCommAbort) so the streams drain, rather than hang. The
  // CPU worker's waits are for local copies only.
  ~DeviceEngine() override {
    comm::Communicator& comm = *state_.context.comm;
    if (launched_ > 0) comm.Abort("session destroyed during a step (rank " + std::to_string(comm.rank()) + ")");
    if (thread_.joinable()) {
      {
        std::lock_guard lock(mu_);
        stop_ = true;
      }
      cv_.notify_all();
      thread_.join();
    }
  }

  Status GroupReady(int k) override {
    Group& g = state_.group(k);
    std::lock_guard lock(mu_);  // the CPU worker launches collectives too
    const int job_ready = 2 * count_ + 1 + k;
    auto where = [k] { return "GradientReady: groups[" + std::to_string(k) + "]"; };  // built on failure only
    if (Status s = device_->Record(job_ready, state_.job_stream); !s.ok()) return s.WithPrefix(where());
    const bool offloaded = g.runner->offload() != nullptr;
    const StepContext context = state_.Context();
    bool work_failed = false;
    auto work = [&](void* stream) {
      Status w = offloaded ? CopyTensors(g, /*to_host=*/true, stream) : g.runner->Encode(g.work(), context, stream);
      work_failed = !w.ok();
      return w;
    };
    Status s = device_->Enqueue(Graph(g, k, /*decode=*/false), job_ready, k, StreamWork(work));
    if (!s.ok()) return work_failed ? s : s.WithPrefix(where());
    if (offloaded) {  // the CPU worker encodes it once the copies are done (event k)
      offload_queue_.push_back(k);
      cv_.notify_all();
      return Status::Ok();
    }
    g.stage = Stage::kEncoded;
    return LaunchInOrder();
  }

  Status Synchronize() override {
    const double start_us = state_.clock->NowUs();
    CUPCAKE_RETURN_IF_ERROR(WaitAllLaunched(start_us));
    for (int k = 0; k < count_; ++k) {
      Group& g = state_.group(k);
      if (g.runner->offload() != nullptr) continue;
      const StepContext context = state_.Context();
      bool work_failed = false;
      auto work = [&](void* stream) {
        Status w = g.runner->Decode(g.work(), context, stream);
        work_failed = !w.ok();
        return w;
      };
      Status s = device_->Enqueue(Graph(g, k, /*decode=*/true), count_ + k, -1, StreamWork(work));
      if (!s.ok()) return work_failed ? s : s.WithPrefix("Synchronize");
    }
    CUPCAKE_RETURN_IF_ERROR(DecodeOffloaded(start_us));
    if (Status s = device_->Record(2 * count_, device_->compute()); !s.ok()) return s.WithPrefix("Synchronize");
    return WaitFor(2 * count_, start_us);
  }

  Status CheckDeviceMemory(const void* p) const override { return device_->CheckDeviceMemory(p); }

  void EndStep() override {
    std::lock_guard lock(mu_);
    for (Group& g : *state_.groups) {
      g.pending = g.layout->last - g.layout->first + 1;
      g.stage = Stage::kIdle;
    }
    launched_ = 0;
  }

 private:
  // The graph that holds group k's encode (or decode), or -1 to queue it directly. A probed
  // step's encode is queued directly: GraVAC's gain probe (before the encode) changes its
  // arguments with the rungs and runs on some steps only.
  int Graph(const Group& g, int k, bool decode) const {
    if (!state_.device_graphs || !g.runner->Graphable(decode)) return -1;
    if (!decode && state_.Context().gain != nullptr) return -1;
    return decode ? count_ + k : k;
  }

  // The collectives of the encoded groups in group order (every rank launches the same
  // sequence), each after its encode (event k) and marked by event K + k; an offloaded group's
  // payload is copied in from the host before and what it receives out after. With mu_ held.
  Status LaunchInOrder() {
    void* stream = state_.context.comm->stream();
    const StepContext context = state_.Context();
    while (launched_ < count_ && state_.group(launched_).stage == Stage::kEncoded) {
      const int k = launched_;
      Group& g = state_.group(k);
      const OffloadBuffers* o = g.runner->offload();
      Status s = device_->StreamWait(stream, k);
      if (s.ok() && o != nullptr) s = device_->Copy(o->device_payload, o->payload, o->payload_bytes, stream);
      if (s.ok()) s = g.runner->Exchange(g.work(), context);
      if (s.ok() && o != nullptr) s = device_->Copy(o->received, o->device_received, o->received_bytes, stream);
      if (s.ok()) s = device_->Record(count_ + k, stream);
      if (!s.ok()) return s.WithPrefix("GradientReady: " + CollectiveName(state_, k));
      g.stage = Stage::kExchanged;  // enqueued; event K + k says when it is done
      ++launched_;
    }
    return Status::Ok();
  }

  bool TimedOut(double start_us) const { return state_.clock->NowUs() - start_us >= state_.timeout_us; }

  // Every tensor ready and every offloaded encode done: all collectives enqueued.
  Status WaitAllLaunched(double start_us) {
    while (true) {
      {
        std::lock_guard lock(mu_);
        if (!offload_status_.ok()) return offload_status_;
        if (launched_ == count_) return Status::Ok();
        if (TimedOut(start_us)) return StepTimeout(state_, launched_);
      }
      std::this_thread::sleep_for(kPoll);
    }
  }

  // Until event `event` is done. A lost peer never completes the collectives: NCCL's
  // asynchronous error ends the wait.
  Status WaitFor(int event, double start_us) {
    while (true) {
      StatusOr<bool> done = device_->Done(event);
      if (!done.ok()) return done.status().WithPrefix("Synchronize");
      if (*done) return Status::Ok();
      if (Status s = state_.context.comm->AsyncError().WithPrefix("Synchronize"); !s.ok()) return s;
      if (TimedOut(start_us)) {
        int stuck = 0;
        while (stuck < count_ - 1) {
          StatusOr<bool> d = device_->Done(count_ + stuck);
          if (!d.ok() || !*d) break;
          ++stuck;
        }
        return StepTimeout(state_, stuck);
      }
      std::this_thread::yield();
    }
  }

  // Offloaded groups, in group order: the CPU decode once the exchange is done, then the copies
  // back to the tensors on the compute stream.
  Status DecodeOffloaded(double start_us) {
    for (int k = 0; k < count_; ++k) {
      Group& g = state_.group(k);
      const OffloadBuffers* o = g.runner->offload();
      if (o == nullptr) continue;
      CUPCAKE_RETURN_IF_ERROR(WaitFor(count_ + k, start_us));
      CUPCAKE_RETURN_IF_ERROR(g.runner->Decode({o->floats, g.layout->numel, nullptr}, state_.Context(), nullptr));
      auto work = [&](void* stream) { return CopyTensors(g, /*to_host=*/false, stream); };
      if (Status s = device_->Enqueue(-1, -1, -1, StreamWork(work)); !s.ok()) return s.WithPrefix("Synchronize");
    }
    return Status::Ok();
  }

  // An offloaded group's tensors, one copy each, between their buffers and the group's pinned
  // floats (to_host: into them), on `stream`.
  Status CopyTensors(const Group& g, bool to_host, void* stream) {
    int64_t at = 0;
    float* floats = g.runner->offload()->floats;
    for (int i = g.layout->first; i <= g.layout->last; ++i) {
      const Tensor& t = (*state_.tensors)[static_cast<size_t>(i)];
      float* host = floats + at;
      CUPCAKE_RETURN_IF_ERROR(to_host ? device_->Copy(host, t.buffer.data(), 4 * t.numel, stream)
                                      : device_->Copy(t.buffer.data(), host, 4 * t.numel, stream));
      at += t.numel;
    }
    return Status::Ok();
  }

  // The CPU worker (docs/MODEL.md v2: one thread, serialized with itself): encodes each
  // offloaded group once its copy to the host is done (event k), then launches the collectives
  // next in group order. The first error ends it into offload_status_, which Synchronize reports.
  void OffloadLoop() {
    std::unique_lock lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || !offload_queue_.empty(); });
      if (stop_) return;
      const int k = offload_queue_.front();
      offload_queue_.pop_front();
      Group& g = state_.group(k);
      const StepContext context = state_.Context();
      lock.unlock();
      Status s = device_->Wait(k);  // the runner's encode names itself; a failed wait is named alike
      s = s.ok() ? g.runner->Encode({g.runner->offload()->floats, g.layout->numel, nullptr}, context, nullptr)
                 : s.WithPrefix(StepWhere("GradientReady", k, "encode (offloaded)"));
      lock.lock();
      if (stop_) return;
      if (s.ok()) {
        g.stage = Stage::kEncoded;
        s = LaunchInOrder();
      }
      if (!s.ok()) {
        offload_status_ = s;
        return;
      }
    }
  }

  StepState state_;
  std::unique_ptr<DeviceStreams> device_;
  const int count_;
  int launched_ = 0;  // collectives enqueued this step, in group order; guarded by mu_
  bool offloading_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by mu_
  std::deque<int> offload_queue_;  // guarded by mu_
  Status offload_status_;  // guarded by mu_
  std::thread thread_;
};

}  // namespace

std::unique_ptr<Engine> MakeDeviceEngine(StepState state, std::unique_ptr<DeviceStreams> device) {
  return std::make_unique<DeviceEngine>(state, std::move(device));
}

}  // namespace cupcake::runtime::internal
