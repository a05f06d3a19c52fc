#include "plan_agreement.h"

#include <algorithm>
#include <cstdio>
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

// What a failed rank sends in place of a fingerprint: its failure's digest (FNV-1a, 64 bits, over
// the code and the message), so the ranks can tell a failure every rank found alike.
std::string FailureDigest(const Status& local) {
  uint64_t h = 1469598103934665603ull;
  const std::string text = std::to_string(static_cast<int>(local.code())) + ":" + local.message();
  for (const char c : text) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return std::string("failed:") + hex;
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
  CopyField(mine.fingerprint, vote.local.ok() ? vote.fingerprint : FailureDigest(vote.local));
  CopyField(mine.origin, vote.origin);
  auto exchanged = Exchange(comm, mine);
  if (!exchanged.ok()) {
    if (!vote.local.ok()) return vote.local;
    return Status(exchanged.status().code(),
                  vote.origin + ": agreeing on the plan with the other ranks: " + exchanged.status().message());
  }
  const std::vector<Record>& all = *exchanged;
  // This rank's own failure: reported by the lowest rank that failed alike (itself, when none).
  if (!vote.local.ok()) {
    const auto alike = std::find_if(all.begin(), all.end(), [&](const Record& r) {
      return r.ok == 0 && ReadField(r.fingerprint) == ReadField(mine.fingerprint);
    });
    return vote.local.ReportedBy(alike != all.end() ? alike->rank : mine.rank);
  }

  // One entry per plan (fingerprint), in order of its lowest rank, shown with that
  // rank's file (ranks may read one plan from different paths); ranks that failed apart.
  struct Plan {
    std::string fingerprint;
    std::string origin;
    std::vector<int> ranks;
  };
  std::vector<Plan> plans;
  std::string failed;
  int first_ok = -1;
  for (const Record& r : all) {
    const std::string origin = ReadField(r.origin);
    if (r.ok == 0) {
      failed += (failed.empty() ? "" : "; ") + Ranks({r.rank}) + " (" + origin + ")";
      continue;
    }
    if (first_ok < 0) first_ok = r.rank;
    const std::string fingerprint = ReadField(r.fingerprint);
    auto it = std::find_if(plans.begin(), plans.end(), [&](const Plan& p) { return p.fingerprint == fingerprint; });
    if (it == plans.end()) it = plans.insert(plans.end(), Plan{fingerprint, origin, {}});
    it->ranks.push_back(r.rank);
  }
  // Every rank whose checks passed finds the same: the lowest of them says which ranks stopped.
  if (!failed.empty())
    return FailedPreconditionError(vote.origin + ": other ranks could not use their plan: " + failed +
                                   "; every rank stops (each of those ranks reports why)")
        .ReportedBy(first_ok);
  if (plans.size() == 1) return Status::Ok();
  std::string text;
  for (const Plan& p : plans) text += "\n  " + Ranks(p.ranks) + ": plan " + p.fingerprint + " (" + p.origin + ")";
  return InvalidArgumentError(vote.origin + ": the ranks run different plans; expected one plan on every rank:" + text)
      .ReportedBy(0);
}

}  // namespace cupcake::runtime::internal
