#include "profiling.h"

#include "cupcake/tools/cli.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "cupcake/proto/host_load.h"
#include "cupcake/proto/names.h"

namespace cupcake::profile_cli {
namespace {

double NowS() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::string Seconds(double s) {
  char buf[32];
  if (s < 60)
    std::snprintf(buf, sizeof buf, "%.0fs", s);
  else
    std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  return buf;
}

}  // namespace

ProgressBar::ProgressBar(std::ostream& err, std::string label)
    : err_(err), label_(std::move(label)), start_s_(NowS()) {}

void ProgressBar::Update(int64_t done, int64_t total) {
  constexpr int kWidth = 30;
  const double elapsed = NowS() - start_s_;
  const double frac = total > 0 ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
  const int filled = static_cast<int>(std::lround(frac * kWidth));
  std::string eta = done > 0 && done < total ? Seconds(elapsed / frac - elapsed) : "-";
  err_ << "\r" << label_ << " [" << std::string(static_cast<size_t>(filled), '#')
       << std::string(static_cast<size_t>(kWidth - filled), '.') << "] " << done << "/" << total << " points, elapsed "
       << Seconds(elapsed) << ", eta " << eta << "   " << std::flush;
  drawn_ = true;
}

void ProgressBar::Finish() {
  if (drawn_) err_ << "\n" << std::flush;
  drawn_ = false;
}

StatusOr<int> LockTimeoutMs(double seconds) {
  if (!(seconds >= 0 && seconds <= 86400)) {
    char got[32];
    std::snprintf(got, sizeof got, "%g", seconds);
    return InvalidArgumentError(std::string("--lock-timeout: out of range; got ") + got +
                                ", expected 0 <= seconds <= 86400");
  }
  return static_cast<int>(std::lround(seconds * 1000));
}

bool StderrIsTerminal() { return isatty(STDERR_FILENO) == 1; }

StatusOr<int64_t> LargestModelSize(const std::string& db, bool bytes, std::string_view flag) {
  const std::string what = std::string(flag) + " auto";
  auto store = profile::ProfileStore::Open(db, /*create=*/false);
  if (!store.ok()) return Status(store.status().code(), what + ": " + store.status().message());
  CUPCAKE_ASSIGN_OR_RETURN(std::vector<std::string> names, store->ModelNames());
  if (names.empty())
    return FailedPreconditionError(what + ": " + db +
                                   " holds no model; expected one (cupcake-profile import MODEL.json, "
                                   "or compute), or a size such as " +
                                   std::string(flag) + " 16777216");
  int64_t largest = 1;
  for (const std::string& name : names) {
    CUPCAKE_ASSIGN_OR_RETURN(pb::Model m, store->LoadModel(name));
    int64_t total = 0;  // bounded: at most 2^40 elements of at most 8 bytes
    for (const pb::Tensor& t : m.tensors()) total += t.numel() * (bytes ? DTypeBytes(t.dtype()) : 1);
    largest = std::max(largest, total);
  }
  return std::min<int64_t>(static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(largest))), int64_t{1} << 30);
}

StatusOr<std::optional<int64_t>> ParseSizeOrAuto(std::string_view flag, const std::string& text) {
  if (text == "auto") return std::optional<int64_t>();
  int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size())
    return InvalidArgumentError(std::string(flag) + ": not a size; got '" + text +
                                "', expected a power of two in bytes or elements, or auto");
  return std::optional<int64_t>(v);
}

std::string UtcNow() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

void AddHostLoad(std::string_view key, std::map<std::string, std::string>& meta) {
  double load1 = 0;
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (getloadavg(&load1, 1) == 1 && cores >= 1)
    meta[std::string(key)] = FormatHostLoad({load1, static_cast<int>(cores)});
}

StatusOr<int64_t> LargestModelSizeFromRoot(comm::Communicator* world, const std::string& db, bool bytes,
                                           std::string_view flag) {
  if (world == nullptr) return LargestModelSize(db, bytes, flag);
  int64_t size = 0;
  Status found;
  if (world->rank() == 0) {
    auto largest = LargestModelSize(db, bytes, flag);
    if (largest.ok())
      size = *largest;
    else
      found = largest.status();
  }
  CUPCAKE_RETURN_IF_ERROR(ShareRootStatus(*world, found));
  CUPCAKE_RETURN_IF_ERROR(world->Broadcast(&size, sizeof size, 0));
  return size;
}

}  // namespace cupcake::profile_cli
