// Record mode: the median gaps under a fake clock, the model JSON read back by libprofile's
// parser, the misuse messages, and the C API.
#include "cupcake/runtime/recorder.h"
#include "cupcake/comm/communicator.h"
#include "cupcake/comm/mpi.h"
#include "cupcake/comm/nccl.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <deque>
#include <filesystem>
#include <thread>

#include "cupcake/cupcake.pb.h"
#include "cupcake/kernels/compressor.h"
#include "cupcake/profile/json_io.h"
#include "cupcake/proto/file_io.h"
#include "cupcake/proto/fingerprint.h"
#include "cupcake/runtime/cupcake.h"

namespace cupcake::runtime {
namespace {

using comm::Communicator;
using comm::InProcessGroup;

// A fake: NowUs() returns the queued times in order. Aborts (by a test failure) when empty.
class ScriptedClock final : public Clock {
 public:
  void Push(double t_us) { times_.push_back(t_us); }
  double NowUs() override {
    EXPECT_FALSE(times_.empty()) << "the test did not queue enough times";
    if (times_.empty()) return 0;
    double t = times_.front();
    times_.pop_front();
    return t;
  }

 private:
  std::deque<double> times_;
};

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("cupcake_recorder_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

// One iteration: backward starts at `start_us`, then gradient i is ready `gaps[i]` after the previous.
void Iteration(Recorder& r, ScriptedClock& clock, double start_us, const std::vector<double>& gaps) {
  clock.Push(start_us);
  ASSERT_TRUE(r.BeginBackward().ok());
  double t = start_us;
  for (size_t i = 0; i < gaps.size(); ++i) {
    t += gaps[i];
    clock.Push(t);
    Status s = r.GradientReady(static_cast<int>(i));
    ASSERT_TRUE(s.ok()) << s.message();
  }
}

// A recorder of `model` on `clock` (and `activity`, when given) with `tensors` registered.
std::unique_ptr<Recorder> MakeRecorder(ScriptedClock& clock, const std::string& model,
                                       const std::vector<std::pair<std::string, int64_t>>& tensors,
                                       ActivitySource* activity = nullptr) {
  RecorderOptions options;
  options.clock = &clock;
  options.activity = activity;
  auto r = Recorder::Create(model, options);
  EXPECT_TRUE(r.ok());
  for (const auto& [name, numel] : tensors) EXPECT_TRUE((*r)->Register(name, numel).ok());
  return std::move(r).value();
}

const std::vector<std::pair<std::string, int64_t>> kThreeTensors = {
    {"fc2.bias", 10}, {"fc2.weight", 640}, {"fc1.weight", 64 * 32}};

std::unique_ptr<Recorder> ThreeTensors(ScriptedClock& clock) { return MakeRecorder(clock, "mlp", kThreeTensors); }

TEST(Recorder, MedianOfOddIterationCountIsTheMiddleGap) {
  ScriptedClock clock;
  auto r = ThreeTensors(clock);
  Iteration(*r, clock, 1000, {5, 100, 30});
  Iteration(*r, clock, 2000, {7, 300, 10});  // outliers in tensors 1 and 2
  Iteration(*r, clock, 3000, {6, 110, 20});
  EXPECT_EQ(r->completed_iterations(), 3);
  auto medians = r->MedianBackwardUs();
  ASSERT_TRUE(medians.ok());
  EXPECT_EQ(*medians, (std::vector<double>{6, 110, 20}));
}

// Jitter that falls in a different gap each iteration: every iteration's backward takes 12 us,
// and so does the recorded one (the gaps between the median ready times 1, 11, 12); medians of
// the gaps themselves would record 1, 1, 1.
TEST(Recorder, GapsKeepTheMedianIterationsBackward) {
  ScriptedClock clock;
  auto r = ThreeTensors(clock);
  Iteration(*r, clock, 0, {1, 1, 10});
  Iteration(*r, clock, 1000, {10, 1, 1});
  Iteration(*r, clock, 2000, {1, 10, 1});
  auto gaps = r->MedianBackwardUs();
  ASSERT_TRUE(gaps.ok());
  EXPECT_EQ(*gaps, (std::vector<double>{1, 10, 1}));
}

TEST(Recorder, MedianOfEvenIterationCountIsTheMeanOfTheMiddleTwo) {
  ScriptedClock clock;
  auto r = ThreeTensors(clock);
  Iteration(*r, clock, 0, {1, 10, 100});
  Iteration(*r, clock, 500, {2, 20, 200});
  Iteration(*r, clock, 1000, {4, 40, 400});
  Iteration(*r, clock, 2000, {8, 80, 800});
  auto medians = r->MedianBackwardUs();
  ASSERT_TRUE(medians.ok());
  EXPECT_EQ(*medians, (std::vector<double>{3, 30, 300}));
}

TEST(Recorder, WritesAModelThatLibprofileParses) {
  ScriptedClock clock;
  auto r = ThreeTensors(clock);
  Iteration(*r, clock, 0, {1.5, 0.125, 12345.678});
  const std::string path = TempPath("model.json");
  Status s = r->Write(path);
  ASSERT_TRUE(s.ok()) << s.message();
  auto text = ReadFile(path);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text,
            "{\n"
            "  \"format\": \"cupcake.model.v1\",\n"
            "  \"name\": \"mlp\",\n"
            "  \"source\": \"cupcake runtime record mode: median of 1 iterations\",\n"
            "  \"tensors\": [\n"
            "    {\"name\": \"fc2.bias\", \"numel\": 10, \"dtype\": \"float32\", \"backward_us\": 1.5},\n"
            "    {\"name\": \"fc2.weight\", \"numel\": 640, \"dtype\": \"float32\", \"backward_us\": 0.125},\n"
            "    {\"name\": \"fc1.weight\", \"numel\": 2048, \"dtype\": \"float32\", \"backward_us\": 12345.678}\n"
            "  ]\n"
            "}\n");
  auto model = profile::ParseModelJson(*text, path);
  ASSERT_TRUE(model.ok()) << model.status().message();
  EXPECT_EQ(model->name(), "mlp");
  EXPECT_EQ(model->source(), "cupcake runtime record mode: median of 1 iterations");
  ASSERT_EQ(model->tensors_size(), 3);
  EXPECT_EQ(model->tensors(1).name(), "fc2.weight");
  EXPECT_EQ(model->tensors(2).numel(), 2048);
  EXPECT_EQ(model->tensors(2).dtype(), pb::FLOAT32);
  EXPECT_EQ(model->tensors(0).backward_us(), 1.5);
  EXPECT_EQ(model->tensors(2).backward_us(), 12345.678);
  std::filesystem::remove(path);
}

TEST(Recorder, EscapesNamesAndRoundTripsIntegralTimes) {
  ScriptedClock clock;
  RecorderOptions options;
  options.clock = &clock;
  options.source = "job \"x\"\n";
  auto r = Recorder::Create("odd\\name", options);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE((*r)->Register("layer\t\"0\"", 3).ok());
  Iteration(**r, clock, 0, {42});
  auto json = (*r)->ToJson();
  ASSERT_TRUE(json.ok());
  EXPECT_NE(json->find("\"backward_us\": 42.0}"), std::string::npos) << *json;
  auto model = profile::ParseModelJson(*json, "recorded");
  ASSERT_TRUE(model.ok()) << model.status().message();
  EXPECT_EQ(model->name(), "odd\\name");
  EXPECT_EQ(model->source(), "job \"x\"\n");
  EXPECT_EQ(model->tensors(0).name(), "layer\t\"0\"");
  EXPECT_EQ(model->tensors(0).backward_us(), 42);
}

// A registered shape reaches the model file (PowerSGD's matrices); a tensor registered without
// one records none; a shape whose product is not the numel is refused naming the tensor.
TEST(Recorder, WritesRegisteredShapes) {
  ScriptedClock clock;
  RecorderOptions options;
  options.clock = &clock;
  auto r = Recorder::Create("conv", options);
  ASSERT_TRUE(r.ok());
  const int64_t conv[] = {8, 3, 3, 3};
  ASSERT_TRUE((*r)->Register("weight", 216, conv).ok());
  ASSERT_TRUE((*r)->Register("bias", 8).ok());
  const int64_t wrong[] = {4, 5};
  EXPECT_EQ((*r)->Register("fc", 21, wrong).message(),
            "recorder: tensor 2 ('fc'): shape: wrong size; got [4, 5] (20 elements), expected numel 21");
  Iteration(**r, clock, 0, {5, 7});
  auto json = (*r)->ToJson();
  ASSERT_TRUE(json.ok());
  EXPECT_NE(json->find("\"backward_us\": 5.0, \"shape\": [8, 3, 3, 3]}"), std::string::npos) << *json;
  auto model = profile::ParseModelJson(*json, "recorded");
  ASSERT_TRUE(model.ok()) << model.status().message();
  ASSERT_EQ(model->tensors_size(), 2);
  EXPECT_EQ(std::vector<int64_t>(model->tensors(0).shape().begin(), model->tensors(0).shape().end()),
            (std::vector<int64_t>{8, 3, 3, 3}));
  EXPECT_TRUE(model->tensors(1).shape().empty());
}

TEST(Recorder, RejectsMisuseWithClearMessages) {
  ScriptedClock clock;
  RecorderOptions options;
  options.clock = &clock;
  EXPECT_EQ(Recorder::Create("", options).status().message(), "recorder: model name: empty; expected the model's name");
  auto r = std::move(Recorder::Create("m", options)).value();
  EXPECT_EQ(r->BeginBackward().message(), "recorder: BeginBackward: no gradient registered; expected Register first");
  EXPECT_EQ(r->Register("a", 0).message(), "recorder: tensor 0 ('a'): numel: out of range; got 0, expected >= 1");
  ASSERT_TRUE(r->Register("a", 4).ok());
  EXPECT_EQ(r->Register("a", 4).message(), "recorder: tensor 1 ('a'): name: registered twice; expected distinct names");
  ASSERT_TRUE(r->Register("b", 4).ok());
  EXPECT_EQ(
      r->MedianBackwardUs().status().message(),
      "recorder: model 'm': no completed iteration; expected BeginBackward and every GradientReady at least once");
  EXPECT_EQ(
      r->Write(TempPath("never.json")).message(),
      "recorder: model 'm': no completed iteration; expected BeginBackward and every GradientReady at least once");
  clock.Push(0);
  EXPECT_EQ(r->GradientReady(0).message(),
            "recorder: GradientReady(0): outside backward; expected BeginBackward first");
  clock.Push(0);
  ASSERT_TRUE(r->BeginBackward().ok());
  clock.Push(1);
  EXPECT_EQ(r->GradientReady(1).message(),
            "recorder: GradientReady: out of order; got 1, expected 0 ('a'; gradients are registered in gradient-ready "
            "order)");
  clock.Push(2);
  ASSERT_TRUE(r->GradientReady(0).ok());
  EXPECT_EQ(r->BeginBackward().message(),
            "recorder: BeginBackward: iteration 0 is incomplete; got 1 of 2 gradients ready, expected all (next: 'b')");
  clock.Push(3);
  ASSERT_TRUE(r->GradientReady(1).ok());
  EXPECT_EQ(r->Register("c", 1).message(),
            "recorder: tensor 2 ('c'): registered after BeginBackward; expected every gradient registered first");
  auto medians = r->MedianBackwardUs();
  ASSERT_TRUE(medians.ok());
  // The gap of tensor 0 runs from BeginBackward (0) to its accepted mark (2).
  EXPECT_EQ(*medians, (std::vector<double>{2, 1}));
}

// Runs fn(rank) on one thread per rank of an in-process group.
template <typename F>
void OnRanks(InProcessGroup& group, int world, F fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back([&, r] { fn(r, *group.Rank(r)); });
  for (auto& t : threads) t.join();
}

// A record of `us` of device work from `start_us`, launched under `mark`.
KernelActivity Kernel(double start_us, double us, uint64_t mark) {
  return {"k", static_cast<uint64_t>(start_us * 1000), static_cast<uint64_t>((start_us + us) * 1000), 1, mark};
}

std::unique_ptr<Recorder> ThreeTensorsOnKernelTime(ScriptedClock& clock, ActivitySource& activity) {
  return MakeRecorder(clock, "mlp", kThreeTensors, &activity);
}

TEST(RecorderKernelTime, GapsAreTheBusyTimeOfEachMarksRecords) {
  ScriptedClock clock;
  // Iteration 1: tensor 0 has unmarked work (a framework's backward thread before its first
  // hook) and mark-1 work; tensor 1 two overlapping kernels (busy 7 us, not 10); tensor 2 one
  // kernel; a foreign mark (9) is ignored. Iteration 2 and 3 differ, to take medians.
  FakeActivitySource activity({
      {Kernel(0, 2, 0), Kernel(10, 3, 1), Kernel(20, 5, 2), Kernel(22, 5, 2), Kernel(40, 1, 3), Kernel(50, 99, 9)},
      {Kernel(0, 4, 1), Kernel(20, 9, 2), Kernel(40, 3, 3)},
      {Kernel(0, 6, 0), Kernel(20, 8, 2), Kernel(40, 2, 3)},
  });
  auto r = ThreeTensorsOnKernelTime(clock, activity);
  for (double start : {1000.0, 2000.0, 3000.0}) Iteration(*r, clock, start, {100, 100, 100});  // host gaps: ignored
  EXPECT_EQ(activity.started(), 3);
  // Per iteration: mark 1 at BeginBackward, 2 and 3 after tensors 0 and 1, cleared after 2.
  EXPECT_EQ(activity.marks(), (std::vector<uint64_t>{1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0}));
  auto gaps = r->MedianBackwardUs();
  ASSERT_TRUE(gaps.ok()) << gaps.status().message();
  // Busy times {5,4,6}, {7,9,8}, {1,3,2}: ready times (5,12,13), (4,13,16), (6,14,16), whose
  // medians 5, 13, 16 give the gaps 5, 8, 3.
  EXPECT_EQ(*gaps, (std::vector<double>{5, 8, 3}));
  auto json = r->ToJson();
  ASSERT_TRUE(json.ok());
  EXPECT_NE(json->find("\"source\": \"cupcake runtime record mode: median of 3 iterations, kernel time between "
                       "gradient-ready marks\""),
            std::string::npos)
      << *json;
}

TEST(RecorderKernelTime, SourceErrorsAbandonTheIterationWithTheirMessage) {
  ScriptedClock clock;
  FakeActivitySource activity({{Kernel(0, 1, 1), Kernel(5, 1, 2), Kernel(9, 1, 3)}});
  auto r = ThreeTensorsOnKernelTime(clock, activity);
  activity.start_error = FailedPreconditionError("this build has no CUPTI");
  clock.Push(0);
  EXPECT_EQ(r->BeginBackward().message(), "recorder: BeginBackward: kernel time: this build has no CUPTI");
  activity.start_error = Status::Ok();
  activity.flush_error = UnavailableError("cupti: dropped 3 activity records");
  clock.Push(0);
  ASSERT_TRUE(r->BeginBackward().ok());
  for (int i = 0; i < 2; ++i) {
    clock.Push(1.0 + i);
    ASSERT_TRUE(r->GradientReady(i).ok());
  }
  clock.Push(3);
  EXPECT_EQ(r->GradientReady(2).message(),
            "recorder: GradientReady(2): kernel time; iteration 0 abandoned: cupti: dropped 3 activity records");
  EXPECT_EQ(r->completed_iterations(), 0);
  // The next iteration starts afresh and completes.
  activity.flush_error = Status::Ok();
  Iteration(*r, clock, 10, {1, 1, 1});
  EXPECT_EQ(r->completed_iterations(), 1);
  EXPECT_EQ(*r->MedianBackwardUs(), (std::vector<double>{1, 1, 1}));
}

// A CUPTI build records an iteration where there is a GPU and says why not where there is none;
// a build without CUPTI names the fix.
TEST(RecorderKernelTime, CApiRecordsOnAGpuOrSaysWhyNot) {
  const Status gpu = kernels::BackendAvailable(kernels::Backend::kCuda);
  cupcake_recorder* rec = nullptr;
  const int rc = cupcake_recorder_create_cupti("mlp", &rec);
  if (rc == CUPCAKE_OK) {  // a CUPTI build: the source opens; one iteration needs a GPU
    ASSERT_EQ(cupcake_recorder_register(rec, "fc.bias", 10), CUPCAKE_OK);
    const int begin = cupcake_recorder_begin_backward(rec);
    const int ready = begin == CUPCAKE_OK ? cupcake_recorder_gradient_ready(rec, 0) : begin;
    const std::string m = cupcake_last_error();
    const std::string path = TempPath("cupti.json");
    const int written = ready == CUPCAKE_OK ? cupcake_recorder_write(rec, path.c_str()) : ready;
    cupcake_recorder_destroy(rec);
    std::filesystem::remove(path);
    if (gpu.ok()) {  // the GPU path must work: one iteration recorded and written
      EXPECT_EQ(ready, CUPCAKE_OK) << m;
      EXPECT_EQ(written, CUPCAKE_OK) << cupcake_last_error();
      return;
    }
    EXPECT_NE(ready, CUPCAKE_OK) << "recorded kernel time without a GPU (" << gpu.message() << ")";
    // No GPU: CUPTI (at Start) or CUDA (at the flush's device synchronize) says so.
    EXPECT_TRUE(m.starts_with("recorder: BeginBackward: kernel time: cupti: ") ||
                m.starts_with("recorder: GradientReady(0): kernel time; iteration 0 abandoned: cuda: "))
        << m;
    return;
  }
  EXPECT_EQ(rec, nullptr);
  const std::string m = cupcake_last_error();
  if (m.starts_with("cupcake_recorder_create_cupti: cupti: ")) {  // a CUPTI build that CUPTI refuses here
    EXPECT_FALSE(gpu.ok()) << "CUPTI refused on a machine with a GPU: " << m;
    EXPECT_NE(rc, CUPCAKE_OK);
    return;
  }
  EXPECT_EQ(rc, CUPCAKE_FAILED_PRECONDITION);
  EXPECT_EQ(m,
            "cupcake_recorder_create_cupti: this build has no CUPTI; build with the CUDA toolkit's CUPTI "
            "(extras/CUPTI) and -DCUPCAKE_WITH_CUPTI=ON");
}

TEST(RecorderMerge, TakesTheSlowestRankPerTensorOnReadyTimes) {
  // Per-rank median gaps (one iteration each): ready times are the prefix sums.
  const std::vector<std::vector<double>> gaps = {{5, 100, 30},  // ready 5, 105, 135
                                                 {20, 10, 10},  // ready 20, 30, 40
                                                 {1, 50, 200}};  // ready 1, 51, 251
  // Slowest ready time per tensor: 20, 105, 251; gaps 20, 85, 146. (The maximum of each gap
  // separately would be 20, 100, 200: ready at 320, later than any rank.)
  const std::vector<double> want = {20, 85, 146};
  InProcessGroup group(3);
  std::vector<std::string> json(3);
  OnRanks(group, 3, [&](int r, Communicator& comm) {
    ScriptedClock clock;
    auto rec = ThreeTensors(clock);
    Iteration(*rec, clock, 0, gaps[static_cast<size_t>(r)]);
    Iteration(*rec, clock, 1000, gaps[static_cast<size_t>(r)]);
    Status s = rec->MergeRanks(comm);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(rec->merged_ranks(), 3);
    EXPECT_EQ(*rec->BackwardUs(), want) << "rank " << r;
    EXPECT_EQ(*rec->MedianBackwardUs(), gaps[static_cast<size_t>(r)]) << "the local medians are kept";
    json[static_cast<size_t>(r)] = *rec->ToJson();
    // Another completed iteration drops the merged snapshot.
    Iteration(*rec, clock, 2000, gaps[static_cast<size_t>(r)]);
    EXPECT_EQ(rec->merged_ranks(), 0);
  });
  EXPECT_EQ(json[0], json[1]);
  EXPECT_EQ(json[0], json[2]);
  auto model = profile::ParseModelJson(json[0], "merged");
  ASSERT_TRUE(model.ok()) << model.status().message();
  EXPECT_EQ(model->source(), "cupcake runtime record mode: median of 2 iterations, slowest of 3 ranks");
  EXPECT_EQ(model->tensors(2).backward_us(), 146);
}

// One iteration with forward and update marked: forward from `start_us` for `forward_us`, the
// gradients' `gaps`, then the update for `update_us` after the last gradient.
void MarkedIteration(Recorder& r, ScriptedClock& clock, double start_us, double forward_us,
                     const std::vector<double>& gaps, double update_us) {
  clock.Push(start_us);
  ASSERT_TRUE(r.BeginForward().ok());
  Iteration(r, clock, start_us + forward_us, gaps);
  double last = start_us + forward_us;
  for (double g : gaps) last += g;
  clock.Push(last + update_us);
  Status s = r.EndIteration();
  ASSERT_TRUE(s.ok()) << s.message();
}

TEST(Recorder, ForwardAndUpdateAreMediansOfTheMarkedIterations) {
  ScriptedClock clock;
  auto r = ThreeTensors(clock);
  EXPECT_LT(r->ForwardUs(), 0) << "nothing marked yet";
  MarkedIteration(*r, clock, 0, 400, {1, 2, 3}, 90);
  MarkedIteration(*r, clock, 1000, 800, {1, 2, 3}, 30);  // outliers: forward, and update low
  MarkedIteration(*r, clock, 5000, 500, {1, 2, 3}, 70);
  Iteration(*r, clock, 9000, {1, 2, 3});  // neither marked: no sample
  EXPECT_EQ(r->ForwardUs(), 500);
  EXPECT_EQ(r->UpdateUs(), 70);
  auto json = r->ToJson();
  ASSERT_TRUE(json.ok());
  auto model = profile::ParseModelJson(*json, "marked");
  ASSERT_TRUE(model.ok()) << model.status().message();
  ASSERT_TRUE(model->has_forward_us() && model->has_update_us());
  EXPECT_EQ(model->forward_us(), 500);
  EXPECT_EQ(model->update_us(), 70);
  EXPECT_NE(json->find("\"forward_us\": 500.0,\n  \"update_us\": 70.0,\n  \"tensors\""), std::string::npos) << *json;
}

TEST(Recorder, UnmarkedModelsHaveNoForwardOrUpdate) {
  ScriptedClock clock;
  auto r = ThreeTensors(clock);
  Iteration(*r, clock, 0, {1, 2, 3});
  auto model = profile::ParseModelJson(*r->ToJson(), "unmarked");
  ASSERT_TRUE(model.ok());
  EXPECT_FALSE(model->has_forward_us());
  EXPECT_FALSE(model->has_update_us());
}

TEST(Recorder, RejectsMisplacedForwardAndUpdateMarks) {
  ScriptedClock clock;
  auto r = ThreeTensors(clock);
  clock.Push(0);
  Status s = r->EndIteration();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("EndIteration: no iteration to end"), std::string::npos) << s.message();
  clock.Push(1);
  ASSERT_TRUE(r->BeginBackward().ok());
  s = r->BeginForward();  // reads no time
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("BeginForward: iteration 0 is in backward"), std::string::npos) << s.message();
  for (int i = 0; i < 3; ++i) {
    clock.Push(10.0 + i);
    ASSERT_TRUE(r->GradientReady(i).ok());
  }
  clock.Push(20);
  ASSERT_TRUE(r->EndIteration().ok());
  clock.Push(21);
  EXPECT_EQ(r->EndIteration().code(), StatusCode::kFailedPrecondition) << "once per iteration";
  EXPECT_EQ(r->UpdateUs(), 8);
  EXPECT_LT(r->ForwardUs(), 0);
}

