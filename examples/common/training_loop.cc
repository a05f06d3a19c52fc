#include "training_loop.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cupcake/proto/file_io.h"

namespace cupcake::examples {
namespace {

// A flag's integer value in [lo, hi], or nullopt.
std::optional<int> ParseInt(const char* text, int lo, int hi) {
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || v < lo || v > hi) return std::nullopt;
  return static_cast<int>(v);
}

// One shared flag; nullopt when `arg` is not one of them.
std::optional<std::string> ParseSharedFlag(const std::string& arg, const char* value, LoopFlags& f) {
  auto integer = [&](int& out, int lo, int hi) -> std::string {
    auto v = ParseInt(value, lo, hi);
    if (!v)
      return arg + ": got '" + value + "', expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
             "]";
    out = *v;
    return "";
  };
  if (arg == "--plan") {
    f.plan = value;
  } else if (arg == "--epochs") {
    return integer(f.epochs, 1, 1000000);
  } else if (arg == "--steps") {
    return integer(f.steps, 1, 1000000);
  } else if (arg == "--warmup") {
    return integer(f.warmup, 0, 1000000);
  } else if (arg == "--threads") {
    return integer(f.threads, 1, 1024);
  } else if (arg == "--batches") {
    return integer(f.batches, 1, 1024);
  } else if (arg == "--adapt") {
    return integer(f.adapt_window, 1, 1000000);
  } else if (arg == "--lr") {
    char* end = nullptr;
    f.lr = std::strtod(value, &end);
    if (end == value || *end != '\0' || !(f.lr > 0 && f.lr < 1e3))
      return arg + ": got '" + value + "', expected a number in (0, 1000)";
  } else if (arg == "--timing") {
    f.timing_path = value;
  } else if (arg == "--timeline") {
    f.timeline_path = value;
  } else if (arg == "--checkpoint") {
    f.checkpoint = value;
  } else if (arg == "--persist") {
    f.persist_dir = value;
  } else if (arg == "--persist-every") {
    return integer(f.persist_every, 1, 1000000);
  } else if (arg == "--persist-chunk-bytes") {
    return integer(f.persist_chunk_bytes, 1, 1 << 30);
  } else if (arg == "--crash-at") {
    return integer(f.crash_at, 1, 1000000);
  } else if (arg == "--replica-chunk-bytes") {
    return integer(f.replica_chunk_bytes, 0, 1 << 30);
  } else if (arg == "--replica-gaps") {
    f.replica_gaps.clear();
    const std::string text = value;
    for (size_t at = 0; at <= text.size();) {
      const size_t comma = std::min(text.find(',', at), text.size());
      const std::string item = text.substr(at, comma - at);
      const size_t colon = item.find(':');
      const auto group = ParseInt(item.substr(0, colon).c_str(), -1, 1 << 20);
      const auto bytes =
          colon == std::string::npos ? std::nullopt : ParseInt(item.substr(colon + 1).c_str(), 0, 1 << 30);
      if (!group || !bytes)
        return arg + ": got '" + value + "', expected GROUP:BYTES[,GROUP:BYTES...] (GROUP in [-1, " +
               std::to_string(1 << 20) + "], BYTES in [0, " + std::to_string(1 << 30) + "])";
      f.replica_gaps.push_back({*group, *bytes});
      at = comma + 1;
    }
  } else if (arg == "--replica-group-hosts") {
    return integer(f.replica_group_hosts, 2, 1 << 20);
  } else if (arg == "--replica-max-commits") {
    return integer(f.replica_max_commits, 1, 1000000);
  } else if (arg == "--weights") {
    f.weights_path = value;
  } else if (arg == "--blocking-save") {
    if (*value == '\0') return arg + ": got '', expected a directory";
    f.blocking_save_dir = value;
  } else if (arg == "--save-every") {
    return integer(f.save_every, 1, 1000000);
  } else {
    return std::nullopt;
  }
  return "";
}

std::string JsonNumber(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string JsonLoss(const std::optional<double>& loss) { return loss ? JsonNumber(*loss) : "null"; }

// What one training iteration's own marks were, on the session's clock.
struct IterationMarks {
  double forward_start_us = 0, backward_start_us = 0, backward_end_us = 0, synchronized_us = 0, copied_us = 0,
         stepped_us = 0, end_us = 0;
};

// An iteration's phases (training_loop.h), in the timing file's order: each the time between two
// consecutive marks, so that a rank's phases sum to its iteration's time.
constexpr const char* kPhaseNames[] = {"forward", "backward", "synchronize", "copy_wait", "step", "commit"};
constexpr size_t kPhases = std::size(kPhaseNames);

std::array<double, kPhases> PhasesOf(const IterationMarks& m) {
  return {m.backward_start_us - m.forward_start_us,
          m.backward_end_us - m.backward_start_us,
          m.synchronized_us - m.backward_end_us,
          m.copied_us - m.synchronized_us,
          m.stepped_us - m.copied_us,
          m.end_us - m.stepped_us};
}

std::string TimelineJson(const std::string& model, const IterationMarks& m,
                         const std::vector<runtime::GroupTimeline>& groups) {
  // Times relative to the start of backward, as a plan's group times are.
  auto rel = [&](double t) { return JsonNumber(t - m.backward_start_us); };
  std::string out = "{\n  \"model\": " + JsonString(model) + ",\n  \"origin\": \"backward start\",\n";
  out += "  \"forward_start_us\": " + rel(m.forward_start_us) + ",\n  \"backward_end_us\": " + rel(m.backward_end_us) +
         ",\n  \"synchronized_us\": " + rel(m.synchronized_us) + ",\n  \"iteration_end_us\": " + rel(m.end_us) +
         ",\n  \"groups\": [";
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& t = groups[g];
    out += std::string(g == 0 ? "\n" : ",\n") + "    {\"encode_start_us\": " + rel(t.encode_start_us) +
           ", \"encode_end_us\": " + rel(t.encode_end_us) + ", \"comm_start_us\": " + rel(t.comm_start_us) +
           ", \"comm_end_us\": " + rel(t.comm_end_us) + ", \"decode_start_us\": " + rel(t.decode_start_us) +
           ", \"decode_end_us\": " + rel(t.decode_end_us) +
           (t.zen_union > 0 ? ", \"zen_union\": " + std::to_string(t.zen_union) : "") + "}";
  }
  return out + "\n  ]\n}\n";
}

// One iteration, marks included; the exit code's cause as (what, status) when it fails.
struct IterationError {
  std::string what;
  Status status;
};

// A step written to storage durably (training_loop.h): how long after the end of its iteration
// the loop knew it durable.
struct Durable {
  int64_t step = 0;
  double after_us = 0;
};

// A step whose file the checkpointer may still be writing, and when its iteration ended.
struct Pending {
  int64_t step = 0;
  double iteration_end_us = 0;
};

// The pending steps whose files the checkpointer has written by `now_us` (persists run in step
// order), moved to `durable`.
void NoteDurable(const runtime::Checkpointer& ckpt, double now_us, std::vector<Pending>& pending,
                 std::vector<Durable>& durable) {
  const int64_t written = ckpt.persisted_step();
  auto first_unwritten = pending.begin();
  for (; first_unwritten != pending.end() && first_unwritten->step <= written; ++first_unwritten)
    durable.push_back({first_unwritten->step, now_us - first_unwritten->iteration_end_us});
  pending.erase(pending.begin(), first_unwritten);
}

// `marks` holds the previous iteration's on entry; `pending` gets the step persisted at the
// previous commit, and `durable` the steps found durable here.
std::optional<IterationError> RunIteration(const LoopSetup& s, LoopBody& body, int it, IterationMarks& marks,
                                           std::vector<Pending>& pending, std::vector<Durable>& durable) {
  const double previous_end_us = marks.end_us;
  const bool recording = s.flags->recording();
  runtime::Recorder* recorder = s.runtime->recorder.get();
  runtime::Session* session = s.runtime->session.get();
  const char* what = recording ? "record" : "plan";
  marks.forward_start_us = s.clock->NowUs();
  if (recording) {
    if (Status b = recorder->BeginForward(); !b.ok()) return IterationError{"record", b};
  }
  if (Status f = body.Forward(it); !f.ok()) return IterationError{"forward", f};
  marks.backward_start_us = s.clock->NowUs();
  if (recording) {
    if (Status b = recorder->BeginBackward(); !b.ok()) return IterationError{"record", b};
  }
  Status ready_status;  // the first failure of a GradientReady
  Status b = body.Backward(it, [&](int i) {
    Status r = recording ? recorder->GradientReady(i) : session->GradientReady(i);
    if (!r.ok() && ready_status.ok()) ready_status = r;
    return r;
  });
  marks.backward_end_us = s.clock->NowUs();
  if (!ready_status.ok()) return IterationError{recording ? "record" : "gradient ready", ready_status};
  if (!b.ok()) return IterationError{"backward", b};
  if (!recording) {
    if (Status sync = session->Synchronize(); !sync.ok()) return IterationError{"synchronize", sync};
  }
  marks.synchronized_us = s.clock->NowUs();
  if (s.checkpoint != nullptr) {
    // Step `it` (the previous iteration's) persisted: durable once persisted_step() reaches it.
    const int every = s.flags->persist_every;
    if (every > 0 && it > s.start && it % every == 0) pending.push_back({it, previous_end_us});
    NoteDurable(*s.checkpoint, marks.synchronized_us, pending, durable);
    // It reads what the update writes.
    if (Status w = s.checkpoint->WaitForCopy(); !w.ok()) return IterationError{"--checkpoint", w};
  }
  marks.copied_us = s.clock->NowUs();
  if (Status u = body.Step(it); !u.ok()) return IterationError{"step", u};
  if (s.save && (it + 1) % s.flags->save_every == 0) {
    if (Status v = s.save(it + 1); !v.ok()) return IterationError{"--blocking-save", v};
    durable.push_back({it + 1, 0});
  }
  marks.stepped_us = s.clock->NowUs();
  if (s.checkpoint != nullptr) {
    if (Status c = s.checkpoint->Commit(static_cast<uint64_t>(it) + 1); !c.ok())
      return IterationError{"--checkpoint", c};
    if (it + 1 == s.flags->crash_at) std::_Exit(3);
  }
  marks.end_us = s.clock->NowUs();
  if (recording) {
    if (Status end = recorder->EndIteration(); !end.ok()) return IterationError{what, end};
    // Each gradient's share of non-zeros (an embedding table's is naturally sparse), after the
    // iteration's times are taken.
    for (size_t i = 0; i < s.buffers.size(); ++i) {
      if (Status d = recorder->SampleDensity(static_cast<int>(i), s.buffers[i]); !d.ok())
        return IterationError{what, d};
    }
  }
  return std::nullopt;
}

int WriteRecording(const LoopSetup& s) {
  runtime::Recorder& recorder = *s.runtime->recorder;
  // Every rank recorded; merged, every rank holds the slowest rank's times, and rank 0 writes them.
  if (Status m = recorder.MergeRanks(*s.report); !m.ok()) return Fail(s.job, "record", m, s.rank);
  if (s.rank == 0) {
    if (Status w = recorder.Write(s.flags->record_path); !w.ok()) return Fail(s.job, "record", w, s.rank);
    std::printf("%s: recorded %d tensors over %d iterations into %s\n", s.job.c_str(), recorder.registered(),
                recorder.completed_iterations(), s.flags->record_path.c_str());
  }
  return 0;
}

// Per phase (kPhaseNames), every iteration's time on the rank slowest in that phase.
using PhaseTimes = std::array<std::vector<double>, kPhases>;

// The median of `v` past the warm-up (0 when none is left: a restarted run may have fewer
// iterations than the warm-up).
double TimedMedian(const std::vector<double>& v, int warmup) {
  std::vector<double> timed(v.begin() + std::min<size_t>(static_cast<size_t>(warmup), v.size()), v.end());
  if (timed.empty()) return 0;
  std::nth_element(timed.begin(), timed.begin() + static_cast<std::ptrdiff_t>(timed.size() / 2), timed.end());
  return timed[timed.size() / 2];
}

std::string JsonArray(const std::vector<double>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i == 0 ? "" : ", ") + JsonNumber(v[i]);
  return out + "]";
}

