// The frame every cupcake tool shares (docs/ARCHITECTURE.md, tools): subcommands from a table with one-line
// help and "did you mean", exit codes 0 success / 1 failure / 2 usage error, diagnostics to
// stderr and results to stdout or -o, --help and --version.
//
// A tool is a vector<Command> and a one-line main: `return RunMain(tool, Commands(), argc, argv);`.
// A command parses its flags with ParseFlags into an options struct, calls its
// `Status RunX(const XOptions&, std::ostream& out)` and returns Finish(inv, status).
#pragma once

#include <boost/program_options.hpp>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "cupcake/proto/status.h"

namespace cupcake::tools {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

// What a command gets: its arguments (after the command name) and the streams to write.
struct Invocation {
  std::string tool;  // "cupcake-profile"
  std::string command;  // "import"
  std::vector<std::string> args;
  std::ostream& out;
  std::ostream& err;
  // This process's rank in a job of several processes running the command alike (under mpirun
  // or torchrun; 0 otherwise). What every rank finds alike, it prints on rank 0 only: --help,
  // usage errors (every rank parses the same command line) and failures reported by rank 0
  // (Status::reporter); the other ranks return the same exit code, silently.
  int rank = 0;
};

struct Command {
  std::string name;
  std::string help;  // one line, shown by --help
  std::function<int(Invocation&)> run;  // returns the exit code
};

struct ToolInfo {
  std::string name;  // "cupcake-profile"
  std::string summary;  // one line
};

// Dispatches `args` (argv without the program name) to a command of `commands`.
int Dispatch(const ToolInfo& tool, const std::vector<Command>& commands, const std::vector<std::string>& args,
             std::ostream& out, std::ostream& err);
// Dispatch over argv with std::cout and std::cerr.
int RunMain(const ToolInfo& tool, const std::vector<Command>& commands, int argc, char** argv);

// The tool's usage: commands with their help.
std::string ToolUsage(const ToolInfo& tool, const std::vector<Command>& commands);

// Parses inv.args against `flags` (a --help/-h flag is added) and `positional`.
// Returns nullopt to go on, or the exit code to return now: 0 after printing the command's
// help to out for --help, 2 after printing the problem and the usage to err (both on rank 0
// only: Invocation::rank).
// `synopsis` is the usage line after the command name, e.g. "--db DB FILE.json [--replace]".
std::optional<int> ParseFlags(Invocation& inv, boost::program_options::options_description& flags,
                              const boost::program_options::positional_options_description& positional,
                              const std::string& synopsis, boost::program_options::variables_map& vm);

// A usage error found after parsing (a bad flag value): prints it and the hint (on rank 0 only:
// every rank parses the same command line), returns 2.
int UsageError(Invocation& inv, const std::string& message);

// 0 for OK; otherwise prints the status's message (one line per problem) to err, unless another
// rank of the job reports it (Status::PrintedBy(inv.rank)), and returns 1.
int Finish(Invocation& inv, const Status& status);

enum class OutputFormat { kText, kJson };
// "text" or "json"; `flag` names the flag in the message.
StatusOr<OutputFormat> ParseOutputFormat(const std::string& flag, const std::string& value);

// Human sizes: 1536 -> "1.5 KiB", 1048576 -> "1 MiB"; counts: 1024 -> "1 Ki".
std::string HumanBytes(int64_t bytes);
std::string HumanCount(int64_t count);
// "1 node", "4 nodes": the count and the noun, plural unless the count is 1.
std::string CountOf(int64_t count, const std::string& noun);

}  // namespace cupcake::tools
