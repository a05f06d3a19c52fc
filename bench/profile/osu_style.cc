// osu_style: collective latency measured against MPI directly, sharing no code with cupcake, so
// that it can check `cupcake-profile comm` from outside (bench/profile/compare.sh,
// docs/PROFILER.md). Two methods, per message size (bytes of each rank's send buffer, as in
// docs/FORMATS.md):
//   osu (default; osu_allreduce, osu_allgather):
//     1. Fill the buffers; `warmup` untimed calls.
//     2. One barrier, then `iters` calls back to back between two MPI_Wtime reads.
//     3. Each rank's latency is the elapsed time / iters; the reported one is the max over ranks.
//   per-call (what a training step's collective sees, and how cupcake times it, written anew):
//     1. Fill the buffers; then `warmup` + `iters` calls, each: copy a cleared image into the
//        receive buffer, one barrier, the call between two MPI_Wtime reads, then copy the
//        receive buffer out and read the copy (untimed: the memory traffic of a correctness
//        check around every call, as a profiler that checks each result makes).
//     2. Each rank's latency is the median of its timed calls; the reported one is the max
//        over ranks.
// allreduce: size / 4 floats, MPI_SUM. allgather: size bytes from each rank (MPI_BYTE).
// --allreduce mpi (default): MPI's allreduce. --allreduce exchange: the algorithm cupcake's MPI
// communicator runs for 2 ranks and from 64 KiB (libcomm), written anew here: an alltoall of
// size / 4 / P floats per rank, each rank sums the P chunks it received in rank order, then an
// allgather of the sums; blocking or non-blocking as --call says.
// --call blocking (default): MPI_Allreduce / MPI_Allgather. --call nonblocking: MPI_Iallreduce /
// MPI_Iallgather completed by MPI_Test, back to back for --spin-us (100), then with sched_yield
// between tests, or with --sleep-us T > 0 a sleep of T us (the way a job that must not take a
// core from its computation waits; cupcake's MPI communicator waits the same way, by default
// spinning 100 us, then yielding).
//
// Usage: mpirun -np N osu_style [--ops allreduce,allgather] [--min-bytes B] [--max-bytes B]
//                                [--warmup W] [--iters I] [--method osu|per-call]
//                                [--call blocking|nonblocking] [--spin-us S] [--sleep-us T]
//                                [--thread single|multiple] [--allreduce mpi|exchange]
//                                [--print-calls yes|no]
// Prints, on rank 0, one line per point: "op<TAB>size_bytes<TAB>max_rank_us<TAB>min_rank_us";
// with --print-calls yes and --method per-call, before it, every timed call of rank 0:
// "call<TAB>op<TAB>size_bytes<TAB>index<TAB>us".
#include <mpi.h>

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

void Die(int rank, const std::string& message) {
  if (rank == 0) std::fprintf(stderr, "osu_style: %s\n", message.c_str());
  MPI_Finalize();
  std::exit(2);
}

