#include "gravac.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>

#include "cupcake/kernels/compressor.h"
#include "cupcake/proto/catalogue.h"
#include "cupcake/proto/names.h"

namespace cupcake::runtime::internal {

namespace {

// The magnitude probe's sample: its size, and the smallest group it is drawn from.
constexpr int64_t kSample = 2048;
constexpr int64_t kSampledFrom = 16 * kSample;

// The compressors' k for a ratio (kernels::ResolveLayout): at least one element.
int64_t Kept(double ratio, int64_t n) {
  return std::clamp(static_cast<int64_t>(std::floor(ratio * static_cast<double>(n))), int64_t{1}, n);
}

}  // namespace

GainProbe::GainProbe(Selection selection, int64_t max_numel, uint64_t seed, Clock* clock)
    : selection_(selection),
      seed_(seed),
      clock_(clock),
      scratch_(selection == Selection::kMagnitude ? static_cast<size_t>(max_numel) : 0) {}

Status GainProbe::UseDevice() {
  if (selection_ == Selection::kLowRank)
    return FailedPreconditionError(
        "the gain probe of PowerSGD rungs is not built for GPU memory; expected a ladder of topk, randk or dgc "
        "ratios, or a session on host memory");
  CUPCAKE_ASSIGN_OR_RETURN(device_, kernels::MakeDeviceGain());
  return Status::Ok();
}

Status GainProbe::Observe(std::span<const float> gradient, const float* memory, int group, uint64_t iteration,
                          kernels::Backend where, void* stream) {
  const double start_us = clock_->NowUs();
  Status s;
  if (where == kernels::Backend::kCpu) {
    std::lock_guard lock(mu_);
    ObserveGroup(gradient, memory, group, iteration);
  } else if (device_ == nullptr) {
    s = InternalError("GainProbe: a group on GPU memory, but the probe is not on the device (UseDevice)");
  } else if (!gradient.empty()) {
    const int64_t n = static_cast<int64_t>(gradient.size());
    const int64_t k_min = Kept(ratio_min_, n);
    const int64_t k_c = std::min(Kept(ratio_c_, n), k_min);
    s = selection_ == Selection::kRandom
            ? device_->AddRandom(gradient.data(), memory, n, k_min, k_c,
                                 GroupSeed(seed_, group, 0, /*allreduce=*/true), iteration, stream)
            : device_->AddLargest(gradient.data(), memory, n, k_min, k_c, stream);
    device_stream_ = stream;
  }
  std::lock_guard lock(mu_);
  cost_us_ += clock_->NowUs() - start_us;
  return s;
}

void GainProbe::SetTensors(const std::vector<std::vector<int64_t>>& shapes, const std::vector<int64_t>& numels,
                           int max_rank) {
  max_rank_ = max_rank;
  tensors_.clear();
  int64_t q = 0, rows = 0, cols = 0, numel = 0;
  for (size_t t = 0; t < numels.size(); ++t) {
    const LowRankMatrix m = PowerSgdMatrix(shapes[t], numels[t], max_rank, kPowerSgdMinCompressionRate);
    tensors_.push_back({shapes[t], numels[t], q});
    q += m.cols * max_rank;
    rows = std::max(rows, m.rows);
    cols = std::max(cols, m.cols);
    numel = std::max(numel, numels[t]);
  }
  // Q's first value: N(0, 1) draws keyed by the seed, as PowerSGD starts (any full-rank start
  // converges; the gains are summed over the ranks, so they need not draw alike).
  std::mt19937_64 rng(seed_);
  std::normal_distribution<double> normal;
  q_.resize(static_cast<size_t>(q));
  for (double& v : q_) v = normal(rng);
  p_.assign(static_cast<size_t>(rows * max_rank), 0.0);
  qn_.assign(static_cast<size_t>(cols * max_rank), 0.0);
  x_.assign(static_cast<size_t>(numel), 0.0);
  group_first_.reserve(numels.size());
}

void GainProbe::SetRanks(int rank_min, int rank_c, std::span<const GroupLayout> groups) {
  rank_min_ = rank_min;
  rank_c_ = rank_c;
  group_first_.clear();
  for (const GroupLayout& g : groups) group_first_.push_back(g.first);
}

double GainProbe::PowerStep(int tensor, int64_t rows, int64_t cols, int r, int rc, double* first) {
  // x_ holds the tensor's g_ef (rows x cols, row-major); P = x Q into p_ (rows x r).
  const double* x = x_.data();
  double* q = q_.data() + tensors_[static_cast<size_t>(tensor)].q_offset;  // cols x max_rank_
  double* p = p_.data();
  double* qn = qn_.data();
  for (int64_t i = 0; i < rows; ++i)
    for (int c = 0; c < r; ++c) {
      double sum = 0;
      for (int64_t j = 0; j < cols; ++j) sum += x[i * cols + j] * q[j * max_rank_ + c];
      p[i * r + c] = sum;
    }
  // PowerSGD's Gram-Schmidt (cupcake/kernels/powersgd.h): each column in order divided by its
  // norm, its projection taken from every later column; a zero column stays zero.
  for (int c = 0; c < r; ++c) {
    double norm = 0;
    for (int64_t i = 0; i < rows; ++i) norm += p[i * r + c] * p[i * r + c];
    norm = std::sqrt(norm);
    if (norm == 0) continue;
    for (int64_t i = 0; i < rows; ++i) p[i * r + c] /= norm;
    for (int d = c + 1; d < r; ++d) {
      double dot = 0;
      for (int64_t i = 0; i < rows; ++i) dot += p[i * r + c] * p[i * r + d];
      for (int64_t i = 0; i < rows; ++i) p[i * r + d] -= dot * p[i * r + c];
    }
  }
  // Q = x^T P (cols x r), kept as the next warm start; ||P Q^T||^2 = ||Q||^2 (P orthonormal),
  // and the first rc columns of P span the rank-rc approximation of P P^T x.
  std::fill(qn, qn + cols * r, 0.0);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const double v = x[i * cols + j];
      for (int c = 0; c < r; ++c) qn[j * r + c] += v * p[i * r + c];
    }
  double all = 0;
  *first = 0;
  for (int c = 0; c < r; ++c) {
    double energy = 0;
    for (int64_t j = 0; j < cols; ++j) {
      const double v = qn[j * r + c];
      energy += v * v;
      q[j * max_rank_ + c] = v;
    }
    all += energy;
    if (c < rc) *first += energy;
  }
  return all;
}

