#include <algorithm>

#include "cupcake/profile/sink.h"
#include "cupcake/profile/store.h"
#include "cupcake/proto/names.h"

namespace cupcake::profile {

StatusOr<std::vector<int64_t>> StoreSink::PointSizes(const pb::Curve& key) { return store_.PointSizes(key); }

Status StoreSink::AddPoint(const pb::Curve& key_and_metadata, int64_t size, double us, bool replace) {
  return store_.AddPoint(key_and_metadata, size, us, replace);
}

Status StoreSink::UpdateCurveMetadata(const pb::Curve& key_and_metadata) {
  return store_.UpdateCurveMetadata(key_and_metadata);
}

StatusOr<std::vector<int64_t>> MemorySink::PointSizes(const pb::Curve& key) {
  std::vector<int64_t> sizes;
  auto it = curves_.find(CurveKey(key));
  if (it == curves_.end()) return sizes;
  for (const auto& p : it->second.points()) sizes.push_back(p.size());
  std::sort(sizes.begin(), sizes.end());
  return sizes;
}

Status MemorySink::AddPoint(const pb::Curve& key_and_metadata, int64_t size, double us, bool replace) {
  if (fail_after >= 0 && added_ >= fail_after)
    return UnavailableError("memory sink: interrupted after " + std::to_string(added_) + " points");
  const std::string key = CurveKey(key_and_metadata);
  auto [it, inserted] = curves_.try_emplace(key);
  pb::Curve& c = it->second;
  pb::Curve meta = key_and_metadata;
  meta.clear_points();
  if (inserted) {
    c = meta;
  } else {
    if (meta.has_method()) c.set_method(meta.method());
    if (meta.has_warmup()) c.set_warmup(meta.warmup());
    if (meta.has_iters()) c.set_iters(meta.iters());
    if (meta.has_wrong()) c.set_wrong(meta.wrong());
  }
  for (auto& p : *c.mutable_points()) {
    if (p.size() != size) continue;
    if (!replace)
      return AlreadyExistsError("memory sink: curve '" + key + "': point already present; got size " +
                                std::to_string(size));
    p.set_us(us);
    ++added_;
    return Status::Ok();
  }
  pb::Point* p = c.add_points();
  p->set_size(size);
  p->set_us(us);
  ++added_;
  return Status::Ok();
}

Status MemorySink::UpdateCurveMetadata(const pb::Curve& key_and_metadata) {
  auto it = curves_.find(CurveKey(key_and_metadata));
  if (it == curves_.end()) return NotFoundError("memory sink: curve '" + CurveKey(key_and_metadata) + "': not present");
  const pb::Curve& meta = key_and_metadata;
  if (meta.has_method()) it->second.set_method(meta.method());
  if (meta.has_warmup()) it->second.set_warmup(meta.warmup());
  if (meta.has_iters()) it->second.set_iters(meta.iters());
  if (meta.has_wrong()) it->second.set_wrong(meta.wrong());
  return Status::Ok();
}

std::vector<pb::Curve> MemorySink::Curves() const {
  std::vector<pb::Curve> out;
  for (const auto& [key, c] : curves_) {
    pb::Curve sorted = c;
    std::sort(sorted.mutable_points()->begin(), sorted.mutable_points()->end(),
              [](const pb::Point& a, const pb::Point& b) { return a.size() < b.size(); });
    out.push_back(sorted);
  }
  return out;
}

}  // namespace cupcake::profile
