/* cupcake.h compiles as C: the types, the options struct with a C initializer, and the
 * declarations of the current and the deprecated names. */
#include "cupcake/runtime/cupcake.h"

#include <stddef.h>

int cupcake_c_header_check(void);
int cupcake_c_header_check(void) {
  cupcake_session* s = 0;
  cupcake_session_options o = {0};
  int (*create)(const char*, const cupcake_session_options*, cupcake_session**) = cupcake_session_create_with_options;
  int (*ready)(cupcake_session*, int) = cupcake_session_gradient_ready;
  int (*switch_plan)(cupcake_session*, int) = cupcake_session_switch_plan;
  int (*plan_count)(const cupcake_session*, int*) = cupcake_session_plan_count;
  o.backend = CUPCAKE_BACKEND_NCCL;
  o.ready_timeout_us = 30e6;
  (void)s;
  (void)create;
  (void)switch_plan;
  (void)plan_count;
  (void)ready;
  return o.mpi_comm == NULL ? CUPCAKE_OK : CUPCAKE_INTERNAL;
}
