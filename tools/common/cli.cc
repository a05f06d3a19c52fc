#include "cupcake/tools/cli.h"

#include <algorithm>
#include <cctype>
#include <iostream>
#include <sstream>

#include "cupcake/proto/names.h"
#include "cupcake/tools/version.h"

namespace cupcake::tools {
namespace po = boost::program_options;

std::string ToolUsage(const ToolInfo& tool, const std::vector<Command>& commands) {
  std::ostringstream os;
  os << "usage: " << tool.name << " <command> [options]\n" << tool.summary << "\n\ncommands:\n";
  size_t width = 0;
  for (const Command& c : commands) width = std::max(width, c.name.size());
  for (const Command& c : commands)
    os << "  " << c.name << std::string(width - c.name.size() + 2, ' ') << c.help << "\n";
  if (commands.empty()) os << "  (none yet)\n";
  os << "\noptions:\n  --help     show this help\n  --version  print the version\n"
     << "\nRun '" << tool.name << " <command> --help' for a command's options.\n";
  return os.str();
}

int Dispatch(const ToolInfo& tool, const std::vector<Command>& commands, const std::vector<std::string>& args,
             std::ostream& out, std::ostream& err) {
  const std::string hint = "run '" + tool.name + " --help' for the commands";
  if (args.empty()) {
    err << ToolUsage(tool, commands);
    return kExitUsage;
  }
  const std::string& first = args[0];
  if (first == "--help" || first == "-h" || first == "help") {
    if (first == "help" && args.size() > 1) return Dispatch(tool, commands, {args[1], "--help"}, out, err);
    out << ToolUsage(tool, commands);
    return kExitOk;
  }
  if (first == "--version") {
    out << tool.name << " " << CUPCAKE_VERSION << "\n";
    return kExitOk;
  }
  std::vector<std::string_view> names;
  for (const Command& c : commands) names.push_back(c.name);
  std::string expected = "expected one of ";
  for (size_t i = 0; i < names.size(); ++i) expected += (i ? ", " : "") + std::string(names[i]);
  if (names.empty()) expected = "expected no command yet (this tool has none)";
  if (first.starts_with("-")) {
    err << tool.name << ": unknown option; got '" << first << "', expected a command or --help, --version; " << hint
        << "\n";
    return kExitUsage;
  }
  for (const Command& c : commands) {
    if (c.name != first) continue;
    Invocation inv{tool.name, c.name, std::vector<std::string>(args.begin() + 1, args.end()), out, err};
    return c.run(inv);
  }
  err << tool.name << ": unknown command; got '" << first << "'" << DidYouMean(first, names) << ", " << expected << "; "
      << hint << "\n";
  return kExitUsage;
}

int RunMain(const ToolInfo& tool, const std::vector<Command>& commands, int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  int code = Dispatch(tool, commands, args, std::cout, std::cerr);
  std::cout.flush();
  return code;
}

namespace {

std::string CommandUsage(const Invocation& inv, const po::options_description& flags, const std::string& synopsis) {
  std::ostringstream os;
  os << "usage: " << inv.tool << " " << inv.command << " " << synopsis << "\n" << flags;
  return os.str();
}

}  // namespace

namespace {

// A positional argument is named by its usage (PLAN for --plan), as the synopsis shows it;
// nullopt for a flag that is not positional.
std::optional<std::string> PositionalName(const po::positional_options_description& positional,
                                          const std::string& name) {
  for (unsigned i = 0; i < std::min(positional.max_total_count(), 8u); ++i) {
    if (positional.name_for_position(i) != name) continue;
    std::string upper = name;
    for (char& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    return upper;
  }
  return std::nullopt;
}

}  // namespace

std::optional<int> ParseFlags(Invocation& inv, po::options_description& flags,
                              const po::positional_options_description& positional, const std::string& synopsis,
                              po::variables_map& vm) {
  flags.add_options()("help,h", "show this help");
  // Every rank of a job parses the same command line: rank 0 alone says what it found.
  std::ostream nowhere(nullptr);
  std::ostream& out = inv.rank == 0 ? inv.out : nowhere;
  std::ostream& err = inv.rank == 0 ? inv.err : nowhere;
  try {
    po::store(po::command_line_parser(inv.args).options(flags).positional(positional).run(), vm);
    if (vm.count("help")) {
      out << CommandUsage(inv, flags, synopsis);
      return kExitOk;
    }
    po::notify(vm);
    // An empty value given on purpose (`--db ''`, `show ''`) is never a usable path or name.
    for (const auto& [name, value] : vm) {
      const auto* text = boost::any_cast<std::string>(&value.value());
      if (value.defaulted() || text == nullptr || !text->empty()) continue;
      const auto* option = flags.find_nothrow(name, false);
      return UsageError(inv, PositionalName(positional, name).value_or("--" + name) + ": empty; expected " +
                                 (option ? option->description() : "a value"));
    }
  } catch (const po::unknown_option& e) {
    // A misspelt flag: name it and the nearest flag this command has, not the whole usage.
    const std::string got = e.get_option_name();
    std::vector<std::string> names;
    for (const auto& o : flags.options()) names.push_back("--" + o->long_name());
    std::vector<std::string_view> views(names.begin(), names.end());
    err << inv.tool << " " << inv.command << ": unknown option; got '" << got << "'" << DidYouMean(got, views)
        << "; run '" << inv.tool << " " << inv.command << " --help' for its options\n";
    return kExitUsage;
  } catch (const po::required_option& e) {
    // The positional arguments are named by their usage (PLAN.pb), not by the flag behind them.
    std::string name = e.get_option_name();
    if (name.starts_with("--")) name = name.substr(2);
    if (const std::optional<std::string> upper = PositionalName(positional, name)) {
      const auto* option = flags.find_nothrow(name, false);
      err << inv.tool << " " << inv.command << ": " << *upper << ": missing; expected "
          << (option ? option->description() : "an argument") << "\n"
          << CommandUsage(inv, flags, synopsis);
      return kExitUsage;
    }
    err << inv.tool << " " << inv.command << ": " << e.what() << "\n" << CommandUsage(inv, flags, synopsis);
    return kExitUsage;
  } catch (const po::error& e) {
    err << inv.tool << " " << inv.command << ": " << e.what() << "\n" << CommandUsage(inv, flags, synopsis);
    return kExitUsage;
  }
  return std::nullopt;
}

int UsageError(Invocation& inv, const std::string& message) {
  if (inv.rank != 0) return kExitUsage;
  inv.err << inv.tool << " " << inv.command << ": " << message << "\n"
          << "run '" << inv.tool << " " << inv.command << " --help' for its options\n";
  return kExitUsage;
}

int Finish(Invocation& inv, const Status& status) {
  if (status.ok()) return kExitOk;
  if (status.PrintedBy(inv.rank)) inv.err << status.message() << "\n";
  return kExitFailure;
}

}  // namespace cupcake::tools
