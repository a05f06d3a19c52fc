#include "cupcake/tools/cli.h"

#include <gtest/gtest.h>

#include <sstream>

#include "commands.h"  // cupcake-plan's table
#include "cupcake/tools/version.h"

namespace cupcake::tools {
namespace {

namespace po = boost::program_options;

struct Result {
  int code;
  std::string out, err;
};

struct EchoOptions {
  std::string name;
  int times = 1;
};

// A command built the way real ones are: flags -> options -> Status.
int EchoMain(Invocation& inv) {
  EchoOptions options;
  po::options_description flags("options");
  flags.add_options()("name", po::value(&options.name)->required(), "who")("times", po::value(&options.times), "n");
  po::variables_map vm;
  if (auto code = ParseFlags(inv, flags, {}, "--name NAME [--times N]", vm)) return *code;
  if (options.times < 0) return UsageError(inv, "--times: must not be negative; got " + std::to_string(options.times));
  if (options.name == "fail") return Finish(inv, InvalidArgumentError("x.json: a: bad\nx.json: b: bad"));
  for (int i = 0; i < options.times; ++i) inv.out << options.name << "\n";
  return Finish(inv, Status::Ok());
}

const ToolInfo kTool{"cupcake-test", "A tool for tests."};
const std::vector<Command> kCommands{{"echo", "print a name", EchoMain}, {"export", "unused", EchoMain}};

Result Invoke(const std::vector<std::string>& args, const std::vector<Command>& commands = kCommands,
           const ToolInfo& tool = kTool) {
  std::ostringstream out, err;
  int code = Dispatch(tool, commands, args, out, err);
  return {code, out.str(), err.str()};
}

TEST(Dispatch, HelpListsCommandsWithTheirOneLineHelp) {
  Result r = Invoke({"--help"});
  EXPECT_EQ(r.code, kExitOk);
  EXPECT_EQ(r.out,
            "usage: cupcake-test <command> [options]\nA tool for tests.\n\ncommands:\n  echo    print a name\n"
            "  export  unused\n\noptions:\n  --help     show this help\n  --version  print the version\n\n"
            "Run 'cupcake-test <command> --help' for a command's options.\n");
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(Invoke({}).code, kExitUsage);
  EXPECT_EQ(Invoke({}).err, r.out);
}

TEST(Dispatch, VersionComesFromCMake) {
  Result r = Invoke({"--version"});
  EXPECT_EQ(r.code, kExitOk);
  EXPECT_EQ(r.out, std::string("cupcake-test ") + CUPCAKE_VERSION + "\n");
  EXPECT_FALSE(std::string(CUPCAKE_VERSION).empty());
}

TEST(Dispatch, MisspelledCommandGetsDidYouMeanAndExit2) {
  Result r = Invoke({"ehco", "--name", "x"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "cupcake-test: unknown command; got 'ehco' (did you mean 'echo'?), expected one of echo, export; "
                   "run 'cupcake-test --help' for the commands\n");
  EXPECT_EQ(Invoke({"--frobnicate"}).err,
            "cupcake-test: unknown option; got '--frobnicate', expected a command or --help, --version; run "
            "'cupcake-test --help' for the commands\n");
}

TEST(Dispatch, RunsTheCommandAndMapsStatusToExitCodes) {
  Result ok = Invoke({"echo", "--name", "hi", "--times", "2"});
  EXPECT_EQ(ok.code, kExitOk);
  EXPECT_EQ(ok.out, "hi\nhi\n");
  Result fail = Invoke({"echo", "--name", "fail"});
  EXPECT_EQ(fail.code, kExitFailure);
  EXPECT_EQ(fail.err, "x.json: a: bad\nx.json: b: bad\n");
  EXPECT_EQ(fail.out, "");
}

TEST(ParseFlags, BadFlagsAreUsageErrors) {
  Result missing = Invoke({"echo"});
  EXPECT_EQ(missing.code, kExitUsage);
  EXPECT_TRUE(missing.err.starts_with("cupcake-test echo: the option '--name' is required but missing\n"
                                      "usage: cupcake-test echo --name NAME [--times N]\n"))
      << missing.err;
  Result unknown = Invoke({"echo", "--nmae", "x"});
  EXPECT_EQ(unknown.code, kExitUsage);
  EXPECT_EQ(unknown.err, "cupcake-test echo: unknown option; got '--nmae' (did you mean '--name'?); "
                         "run 'cupcake-test echo --help' for its options\n");
  Result bad_value = Invoke({"echo", "--name", "x", "--times", "many"});
  EXPECT_EQ(bad_value.code, kExitUsage);
  EXPECT_TRUE(bad_value.err.starts_with("cupcake-test echo: the argument ('many') for option '--times' is invalid"))
      << bad_value.err;
  Result negative = Invoke({"echo", "--name", "x", "--times", "-1"});
  EXPECT_EQ(negative.code, kExitUsage);
  EXPECT_EQ(negative.err, "cupcake-test echo: --times: must not be negative; got -1\n"
                          "run 'cupcake-test echo --help' for its options\n");
  Result help = Invoke({"echo", "--help"});
  EXPECT_EQ(help.code, kExitOk);
  EXPECT_TRUE(help.out.starts_with("usage: cupcake-test echo --name NAME [--times N]\n")) << help.out;
  EXPECT_EQ(Invoke({"help", "echo"}).out, help.out);
}

TEST(OutputFormat, TextOrJson) {
  EXPECT_EQ(*ParseOutputFormat("--format", "json"), OutputFormat::kJson);
  EXPECT_EQ(*ParseOutputFormat("--format", "text"), OutputFormat::kText);
  EXPECT_EQ(ParseOutputFormat("--format", "jsn").status().message(),
            "--format: unknown format; got \"jsn\" (did you mean 'json'?), expected one of text, json");
}

TEST(Human, BytesAndCounts) {
  EXPECT_EQ(HumanBytes(4), "4 B");
  EXPECT_EQ(HumanBytes(1023), "1023 B");
  EXPECT_EQ(HumanBytes(1024), "1 KiB");
  EXPECT_EQ(HumanBytes(1536), "1.5 KiB");
  EXPECT_EQ(HumanBytes(int64_t{1} << 30), "1 GiB");
  EXPECT_EQ(HumanBytes(102228128), "97.5 MiB");
  EXPECT_EQ(HumanCount(1), "1");
  EXPECT_EQ(HumanCount(int64_t{1} << 20), "1 Mi");
}

TEST(CupcakePlan, HasAWorkingFrameAndItsCommands) {
  std::ostringstream out, err;
  EXPECT_EQ(Dispatch(plan_cli::kTool, plan_cli::Commands(), {"--version"}, out, err), kExitOk);
  EXPECT_EQ(out.str(), std::string("cupcake-plan ") + CUPCAKE_VERSION + "\n");
  std::ostringstream out2, err2;
  EXPECT_EQ(Dispatch(plan_cli::kTool, plan_cli::Commands(), {"--help"}, out2, err2), kExitOk);
  EXPECT_TRUE(out2.str().starts_with("usage: cupcake-plan <command> [options]\n")) << out2.str();
  for (const char* command : {"\n  search ", "\n  show ", "\n  simulate ", "\n  trace ", "\n  diff "})
    EXPECT_NE(out2.str().find(command), std::string::npos) << command;
  std::ostringstream out3, err3;
  EXPECT_EQ(Dispatch(plan_cli::kTool, plan_cli::Commands(), {"bogus"}, out3, err3), kExitUsage);
  EXPECT_TRUE(err3.str().starts_with("cupcake-plan: unknown command; got 'bogus'")) << err3.str();
  std::ostringstream out4, err4;
  EXPECT_EQ(Dispatch(plan_cli::kTool, plan_cli::Commands(), {"serach"}, out4, err4), kExitUsage);
  EXPECT_EQ(err4.str(), "cupcake-plan: unknown command; got 'serach' (did you mean 'search'?), expected one of search, "
                        "show, simulate, trace, diff; run 'cupcake-plan --help' for the commands\n");
}

}  // namespace
}  // namespace cupcake::tools
