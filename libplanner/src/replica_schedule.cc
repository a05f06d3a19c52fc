// Idle network gaps of a plan's timeline and the replica chunks that fit them
// (replica_schedule.h, docs/CHECKPOINT.md).
#include "cupcake/planner/replica_schedule.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "cupcake/planner/cost_model.h"

namespace cupcake::planner {

namespace {

// The largest integer in [a, b] (a region on which curve.At is linear, clamped at 0) whose value
// is <= budget_us, or -1. On such a region the sizes that fit form one interval.
int64_t LargestFitIn(const Curve& curve, double a, double b, double budget_us) {
  const double fa = curve.At(a), fb = curve.At(b);
  double right;
  if (fb <= budget_us)
    right = b;
  else if (fa <= budget_us)
    right = a + (budget_us - fa) / (fb - fa) * (b - a);  // fb > budget >= fa: the crossing
  else
    return -1;
  // The crossing is computed in floating point: the integer just above floor(right) may fit
  // exactly, floor(right) itself may be a hair over. Try those and one below.
  const int64_t top = static_cast<int64_t>(std::floor(right)) + 1;
  for (int64_t c = top; c >= top - 3 && c >= a; --c)
    if (c <= b && curve.At(static_cast<double>(c)) <= budget_us) return c;
  return -1;
}

}  // namespace

int64_t LargestFit(const Curve& curve, double budget_us, int64_t cap) {
  if (cap <= 0 || budget_us < 0) return 0;
  // Region bounds: 0, the measured sizes inside (0, cap), cap; At is linear between two.
  std::vector<double> bounds{0.0};
  for (double x : curve.sizes())
    if (x > 0 && x < static_cast<double>(cap)) bounds.push_back(x);
  bounds.push_back(static_cast<double>(cap));
  for (size_t i = bounds.size() - 1; i > 0; --i)
    if (const int64_t c = LargestFitIn(curve, bounds[i - 1], bounds[i], budget_us); c >= 0) return c;
  return 0;
}

StatusOr<Curve> TransferCurve(const pb::Profile& profile, int world_size) {
  if (world_size < 2)
    return InvalidArgumentError("replica schedule: world_size: no peer to send a replica to; got " +
                                std::to_string(world_size) + ", expected >= 2");
  const pb::Curve* allreduce = FindProfileCurve(profile, "comm allreduce global");
  if (allreduce == nullptr || allreduce->points().empty())
    return NotFoundError("profile " + profile.cluster().name() +
                         ": curves: no \"comm allreduce global\" curve; expected one to price replica chunks");
  const double per_rank = 2.0 * (world_size - 1) / world_size;  // link bytes per allreduce byte
  std::vector<double> sizes, times;
  for (const pb::Point& p : allreduce->points()) {
    sizes.push_back(static_cast<double>(p.size()) * per_rank);
    times.push_back(p.us());
  }
  return Curve(std::move(sizes), std::move(times));
}

ReplicaSchedule ScheduleReplica(const pb::Plan& plan, const Curve& transfer, int64_t state_bytes) {
  ReplicaSchedule s;
  s.state_bytes = state_bytes;
  const double forward_us = plan.model().model().forward_us();
  auto add_gap = [&](double start_us, double end_us, int after_group) {
    if (end_us <= start_us) return;
    IdleGap g{start_us, end_us, after_group, LargestFit(transfer, end_us - start_us, state_bytes)};
    s.idle_us += end_us - start_us;
    s.bytes_per_iteration += g.chunk_bytes;
    s.gaps.push_back(g);
  };
  // The network blocks in group order; an idle gap before each one that starts after the last ended.
  double busy_until = 0;
  int after = -1;
  for (int k = 0; k < plan.groups_size(); ++k) {
    const pb::Group& g = plan.groups(k);
    add_gap(busy_until, forward_us + g.comm_start_us(), after);
    busy_until = std::max(busy_until, forward_us + g.comm_end_us());
    after = k;
  }
  add_gap(busy_until, plan.predicted().iteration_us(), after);
  auto iterations = [&](int64_t per_iteration) {
    return per_iteration > 0 ? (state_bytes + per_iteration - 1) / per_iteration : 0;
  };
  s.iterations = iterations(s.bytes_per_iteration);
  if (!s.gaps.empty() && s.gaps[0].after_group == -1) s.commit_chunk_bytes = s.gaps[0].chunk_bytes;
  s.commit_iterations = iterations(s.commit_chunk_bytes);
  return s;
}

}  // namespace cupcake::planner