// The --timing file: every iteration's (slowest-rank) time and phases, the losses, the agreement
// and the body's own members.
std::string TimingJson(const LoopSetup& s, int world_size, const std::optional<double>& loss_first,
                       const std::optional<double>& loss_last, bool agree, const std::string& extra,
                       const std::vector<double>& slowest, const PhaseTimes& phases,
                       const std::vector<Durable>& durable) {
  std::string out = "{\n  \"model\": " + JsonString(s.job) + ",\n  \"plan\": " + JsonString(s.flags->plan) +
                    ",\n  \"world_size\": " + std::to_string(world_size) +
                    ",\n  \"warmup\": " + std::to_string(s.flags->warmup) +
                    ",\n  \"loss_first\": " + JsonLoss(loss_first) + ",\n  \"loss_last\": " + JsonLoss(loss_last) +
                    ",\n  \"ranks_agree\": " + (agree ? "true" : "false") + (extra.empty() ? "" : ",\n  " + extra);
  if (!durable.empty()) {
    std::string steps, after;
    for (size_t i = 0; i < durable.size(); ++i) {
      steps += (i == 0 ? "" : ", ") + std::to_string(durable[i].step);
      after += (i == 0 ? "" : ", ") + JsonNumber(durable[i].after_us / 1e3);
    }
    out += ",\n  \"durable_steps\": [" + steps + "],\n  \"durable_after_ms\": [" + after + "]";
  }
  out += ",\n  \"phases_us\": {";
  for (size_t p = 0; p < kPhases; ++p)
    out += std::string(p == 0 ? "\n" : ",\n") + "    " + JsonString(kPhaseNames[p]) + ": " + JsonArray(phases[p]);
  return out + "\n  },\n  \"iteration_us\": " + JsonArray(slowest) + "\n}\n";
}