bool GainProbe::ObserveLowRank(std::span<const float> gradient, const float* memory, int group, GainSums& step) {
  const int64_t n = static_cast<int64_t>(gradient.size());
  int t = group_first_[static_cast<size_t>(group)];
  for (int64_t at = 0; at < n; ++t) {
    const Tensor& tensor = tensors_[static_cast<size_t>(t)];
    double sq = 0;
    for (int64_t j = 0; j < tensor.numel; ++j) {
      const double v = static_cast<double>(gradient[static_cast<size_t>(at + j)]) + (memory ? memory[at + j] : 0.0f);
      x_[static_cast<size_t>(j)] = v;
      sq += v * v;
    }
    if (!std::isfinite(sq)) return false;
    const LowRankMatrix m = PowerSgdMatrix(tensor.shape, tensor.numel, rank_min_, kPowerSgdMinCompressionRate);
    const LowRankMatrix c = PowerSgdMatrix(tensor.shape, tensor.numel, rank_c_, kPowerSgdMinCompressionRate);
    step.input += sq;
    double first = 0;
    if (m.compressed) {
      step.min += PowerStep(t, m.rows, m.cols, static_cast<int>(m.rank), static_cast<int>(c.rank), &first);
      step.cand += first;
    } else {
      // Sent whole at r_min; the candidate compresses that (a lower rank may compress it).
      step.min += sq;
      step.cand +=
          c.compressed ? PowerStep(t, c.rows, c.cols, static_cast<int>(c.rank), static_cast<int>(c.rank), &first) : sq;
    }
    at += tensor.numel;
  }
  return true;
}

