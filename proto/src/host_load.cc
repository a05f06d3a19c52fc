#include "cupcake/proto/host_load.h"

#include <cstdio>

namespace cupcake {

std::string FormatHostLoad(const HostLoad& load) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f on %d cores", load.load1, load.cores);
  return buf;
}

std::optional<HostLoad> ParseHostLoad(std::string_view text) {
  HostLoad load;
  int end = -1;  // where " cores" ends: the whole text must be read
  const std::string s(text);
  if (std::sscanf(s.c_str(), "%lf on %d cores%n", &load.load1, &load.cores, &end) != 2 ||
      end != static_cast<int>(s.size()))
    return std::nullopt;
  if (!(load.load1 >= 0) || load.cores < 1) return std::nullopt;
  return load;
}

bool IsBusy(const HostLoad& load) { return load.load1 > 0.5 * load.cores; }

std::string BusyNote(const pb::Cluster& cluster) {
  std::string busy;
  for (std::string_view key : {kCommLoadKey, kKernelsLoadKey}) {
    auto it = cluster.meta().find(std::string(key));
    if (it == cluster.meta().end()) continue;
    const std::optional<HostLoad> load = ParseHostLoad(it->second);
    if (!load || !IsBusy(*load)) continue;
    busy += (busy.empty() ? "" : ", ") + std::string(key.substr(0, key.find('.'))) + " at load " + FormatHostLoad(*load);
  }
  if (busy.empty()) return "";
  return "measured busy (" + busy + "): its times, and predictions from them, carry that load";
}

}  // namespace cupcake