TEST(RecorderMerge, ForwardAndUpdateAreTheSlowestMarkingRanks) {
  InProcessGroup group(3);
  OnRanks(group, 3, [&](int r, Communicator& comm) {
    ScriptedClock clock;
    auto rec = ThreeTensors(clock);
    if (r == 2) {
      Iteration(*rec, clock, 0, {1, 1, 1});  // rank 2 marks nothing
    } else {
      MarkedIteration(*rec, clock, 0, r == 0 ? 300 : 200, {1, 1, 1}, r == 0 ? 10 : 40);
    }
    Status s = rec->MergeRanks(comm);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(rec->ForwardUs(), 300) << "rank " << r;
    EXPECT_EQ(rec->UpdateUs(), 40) << "rank " << r;
  });
}

// Densities (naturally sparse gradients): each sampled tensor's median share of non-zeros, at
// least 1 / numel; unsampled tensors record none; the JSON carries them and libprofile reads
// them back. fc2.bias (10 values) sampled 0.2, 0.4, 0.3 -> 0.3; fc2.weight sampled all zero ->
// 1/640; fc1.weight not sampled.
TEST(Recorder, DensityIsTheMedianShareOfNonzeros) {
  ScriptedClock clock;
  auto r = ThreeTensors(clock);
  Iteration(*r, clock, 0, {1, 1, 1});
  for (int nonzero : {2, 4, 3}) {
    std::vector<float> bias(10, 0.0f);
    for (int j = 0; j < nonzero; ++j) bias[static_cast<size_t>(3 * j)] = j % 2 == 0 ? 1.5f : -0.5f;
    bias[9] = -0.0f;  // zero
    ASSERT_TRUE(r->SampleDensity(0, bias).ok());
  }
  ASSERT_TRUE(r->SampleDensity(1, std::vector<float>(640, 0.0f)).ok());
  EXPECT_EQ(r->Densities(), (std::vector<double>{0.3, 1.0 / 640, -1}));
  auto text = r->ToJson();
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_NE(text->find("\"backward_us\": 1.0, \"density\": 0.3}"), std::string::npos) << *text;
  auto model = profile::ParseModelJson(*text, "model.json");
  ASSERT_TRUE(model.ok()) << model.status().message();
  EXPECT_EQ(model->tensors(0).density(), 0.3);
  EXPECT_EQ(model->tensors(1).density(), 1.0 / 640);
  EXPECT_FALSE(model->tensors(2).has_density());
  EXPECT_EQ(r->SampleDensity(3, std::vector<float>(1)).message(),
            "recorder: SampleDensity: tensor out of range; got 3, expected 0 <= i < 3 (the registered tensors)");
  EXPECT_EQ(r->SampleDensity(0, std::vector<float>(9)).message(),
            "recorder: SampleDensity(0, 'fc2.bias'): size mismatch; got 9 values, expected 10 (its numel)");
}

