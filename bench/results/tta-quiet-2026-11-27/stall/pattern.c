// The fp32 plan's collectives without the runtime: per iteration the small allreduces, a
// backward-long gap, the 8 MiB one, then a forward-long gap; prints each 8 MiB allreduce's time.
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
int main(int argc, char** argv) {
  int provided; MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int smalls = atoi(argv[1]);  // 1: the small groups too
  int gap_ms = atoi(argv[2]);
  int iters = atoi(argv[3]);
  int rank; MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const int sizes[] = {10, 20480, 2048};  // floats: fc2.bias, fc2.weight, fc1.bias
  const int after[] = {18432, 384};
  float* big = calloc(2097152, 4); float* buf = calloc(20480, 4);
  int slow = 0; double sum = 0;
  for (int it = 0; it < iters; ++it) {
    double t0 = now();
    if (smalls) for (int k = 0; k < 3; ++k) MPI_Allreduce(MPI_IN_PLACE, buf, sizes[k], MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    usleep(1000);
    double t1 = now();
    MPI_Allreduce(MPI_IN_PLACE, big, 2097152, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double t2 = now();
    if (smalls) for (int k = 0; k < 2; ++k) MPI_Allreduce(MPI_IN_PLACE, buf, after[k], MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double ms = 1e3 * (t2 - t1); sum += ms;
    if (ms > 500) ++slow; if (rank == 0) printf("%.0f ", ms);
    usleep(gap_ms * 1000);
    (void)t0;
  }
  if (rank == 0) printf("smalls %d gap %d ms: %d of %d slow, mean %.1f ms\n", smalls, gap_ms, slow, iters, sum / iters);
  MPI_Finalize();
}