// Rank 0's line on the durable checkpoints (the slowest rank's times), e.g. `durable: 6
// checkpoints, steps 5 to 30, every 5.0 steps; known durable at most 310.2 ms (median 250.1 ms)
// after their step's end`.
void PrintDurable(const std::vector<Durable>& durable) {
  if (durable.empty()) return;
  std::vector<double> after;
  for (const Durable& d : durable) after.push_back(d.after_us / 1e3);
  std::sort(after.begin(), after.end());
  const double apart = durable.size() < 2 ? 0.0
                                           : static_cast<double>(durable.back().step - durable.front().step) /
                                                 static_cast<double>(durable.size() - 1);
  std::printf("durable: %zu checkpoints, steps %lld to %lld, every %.1f steps; known durable at most %.1f ms "
              "(median %.1f ms) after their step's end\n",
              durable.size(), static_cast<long long>(durable.front().step),
              static_cast<long long>(durable.back().step), apart, after.back(), after[after.size() / 2]);
}

// Collective: each element's maximum over the ranks.
StatusOr<std::vector<double>> SlowestRank(comm::Communicator& comm, const std::vector<double>& mine) {
  std::vector<double> out(mine.size());
  CUPCAKE_RETURN_IF_ERROR(comm.Allreduce(mine.data(), out.data(), static_cast<int64_t>(mine.size()),
                                         comm::DataType::kFloat64, comm::ReduceOp::kMax));
  return out;
}