// Merged: the largest density over the ranks that sampled the tensor.
TEST(RecorderMerge, DensityIsTheLargestOverTheRanks) {
  InProcessGroup group(3);
  OnRanks(group, 3, [&](int r, Communicator& comm) {
    ScriptedClock clock;
    auto rec = ThreeTensors(clock);
    Iteration(*rec, clock, 0, {1, 1, 1});
    std::vector<float> bias(10, 0.0f);
    for (int j = 0; j <= r; ++j) bias[static_cast<size_t>(j)] = 1;
    ASSERT_TRUE(rec->SampleDensity(0, bias).ok());
    if (r == 1) {
      ASSERT_TRUE(rec->SampleDensity(2, std::vector<float>(64 * 32, 2.0f)).ok());
    }
    Status s = rec->MergeRanks(comm);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(rec->Densities(), (std::vector<double>{0.3, -1, 1.0})) << "rank " << r;
  });
}

TEST(RecorderMerge, FailsOnEveryRankWhenRanksRegisteredOtherTensors) {
  InProcessGroup group(2);
  std::vector<Status> results(2);
  OnRanks(group, 2, [&](int r, Communicator& comm) {
    ScriptedClock clock;
    auto rec = MakeRecorder(clock, "m", {{"a", 4}, {"b", r == 0 ? 4 : 5}});
    Iteration(*rec, clock, 0, {1, 2});
    results[static_cast<size_t>(r)] = rec->MergeRanks(comm);
  });
  pb::Model m0, m1;
  for (auto [m, b] : {std::pair{&m0, 4}, std::pair{&m1, 5}}) {
    for (auto [name, numel] : {std::pair<std::string, int>{"a", 4}, {"b", b}}) {
      pb::Tensor* t = m->add_tensors();
      t->set_name(name);
      t->set_numel(numel);
      t->set_dtype(pb::FLOAT32);
    }
  }
  const std::string want =
      "recorder: MergeRanks: model 'm': rank 1 registered other gradients than rank 0; got 2 "
      "tensors (fingerprint " +
      ModelFingerprint(m1) + "), expected 2 (fingerprint " + ModelFingerprint(m0) + ")";
  for (const Status& s : results) {
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(s.message(), want);
  }
}

