#include "plan_agreement.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

namespace cupcake::runtime::internal {
namespace {

// One rank's vote on the wire: fixed size, so one allgather carries every rank's. A file name
// longer than the field is cut (the fingerprint decides; the name only helps the reader).
struct Record {
  int32_t rank = 0;
  int32_t ok = 0;
  char fingerprint[24] = {};
  char origin[232] = {};
};
static_assert(sizeof(Record) == 264);

template <size_t N>
void CopyField(char (&to)[N], const std::string& from) {
  const size_t n = std::min(from.size(), N - 1);
  std::memcpy(to, from.data(), n);
  to[n] = '\0';
}

template <size_t N>
std::string ReadField(const char (&from)[N]) {
  return std::string(from, strnlen(from, N));
}

StatusOr<std::vector<Record>> Exchange(comm::Communicator& comm, const Record& mine) {
  const int world = comm.size();
  std::vector<Record> all(static_cast<size_t>(world));
  const auto bytes = static_cast<int64_t>(sizeof(Record));
  if (comm.memory() == comm::MemoryKind::kHost) {
    CUPCAKE_RETURN_IF_ERROR(comm.Allgather(&mine, all.data(), bytes));
    return all;
  }
  CUPCAKE_ASSIGN_OR_RETURN(kernels::Buffer send, comm.Allocate(bytes));
  CUPCAKE_ASSIGN_OR_RETURN(kernels::Buffer recv, comm.Allocate(bytes * world));
  CUPCAKE_RETURN_IF_ERROR(send.CopyFromHost(&mine, bytes));
  CUPCAKE_RETURN_IF_ERROR(comm.Allgather(send.data(), recv.data(), bytes));
  CUPCAKE_RETURN_IF_ERROR(comm.Synchronize());
  CUPCAKE_RETURN_IF_ERROR(recv.CopyToHost(all.data(), bytes * world));
  return all;
}

// "rank 3", "ranks 0-2, 5": runs of consecutive ranks as ranges. `ranks` ascending.
std::string Ranks(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    text += (i == 0 ? "" : ", ") + std::to_string(ranks[i]) + (j > i ? "-" + std::to_string(ranks[j]) : "");
    i = j + 1;
  }
  return text;
}

}  // namespace

Status AgreeOnPlan(comm::Communicator& comm, const PlanVote& vote) {
  if (comm.size() == 1) return vote.local;
  Record mine;
  mine.rank = comm.rank();
  mine.ok = vote.local.ok() ? 1 : 0;
  CopyField(mine.fingerprint, vote.local.ok() ? vote.fingerprint : std::string());
  CopyField(mine.origin, vote.origin);
  auto exchanged = Exchange(comm, mine);
  if (!exchanged.ok()) {
    if (!vote.local.ok()) return vote.local;
    return Status(exchanged.status().code(),
                  vote.origin + ": agreeing on the plan with the other ranks: " + exchanged.status().message());
  }
  if (!vote.local.ok()) return vote.local;
  const std::vector<Record>& all = *exchanged;

  // One entry per plan (fingerprint), in order of its lowest rank, shown with that
  // rank's file (ranks may read one plan from different paths); ranks that failed apart.
  struct Plan {
    std::string fingerprint;
    std::string origin;
    std::vector<int> ranks;
  };
  std::vector<Plan> plans;
  std::string failed;
  for (const Record& r : all) {
    const std::string origin = ReadField(r.origin);
    if (r.ok == 0) {
      failed += (failed.empty() ? "" : "; ") + Ranks({r.rank}) + " (" + origin + ")";
      continue;
    }
    const std::string fingerprint = ReadField(r.fingerprint);
    auto it = std::find_if(plans.begin(), plans.end(), [&](const Plan& p) { return p.fingerprint == fingerprint; });
    if (it == plans.end()) it = plans.insert(plans.end(), Plan{fingerprint, origin, {}});
    it->ranks.push_back(r.rank);
  }
  if (!failed.empty())
    return FailedPreconditionError(vote.origin + ": other ranks could not use their plan: " + failed +
                                   "; every rank stops (each of those ranks reports why)");
  if (plans.size() == 1) return Status::Ok();
  std::string text;
  for (const Plan& p : plans) text += "\n  " + Ranks(p.ranks) + ": plan " + p.fingerprint + " (" + p.origin + ")";
  return InvalidArgumentError(vote.origin + ": the ranks run different plans; expected one plan on every rank:" + text);
}

}  // namespace cupcake::runtime::internal