// After training: the timeline, the job's after-training step, the agreement, every
// iteration's slowest-rank time, the body's report, and rank 0's files and lines.
int WriteReport(const LoopSetup& s, LoopBody& body, const std::vector<double>& iteration_us,
                const std::vector<double>& phase_us, const IterationMarks& marks,
                const std::optional<double>& loss_first, const std::optional<double>& loss_last,
                std::vector<Durable> durable) {
  const LoopFlags& flags = *s.flags;
  runtime::Session& session = *s.runtime->session;
  std::string timeline;
  if (!flags.timeline_path.empty()) {
    auto groups = session.Timeline();
    if (!groups.ok()) return Fail(s.job, "timeline", groups.status(), s.rank);
    timeline = TimelineJson(s.job, marks, *groups);
  }
  if (s.after_training) {
    if (Status a = s.after_training(); !a.ok()) return Fail(s.job, "after training", a, s.rank);
  }
  auto agree = body.RanksAgree(*s.report);
  if (!agree.ok()) return Fail(s.job, "ranks agree", agree.status(), s.rank);
  // Each iteration's time is the slowest rank's; so is each phase's, on its own (the rank slowest
  // in one phase need not be the slowest overall), and each durable step's.
  auto slowest = SlowestRank(*s.report, iteration_us);
  if (!slowest.ok()) return Fail(s.job, "timing", slowest.status(), s.rank);
  auto phase_max = SlowestRank(*s.report, phase_us);
  if (!phase_max.ok()) return Fail(s.job, "timing", phase_max.status(), s.rank);
  PhaseTimes phases;
  for (size_t p = 0; p < kPhases; ++p)
    for (size_t i = 0; i < iteration_us.size(); ++i) phases[p].push_back((*phase_max)[i * kPhases + p]);
  // Every rank notes the same steps (the flags decide them).
  if (!durable.empty()) {
    std::vector<double> after;
    for (const Durable& d : durable) after.push_back(d.after_us);
    auto latest = SlowestRank(*s.report, after);
    if (!latest.ok()) return Fail(s.job, "timing", latest.status(), s.rank);
    for (size_t i = 0; i < durable.size(); ++i) durable[i].after_us = (*latest)[i];
  }
  auto extra = body.Report(*s.report);
  if (!extra.ok()) return Fail(s.job, "report", extra.status(), s.rank);
  if (s.rank == 0) {
    if (!flags.timing_path.empty()) {
      const std::string out =
          TimingJson(s, session.world_size(), loss_first, loss_last, *agree, *extra, *slowest, phases, durable);
      if (Status w = WriteFileAtomic(flags.timing_path, out); !w.ok()) return Fail(s.job, "--timing", w, s.rank);
    }
    if (!timeline.empty()) {
      if (Status w = WriteFileAtomic(flags.timeline_path, timeline); !w.ok())
        return Fail(s.job, "--timeline", w, s.rank);
    }
    for (const runtime::GravacDecision& d : session.decisions())
      std::printf("gravac: steps %llu-%llu sent ratio %g (gain %.3f at %g, %.3f at %g), next %g\n",
                  static_cast<unsigned long long>(d.step), static_cast<unsigned long long>(d.step + d.steps - 1),
                  d.ratio, d.gain_min, d.ratio_min, d.gain_c, d.ratio_c, d.next_ratio);
    const size_t timed = slowest->size() - std::min<size_t>(static_cast<size_t>(flags.warmup), slowest->size());
    std::printf("%s: %zu timed iterations, median %.1f ms (slowest rank), ranks agree: %s\n", s.job.c_str(), timed,
                TimedMedian(*slowest, flags.warmup) / 1e3, *agree ? "yes" : "NO");
    std::string line;
    for (size_t p = 0; p < kPhases; ++p) {
      char part[64];
      std::snprintf(part, sizeof(part), "%s %s %.1f", p == 0 ? "" : ",", kPhaseNames[p],
                    TimedMedian(phases[p], flags.warmup) / 1e3);
      line += part;
    }
    std::printf("%s: phases, ms (medians; each phase's slowest rank):%s\n", s.job.c_str(), line.c_str());
    PrintDurable(durable);
    const runtime::NetworkGate* gate = s.runtime->gate.get();
    if (gate != nullptr && s.checkpoint != nullptr && flags.persist_chunk_bytes > 0)
      std::printf(
          "checkpoint: rank 0: %lld persist pieces in the network's idle time; %lld collectives waited for a "
          "piece or an exchange\n",
          static_cast<long long>(gate->idle_transfers()), static_cast<long long>(gate->collectives_waited()));
    if (gate != nullptr && s.checkpoint != nullptr && flags.replicate)
      std::printf(
          "checkpoint: rank 0: %lld replica exchanges; %lld collectives waited for one; %lld gaps skipped; "
          "the newest replica sent in full is of step %lld, of %d committed\n",
          static_cast<long long>(gate->transfers()), static_cast<long long>(gate->collectives_waited()),
          static_cast<long long>(s.checkpoint->replica_gaps_skipped()),
          static_cast<long long>(s.checkpoint->replicated_step()), flags.iterations());
  }
  if (!*agree) {
    if (s.rank == 0) std::fprintf(stderr, "%s: the ranks ended with different state\n", s.job.c_str());
    return 1;
  }
  return 0;
}

}  // namespace

