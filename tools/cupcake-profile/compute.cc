// compute: runs a training job in record mode and imports the model it writes (libruntime/README.md).
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "commands.h"
#include "cupcake/profile/store.h"
#include "cupcake/tools/subprocess.h"
#include "profiling.h"

namespace cupcake::profile_cli {
namespace po = boost::program_options;
namespace {

std::string Join(const std::vector<std::string>& words) {
  std::string s;
  for (const auto& w : words) s += (s.empty() ? "" : " ") + w;
  return s;
}

}  // namespace

Status RunCompute(const ComputeOptions& options, std::ostream& out) {
  if (options.command.empty()) return InvalidArgumentError("compute: no training command; expected it after --");
  if (options.iterations < 1)
    return InvalidArgumentError("compute: --iterations: out of range; got " + std::to_string(options.iterations) +
                                ", expected >= 1");
  // The model goes into a DB with a profile: say so before a possibly long job, not after it.
  {
    CUPCAKE_ASSIGN_OR_RETURN(int lock_ms, LockTimeoutMs(options.lock_timeout_s));
    auto store = profile::ProfileStore::Open(options.db, /*create=*/false, lock_ms);
    Status has_profile = store.ok() ? store->Load().status() : store.status();
    if (!has_profile.ok())
      return Status(has_profile.code(), "compute: " + has_profile.message() +
                                            "\ncompute: nothing run; profile the cluster into the DB first "
                                            "(cupcake-profile kernels/comm, or import a profile)");
  }
  std::string model_file = options.model_file;
  const bool temporary = model_file.empty();
  if (temporary) {
    model_file =
        (std::filesystem::temp_directory_path() / ("cupcake_record_" + std::to_string(::getpid()) + ".json")).string();
  }
  // A model left by an earlier run must not pass for this run's.
  std::error_code ec;
  std::filesystem::remove(model_file, ec);

  const std::string command = Join(options.command);
  CUPCAKE_ASSIGN_OR_RETURN(int wstatus,
                           tools::RunChild(options.command,
                                           {{std::string(kRecordEnv), model_file},
                                            {std::string(kRecordIterationsEnv), std::to_string(options.iterations)}},
                                           "compute", "cupcake-profile compute: cannot run the training command: "));
  Status status;
  if (WIFSIGNALED(wstatus)) {
    status = FailedPreconditionError("compute: the training command failed; got signal " +
                                     std::to_string(WTERMSIG(wstatus)) + " (" + ::strsignal(WTERMSIG(wstatus)) +
                                     "), expected exit status 0 (command: " + command + ")");
  } else if (WEXITSTATUS(wstatus) != 0) {
    status = FailedPreconditionError("compute: the training command failed; got exit status " +
                                     std::to_string(WEXITSTATUS(wstatus)) + ", expected 0 (command: " + command + ")");
  } else if (!std::filesystem::exists(model_file, ec)) {
    status =
        NotFoundError("compute: " + model_file + ": no model written; expected the training command to write one (" +
                      std::string(kRecordEnv) + " names the file; command: " + command + ")");
  } else {
    ImportOptions import;
    import.db = options.db;
    import.file = model_file;
    import.replace = options.replace;
    import.lock_timeout_s = options.lock_timeout_s;
    status = RunImport(import, out);
    if (!status.ok()) status = status.WithPrefix("compute: the recorded model");
  }
  if (temporary) std::filesystem::remove(model_file, ec);
  return status;
}

int ComputeMain(tools::Invocation& inv) {
  ComputeOptions options;
  // Everything after "--" is the training command, passed through untouched.
  auto dashes = std::find(inv.args.begin(), inv.args.end(), "--");
  if (dashes != inv.args.end()) {
    options.command.assign(dashes + 1, inv.args.end());
    inv.args.erase(dashes, inv.args.end());
  }
  po::options_description flags("options");
  flags.add_options()("db", po::value(&options.db)->required(),
                      "the profile DB the model is imported into (created when missing)")(
      "iterations", po::value(&options.iterations)->default_value(20),
      "iterations the job records (passed in CUPCAKE_RECORD_ITERATIONS); backward_us is their median")(
      "model-file", po::value(&options.model_file),
      "where the job writes the model (passed in CUPCAKE_RECORD); default: a temporary file, removed afterwards")(
      "replace", po::bool_switch(&options.replace), "replace a model of the same name in the DB")(
      "lock-timeout", po::value(&options.lock_timeout_s)->default_value(10), kLockTimeoutHelp);
  po::positional_options_description positional;
  po::variables_map vm;
  const std::string synopsis = "--db DB [--iterations N] [--model-file F] [--replace] -- TRAINING COMMAND...";
  if (auto code = tools::ParseFlags(inv, flags, positional, synopsis, vm)) return *code;
  if (options.command.empty()) return tools::UsageError(inv, "no training command; expected it after --");
  return tools::Finish(inv, RunCompute(options, inv.out));
}

}  // namespace cupcake::profile_cli