// Completes `request` by MPI_Test: back to back until `spin_us` have passed, then yielding the
// core (sleep_us = 0) or sleeping `sleep_us` between tests.
void WaitByTesting(MPI_Request* request, double spin_us, long sleep_us) {
  const double start = MPI_Wtime();
  int done = 0;
  for (;;) {
    MPI_Test(request, &done, MPI_STATUS_IGNORE);
    if (done) return;
    if ((MPI_Wtime() - start) * 1e6 < spin_us) continue;
    if (sleep_us > 0) {
      timespec pause{0, sleep_us * 1000};
      nanosleep(&pause, nullptr);
    } else {
      sched_yield();
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  // --thread multiple (anywhere on the command line): MPI_Init_thread at MPI_THREAD_MULTIPLE,
  // the level cupcake initializes MPI at (its runtime calls collectives from a thread of its own).
  bool multiple = false;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--thread") multiple = std::string(argv[i + 1]) == "multiple";
  int provided = 0;
  if (multiple)
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  else
    MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  std::string ops = "allreduce,allgather";
  long long min_bytes = 4, max_bytes = 1 << 24;
  int warmup = 10, iters = 100;
  std::string method = "osu", call_kind = "blocking", allreduce = "mpi";
  double spin_us = 100;
  long sleep_us = 0;
  bool print_calls = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) Die(rank, flag + ": missing value");
    const char* value = argv[++i];
    if (flag == "--ops")
      ops = value;
    else if (flag == "--min-bytes")
      min_bytes = std::atoll(value);
    else if (flag == "--max-bytes")
      max_bytes = std::atoll(value);
    else if (flag == "--warmup")
      warmup = std::atoi(value);
    else if (flag == "--iters")
      iters = std::atoi(value);
    else if (flag == "--method")
      method = value;
    else if (flag == "--call")
      call_kind = value;
    else if (flag == "--thread") {
      if (std::string(value) != "single" && std::string(value) != "multiple")
        Die(rank, "--thread: unknown; got " + std::string(value) + ", expected single or multiple");
    }
    else if (flag == "--allreduce")
      allreduce = value;
    else if (flag == "--spin-us")
      spin_us = std::atof(value);
    else if (flag == "--sleep-us")
      sleep_us = std::atol(value);
    else if (flag == "--print-calls") {
      if (std::string(value) != "yes" && std::string(value) != "no")
        Die(rank, "--print-calls: unknown; got " + std::string(value) + ", expected yes or no");
      print_calls = std::string(value) == "yes";
    } else
      Die(rank, "unknown flag " + flag);
  }
  if (min_bytes < 4 || max_bytes < min_bytes || max_bytes > (1ll << 30) || iters < 1 || warmup < 0)
    Die(rank, "bad sizes or counts");
  if (method != "osu" && method != "per-call")
    Die(rank, "--method: unknown; got " + method + ", expected osu or per-call");
  if (call_kind != "blocking" && call_kind != "nonblocking")
    Die(rank, "--call: unknown; got " + call_kind + ", expected blocking or nonblocking");
  if (allreduce != "mpi" && allreduce != "exchange")
    Die(rank, "--allreduce: unknown; got " + allreduce + ", expected mpi or exchange");
  if (spin_us < 0 || sleep_us < 0 || sleep_us > 999999) Die(rank, "--spin-us, --sleep-us: expected 0..999999");

  std::vector<std::string> op_list;
  for (size_t start = 0; start <= ops.size();) {
    size_t comma = ops.find(',', start);
    if (comma == std::string::npos) comma = ops.size();
    if (comma > start) op_list.push_back(ops.substr(start, comma - start));
    start = comma + 1;
  }

  if (rank == 0) {
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(lib, &len);
    std::string l(lib, static_cast<size_t>(len));
    l = l.substr(0, l.find_first_of(",\n"));
    std::printf("# osu_style: %d ranks, %s, warmup %d, iters %d, method %s: latency = max over ranks of %s; %s calls",
                size, l.c_str(), warmup, iters, method.c_str(),
                method == "osu" ? "(elapsed / iters), calls back to back" : "the median call, each after a barrier",
                call_kind.c_str());
    if (allreduce == "exchange") std::printf(", allreduce by alltoall + sum + allgather");
    if (multiple) std::printf(", MPI_THREAD_MULTIPLE");
    if (call_kind == "nonblocking") {
      if (sleep_us > 0)
        std::printf(" (MPI_Test: spin %.0f us, then sleep %ld us between tests)", spin_us, sleep_us);
      else
        std::printf(" (MPI_Test: spin %.0f us, then yield between tests)", spin_us);
    }
    std::printf("\n");
    std::printf("# op\tsize_bytes\tavg_us\tmin_rank_us\n");
  }
  for (const std::string& op : op_list) {
    if (op != "allreduce" && op != "allgather") Die(rank, "unknown op " + op + "; expected allreduce or allgather");
    for (long long bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
      const size_t n = static_cast<size_t>(bytes);
      std::vector<char> send(n), recv(op == "allgather" ? n * static_cast<size_t>(size) : n);
      for (size_t i = 0; i < n / 4; ++i) {
        const float v = static_cast<float>((rank + static_cast<int>(i)) % 7);
        std::memcpy(send.data() + 4 * i, &v, 4);
      }
      std::vector<float> chunks;  // --allreduce exchange: the P chunks this rank receives
      if (op == "allreduce" && allreduce == "exchange") {
        if ((n / 4) % static_cast<size_t>(size) != 0)
          Die(rank, "--allreduce exchange: size / 4 must divide by the ranks");
        chunks.resize(n / 4);
      }
      auto exchange = [&] {
        const int chunk = static_cast<int>(n / 4 / static_cast<size_t>(size));
        MPI_Request request;
        if (call_kind == "blocking") {
          MPI_Alltoall(send.data(), chunk, MPI_FLOAT, chunks.data(), chunk, MPI_FLOAT, MPI_COMM_WORLD);
        } else {
          MPI_Ialltoall(send.data(), chunk, MPI_FLOAT, chunks.data(), chunk, MPI_FLOAT, MPI_COMM_WORLD, &request);
          WaitByTesting(&request, spin_us, sleep_us);
        }
        for (int r = 1; r < size; ++r)
          for (int i = 0; i < chunk; ++i) chunks[static_cast<size_t>(i)] += chunks[static_cast<size_t>(r * chunk + i)];
        if (call_kind == "blocking") {
          MPI_Allgather(chunks.data(), chunk, MPI_FLOAT, recv.data(), chunk, MPI_FLOAT, MPI_COMM_WORLD);
        } else {
          MPI_Iallgather(chunks.data(), chunk, MPI_FLOAT, recv.data(), chunk, MPI_FLOAT, MPI_COMM_WORLD, &request);
          WaitByTesting(&request, spin_us, sleep_us);
        }
      };
      auto call = [&] {
        if (!chunks.empty()) return exchange();
        const int count = static_cast<int>(op == "allreduce" ? n / 4 : n);
        if (call_kind == "blocking") {
          if (op == "allreduce")
            MPI_Allreduce(send.data(), recv.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
          else
            MPI_Allgather(send.data(), count, MPI_BYTE, recv.data(), count, MPI_BYTE, MPI_COMM_WORLD);
          return;
        }
        MPI_Request request;
        if (op == "allreduce")
          MPI_Iallreduce(send.data(), recv.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &request);
        else
          MPI_Iallgather(send.data(), count, MPI_BYTE, recv.data(), count, MPI_BYTE, MPI_COMM_WORLD, &request);
        WaitByTesting(&request, spin_us, sleep_us);
      };
      double us = 0;
      if (method == "osu") {
        for (int i = 0; i < warmup; ++i) call();
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = MPI_Wtime();
        for (int i = 0; i < iters; ++i) call();
        us = (MPI_Wtime() - t0) * 1e6 / iters;
      } else {
        // The buffers a correctness check touches around each call: the receive buffer is
        // cleared from a host image and copied out after the call, then the copy is checked.
        const std::vector<char> cleared(recv.size(), static_cast<char>(0xff));
        std::vector<char> got(recv.size());
        std::vector<double> calls;
        unsigned sink = 0;
        for (int i = 0; i < warmup + iters; ++i) {
          std::memcpy(recv.data(), cleared.data(), recv.size());
          MPI_Barrier(MPI_COMM_WORLD);
          const double t0 = MPI_Wtime();
          call();
          const double t1 = MPI_Wtime();
          std::memcpy(got.data(), recv.data(), recv.size());
          for (char c : got) sink += static_cast<unsigned char>(c);
          if (i >= warmup) calls.push_back((t1 - t0) * 1e6);
        }
        if (print_calls && rank == 0)
          for (size_t i = 0; i < calls.size(); ++i)
            std::printf("call\t%s\t%lld\t%zu\t%.1f\n", op.c_str(), bytes, i, calls[i]);
        std::nth_element(calls.begin(), calls.begin() + iters / 2, calls.end());
        us = calls[static_cast<size_t>(iters / 2)];
        if (iters % 2 == 0) us = (us + *std::max_element(calls.begin(), calls.begin() + iters / 2)) / 2;
        if (sink == 1) std::fprintf(stderr, " ");  // keeps the read-back
      }
      double max_us = 0, min_us = 0;
      MPI_Reduce(&us, &max_us, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
      MPI_Reduce(&us, &min_us, 1, MPI_DOUBLE, MPI_MIN, 0, MPI_COMM_WORLD);
      if (rank == 0) std::printf("%s\t%lld\t%.2f\t%.2f\n", op.c_str(), bytes, max_us, min_us);
      std::fflush(stdout);
    }
  }
  MPI_Finalize();
  return 0;
}
