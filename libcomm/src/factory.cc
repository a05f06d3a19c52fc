// The one file that picks backends by what the build has (`#if CUPCAKE_HAVE_*` lives only
// here): MPI, NCCL and gloo.
#include "cupcake/comm/gloo.h"
#include "cupcake/comm/mpi.h"
#include "cupcake/comm/nccl.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>

#if CUPCAKE_HAVE_MPI
#include "mpi/mpi_communicator.h"
#endif
#if CUPCAKE_HAVE_NCCL
#include "nccl/nccl_communicator.h"
#endif
#if CUPCAKE_HAVE_GLOO
#include "gloo/gloo_communicator.h"
#endif

namespace cupcake::comm {
namespace {
[[maybe_unused]] Status NoMpi() {
  return FailedPreconditionError(
      "this build has no MPI; install libopenmpi-dev and openmpi-bin (scripts/install-deps.sh) and rebuild with "
      "-DCUPCAKE_WITH_MPI=ON");
}
[[maybe_unused]] Status NoNccl(const std::string& call) {
  return FailedPreconditionError(call +
                                 ": this build has no NCCL; expected a build with the CUDA toolkit and NCCL found "
                                 "(CUPCAKE_WITH_NCCL=ON or AUTO)");
}
// The arguments of MakeGlooCommunicator, every problem reported together.
Status CheckGlooArguments(const KeyValueStore* store, int rank, int size, const GlooOptions& options) {
  std::string problems;
  auto add = [&](const std::string& p) { problems += (problems.empty() ? "" : "\n") + ("gloo communicator: " + p); };
  if (store == nullptr) add("store: null; expected a KeyValueStore shared by the ranks");
  if (size < 1) add("size: out of range; got " + std::to_string(size) + ", expected >= 1");
  if (rank < 0 || rank >= std::max(size, 1))
    add("rank: out of range; got " + std::to_string(rank) + ", expected 0 <= rank < " + std::to_string(size));
  if (options.timeout.count() <= 0)
    add("timeout: out of range; got " + std::to_string(options.timeout.count()) + " ms, expected > 0");
  return problems.empty() ? Status::Ok() : InvalidArgumentError(problems);
}
Status CheckMpiWait(const MpiWait& wait) {
  std::string problems;
  for (auto [name, v] : {std::pair<const char*, double>{"spin_us", wait.spin_us},
                         {"sleep_us", wait.sleep_us},
                         {"startup_us", wait.startup_us}}) {
    if (!(v >= 0 && v <= 1e6))
      problems += std::string(problems.empty() ? "" : "\n") + "MpiWait: " + name + ": out of range; got " +
                  std::to_string(v) + ", expected 0 <= t <= 1e6 (us)";
  }
  return problems.empty() ? Status::Ok() : InvalidArgumentError(problems);
}
// `wait`, checked, with startup_us from kEmulatedStartupVariable when that is set.
StatusOr<MpiWait> Checked(MpiWait wait) {
  if (const char* v = std::getenv(kEmulatedStartupVariable); v != nullptr) {
    char* end = nullptr;
    const double us = std::strtod(v, &end);
    if (*v == '\0' || *end != '\0' || !(us >= 0 && us <= 1e6))
      return InvalidArgumentError(std::string(kEmulatedStartupVariable) + ": got '" + v +
                                  "', expected a time in microseconds, 0 <= t <= 1e6 (an emulated start-up per "
                                  "collective, scripts/testbed.sh --startup-us)");
    wait.startup_us = us;
  }
  CUPCAKE_RETURN_IF_ERROR(CheckMpiWait(wait));
  return wait;
}
}  // namespace

bool BuiltWithMpi() { return CUPCAKE_HAVE_MPI != 0; }
bool BuiltWithNccl() { return CUPCAKE_HAVE_NCCL != 0; }
bool BuiltWithGloo() { return CUPCAKE_HAVE_GLOO != 0; }

StatusOr<std::unique_ptr<Communicator>> MakeGlooCommunicator(std::shared_ptr<KeyValueStore> store, int rank, int size,
                                                             const GlooOptions& options) {
  CUPCAKE_RETURN_IF_ERROR(CheckGlooArguments(store.get(), rank, size, options));
#if CUPCAKE_HAVE_GLOO
  return internal::MakeGlooCommunicator(std::move(store), rank, size, options);
#else
  return FailedPreconditionError(
      "gloo communicator: this build has no gloo; install libgloo-dev (scripts/install-deps.sh) and rebuild with "
      "-DCUPCAKE_WITH_GLOO=ON");
#endif
}

bool MpiInitialized() {
#if CUPCAKE_HAVE_MPI
  return internal::MpiInitialized();
#else
  return false;
#endif
}

StatusOr<std::unique_ptr<MpiProcess>> InitMpi(int* argc, char*** argv, const MpiWait& wait) {
  CUPCAKE_ASSIGN_OR_RETURN(const MpiWait checked, Checked(wait));
#if CUPCAKE_HAVE_MPI
  return internal::MakeMpiProcess(argc, argv, checked);
#else
  (void)argc;
  (void)argv;
  return NoMpi();
#endif
}

StatusOr<std::unique_ptr<Communicator>> MpiCommunicatorFromHandle(const void* mpi_comm, const MpiWait& wait) {
  CUPCAKE_ASSIGN_OR_RETURN(const MpiWait checked, Checked(wait));
#if CUPCAKE_HAVE_MPI
  return internal::MakeMpiCommunicator(mpi_comm, checked);
#else
  (void)mpi_comm;
  return NoMpi();
#endif
}

StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(Communicator* bootstrap, int device) {
#if CUPCAKE_HAVE_NCCL
  return internal::MakeNcclCommunicator(bootstrap, device);
#else
  (void)bootstrap;
  (void)device;
  return NoNccl("NCCL communicator");
#endif
}

StatusOr<std::unique_ptr<Communicator>> NcclCommunicatorFromHandle(const void* nccl_comm) {
#if CUPCAKE_HAVE_NCCL
  return internal::MakeNcclCommunicatorFromHandle(nccl_comm);
#else
  (void)nccl_comm;
  return NoNccl("NCCL communicator from the job's");
#endif
}

}  // namespace cupcake::comm
