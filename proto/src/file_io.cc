#include "cupcake/proto/file_io.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace cupcake {

namespace {

// Closes the descriptor on every path out.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

}  // namespace

StatusOr<std::string> ReadFile(const std::string& path, const ReadLimits& limits) {
  // Non-blocking open: opening a FIFO for reading would otherwise wait for a writer forever.
  Fd f{::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)};
  if (f.fd < 0) {
    int err = errno;
    if (err == ENOENT) return NotFoundError(path + ": no such file");
    return InvalidArgumentError(path + ": cannot open: " + std::strerror(err));
  }
  struct stat info;
  if (::fstat(f.fd, &info) != 0) return InvalidArgumentError(path + ": cannot stat: " + std::strerror(errno));
  if (S_ISDIR(info.st_mode)) return InvalidArgumentError(path + ": is a directory; expected a file");
  const bool regular = S_ISREG(info.st_mode);
  auto too_large = [&] {
    return InvalidArgumentError(path + ": too large; got more than " + std::to_string(limits.max_bytes) +
                                " bytes, expected at most " + std::to_string(limits.max_bytes) +
                                " (is it the right file?)");
  };
  if (regular && info.st_size > limits.max_bytes) return too_large();

  std::string out;
  char chunk[1 << 16];
  while (true) {
    if (!regular) {  // wait, boundedly, for data or the writer's end
      pollfd p{f.fd, POLLIN, 0};
      int ready = ::poll(&p, 1, static_cast<int>(limits.wait_s * 1000));
      if (ready < 0 && errno == EINTR) continue;
      if (ready < 0) return InvalidArgumentError(path + ": cannot wait for data: " + std::strerror(errno));
      if (ready == 0)
        return UnavailableError(path + ": no data for " + Seconds(limits.wait_s) + " s after " +
                                std::to_string(out.size()) +
                                " bytes; expected a file, or a pipe whose writer sends it (a FIFO with no writer?)");
    }
    ssize_t n = ::read(f.fd, chunk, sizeof chunk);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) return DataLossError(path + ": read failed: " + std::strerror(errno));
    if (n == 0) return out;
    if (static_cast<int64_t>(out.size()) + n > limits.max_bytes) return too_large();
    out.append(chunk, static_cast<size_t>(n));
  }
}

namespace {

// The file a path names once its symbolic links are followed (relative targets against the
// link's folder); the path itself when it is no link. A dangling link gives its target path.
StatusOr<std::string> FollowLinks(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path at = path;
  for (int hops = 0; hops < 40; ++hops) {
    std::error_code ec;
    if (!fs::is_symlink(fs::symlink_status(at, ec))) return at.string();
    const fs::path target = fs::read_symlink(at, ec);
    if (ec) return InvalidArgumentError(path + ": cannot read the link: " + ec.message());
    at = target.is_absolute() ? target : at.parent_path() / target;
  }
  return InvalidArgumentError(path + ": too many levels of symbolic links");
}

// Writes straight to a FIFO, a device or a socket: there is nothing to replace atomically.
Status WriteStraight(const std::string& path, std::string_view contents) {
  // Non-blocking open: a FIFO with no reader fails at once (ENXIO) instead of waiting forever.
  Fd f{::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC)};
  if (f.fd < 0) {
    const int err = errno;
    if (err == ENXIO) return UnavailableError(path + ": cannot write: a FIFO with no reader");
    return InvalidArgumentError(path + ": cannot write: " + std::strerror(err));
  }
  ::fcntl(f.fd, F_SETFL, ::fcntl(f.fd, F_GETFL) & ~O_NONBLOCK);
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = ::write(f.fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return UnavailableError(path + ": write failed: " + std::strerror(errno));
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

}  // namespace

Status WriteFileAtomic(const std::string& path, std::string_view contents) {
  if (path == "-") {
    if (std::fwrite(contents.data(), 1, contents.size(), stdout) != contents.size() || std::fflush(stdout) != 0)
      return UnavailableError("stdout: write failed");
    return Status::Ok();
  }
  if (path.empty()) return InvalidArgumentError("output path: empty; expected a file name, or - for stdout");
  CUPCAKE_ASSIGN_OR_RETURN(const std::string target, FollowLinks(path));
  struct stat info;
  if (::stat(target.c_str(), &info) == 0) {
    if (S_ISDIR(info.st_mode)) return InvalidArgumentError(path + ": is a directory; expected a file");
    if (!S_ISREG(info.st_mode)) return WriteStraight(path, contents);
  }
  // A regular file or a new one: written beside the target and renamed over it, so readers see
  // the old contents or the new, never a part; a link keeps pointing at the new file.
  std::string tmp = target + ".tmp." + std::to_string(::getpid());
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
  if (std::rename(tmp.c_str(), target.c_str()) != 0) {
    int err = errno;
    std::remove(tmp.c_str());
    return UnavailableError(path + ": rename failed: " + std::strerror(err));
  }
  return Status::Ok();
}

Status SyncDirectory(const std::string& dir) {
  Fd d{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (d.fd < 0) return UnavailableError(dir + ": cannot open the directory: " + std::strerror(errno));
  if (::fsync(d.fd) != 0) return UnavailableError(dir + ": fsync of the directory failed: " + std::strerror(errno));
  return Status::Ok();
}

}  // namespace cupcake
