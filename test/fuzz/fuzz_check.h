// A property a fuzz target checks: when it fails, the input is a finding (abort, so libFuzzer
// saves it as a crash file).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#define CUPCAKE_FUZZ_CHECK(cond, what)                                                  \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "%s:%d: property failed: %s: %s\n", __FILE__, __LINE__, #cond, \
                   std::string(what).c_str());                                          \
      std::abort();                                                                     \
    }                                                                                   \
  } while (0)
