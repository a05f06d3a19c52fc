#include "cupcake/proto/clock.h"

#include <chrono>

namespace cupcake {

double SteadyClock::NowUs() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace cupcake