void GainProbe::ObserveGroup(std::span<const float> gradient, const float* memory, int group, uint64_t iteration) {
  const int64_t n = static_cast<int64_t>(gradient.size());
  if (n == 0) return;
  if (selection_ == Selection::kLowRank) {
    GainSums step;
    if (ObserveLowRank(gradient, memory, group, step))
      sums_ += step;
    else
      ++sums_.skipped;
    return;
  }
  const auto g_ef = [&](int64_t i) {
    return memory == nullptr ? gradient[static_cast<size_t>(i)] : gradient[static_cast<size_t>(i)] + memory[i];
  };
  const int64_t k_min = Kept(ratio_min_, n);
  const int64_t k_c = std::min(Kept(ratio_c_, n), k_min);
  GainSums step;
  if (selection_ == Selection::kMagnitude) {
    // One pass: the squares at or above a threshold that a sample of the group puts a little
    // below the k_min-th largest are kept as candidates (the kernels' topk selects the same way);
    // the exact top k_min is then chosen among them. A sample that misjudged (fewer candidates
    // than k_min) falls back to every square.
    float* sq = scratch_.data();
    float threshold = 0;
    if (n >= kSampledFrom && k_min * 4 <= n) {
      float sample[kSample];
      for (int64_t j = 0; j < kSample; ++j) {
        const float v = g_ef(j * n / kSample);
        sample[j] = v * v;
      }
      // The sample's rank of 1.5 k_min (at least 8 above the expected k_min-th), from the top.
      const int64_t rank = std::min<int64_t>(kSample, (3 * k_min * kSample) / (2 * n) + 8);
      std::nth_element(sample, sample + (rank - 1), sample + kSample, std::greater<>());
      threshold = sample[rank - 1];
    }
    int64_t kept = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float v = g_ef(i);
      const float s = v * v;
      step.input += s;
      if (s >= threshold) sq[kept++] = s;
    }
    // A NaN would break the ordering the selections need; an infinite sum makes no ratio.
    if (!std::isfinite(step.input)) {
      ++sums_.skipped;
      return;
    }
    if (kept < k_min) {
      for (int64_t i = 0; i < n; ++i) {
        const float v = g_ef(i);
        sq[i] = v * v;
      }
      kept = n;
    }
    std::nth_element(sq, sq + (kept - k_min), sq + kept);
    for (int64_t i = kept - k_min; i < kept; ++i) step.min += sq[i];
    std::nth_element(sq + (kept - k_min), sq + (kept - k_c), sq + kept);
    for (int64_t i = kept - k_c; i < kept; ++i) step.cand += sq[i];
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const float v = g_ef(i);
      step.input += static_cast<double>(v) * v;
    }
    if (!std::isfinite(step.input)) {
      ++sums_.skipped;
      return;
    }
    // randk at r_c keeps the first k_c of the k_min indices randk at r_min keeps (one keyed
    // permutation), so the candidate compressing g_min is randk at r_c itself.
    const uint64_t seed = GroupSeed(seed_, group, 0, /*allreduce=*/true);
    for (int64_t j = 0; j < k_min; ++j) {
      const float v = g_ef(kernels::RandkIndex(seed, iteration, static_cast<uint32_t>(n), static_cast<uint32_t>(j)));
      const double sq = static_cast<double>(v) * v;
      step.min += sq;
      if (j < k_c) step.cand += sq;
    }
  }
  sums_ += step;
}

StatusOr<GainSums> GainProbe::Take(double* cost_us) {
  std::lock_guard lock(mu_);
  GainSums out = sums_;
  if (device_ != nullptr) {
    CUPCAKE_ASSIGN_OR_RETURN(kernels::GainTotals d, device_->Take(device_stream_));
    out += {d.input, d.min, d.cand, static_cast<double>(d.skipped)};
  }
  sums_ = {};
  *cost_us = cost_us_;
  cost_us_ = 0;
  return out;
}

