/* cupcake.h compiles as C. */
#include "cupcake/runtime/cupcake.h"

int cupcake_c_header_check(void);
int cupcake_c_header_check(void) {
  cupcake_session* s = 0;
  (void)s;
  return CUPCAKE_OK;
}
