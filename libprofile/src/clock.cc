#include <chrono>

#include "cupcake/profile/clock.h"

namespace cupcake::profile {

double SteadyClock::NowUs() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace cupcake::profile