Status GainProbe::ReadState(std::span<double> out) const {
  std::lock_guard lock(mu_);
  GainSums sums = sums_;
  if (device_ != nullptr) {
    CUPCAKE_ASSIGN_OR_RETURN(kernels::GainTotals d, device_->Read(device_stream_));
    sums += {d.input, d.min, d.cand};
  }
  out[0] = sums.input;
  out[1] = sums.min;
  out[2] = sums.cand;
  out[3] = cost_us_;
  std::copy(q_.begin(), q_.end(), out.begin() + 4);
  return Status::Ok();
}

// The restored sums are the host's; the device's start from zero.
Status GainProbe::WriteState(std::span<const double> in) {
  std::lock_guard lock(mu_);
  if (device_ != nullptr) CUPCAKE_RETURN_IF_ERROR(device_->Write(kernels::GainTotals{}, device_stream_));
  sums_ = {in[0], in[1], in[2]};
  cost_us_ = in[3];
  std::copy(in.begin() + 4, in.end(), q_.begin());
  return Status::Ok();
}

GravacController::GravacController(std::vector<Rung> rungs, const GravacOptions& options)
    : rungs_(std::move(rungs)),
      options_(options),
      measured_us_(rungs_.size(), 0),
      gain_(rungs_.size(), 0) {
  const int last = static_cast<int>(rungs_.size()) - 1;
  cand_ = std::min(2, last);
  exploring_ = cand_ > min_;
}

void GravacController::ReadState(std::span<double> out) const {
  out[0] = sent_;
  out[1] = min_;
  out[2] = cand_;
  out[3] = exploring_ ? 1 : 0;
  std::copy(measured_us_.begin(), measured_us_.end(), out.begin() + 4);
  std::copy(gain_.begin(), gain_.end(), out.begin() + 4 + static_cast<std::ptrdiff_t>(rungs_.size()));
}

Status GravacController::WriteState(std::span<const double> in) {
  const double rungs = static_cast<double>(rungs_.size());
  const auto rung = [&](double v, double low) { return v == std::floor(v) && v >= low && v < rungs; };
  // cf_min starts at rung 1 and the candidate never falls below it (Decide).
  if (!rung(in[0], 0) || !rung(in[1], 1) || !rung(in[2], in[1]) || (in[3] != 0 && in[3] != 1))
    return InvalidArgumentError("GraVAC's controller: rungs out of range; got sent " + FormatDouble(in[0]) +
                                ", cf_min " + FormatDouble(in[1]) + ", candidate " + FormatDouble(in[2]) +
                                ", exploring " + FormatDouble(in[3]) + ", expected 0 <= sent < " +
                                std::to_string(rungs_.size()) + ", 1 <= cf_min <= candidate < " +
                                std::to_string(rungs_.size()) + " (the ladder's rungs) and exploring 0 or 1");
  sent_ = static_cast<int>(in[0]);
  min_ = static_cast<int>(in[1]);
  cand_ = static_cast<int>(in[2]);
  exploring_ = in[3] != 0;
  std::copy(in.begin() + 4, in.begin() + 4 + static_cast<std::ptrdiff_t>(rungs_.size()), measured_us_.begin());
  std::copy(in.begin() + 4 + static_cast<std::ptrdiff_t>(rungs_.size()), in.end(), gain_.begin());
  return Status::Ok();
}

double GravacController::SystemUs(int rung) const {
  const double predicted = rungs_[static_cast<size_t>(rung)].predicted_us;
  const double measured = measured_us_[static_cast<size_t>(rung)];
  if (measured > 0 && (predicted <= 0 || std::abs(measured - predicted) > options_.measured_tolerance * predicted))
    return measured;
  return predicted > 0 ? predicted : 1;
}