TEST(RecorderMerge, FailsOnEveryRankWhenARankRecordedNothing) {
  InProcessGroup group(2);
  std::vector<Status> results(2);
  OnRanks(group, 2, [&](int r, Communicator& comm) {
    ScriptedClock clock;
    auto rec = MakeRecorder(clock, "m", {{"a", 4}});
    if (r == 0) Iteration(*rec, clock, 0, {1});
    results[static_cast<size_t>(r)] = rec->MergeRanks(comm);
  });
  for (const Status& s : results)
    EXPECT_EQ(s.message(),
              "recorder: MergeRanks: model 'm': rank 1 has no completed iteration; expected every rank "
              "to record at least one");
}

TEST(Recorder, CApiRecordsAndWritesOnASteadyClock) {
  cupcake_recorder* r = nullptr;
  ASSERT_EQ(cupcake_recorder_create("capi", &r), CUPCAKE_OK);
  const int64_t shape[] = {2, 4};
  EXPECT_EQ(cupcake_recorder_register_shape(r, "w", 8, nullptr, 2), CUPCAKE_INVALID_ARGUMENT);
  EXPECT_STREQ(cupcake_last_error(),
               "cupcake_recorder_register_shape: shape: got 2 dimensions at NULL, expected dims >= 0 and a non-NULL "
               "shape when dims > 0");
  ASSERT_EQ(cupcake_recorder_register_shape(r, "w", 8, shape, 2), CUPCAKE_OK) << cupcake_last_error();
  ASSERT_EQ(cupcake_recorder_register(r, "b", 2), CUPCAKE_OK);
  for (int it = 0; it < 3; ++it) {
    ASSERT_EQ(cupcake_recorder_begin_forward(r), CUPCAKE_OK);
    ASSERT_EQ(cupcake_recorder_begin_backward(r), CUPCAKE_OK);
    ASSERT_EQ(cupcake_recorder_gradient_ready(r, 0), CUPCAKE_OK);
    ASSERT_EQ(cupcake_recorder_gradient_ready(r, 1), CUPCAKE_OK);
    ASSERT_EQ(cupcake_recorder_end_iteration(r), CUPCAKE_OK);
  }
  EXPECT_EQ(cupcake_recorder_end_iteration(r), CUPCAKE_FAILED_PRECONDITION);
  EXPECT_EQ(cupcake_recorder_gradient_ready(r, 0), CUPCAKE_FAILED_PRECONDITION);
  EXPECT_STREQ(cupcake_last_error(), "recorder: GradientReady(0): outside backward; expected BeginBackward first");
  const float w[8] = {0, 1, 0, 0, 2, 0, 0, 0};
  ASSERT_EQ(cupcake_recorder_sample_density(r, 0, w, 8), CUPCAKE_OK) << cupcake_last_error();
  EXPECT_EQ(cupcake_recorder_sample_density(r, 0, nullptr, 8), CUPCAKE_INVALID_ARGUMENT);
  EXPECT_STREQ(cupcake_last_error(),
               "cupcake_recorder_sample_density: grad: expected a non-null buffer of numel >= 1 floats; got NULL, "
               "numel 8");
  EXPECT_EQ(cupcake_recorder_sample_density(r, 1, w, 8), CUPCAKE_INVALID_ARGUMENT);  // b has 2 values
  const std::string path = TempPath("capi.json");
  ASSERT_EQ(cupcake_recorder_write(r, path.c_str()), CUPCAKE_OK) << cupcake_last_error();
  cupcake_recorder_destroy(r);
  auto text = ReadFile(path);
  ASSERT_TRUE(text.ok());
  auto model = profile::ParseModelJson(*text, path);
  ASSERT_TRUE(model.ok()) << model.status().message();
  EXPECT_EQ(model->tensors_size(), 2);
  EXPECT_GE(model->tensors(1).backward_us(), 0);
  EXPECT_TRUE(model->has_forward_us() && model->has_update_us());
  EXPECT_EQ(model->tensors(0).density(), 0.25);
  EXPECT_FALSE(model->tensors(1).has_density());
  EXPECT_EQ(model->tensors(0).shape_size(), 2);
  EXPECT_EQ(model->tensors(0).shape(1), 4);
  std::filesystem::remove(path);
  EXPECT_EQ(cupcake_recorder_begin_backward(nullptr), CUPCAKE_INVALID_ARGUMENT);
  EXPECT_STREQ(cupcake_last_error(),
               "cupcake_recorder_begin_backward: recorder is NULL; expected one from cupcake_recorder_create");
}

}  // namespace
}  // namespace cupcake::runtime
