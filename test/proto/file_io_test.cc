#include "cupcake/proto/file_io.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

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

}  // namespace
}  // namespace cupcake
