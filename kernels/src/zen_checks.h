// Internal: the texts of zen::ValidateSparse, shared by the host check (cpu/zen.cc) and the
// device one (cuda/cuda_zen.cu), which find the first problems in different ways.
#pragma once

#include <cstdint>
#include <string>

#include "cupcake/proto/status.h"

namespace cupcake::kernels::zen {

// The first position of each kind of problem in a sparse input of k indices (-1: none).
struct SparseProblems {
  int64_t not_increasing = -1;  // the first j > 0 with indices[j] <= indices[j - 1]
  uint32_t not_increasing_got = 0;
  uint32_t not_increasing_previous = 0;
  int64_t out_of_range = -1;  // the first j with indices[j] >= n
  uint32_t out_of_range_got = 0;
};

// InvalidArgument naming `what` and every problem (n out of range, `values` != k, `found`), or Ok.
Status SparseStatus(const std::string& what, int64_t n, int64_t k, int64_t values, const SparseProblems& found);

}  // namespace cupcake::kernels::zen
