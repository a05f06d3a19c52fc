#include "commands.h"
#include "cupcake/profile/json_io.h"
#include "cupcake/profile/store.h"
#include "cupcake/proto/file_io.h"
#include "profiling.h"

namespace cupcake::profile_cli {
namespace po = boost::program_options;

Status RunImport(const ImportOptions& options, std::ostream& out) {
  // Validate the whole file before touching the DB.
  CUPCAKE_ASSIGN_OR_RETURN(std::string text, ReadFile(options.file));
  CUPCAKE_ASSIGN_OR_RETURN(profile::JsonFormat format, profile::DetectJsonFormat(text, options.file));
  pb::Profile profile_in;
  pb::Model model_in;
  if (format == profile::JsonFormat::kProfile) {
    CUPCAKE_ASSIGN_OR_RETURN(profile_in, profile::ParseProfileJson(text, options.file));
  } else {
    CUPCAKE_ASSIGN_OR_RETURN(model_in, profile::ParseModelJson(text, options.file));
  }

  CUPCAKE_ASSIGN_OR_RETURN(int lock_ms, LockTimeoutMs(options.lock_timeout_s));
  // A new DB appears only with the import in it: a failed import leaves no file behind.
  Status status = profile::ProfileStore::OpenOrCreate(options.db, lock_ms, [&](profile::ProfileStore& store) {
                    return format == profile::JsonFormat::kProfile ? store.ImportProfile(profile_in, options.replace)
                                                                   : store.ImportModel(model_in, options.replace);
                  }).status();
  if (status.code() == StatusCode::kAlreadyExists)
    return Status(status.code(), status.message() + "\n" + options.db +
                                     ": nothing imported; pass --replace to replace what the DB holds");
  CUPCAKE_RETURN_IF_ERROR(status);
  if (format == profile::JsonFormat::kProfile) {
    out << "imported profile '" << profile_in.cluster().name() << "' (" << profile_in.curves_size() << " curves, "
        << profile_in.models_size() << " models) from " << options.file << " into " << options.db << "\n";
  } else {
    out << "imported model '" << model_in.name() << "' (" << model_in.tensors_size() << " tensors) from "
        << options.file << " into " << options.db << "\n";
  }
  return Status::Ok();
}

int ImportMain(tools::Invocation& inv) {
  ImportOptions options;
  po::options_description flags("options");
  flags.add_options()("db", po::value(&options.db)->required(), "the profile DB (created when missing)")(
      "file", po::value(&options.file)->required(), "a cupcake.profile.v1 or cupcake.model.v1 JSON file")(
      "replace", po::bool_switch(&options.replace),
      "replace what the DB holds (another cluster, a present curve or model)")(
      "lock-timeout", po::value(&options.lock_timeout_s)->default_value(10), kLockTimeoutHelp);
  po::positional_options_description positional;
  positional.add("file", 1);
  po::variables_map vm;
  if (auto code = tools::ParseFlags(inv, flags, positional, "--db DB FILE.json [--replace] [--lock-timeout S]", vm))
    return *code;
  return tools::Finish(inv, RunImport(options, inv.out));
}

}  // namespace cupcake::profile_cli
