// Uses the installed cupcake::profile: parse a model, print its tensor count.
#include <iostream>

#include "cupcake/profile/json_io.h"

int main() {
  auto m = cupcake::profile::ParseModelJson(
      R"({"format": "cupcake.model.v1", "name": "m", "tensors": [{"name": "a", "numel": 3, "dtype": "float32", "backward_us": 1}]})",
      "inline");
  if (!m.ok()) {
    std::cerr << m.status().message() << "\n";
    return 1;
  }
  std::cout << m->name() << " " << m->tensors_size() << "\n";
  return 0;
}
