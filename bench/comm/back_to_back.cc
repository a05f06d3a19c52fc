// back_to_back: the communicator's allreduce of one size, each call timed, in three spacings
// (run under mpirun, or scripts/testbed.sh run for a shaped network; docs/EVALUATION.md):
//   gap        a barrier, then --gap-ms of idle, before each call (how `cupcake-profile comm`
//              spaces its calls: a barrier and buffer copies between them)
//   barrier    a barrier alone before each call
//   chained    the calls back to back, as the runtime issues the collectives of consecutive
//              groups once the network is the bottleneck
// The spacings alternate, --rounds times. A call's time is rank 0's; the table gives per spacing
// the median and the min-max over all its calls.
//
//   back_to_back [--floats=6553600] [--calls=8] [--rounds=2] [--gap-ms=30]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "cupcake/comm/communicator.h"
#include "cupcake/comm/mpi.h"

namespace cupcake::comm {
namespace {

struct Options {
  int64_t floats = 6553600;
  int calls = 8;
  int rounds = 2;
  int gap_ms = 30;
};

[[noreturn]] void Usage(const std::string& problem) {
  std::fprintf(stderr,
               "back_to_back: %s\nusage: back_to_back [--floats=N >= 1] [--calls=K >= 1] [--rounds=R >= 1] "
               "[--gap-ms=G >= 0]\n",
               problem.c_str());
  std::exit(2);
}

Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const size_t eq = a.find('=');
    if (eq == std::string::npos) Usage("flag '" + a + "': expected --name=value");
    const std::string name = a.substr(0, eq);
    char* end = nullptr;
    const long long v = std::strtoll(a.c_str() + eq + 1, &end, 10);
    if (*end != '\0') Usage(name + ": not an integer: '" + a.substr(eq + 1) + "'");
    if (name == "--floats" && v >= 1) {
      o.floats = v;
    } else if (name == "--calls" && v >= 1) {
      o.calls = static_cast<int>(v);
    } else if (name == "--rounds" && v >= 1) {
      o.rounds = static_cast<int>(v);
    } else if (name == "--gap-ms" && v >= 0) {
      o.gap_ms = static_cast<int>(v);
    } else {
      Usage("flag '" + a + "': unknown or out of range");
    }
  }
  return o;
}

double NowMs() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void Check(const Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "back_to_back: %s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}

int Main(int argc, char** argv) {
  auto mpi = InitMpi(&argc, &argv);
  Check(mpi.status(), "MPI");
  const Options o = Parse(argc, argv);
  auto world = (*mpi)->World();
  Check(world.status(), "MPI");
  Communicator& comm = **world;
  std::vector<float> buf(static_cast<size_t>(o.floats), 1.0f);
  const char* names[] = {"gap", "barrier", "chained"};
  std::vector<double> times[3];
  for (int round = 0; round < o.rounds; ++round) {
    for (int spacing = 0; spacing < 3; ++spacing) {
      Check(comm.Barrier(), "barrier");
      for (int call = 0; call < o.calls; ++call) {
        if (spacing < 2) Check(comm.Barrier(), "barrier");
        if (spacing == 0) std::this_thread::sleep_for(std::chrono::milliseconds(o.gap_ms));
        const double t0 = NowMs();
        Check(comm.Allreduce(buf.data(), buf.data(), o.floats, DataType::kFloat32, ReduceOp::kSum), "allreduce");
        times[spacing].push_back(NowMs() - t0);
      }
    }
  }
  if (comm.rank() == 0) {
    std::printf("# back_to_back: %d ranks (%s), allreduce of %lld floats (%.2f MiB), %d calls x %d rounds per "
                "spacing, gap %d ms\n",
                comm.size(), comm.library().c_str(), static_cast<long long>(o.floats),
                4.0 * static_cast<double>(o.floats) / (1 << 20), o.calls, o.rounds, o.gap_ms);
    std::printf("%-8s %10s %10s %10s\n", "# spacing", "median_ms", "min_ms", "max_ms");
    for (int spacing = 0; spacing < 3; ++spacing) {
      std::vector<double>& t = times[spacing];
      std::sort(t.begin(), t.end());
      const size_t n = t.size();
      const double median = n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
      std::printf("%-9s %10.1f %10.1f %10.1f\n", names[spacing], median, t.front(), t.back());
    }
  }
  return 0;
}

}  // namespace
}  // namespace cupcake::comm

int main(int argc, char** argv) { return cupcake::comm::Main(argc, argv); }
