#include "cupcake/proto/file_io.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace cupcake {

StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    int err = errno;
    if (err == ENOENT) return NotFoundError(path + ": no such file");
    return InvalidArgumentError(path + ": cannot open: " + std::strerror(err));
  }
  std::ostringstream os;
  os << in.rdbuf();
  if (in.bad()) return DataLossError(path + ": read failed");
  return os.str();
}

Status WriteFileAtomic(const std::string& path, std::string_view contents) {
  if (path == "-") {
    if (std::fwrite(contents.data(), 1, contents.size(), stdout) != contents.size() || std::fflush(stdout) != 0)
      return UnavailableError("stdout: write failed");
    return Status::Ok();
  }
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return InvalidArgumentError(path + ": cannot write: " + std::strerror(errno));
  bool ok = std::fwrite(contents.data(), 1, contents.size(), f) == contents.size();
  ok = (std::fflush(f) == 0) && ok;
  ok = (::fsync(::fileno(f)) == 0) && ok;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    return UnavailableError(path + ": write failed: " + std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    std::remove(tmp.c_str());
    return UnavailableError(path + ": rename failed: " + std::strerror(err));
  }
  return Status::Ok();
}

}  // namespace cupcake
