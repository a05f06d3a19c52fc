#include "cupcake/runtime/recorder.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <set>

#include "cupcake/cupcake.pb.h"
#include "cupcake/proto/catalogue.h"
#include "cupcake/proto/file_io.h"
#include "cupcake/proto/fingerprint.h"

namespace cupcake::runtime {
namespace {

// A JSON string literal: quotes, backslashes and control characters escaped.
void AppendJsonString(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '"';
}

// The shortest text that reads back as the same double.
void AppendDouble(std::string& out, double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, end);
  if (std::string_view(buf, end - buf).find_first_of(".eE") == std::string_view::npos) out += ".0";
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The median of the samples; -1 when there are none (the field stays absent).
double MedianOrNone(const std::vector<double>& v) { return v.empty() ? -1 : Median(v); }

}  // namespace

Recorder::Recorder(std::string model_name, const RecorderOptions& options)
    : model_name_(std::move(model_name)), source_(options.source), activity_(options.activity) {
  if (options.clock == nullptr) owned_clock_ = std::make_unique<SteadyClock>();
  clock_ = options.clock != nullptr ? options.clock : owned_clock_.get();
}

Recorder::~Recorder() = default;

StatusOr<std::unique_ptr<Recorder>> Recorder::Create(const std::string& model_name, const RecorderOptions& options) {
  if (model_name.empty()) return InvalidArgumentError("recorder: model name: empty; expected the model's name");
  return std::unique_ptr<Recorder>(new Recorder(model_name, options));
}

Status Recorder::Register(const std::string& name, int64_t numel, std::span<const int64_t> shape) {
  const std::string where = "recorder: tensor " + std::to_string(names_.size()) + " ('" + name + "')";
  if (in_backward_ || completed_ > 0)
    return FailedPreconditionError(where +
                                   ": registered after BeginBackward; expected every gradient registered first");
  if (name.empty()) return InvalidArgumentError(where + ": name: empty; expected the parameter's name");
  if (numel < 1)
    return InvalidArgumentError(where + ": numel: out of range; got " + std::to_string(numel) + ", expected >= 1");
  if (std::find(names_.begin(), names_.end(), name) != names_.end())
    return InvalidArgumentError(where + ": name: registered twice; expected distinct names");
  pb::Tensor t;
  t.set_numel(numel);
  for (int64_t d : shape) t.add_shape(d);
  if (std::string why = ShapeProblem(t); !why.empty()) return InvalidArgumentError(where + ": shape: " + why);
  names_.push_back(name);
  numels_.push_back(numel);
  shapes_.emplace_back(shape.begin(), shape.end());
  gaps_us_.emplace_back();
  density_samples_.emplace_back();
  return Status::Ok();
}

int Recorder::registered() const { return static_cast<int>(names_.size()); }
int Recorder::completed_iterations() const { return completed_; }

Status Recorder::BeginForward() {
  if (in_backward_)
    return FailedPreconditionError("recorder: BeginForward: iteration " + std::to_string(completed_) +
                                   " is in backward; expected BeginForward before BeginBackward");
  awaiting_end_ = false;
  forward_start_us_ = clock_->NowUs();
  return Status::Ok();
}

Status Recorder::EndIteration() {
  const double now_us = clock_->NowUs();
  if (!awaiting_end_)
    return FailedPreconditionError(
        "recorder: EndIteration: no iteration to end; expected it once after the last GradientReady of an iteration");
  awaiting_end_ = false;
  update_us_.push_back(std::max(0.0, now_us - last_us_));
  merged_ranks_ = 0;  // a merge is a snapshot of the samples before it
  return Status::Ok();
}

Status Recorder::BeginBackward() {
  if (names_.empty())
    return FailedPreconditionError("recorder: BeginBackward: no gradient registered; expected Register first");
  if (in_backward_)
    return FailedPreconditionError("recorder: BeginBackward: iteration " + std::to_string(completed_) +
                                   " is incomplete; got " + std::to_string(next_) + " of " +
                                   std::to_string(names_.size()) + " gradients ready, expected all (next: '" +
                                   names_[next_] + "')");
  if (activity_ != nullptr) {
    CUPCAKE_RETURN_IF_ERROR(activity_->Start().WithPrefix("recorder: BeginBackward: kernel time"));
    if (Status s = activity_->SetMark(1); !s.ok()) {
      (void)activity_->Flush();  // stop collecting
      return s.WithPrefix("recorder: BeginBackward: kernel time");
    }
  }
  in_backward_ = true;
  awaiting_end_ = false;
  next_ = 0;
  current_us_.clear();
  last_us_ = clock_->NowUs();
  current_forward_us_ = forward_start_us_ < 0 ? -1 : std::max(0.0, last_us_ - forward_start_us_);
  forward_start_us_ = -1;
  return Status::Ok();
}

Status Recorder::MarkKernelTime(int i) {
  const int n = registered();
  if (i + 1 < n) return activity_->SetMark(static_cast<uint64_t>(i) + 2);
  CUPCAKE_RETURN_IF_ERROR(activity_->ClearMark());
  CUPCAKE_ASSIGN_OR_RETURN(std::vector<KernelActivity> records, activity_->Flush());
  std::vector<std::vector<KernelActivity>> by_tensor(static_cast<size_t>(n));
  for (KernelActivity& r : records) {
    if (r.mark > static_cast<uint64_t>(n)) continue;  // another user's mark
    by_tensor[r.mark == 0 ? 0 : static_cast<size_t>(r.mark - 1)].push_back(std::move(r));
  }
  for (size_t t = 0; t < by_tensor.size(); ++t) {
    CUPCAKE_ASSIGN_OR_RETURN(current_us_[t], KernelBusyUs(by_tensor[t]));
  }
  return Status::Ok();
}

Status Recorder::GradientReady(int i) {
  const double now_us = clock_->NowUs();
  if (!in_backward_)
    return FailedPreconditionError("recorder: GradientReady(" + std::to_string(i) +
                                   "): outside backward; expected BeginBackward first");
  if (i != next_)
    return InvalidArgumentError("recorder: GradientReady: out of order; got " + std::to_string(i) + ", expected " +
                                std::to_string(next_) + " ('" + names_[next_] +
                                "'; gradients are registered in gradient-ready order)");
  current_us_.push_back(std::max(0.0, now_us - last_us_));
  last_us_ = now_us;
  if (activity_ != nullptr) {
    if (Status s = MarkKernelTime(i); !s.ok()) {
      in_backward_ = false;  // the iteration is abandoned; the next BeginBackward starts afresh
      (void)activity_->ClearMark();
      (void)activity_->Flush();  // stop collecting, if the failure came before the flush
      return s.WithPrefix("recorder: GradientReady(" + std::to_string(i) + "): kernel time; iteration " +
                          std::to_string(completed_) + " abandoned");
    }
  }
  ++next_;
  if (next_ == registered()) {
    for (size_t t = 0; t < names_.size(); ++t) gaps_us_[t].push_back(current_us_[t]);
    if (current_forward_us_ >= 0) forward_us_.push_back(current_forward_us_);
    ++completed_;
    in_backward_ = false;
    awaiting_end_ = true;
    merged_us_.clear();  // a merge is a snapshot of the iterations before it
    merged_ranks_ = 0;
  }
  return Status::Ok();
}

Status Recorder::SampleDensity(int i, std::span<const float> grad) {
  if (i < 0 || i >= registered())
    return InvalidArgumentError("recorder: SampleDensity: tensor out of range; got " + std::to_string(i) +
                                ", expected 0 <= i < " + std::to_string(registered()) + " (the registered tensors)");
  const auto t = static_cast<size_t>(i);
  if (static_cast<int64_t>(grad.size()) != numels_[t])
    return InvalidArgumentError("recorder: SampleDensity(" + std::to_string(i) + ", '" + names_[t] +
                                "'): size mismatch; got " + std::to_string(grad.size()) + " values, expected " +
                                std::to_string(numels_[t]) + " (its numel)");
  int64_t nonzero = 0;
  for (float v : grad) nonzero += v != 0.0f;
  density_samples_[t].push_back(static_cast<double>(nonzero) / static_cast<double>(grad.size()));
  merged_ranks_ = 0;  // a merge is a snapshot of the samples before it
  return Status::Ok();
}

std::vector<double> Recorder::Densities() const {
  if (merged_ranks_ > 0) return merged_density_;
  std::vector<double> out;
  out.reserve(density_samples_.size());
  for (size_t t = 0; t < density_samples_.size(); ++t) {
    const double median = MedianOrNone(density_samples_[t]);
    // A tensor sampled all zero still records a density in (0, 1]: one non-zero element.
    out.push_back(median < 0 ? -1 : std::max(median, 1.0 / static_cast<double>(numels_[t])));
  }
  return out;
}

StatusOr<std::vector<double>> Recorder::MedianBackwardUs() const {
  if (completed_ == 0)
    return FailedPreconditionError(
        "recorder: model '" + model_name_ +
        "': no completed iteration; expected BeginBackward and every GradientReady at least once");
  // Per tensor the median of its ready time (the sum of the gaps up to it), then the gaps between
  // those medians: their sum is the median iteration's backward. Medians of the gaps themselves
  // would drop each iteration's jitter wherever it fell, and sum to less than any iteration.
  std::vector<double> ready(static_cast<size_t>(completed_), 0.0), gaps;
  gaps.reserve(names_.size());
  double before = 0;
  for (const auto& gaps_of_tensor : gaps_us_) {
    for (size_t k = 0; k < ready.size(); ++k) ready[k] += gaps_of_tensor[k];
    const double at = Median(ready);
    gaps.push_back(std::max(0.0, at - before));
    before = at;
  }
  return gaps;
}

namespace {
// What each rank contributes to the merge's first collective: fixed size, so ranks that
// registered different tensors still exchange it and all report the same problem.
struct MergeHeader {
  char fingerprint[32];  // ModelFingerprint of the registered names and sizes, NUL-padded
  int64_t tensors;
  int64_t completed;
};
}  // namespace

Status Recorder::MergeRanks(comm::Communicator& comm) {
  const int w = comm.size();
  pb::Model model;
  for (size_t t = 0; t < names_.size(); ++t) {
    pb::Tensor* pt = model.add_tensors();
    pt->set_name(names_[t]);
    pt->set_numel(numels_[t]);
    pt->set_dtype(pb::FLOAT32);
    for (int64_t d : shapes_[t]) pt->add_shape(d);
  }
  MergeHeader mine{};
  const std::string fp = ModelFingerprint(model);
  fp.copy(mine.fingerprint, sizeof mine.fingerprint - 1);
  mine.tensors = static_cast<int64_t>(names_.size());
  mine.completed = completed_;
  std::vector<MergeHeader> all(static_cast<size_t>(w));
  CUPCAKE_RETURN_IF_ERROR(comm.Allgather(&mine, all.data(), sizeof(MergeHeader)).WithPrefix("recorder: MergeRanks"));
  const std::string where = "recorder: MergeRanks: model '" + model_name_ + "': ";
  for (int r = 0; r < w; ++r) {
    const MergeHeader& h = all[static_cast<size_t>(r)];
    if (std::string(h.fingerprint) != std::string(all[0].fingerprint) || h.tensors != all[0].tensors)
      return FailedPreconditionError(where + "rank " + std::to_string(r) +
                                     " registered other gradients than rank 0; got " + std::to_string(h.tensors) +
                                     " tensors (fingerprint " + h.fingerprint + "), expected " +
                                     std::to_string(all[0].tensors) + " (fingerprint " + all[0].fingerprint + ")");
    if (h.completed < 1)
      return FailedPreconditionError(where + "rank " + std::to_string(r) +
                                     " has no completed iteration; expected every rank to record at least one");
  }
  // Each rank sends its n median gaps, then its forward and update medians, then its n
  // densities (-1: none).
  CUPCAKE_ASSIGN_OR_RETURN(std::vector<double> medians, MedianBackwardUs());
  const size_t n = medians.size();
  medians.push_back(MedianOrNone(forward_us_));
  medians.push_back(MedianOrNone(update_us_));
  for (double d : Densities()) medians.push_back(d);
  const size_t stride = 2 * n + 2;
  std::vector<double> gathered(stride * static_cast<size_t>(w));
  CUPCAKE_RETURN_IF_ERROR(comm.Allgather(medians.data(), gathered.data(), static_cast<int64_t>(stride * sizeof(double)))
                              .WithPrefix("recorder: MergeRanks"));
  // 1. Each rank's ready times (prefix sums of its gaps, summed in the same order everywhere);
  // 2. their maximum over ranks; 3. back to gaps.
  std::vector<double> ready(n, 0.0);
  for (int r = 0; r < w; ++r) {
    double t = 0;
    for (size_t i = 0; i < n; ++i) {
      t += gathered[static_cast<size_t>(r) * stride + i];
      ready[i] = r == 0 ? t : std::max(ready[i], t);
    }
  }
  merged_us_.assign(n, 0.0);
  for (size_t i = 0; i < n; ++i) merged_us_[i] = std::max(0.0, ready[i] - (i == 0 ? 0.0 : ready[i - 1]));
  // Forward and update: the slowest rank's among those that marked them (the iteration waits for
  // every rank), -1 when none did.
  merged_forward_us_ = merged_update_us_ = -1;
  for (int r = 0; r < w; ++r) {
    merged_forward_us_ = std::max(merged_forward_us_, gathered[static_cast<size_t>(r) * stride + n]);
    merged_update_us_ = std::max(merged_update_us_, gathered[static_cast<size_t>(r) * stride + n + 1]);
  }
  // Densities: the largest over the ranks that sampled the tensor.
  merged_density_.assign(n, -1.0);
  for (int r = 0; r < w; ++r)
    for (size_t i = 0; i < n; ++i)
      merged_density_[i] = std::max(merged_density_[i], gathered[static_cast<size_t>(r) * stride + n + 2 + i]);
  merged_ranks_ = w;
  merged_iterations_ = static_cast<int>(all[0].completed);
  for (const MergeHeader& h : all) merged_iterations_ = std::min(merged_iterations_, static_cast<int>(h.completed));
  return Status::Ok();
}

int Recorder::merged_ranks() const { return merged_ranks_; }

StatusOr<std::vector<double>> Recorder::BackwardUs() const {
  if (merged_ranks_ > 0) return merged_us_;
  return MedianBackwardUs();
}

double Recorder::ForwardUs() const { return merged_ranks_ > 0 ? merged_forward_us_ : MedianOrNone(forward_us_); }
double Recorder::UpdateUs() const { return merged_ranks_ > 0 ? merged_update_us_ : MedianOrNone(update_us_); }

StatusOr<std::string> Recorder::ToJson() const {
  CUPCAKE_ASSIGN_OR_RETURN(std::vector<double> medians, BackwardUs());
  std::string source = source_;
  if (source.empty()) {
    source = "cupcake runtime record mode: median of " +
             std::to_string(merged_ranks_ > 0 ? merged_iterations_ : completed_) + " iterations";
    if (activity_ != nullptr) source += ", kernel time between gradient-ready marks";
    if (merged_ranks_ > 0) source += ", slowest of " + std::to_string(merged_ranks_) + " ranks";
  }
  std::string out = "{\n  \"format\": \"cupcake.model.v1\",\n  \"name\": ";
  AppendJsonString(out, model_name_);
  out += ",\n  \"source\": ";
  AppendJsonString(out, source);
  if (const double f = ForwardUs(); f >= 0) {
    out += ",\n  \"forward_us\": ";
    AppendDouble(out, f);
  }
  if (const double u = UpdateUs(); u >= 0) {
    out += ",\n  \"update_us\": ";
    AppendDouble(out, u);
  }
  out += ",\n  \"tensors\": [";
  const std::vector<double> densities = Densities();
  for (size_t t = 0; t < names_.size(); ++t) {
    out += t == 0 ? "\n    {\"name\": " : ",\n    {\"name\": ";
    AppendJsonString(out, names_[t]);
    out += ", \"numel\": " + std::to_string(numels_[t]) + ", \"dtype\": \"float32\", \"backward_us\": ";
    AppendDouble(out, medians[t]);
    if (densities[t] > 0) {
      out += ", \"density\": ";
      AppendDouble(out, densities[t]);
    }
    for (size_t d = 0; d < shapes_[t].size(); ++d) out += (d == 0 ? ", \"shape\": [" : ", ") + std::to_string(shapes_[t][d]);
    if (!shapes_[t].empty()) out += "]";
    out += "}";
  }
  out += "\n  ]\n}\n";
  return out;
}

Status Recorder::Write(const std::string& path) const {
  CUPCAKE_ASSIGN_OR_RETURN(std::string json, ToJson());
  return WriteFileAtomic(path, json);
}

}  // namespace cupcake::runtime