// The least compression whose throughput (its last gain per unit of system time, with the
// system times known now) is within omega of the best probed from cf_min up: beyond it more
// compression buys no more progress per second.
int GravacController::SaturationRung() const {
  const int last = static_cast<int>(rungs_.size()) - 1;
  std::vector<double> throughput(rungs_.size(), 0);
  double best = 0;
  for (int r = min_; r <= last; ++r) {
    throughput[static_cast<size_t>(r)] = gain_[static_cast<size_t>(r)] / SystemUs(r);
    best = std::max(best, throughput[static_cast<size_t>(r)]);
  }
  for (int r = min_; r <= last; ++r)
    if (best > 0 && throughput[static_cast<size_t>(r)] >= (1 - options_.omega) * best) return r;
  return min_;
}

GravacDecision GravacController::Decide(uint64_t first_step, int steps, const GainSums& sums, double measured_us,
                                        int64_t bytes_sent, double probe_us) {
  const int last = static_cast<int>(rungs_.size()) - 1;
  GravacDecision d;
  d.step = first_step;
  d.steps = steps;
  d.ratio = rungs_[static_cast<size_t>(sent_)].ratio;
  d.ratio_min = rungs_[static_cast<size_t>(min_)].ratio;
  d.ratio_c = rungs_[static_cast<size_t>(cand_)].ratio;
  // No gradient at all loses nothing to compression.
  d.gain_min = sums.input > 0 ? sums.min / sums.input : 1;
  d.gain_c = sums.input > 0 ? sums.cand / sums.input : 1;
  d.groups_skipped = static_cast<int64_t>(sums.skipped);
  d.predicted_ms = rungs_[static_cast<size_t>(sent_)].predicted_us / 1e3;
  d.measured_ms = measured_us > 0 ? measured_us / 1e3 : 0;
  d.bytes_sent = bytes_sent;
  d.probe_ms = probe_us / 1e3;
  if (measured_us > 0) measured_us_[static_cast<size_t>(sent_)] = measured_us;
  gain_[static_cast<size_t>(min_)] = d.gain_min;
  gain_[static_cast<size_t>(cand_)] = d.gain_c;

  // What the next window sends: the candidate while it keeps enough of the gradient, else
  // cf_min, else the dense gradient.
  sent_ = d.gain_c >= options_.epsilon ? cand_ : d.gain_min >= options_.epsilon ? min_ : 0;
  // Scale up: the candidate loses next to nothing more than cf_min, so it becomes cf_min.
  if (cand_ > min_ && std::abs(d.gain_min - d.gain_c) <= options_.omega * d.gain_min) min_ = cand_;
  // The next candidate: one rung further while exploring; once every rung has been probed, the
  // rung where the throughput saturates; once cf_min has reached it, explore again from there.
  if (exploring_) {
    if (cand_ < last) {
      cand_ = std::min(std::max(cand_ + 1, min_ + 1), last);
    } else {
      exploring_ = false;
      cand_ = std::max(min_, SaturationRung());
    }
  } else {
    cand_ = std::max(cand_, min_);
    if (cand_ == min_ && min_ < last) {
      exploring_ = true;
      cand_ = min_ + 1;
    }
  }
  d.next_ratio = rungs_[static_cast<size_t>(sent_)].ratio;
  return d;
}

Status CheckGravacOptions(const GravacOptions& o) {
  std::string problems;
  const auto bad = [&](const char* field, double got, const char* expected) {
    problems += (problems.empty() ? "" : "\n") + std::string("GravacOptions.") + field + ": out of range; got " +
                FormatDouble(got) + ", expected " + expected;
  };
  if (o.window < 1) bad("window", o.window, ">= 1 (steps)");
  if (o.probe_every < 1) bad("probe_every", o.probe_every, ">= 1 (steps)");
  if (!(o.epsilon > 0 && o.epsilon <= 1)) bad("epsilon", o.epsilon, "0 < epsilon <= 1");
  if (!(o.omega >= 0 && o.omega < 1)) bad("omega", o.omega, "0 <= omega < 1");
  if (!(o.measured_tolerance >= 0 && std::isfinite(o.measured_tolerance)))
    bad("measured_tolerance", o.measured_tolerance, "a finite fraction >= 0");
  if (problems.empty()) return Status::Ok();
  return InvalidArgumentError(problems);
}

}  // namespace cupcake::runtime::internal
