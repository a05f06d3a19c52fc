#include "cupcake/proto/file_io.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

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

}  // namespace
}  // namespace cupcake
