#include "cupcake/profile/load.h"

#include <cstring>
#include <filesystem>
#include <fstream>

#include "cupcake/profile/json_io.h"
#include "cupcake/profile/store.h"
#include "cupcake/proto/file_io.h"
#include "cupcake/proto/names.h"

namespace cupcake::profile {
namespace {

// JSON text starts with '{' after white space (and a UTF-8 byte order mark, which the JSON
// parser skips too: every reader accepts one); anything else is neither format.
Status CheckLooksLikeJson(const std::string& text, const std::string& path, std::string_view expected) {
  const size_t bom = text.starts_with("\xEF\xBB\xBF") ? 3 : 0;
  size_t first = text.find_first_not_of(" \t\r\n", bom);
  if (first != std::string::npos && text[first] == '{') return Status::Ok();
  if (first == std::string::npos) return InvalidArgumentError(path + ": empty file; expected " + std::string(expected));
  return InvalidArgumentError(path + ": not a profile or model file; got a file starting with '" +
                              EscapeBytes(text.substr(first, 12)) + "', expected " + std::string(expected));
}

}  // namespace

bool IsSqliteFile(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;  // a pipe is read once, by ReadFile
  std::ifstream in(path, std::ios::binary);
  char head[16] = {};
  if (!in.read(head, sizeof head)) return false;
  return std::memcmp(head, "SQLite format 3", 16) == 0;  // includes the terminating NUL
}

StatusOr<pb::Profile> LoadProfileFile(const std::string& path) {
  if (IsSqliteFile(path)) {
    CUPCAKE_ASSIGN_OR_RETURN(ProfileStore store, ProfileStore::OpenForReading(path));
    return store.Load();
  }
  CUPCAKE_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  CUPCAKE_RETURN_IF_ERROR(CheckLooksLikeJson(text, path, "an SQLite profile DB or a cupcake.profile.v1 JSON file"));
  return ParseProfileJson(text, path);
}

StatusOr<pb::Model> LoadModelFile(const std::string& path) {
  if (IsSqliteFile(path))
    return InvalidArgumentError(path +
                                ": is an SQLite profile DB; expected a cupcake.model.v1 JSON file "
                                "(write one with: cupcake-profile export --db " +
                                path + " --model NAME -o FILE)");
  CUPCAKE_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  CUPCAKE_RETURN_IF_ERROR(CheckLooksLikeJson(text, path, "a cupcake.model.v1 JSON file"));
  return ParseModelJson(text, path);
}

}  // namespace cupcake::profile
