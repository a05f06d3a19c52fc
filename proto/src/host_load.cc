#include "cupcake/proto/host_load.h"

#include <cstdio>

namespace cupcake {

std::string FormatHostLoad(const HostLoad& load) {
  char buf[64];
  if (load.load_average)
    std::snprintf(buf, sizeof buf, "%.2f on %d cores", load.load, load.cores);
  else
    std::snprintf(buf, sizeof buf, "other work %.2f of %d cores", load.load, load.cores);
  return buf;
}

std::optional<HostLoad> ParseHostLoad(std::string_view text) {
  const std::string s(text);
  // The whole text must be read: `end` is where " cores" ends.
  const auto parse = [&s](const char* format, bool load_average) -> std::optional<HostLoad> {
    HostLoad load;
    load.load_average = load_average;
    int end = -1;
    if (std::sscanf(s.c_str(), format, &load.load, &load.cores, &end) != 2 || end != static_cast<int>(s.size()))
      return std::nullopt;
    if (!(load.load >= 0) || load.cores < 1) return std::nullopt;
    return load;
  };
  if (auto other = parse("other work %lf of %d cores%n", false)) return other;
  return parse("%lf on %d cores%n", true);
}

bool IsBusy(const HostLoad& load) { return load.load > (load.load_average ? 0.5 : 0.25) * load.cores; }

std::string BusyNote(const pb::Cluster& cluster) {
  std::string busy;
  for (std::string_view key : {kCommLoadKey, kKernelsLoadKey}) {
    auto it = cluster.meta().find(std::string(key));
    if (it == cluster.meta().end()) continue;
    const std::optional<HostLoad> load = ParseHostLoad(it->second);
    if (!load || !IsBusy(*load)) continue;
    busy += (busy.empty() ? "" : ", ") + std::string(key.substr(0, key.find('.'))) +
            (load->load_average ? " at load " : ": ") + FormatHostLoad(*load);
  }
  if (busy.empty()) return "";
  return "measured busy (" + busy + "): its times, and predictions from them, carry that load";
}

}  // namespace cupcake
