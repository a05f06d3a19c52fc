#include "cupcake/profile/load.h"

#include <cstring>
#include <fstream>

#include "cupcake/profile/json_io.h"
#include "cupcake/profile/store.h"
#include "cupcake/proto/file_io.h"

namespace cupcake::profile {

bool IsSqliteFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char head[16] = {};
  if (!in.read(head, sizeof head)) return false;
  return std::memcmp(head, "SQLite format 3", 16) == 0;  // includes the terminating NUL
}

StatusOr<pb::Profile> LoadProfileFile(const std::string& path) {
  if (IsSqliteFile(path)) {
    CUPCAKE_ASSIGN_OR_RETURN(ProfileStore store, ProfileStore::Open(path, /*create=*/false));
    return store.Load();
  }
  CUPCAKE_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  return ParseProfileJson(text, path);
}

StatusOr<pb::Model> LoadModelFile(const std::string& path) {
  if (IsSqliteFile(path))
    return InvalidArgumentError(path + ": is an SQLite profile DB; expected a cupcake.model.v1 JSON file "
                                       "(write one with: cupcake-profile export --db " + path + " --model NAME -o FILE)");
  CUPCAKE_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  return ParseModelJson(text, path);
}

}  // namespace cupcake::profile
