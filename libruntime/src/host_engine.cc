// The host engine: encode on the caller's thread when a group completes, the collectives on one
// communication thread in group order, overlapping with the rest of backward, and the decodes
// on the caller's thread in Synchronize, each as soon as its collective has finished.
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <sstream>
#include <thread>

#include "engine.h"

namespace cupcake::runtime::internal {

std::string Quoted(const std::string& s) { return "'" + s + "'"; }

std::string CollectiveName(const StepState& state, int k) {
  return "groups[" + std::to_string(k) + "] " + state.group(k).runner->CollectiveName();
}

Status StepTimeout(const StepState& state, int group) {
  const std::vector<Tensor>& tensors = *state.tensors;
  std::string missing;
  int count = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].ready) continue;
    if (count < 10) missing += (count ? ", " : "") + std::to_string(i) + " (" + Quoted(tensors[i].name) + ")";
    ++count;
  }
  if (count > 10) missing += " and " + std::to_string(count - 10) + " more";
  const comm::Communicator& comm = *state.context.comm;
  const std::string where = " (iteration " + std::to_string(*state.iteration) + ", rank " +
                            std::to_string(comm.rank()) + " on " + comm.host() + ")";
  std::ostringstream seconds;
  seconds << state.timeout_us / 1e6 << " s";
  if (count > 0)
    return DeadlineExceededError("Synchronize: gradients never became ready; got no GradientReady within " +
                                 seconds.str() + " for " + std::to_string(count) + " of " +
                                 std::to_string(tensors.size()) + " tensors: " + missing + where);
  return DeadlineExceededError(
      "Synchronize: " + CollectiveName(state, group) + " did not finish within " + seconds.str() +
      "; every gradient of this rank is ready, so a peer is missing gradients or has died" + where);
}

namespace {

// The longest a wait sleeps before it reads the clock again (real time), so a fake clock that
// advances on every read ends a wait after a few polls.
constexpr auto kPoll = std::chrono::milliseconds(1);

class HostEngine final : public Engine {
 public:
  explicit HostEngine(StepState state) : state_(state) {
    thread_ = std::thread([this] { CommLoop(); });
  }

  // A collective still running at destruction waits for a peer that may never come: give up on
  // the group (MPI ends the job with a non-zero exit) rather than hang.
  ~HostEngine() override {
    bool abort = false;
    {
      std::lock_guard lock(mu_);
      stop_ = true;
      abort = in_collective_;
    }
    cv_.notify_all();
    comm::Communicator& comm = *state_.context.comm;
    if (abort) comm.Abort("session destroyed during a collective (rank " + std::to_string(comm.rank()) + ")");
    thread_.join();
  }

  Status GroupReady(int k) override {
    Group& g = state_.group(k);
    if (state_.record_timeline) g.times.encode_start_us = state_.clock->NowUs();
    CUPCAKE_RETURN_IF_ERROR(g.runner->Encode(g.work(), state_.Context(), nullptr));
    if (state_.record_timeline) g.times.encode_end_us = state_.clock->NowUs();
    {
      std::lock_guard lock(mu_);
      g.stage = Stage::kEncoded;
    }
    cv_.notify_all();
    return Status::Ok();
  }

  Status Synchronize() override {
    const double start_us = state_.clock->NowUs();
    for (int k = 0; k < state_.group_count(); ++k) {
      Group& g = state_.group(k);
      std::unique_lock lock(mu_);
      while (g.stage != Stage::kExchanged && comm_status_.ok()) {
        if (state_.clock->NowUs() - start_us >= state_.timeout_us) {
          lock.unlock();
          return StepTimeout(state_, k);
        }
        cv_.wait_for(lock, kPoll);
      }
      if (!comm_status_.ok()) return comm_status_.WithPrefix("Synchronize");
      lock.unlock();
      if (state_.record_timeline) g.times.decode_start_us = state_.clock->NowUs();
      CUPCAKE_RETURN_IF_ERROR(g.runner->Decode(g.work(), state_.Context(), nullptr));
      if (state_.record_timeline) g.times.decode_end_us = state_.clock->NowUs();
    }
    return Status::Ok();
  }

  Status CheckDeviceMemory(const void*) const override { return Status::Ok(); }

  void EndStep() override {
    std::lock_guard lock(mu_);
    for (Group& g : *state_.groups) {
      g.pending = g.layout->last - g.layout->first + 1;
      g.stage = Stage::kIdle;
    }
  }

 private:
  // The groups' collectives in group order, one step after another.
  void CommLoop() {
    std::unique_lock lock(mu_);
    int k = 0;
    while (true) {
      cv_.wait(lock, [&] { return stop_ || state_.group(k).stage == Stage::kEncoded; });
      if (stop_) return;
      Group& g = state_.group(k);
      in_collective_ = true;
      lock.unlock();
      if (state_.record_timeline) g.times.comm_start_us = state_.clock->NowUs();
      Status s = g.runner->Exchange(g.work(), state_.Context());
      if (state_.record_timeline) {
        g.times.comm_end_us = state_.clock->NowUs();
        g.times.zen_union = g.runner->zen_union();
      }
      // Before the group is marked exchanged: Synchronize (and the job's collectives after it)
      // cannot pass this group until the hook has returned.
      if (s.ok() && state_.after_collective != nullptr && *state_.after_collective) {
        lock.lock();
        const bool next_waiting = k + 1 < state_.group_count() && state_.group(k + 1).stage == Stage::kEncoded;
        lock.unlock();
        (*state_.after_collective)(state_.plan, k, next_waiting);
      }
      lock.lock();
      in_collective_ = false;
      if (!s.ok()) {
        comm_status_ = s.WithPrefix(CollectiveName(state_, k));
        cv_.notify_all();
        return;
      }
      g.stage = Stage::kExchanged;
      cv_.notify_all();
      k = (k + 1) % state_.group_count();
    }
  }

  StepState state_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by mu_
  bool in_collective_ = false;  // guarded by mu_
  Status comm_status_;  // guarded by mu_
  std::thread thread_;
};

}  // namespace

std::unique_ptr<Engine> MakeHostEngine(StepState state) { return std::make_unique<HostEngine>(state); }

}  // namespace cupcake::runtime::internal
