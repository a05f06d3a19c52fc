#include "cupcake/proto/file_io.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "profile/test_files.h"

namespace cupcake {
namespace {

TEST(FileIo, WriteAtomicThenReadBack) {
  std::string tmpl = (std::filesystem::temp_directory_path() / "cupcake-io-XXXXXX").string();
  std::string dir = ::mkdtemp(tmpl.data());
  const std::string path = dir + "/f.json";
  ASSERT_TRUE(WriteFileAtomic(path, "first").ok());
  ASSERT_TRUE(WriteFileAtomic(path, std::string("second\0with nul", 15)).ok());
  auto text = ReadFile(path);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, std::string("second\0with nul", 15));
  int entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++entries;
  EXPECT_EQ(entries, 1);  // no temporary left behind

  EXPECT_EQ(ReadFile(dir + "/missing").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(ReadFile(dir + "/missing").status().message(), dir + "/missing: no such file");
  Status s = WriteFileAtomic(dir + "/no/such/dir/f", "x");
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(s.message().starts_with(dir + "/no/such/dir/f: cannot write: ")) << s.message();
  std::filesystem::remove_all(dir);
}

class ReadFileTest : public ::testing::Test {
 protected:
  testing::TempDir tmp_;
  const std::string dir_ = tmp_.path();
};

TEST_F(ReadFileTest, RefusesADirectory) {
  EXPECT_EQ(ReadFile(dir_).status().message(), dir_ + ": is a directory; expected a file");
}

// Regression: `show /dev/zero` read until memory ran out.
TEST_F(ReadFileTest, StopsAnEndlessInputAtTheLimit) {
  auto r = ReadFile("/dev/zero", {.max_bytes = 1 << 20, .wait_s = 1});
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "/dev/zero: too large; got more than 1048576 bytes, expected at most 1048576 (is it "
                                  "the right file?)");
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/big", std::string(2000, 'x')).ok());
  EXPECT_EQ(ReadFile(dir_ + "/big", {.max_bytes = 1000}).status().message(),
            dir_ + "/big: too large; got more than 1000 bytes, expected at most 1000 (is it the right file?)");
}

// Regression: a FIFO with no writer blocked the tools forever.
TEST_F(ReadFileTest, GivesUpOnAFifoWithNoWriter) {
  const std::string fifo = dir_ + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto r = ReadFile(fifo, {.wait_s = 0.2});
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(r.status().message(), fifo + ": no data for 0.2 s after 0 bytes; expected a file, or a pipe whose writer "
                                         "sends it (a FIFO with no writer?)");
}

// A pipe is read once, whole: `--model <(cat m.json)` works.
TEST_F(ReadFileTest, ReadsAPipeWhole) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const std::string text(200000, 'p');  // more than the pipe's buffer: the writer blocks until read
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(fds[0]);
    size_t done = 0;
    while (done < text.size()) {
      ssize_t n = ::write(fds[1], text.data() + done, text.size() - done);
      if (n <= 0) ::_exit(1);
      done += static_cast<size_t>(n);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  auto r = ReadFile("/dev/fd/" + std::to_string(fds[0]));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, text);
}

// -o over what is not a regular file: a symbolic link is followed (its target replaced, the
// link kept), a FIFO and a device are written straight and stay what they are, a FIFO without
// a reader fails at once, a directory and an empty path are refused. The nodes are made in a
// private folder; the machine's own /dev is never touched.
class WriteFileTest : public ::testing::Test {
 protected:
  testing::TempDir tmp_;
  const std::string dir_ = tmp_.path();
};

TEST_F(WriteFileTest, FollowsASymlinkAndKeepsIt) {
  const std::string target = dir_ + "/target.pb", link = dir_ + "/link.pb", dangling = dir_ + "/dangling.pb";
  ASSERT_TRUE(WriteFileAtomic(target, "old").ok());
  std::filesystem::create_symlink("target.pb", link);
  ASSERT_TRUE(WriteFileAtomic(link, "new").ok());
  EXPECT_TRUE(std::filesystem::is_symlink(link));
  EXPECT_EQ(*ReadFile(target), "new");
  std::filesystem::create_symlink("made-through-link.pb", dangling);
  ASSERT_TRUE(WriteFileAtomic(dangling, "fresh").ok());
  EXPECT_TRUE(std::filesystem::is_symlink(dangling));
  EXPECT_EQ(*ReadFile(dir_ + "/made-through-link.pb"), "fresh");
}

TEST_F(WriteFileTest, WritesStraightToAFifoAndFailsWithoutAReader) {
  const std::string fifo = dir_ + "/out.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(WriteFileAtomic(fifo, "x").message(), fifo + ": cannot write: a FIFO with no reader");
  StatusOr<std::string> read = std::string();
  std::thread reader([&] { read = ReadFile(fifo); });
  Status written = UnavailableError("not written");
  for (int i = 0; i < 500 && !written.ok(); ++i) {  // until the reader has opened its end
    written = WriteFileAtomic(fifo, "through the fifo");
    if (!written.ok()) ::usleep(10000);
  }
  reader.join();
  EXPECT_TRUE(written.ok()) << written.ToString();
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(*read, "through the fifo");
  struct stat info;
  ASSERT_EQ(::lstat(fifo.c_str(), &info), 0);
  EXPECT_TRUE(S_ISFIFO(info.st_mode));
}

TEST_F(WriteFileTest, WritesStraightToADeviceNode) {
  const std::string null = dir_ + "/null", full = dir_ + "/full";
  if (::mknod(null.c_str(), S_IFCHR | 0600, makedev(1, 3)) != 0 ||
      ::mknod(full.c_str(), S_IFCHR | 0600, makedev(1, 7)) != 0)
    GTEST_SKIP() << "mknod: " << std::strerror(errno) << " (device nodes need root; the FIFO test covers the path)";
  ASSERT_TRUE(WriteFileAtomic(null, "discarded").ok());
  struct stat info;
  ASSERT_EQ(::lstat(null.c_str(), &info), 0);
  EXPECT_TRUE(S_ISCHR(info.st_mode));
  EXPECT_EQ(WriteFileAtomic(full, "x").message(), full + ": write failed: No space left on device");
  ASSERT_EQ(::lstat(full.c_str(), &info), 0);
  EXPECT_TRUE(S_ISCHR(info.st_mode));
}

TEST_F(WriteFileTest, RefusesADirectoryAndAnEmptyPath) {
  EXPECT_EQ(WriteFileAtomic(dir_, "x").message(), dir_ + ": is a directory; expected a file");
  EXPECT_EQ(WriteFileAtomic("", "x").message(), "output path: empty; expected a file name, or - for stdout");
  int entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir_)) ++entries;
  EXPECT_EQ(entries, 0);
}

// A directory syncs; a missing path and a regular file are refused naming the path.
TEST_F(WriteFileTest, SyncsADirectoryAndRefusesWhatIsNotOne) {
  EXPECT_TRUE(SyncDirectory(dir_).ok());
  EXPECT_EQ(SyncDirectory(dir_ + "/missing").message(),
            dir_ + "/missing: cannot open the directory: No such file or directory");
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/file", "x").ok());
  EXPECT_EQ(SyncDirectory(dir_ + "/file").message(), dir_ + "/file: cannot open the directory: Not a directory");
}

}  // namespace
}  // namespace cupcake
