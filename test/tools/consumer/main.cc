// Uses the installed libraries: parse a model (profile), name the search (planner), and
// ask the runtime's C API for its last error (none yet).
#include <iostream>

#include "cupcake/planner/search.h"
#include "cupcake/profile/json_io.h"
#include "cupcake/runtime/cupcake.h"

int main() {
  auto m = cupcake::profile::ParseModelJson(
      R"({"format": "cupcake.model.v1", "name": "m", "tensors": [{"name": "a", "numel": 3, "dtype": "float32", "backward_us": 1}]})",
      "inline");
  if (!m.ok()) {
    std::cerr << m.status().message() << "\n";
    return 1;
  }
  std::cout << m->name() << " " << m->tensors_size() << " "
            << cupcake::planner::AlgorithmName(cupcake::planner::Algorithm::kBranchAndBound) << " ["
            << cupcake_last_error() << "]\n";
  return 0;
}
