#include "cupcake/profile/load.h"

#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include "cupcake/profile/json_io.h"
#include "cupcake/profile/store.h"
#include "test_files.h"

namespace cupcake::profile {
namespace {

using google::protobuf::util::MessageDifferencer;

TEST(LoadProfileFile, ReadsJsonAndDbAlikeWhateverTheExtension) {
  testing::TempDir dir;
  const std::string json_path = testing::ExamplePath("profiles/v100-8x8-pcie-25g.json");
  auto from_json = LoadProfileFile(json_path);
  ASSERT_TRUE(from_json.ok()) << from_json.status().ToString();
  EXPECT_FALSE(IsSqliteFile(json_path));

  const std::string db = dir.File("profile.data");  // no .db extension: detected by the header
  {
    auto store = ProfileStore::Open(db, true);
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE(store->ImportProfile(*from_json, false).ok());
  }
  EXPECT_TRUE(IsSqliteFile(db));
  auto from_db = LoadProfileFile(db);
  ASSERT_TRUE(from_db.ok()) << from_db.status().ToString();
  EXPECT_TRUE(MessageDifferencer::Equals(*from_db, *from_json));

  EXPECT_EQ(LoadProfileFile(dir.File("missing.json")).status().message(), dir.File("missing.json") + ": no such file");
  EXPECT_EQ(LoadModelFile(db).status().message(),
            db + ": is an SQLite profile DB; expected a cupcake.model.v1 JSON file (write one with: cupcake-profile "
                 "export --db " + db + " --model NAME -o FILE)");
}

TEST(LoadModelFile, ReadsAModelAndNamesTheFileInErrors) {
  auto m = LoadModelFile(testing::ExamplePath("models/gpt2.json"));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->name(), "gpt2");
  const std::string profile = testing::ExamplePath("profiles/v100-8x8-pcie-25g.json");
  EXPECT_EQ(LoadModelFile(profile).status().message(),
            profile + R"(: format: wrong format; got "cupcake.profile.v1" (this is a profile), expected "cupcake.model.v1")");
}

// A UTF-8 byte order mark (what some editors write first) is accepted by every reader: the
// loaders (search, simulate) as the JSON parser (import) did; before, the loaders refused it.
TEST(LoadModelFile, AcceptsAByteOrderMark) {
  testing::TempDir dir;
  auto text = ReadFile(testing::ExamplePath("models/gpt2.json"));
  ASSERT_TRUE(text.ok());
  ASSERT_TRUE(WriteFileAtomic(dir.File("bom.json"), "\xEF\xBB\xBF" + *text).ok());
  auto m = LoadModelFile(dir.File("bom.json"));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->name(), "gpt2");
  auto parsed = ParseModelJson("\xEF\xBB\xBF" + *text, "bom.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  auto p = ReadFile(testing::ExamplePath("profiles/v100-8x8-pcie-25g.json"));
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(WriteFileAtomic(dir.File("profile.json"), "\xEF\xBB\xBF" + *p).ok());
  EXPECT_TRUE(LoadProfileFile(dir.File("profile.json")).ok());
}

// Regression: a directory or a binary file given as a profile was reported as "not valid JSON",
// and a model given through a pipe was read twice (the second read found it empty).
TEST(LoadProfileFile, NamesWhatIsWrongWithADirectoryAPipeOrABinaryFile) {
  testing::TempDir dir;
  EXPECT_EQ(LoadProfileFile(dir.path()).status().message(), dir.path() + ": is a directory; expected a file");
  ASSERT_TRUE(WriteFileAtomic(dir.File("x.bin"), std::string("\x7f" "ELF\x02\x01", 6)).ok());
  EXPECT_EQ(LoadProfileFile(dir.File("x.bin")).status().message(),
            dir.File("x.bin") + ": not a profile or model file; got a file starting with '\\x7fELF\\x02\\x01', expected "
                                "an SQLite profile DB or a cupcake.profile.v1 JSON file");

  const std::string text = testing::ReadExample("models/gpt2.json");
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ASSERT_LT(text.size(), 65536u);  // fits the pipe's buffer: written whole before the read
  ASSERT_EQ(::write(fds[1], text.data(), text.size()), static_cast<ssize_t>(text.size()));
  ::close(fds[1]);
  auto m = LoadModelFile("/dev/fd/" + std::to_string(fds[0]));
  ::close(fds[0]);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->name(), "gpt2");
}

}  // namespace
}  // namespace cupcake::profile