std::string ParseLoopFlags(int argc, char** argv, const JobFlags& job_flags, LoopFlags& f) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (std::find(job_flags.unsupported.begin(), job_flags.unsupported.end(), arg) != job_flags.unsupported.end())
      return arg + ": not a flag of this job";
    if (arg == "--replicate") {  // the one flag without a value
      f.replicate = true;
      continue;
    }
    if (i + 1 >= argc) return arg + ": missing value";
    const char* value = argv[++i];
    std::optional<std::string> problem = ParseSharedFlag(arg, value, f);
    if (!problem && job_flags.parse) problem = job_flags.parse(arg, value);
    if (!problem) return "unknown flag " + arg;
    if (!problem->empty()) return *problem;
  }
  // The job's main reads the environment; the runtime never does.
  if (const char* path = std::getenv("CUPCAKE_RECORD"); path != nullptr && *path != '\0') f.record_path = path;
  if (const char* n = std::getenv("CUPCAKE_RECORD_ITERATIONS"); n != nullptr && *n != '\0') {
    auto v = ParseInt(n, 1, 1000000);
    if (!v) return std::string("CUPCAKE_RECORD_ITERATIONS: got '") + n + "', expected an integer in [1, 1000000]";
    f.record_iterations = *v;
  }
  if (f.record_path.empty() == f.plan.empty())
    return "expected either --plan PLAN.pb or CUPCAKE_RECORD in the environment";
  if (f.checkpoint.empty() && (!f.persist_dir.empty() || f.persist_every > 0 || f.crash_at > 0 || f.replicate))
    return "--persist, --persist-every, --crash-at and --replicate need --checkpoint NAME";
  if (!f.replicate &&
      (f.replica_chunk_bytes > 0 || f.replica_group_hosts != 2 || !f.replica_gaps.empty() || f.replica_max_commits > 0))
    return "--replica-chunk-bytes, --replica-gaps, --replica-group-hosts and --replica-max-commits need --replicate";
  if (f.persist_chunk_bytes > 0 && f.persist_every == 0) return "--persist-chunk-bytes: needs --persist-every N";
  if (!f.checkpoint.empty() && f.plan.empty()) return "--checkpoint: needs --plan (not in record mode)";
  if (!f.blocking_save_dir.empty() && f.save_every == 0) return "--blocking-save: needs --save-every N";
  if (f.blocking_save_dir.empty() && f.save_every > 0) return "--save-every: needs --blocking-save DIR";
  if (!f.blocking_save_dir.empty() && !f.checkpoint.empty())
    return "--blocking-save: not with --checkpoint (the baseline it is compared against); expected one of them";
  if (!f.blocking_save_dir.empty() && f.plan.empty()) return "--blocking-save: needs --plan (not in record mode)";
  if (f.warmup >= f.epochs * f.steps)
    return "--warmup: must be below --epochs x --steps (" + std::to_string(f.epochs * f.steps) + ")";
  return "";
}

