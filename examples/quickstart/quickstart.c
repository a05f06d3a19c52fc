/* Getting started, C (docs/GETTING_STARTED.md): the same job as quickstart.cc through the C API.
 * Usage: mpirun -np 2 quickstart_c PLAN.pb */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "cupcake/runtime/cupcake.h"

/* A failed call: the job shows its error once. One every rank got alike (a plan for another
 * world size) is printed by its reporter, and every rank ends here, so they finalize together;
 * this rank's own error is printed here and ends the job, whose other ranks may be waiting for
 * this one in a collective. */
static int fail(const char* what, int rank, cupcake_session* s) {
  if (cupcake_last_error_printed_by(rank)) fprintf(stderr, "%s: %s\n", what, cupcake_last_error());
  if (cupcake_last_error_reporter() == CUPCAKE_ANY_RANK) MPI_Abort(MPI_COMM_WORLD, 1);
  cupcake_session_destroy(s);
  MPI_Finalize();
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: mpirun -np N %s PLAN.pb\n", argv[0]);
    return 2;
  }
  int provided = 0, rank = 0, size = 1;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided); /* the runtime needs >= SERIALIZED */
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  cupcake_session_options options = {0}; /* MPI on MPI_COMM_WORLD, nothing checked, 60 s */
  cupcake_session* s = NULL;
  if (cupcake_session_create_with_options(argv[1], &options, &s)) return fail("create", rank, s);

  const char* names[4] = {"fc2.bias", "fc2.weight", "fc1.bias", "fc1.weight"};
  const int64_t sizes[4] = {10, 640, 64, 50176};
  float* grads[4];
  for (int i = 0; i < 4; ++i) {
    grads[i] = malloc(sizeof(float) * (size_t)sizes[i]);
    if (cupcake_session_register(s, names[i], grads[i], sizes[i])) return fail("register", rank, s);
  }
  for (int step = 0; step < 3; ++step) {
    for (int i = 0; i < 4; ++i) {
      for (int64_t j = 0; j < sizes[i]; ++j) grads[i][j] = (float)(rank + 1 + step); /* "backward" */
      if (cupcake_session_gradient_ready(s, i)) return fail("gradient_ready", rank, s);
    }
    if (cupcake_session_synchronize(s)) return fail("synchronize", rank, s);
    printf("rank %d step %d: fc1.weight[0] = %g (expected %g)\n", rank, step, grads[3][0], (size + 1) / 2.0 + step);
  }
  cupcake_session_destroy(s);
  for (int i = 0; i < 4; ++i) free(grads[i]);
  MPI_Finalize();
  return 0;
}
