#include "commands.h"
#include "cupcake/profile/json_io.h"
#include "cupcake/profile/store.h"
#include "cupcake/proto/file_io.h"

namespace cupcake::profile_cli {
namespace po = boost::program_options;

Status RunExport(const ExportOptions& options, std::ostream& out) {
  CUPCAKE_ASSIGN_OR_RETURN(profile::ProfileStore store, profile::ProfileStore::OpenForReading(options.db));
  std::string text;
  if (options.model.empty()) {
    CUPCAKE_ASSIGN_OR_RETURN(pb::Profile p, store.Load());
    text = profile::ProfileToJson(p);
  } else {
    CUPCAKE_ASSIGN_OR_RETURN(pb::Model m, store.LoadModel(options.model));
    text = profile::ModelToJson(m);
  }
  if (options.output.empty() || options.output == "-") {
    out << text;
    return out ? Status::Ok() : UnavailableError("stdout: write failed");
  }
  return WriteFileAtomic(options.output, text);
}

int ExportMain(tools::Invocation& inv) {
  ExportOptions options;
  po::options_description flags("options");
  flags.add_options()("db", po::value(&options.db)->required(), "the profile DB")(
      "model", po::value(&options.model), "export this model instead of the profile")(
      "output,o", po::value(&options.output)->default_value("-"), "output file, written atomically; - for stdout");
  po::variables_map vm;
  if (auto code = tools::ParseFlags(inv, flags, {}, "--db DB [--model NAME] [-o FILE.json]", vm)) return *code;
  return tools::Finish(inv, RunExport(options, inv.out));
}

}  // namespace cupcake::profile_cli