int UsageError(const std::string& job, const std::string& problem, const JobFlags& job_flags, int rank) {
  if (rank != 0) return 2;
  auto has = [&](const char* flag) {
    return std::find(job_flags.unsupported.begin(), job_flags.unsupported.end(), flag) == job_flags.unsupported.end();
  };
  std::string usage = "usage: " + job + " --plan PLAN.pb [--epochs N] [--steps N] [--warmup N] [--timing FILE.json]\n" +
                      "           [--timeline FILE.json] [--adapt WINDOW]";
  if (has("--lr")) usage += " [--lr X]";
  if (has("--threads")) usage += " [--threads N]";
  if (has("--batches")) usage += " [--batches N]";
  if (has("--checkpoint"))
    usage +=
        "\n           [--checkpoint NAME [--persist DIR --persist-every N [--persist-chunk-bytes B]]\n"
        "            [--crash-at STEP]\n"
        "            [--replicate [--replica-chunk-bytes N | --replica-gaps G:B,...] [--replica-group-hosts M]\n"
        "                         [--replica-max-commits K]]]";
  if (has("--weights")) usage += " [--weights FILE]";
  if (has("--blocking-save")) usage += "\n           [--blocking-save DIR --save-every N]";
  if (!job_flags.usage.empty()) usage += "\n           " + job_flags.usage;
  usage += "\n       CUPCAKE_RECORD=MODEL.json [CUPCAKE_RECORD_ITERATIONS=N] " + job +
           (job_flags.usage.empty() ? "" : " ...") + "   (record mode)\n";
  std::fprintf(stderr, "%s: %s\n%s", job.c_str(), problem.c_str(), usage.c_str());
  return 2;
}

