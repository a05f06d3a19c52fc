#include "cupcake/proto/activity.h"

#include <algorithm>

namespace cupcake {

Status FakeActivitySource::Start() {
  if (!start_error.ok()) return start_error;
  if (running_) return FailedPreconditionError("activity source: Start() twice without Flush()");
  running_ = true;
  ++started_;
  return Status::Ok();
}

StatusOr<std::vector<KernelActivity>> FakeActivitySource::Flush() {
  if (!running_) return FailedPreconditionError("activity source: Flush() without Start()");
  running_ = false;
  if (!flush_error.ok()) return flush_error;
  if (next_ >= batches_.size()) return std::vector<KernelActivity>();
  return batches_[next_++];
}

Status FakeActivitySource::SetMark(uint64_t mark) {
  if (mark == 0) return InvalidArgumentError("activity source: SetMark: mark out of range; got 0, expected >= 1");
  marks_.push_back(mark);
  return Status::Ok();
}

Status FakeActivitySource::ClearMark() {
  marks_.push_back(0);
  return Status::Ok();
}

StatusOr<double> KernelBusyUs(const std::vector<KernelActivity>& records) {
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  spans.reserve(records.size());
  for (const KernelActivity& r : records) {
    if (r.end_ns < r.start_ns)
      return InvalidArgumentError("kernel '" + r.name + "' (correlation " + std::to_string(r.correlation_id) +
                                  "): ends before it starts; got start " + std::to_string(r.start_ns) + " ns, end " +
                                  std::to_string(r.end_ns) + " ns, expected end >= start");
    spans.emplace_back(r.start_ns, r.end_ns);
  }
  std::sort(spans.begin(), spans.end());
  uint64_t busy = 0, cur_start = 0, cur_end = 0;
  bool open = false;
  for (const auto& [s, e] : spans) {
    if (open && s <= cur_end) {
      cur_end = std::max(cur_end, e);
      continue;
    }
    if (open) busy += cur_end - cur_start;
    cur_start = s;
    cur_end = e;
    open = true;
  }
  if (open) busy += cur_end - cur_start;
  return static_cast<double>(busy) / 1000.0;
}

}  // namespace cupcake
