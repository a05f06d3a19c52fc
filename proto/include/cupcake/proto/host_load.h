// The host's load when a profile was measured, as the profiler records it in the cluster's meta
// ("comm.load", "kernels.load": "3.12 on 2 cores", the 1-minute load average when the command
// started its sweep and the cores online), and the note that plans and tools show when it says
// the machine was busy: curves measured beside other work carry that work's cost, and so do
// predictions made from them.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "cupcake/cupcake.pb.h"

namespace cupcake {

struct HostLoad {
  double load1 = 0;  // the 1-minute load average
  int cores = 0;  // cores online
};

inline constexpr std::string_view kCommLoadKey = "comm.load";
inline constexpr std::string_view kKernelsLoadKey = "kernels.load";

// "3.12 on 2 cores"
std::string FormatHostLoad(const HostLoad& load);
// The inverse of FormatHostLoad; nullopt for any other text.
std::optional<HostLoad> ParseHostLoad(std::string_view text);
// Busy: a 1-minute load above half the cores (a sweep then shares the cores with other work).
bool IsBusy(const HostLoad& load);
// "" when no recorded load says busy; else "measured busy (comm at load 3.12 on 2 cores): its
// times, and predictions from them, carry that load".
std::string BusyNote(const pb::Cluster& cluster);

}  // namespace cupcake