int Fail(const std::string& job, const std::string& what, const Status& s, int rank) {
  if (s.PrintedBy(rank)) std::fprintf(stderr, "%s: %s: %s\n", job.c_str(), what.c_str(), s.message().c_str());
  return 1;
}

runtime::CheckpointOptions CheckpointOptionsOf(const LoopFlags& flags, std::shared_ptr<runtime::NetworkGate> gate) {
  runtime::CheckpointOptions options;
  options.name = flags.checkpoint;
  options.persist_dir = flags.persist_dir;
  options.persist_every = flags.persist_every;
  options.persist_chunk_bytes = flags.persist_chunk_bytes;
  options.replicate = flags.replicate;
  options.replica_chunk_bytes = flags.replica_chunk_bytes;
  options.replica_group_hosts = flags.replica_group_hosts;
  options.replica_gaps = flags.replica_gaps;
  options.replica_max_commits = flags.replica_max_commits;
  options.gate = std::move(gate);
  return options;
}

int RestoreCheckpoint(const std::string& job, runtime::Checkpointer& ckpt, int rank, Clock& clock, double started_us,
                      int& start) {
  const double restore_us = clock.NowUs();
  auto point = ckpt.Restore();
  if (!point.ok()) return Fail(job, "--checkpoint", point.status(), rank);
  const double restored_us = clock.NowUs();
  start = static_cast<int>(point->step);
  for (const std::string& line : point->refused) std::printf("checkpoint: rank %d refused %s\n", rank, line.c_str());
  if (rank == 0 && start > 0) std::printf("checkpoint: restored step %d from %s\n", start, point->source.c_str());
  if (rank != 0 && start > 0) std::printf("checkpoint: rank %d restored from %s\n", rank, point->source.c_str());
  if (rank == 0 && start > 0)
    std::printf("checkpoint: restore took %.1f ms, done %.1f ms after the job's start\n",
                (restored_us - restore_us) / 1e3, (restored_us - started_us) / 1e3);
  std::fflush(stdout);
  return 0;
}

