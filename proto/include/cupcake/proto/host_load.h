// How busy the machines were while a profile was measured, as the profiler records it in the
// cluster's meta ("comm.load", "kernels.load"), and the note that plans and tools show when it
// says the machine was busy: curves measured beside other work carry that work's cost, and so do
// predictions made from them.
//
// The profiler records the other work: "other work 0.31 of 2 cores", the CPU time that processes
// other than the sweep's own ranks used on the busiest machine during the sweep, per second of
// wall time. Profiles from older builds hold the 1-minute load average when the sweep started,
// "3.12 on 2 cores", which counts the sweep's own ranks and the stage before it; they still read.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "cupcake/cupcake.pb.h"

namespace cupcake {

struct HostLoad {
  double load = 0;  // cores' worth of other work (load_average: the 1-minute load average)
  int cores = 0;  // cores online
  bool load_average = false;  // an older profile's load average
};

inline constexpr std::string_view kCommLoadKey = "comm.load";
inline constexpr std::string_view kKernelsLoadKey = "kernels.load";

// "other work 0.31 of 2 cores"; a load average "3.12 on 2 cores".
std::string FormatHostLoad(const HostLoad& load);
// The inverse of FormatHostLoad (either form); nullopt for any other text.
std::optional<HostLoad> ParseHostLoad(std::string_view text);
// Busy: other work took more than a quarter of the cores (a load average: above half the cores,
// since it counts the sweep's own ranks).
bool IsBusy(const HostLoad& load);
// "" when no recorded load says busy; else "measured busy (comm: other work 1.20 of 2 cores): its
// times, and predictions from them, carry that load".
std::string BusyNote(const pb::Cluster& cluster);

}  // namespace cupcake