int MakeLoopRuntime(const std::string& job, const LoopFlags& flags, std::unique_ptr<comm::Communicator> world,
                    Clock* clock, bool record_timeline, LoopRuntime& out) {
  const int rank = world->rank();
  if (flags.recording()) {
    runtime::RecorderOptions options;
    options.clock = clock;
    auto r = runtime::Recorder::Create(job, options);
    if (!r.ok()) return Fail(job, "record", r.status(), rank);
    out.recorder = std::move(r).value();
    return 0;
  }
  runtime::SessionOptions options;
  options.clock = clock;
  options.record_timeline = record_timeline;
  if (flags.replicate || flags.persist_chunk_bytes > 0) {
    out.gate = std::make_shared<runtime::NetworkGate>();
    world = runtime::GateCommunicator(out.gate, std::move(world));
  }
  auto s = runtime::Session::Create(flags.plan, std::move(world), options);
  if (!s.ok()) return Fail(job, "plan", s.status(), rank);
  out.session = std::move(s).value();
  if (flags.adapt_window > 0) {
    runtime::GravacOptions gravac;
    gravac.window = flags.adapt_window;
    if (Status a = out.session->EnableGravac(gravac); !a.ok()) return Fail(job, "--adapt", a, rank);
  }
  return 0;
}

Status RegisterGradients(LoopRuntime& runtime, const std::vector<LoopGradient>& gradients) {
  if (runtime.recorder != nullptr) {
    for (const LoopGradient& g : gradients)
      CUPCAKE_RETURN_IF_ERROR(runtime.recorder->Register(g.name, static_cast<int64_t>(g.buffer.size()), g.shape));
    return Status::Ok();
  }
  std::vector<runtime::GradientBuffer> buffers;
  for (const LoopGradient& g : gradients)
    buffers.push_back({g.name, g.buffer.data(), static_cast<int64_t>(g.buffer.size())});
  return runtime.session->RegisterAll(buffers);
}

int RunLoop(const LoopSetup& s, LoopBody& body) {
  const LoopFlags& flags = *s.flags;
  const bool recording = flags.recording();
  const int iterations = flags.iterations();
  const int steps_per_epoch = flags.steps_per_epoch();
  std::vector<double> iteration_us, phase_us;  // phase_us: kPhases per iteration
  std::vector<Pending> pending;
  std::vector<Durable> durable;
  IterationMarks marks;
  const std::optional<double> loss_first = body.EvalLoss();
  std::optional<double> loss_last = loss_first;
  if (s.rank == 0 && !recording && loss_first) std::printf("epoch 0 loss %.6f\n", *loss_first);
  for (int it = s.start; it < iterations; ++it) {
    if (auto error = RunIteration(s, body, it, marks, pending, durable))
      return Fail(s.job, error->what, error->status, s.rank);
    iteration_us.push_back(marks.end_us - marks.forward_start_us);
    for (double t : PhasesOf(marks)) phase_us.push_back(t);
    if (!recording && (it + 1) % steps_per_epoch == 0) {
      loss_last = body.EvalLoss();
      if (s.rank == 0 && loss_last) {
        std::printf("epoch %d loss %.6f\n", (it + 1) / steps_per_epoch, *loss_last);
        std::fflush(stdout);
      }
    }
    if (it + 1 < iterations) {
      if (Status between = body.BetweenIterations(it); !between.ok())
        return Fail(s.job, "between iterations", between, s.rank);
    }
  }
  if (recording) {
    // The body's own results (printed; record mode writes no timing file).
    if (auto extra = body.Report(*s.report); !extra.ok()) return Fail(s.job, "report", extra.status(), s.rank);
    return WriteRecording(s);
  }
  if (!pending.empty()) {  // files still being written: every rank notes the same steps
    if (Status w = s.checkpoint->WaitForPersist(); !w.ok()) return Fail(s.job, "--checkpoint", w, s.rank);
    NoteDurable(*s.checkpoint, s.clock->NowUs(), pending, durable);
  }
  return WriteReport(s, body, iteration_us, phase_us, marks, loss_first, loss_last, std::move(durable));
}

}  // namespace cupcake::examples
