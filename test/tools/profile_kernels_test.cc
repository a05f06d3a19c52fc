// cupcake-profile kernels: a quick CPU sweep into a new DB, a re-run that skips everything,
// and the errors a user can cause.
#include <gtest/gtest.h>

#include <sstream>

#include "commands.h"
#include "cupcake/profile/store.h"
#include "test_files.h"

namespace cupcake::profile_cli {
namespace {

KernelsOptions Tiny(const std::string& db) {
  KernelsOptions o;
  o.db = db;
  o.min_elements = 256;
  o.max_elements = 1024;
  o.warmup = 0;
  o.iters = 1;
  o.compressors = {"fp32", "topk"};
  o.world_size = 2;
  return o;
}

TEST(KernelsCommand, SweepsIntoANewDbThenSkipsWhatIsThere) {
  testing::TempDir dir;
  const std::string db = dir.File("p.db");
  std::ostringstream out;
  ASSERT_TRUE(RunKernels(Tiny(db), out).ok());
  EXPECT_NE(out.str().find("measured 18 points, skipped 0"), std::string::npos) << out.str();
  std::ostringstream again;
  KernelsOptions o = Tiny(db);
  o.world_size = 0;  // taken from the DB's cluster
  ASSERT_TRUE(RunKernels(o, again).ok());
  EXPECT_NE(again.str().find("W=2, 3 sizes"), std::string::npos) << again.str();
  EXPECT_NE(again.str().find("measured 0 points, skipped 18"), std::string::npos) << again.str();
  auto store = profile::ProfileStore::Open(db, false);
  ASSERT_TRUE(store.ok());
  auto p = store->Load();
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->cluster().name(), "local");
  EXPECT_EQ(p->cluster().devices_per_node(), 2);
  EXPECT_EQ(p->curves_size(), 6);
  EXPECT_TRUE(p->cluster().meta().contains("kernels.date"));
}

TEST(KernelsCommand, ErrorsNameTheFlag) {
  testing::TempDir dir;
  std::ostringstream out;
  KernelsOptions o = Tiny(dir.File("p.db"));
  o.min_elements = 4096;
  EXPECT_EQ(RunKernels(o, out).message(), "--max-elements: empty size range; got 1024, expected >= --min-elements (4096)");
  o = Tiny(dir.File("p.db"));
  o.device = "tpu";
  EXPECT_EQ(RunKernels(o, out).message(), "--device: unknown device; got 'tpu', expected cpu or gpu");
  ASSERT_TRUE(RunKernels(Tiny(dir.File("p.db")), out).ok());
  o = Tiny(dir.File("p.db"));
  o.world_size = 8;
  EXPECT_EQ(RunKernels(o, out).message(), dir.File("p.db") +
                                              ": --world-size: disagrees with the DB's cluster 'local'; got 8, "
                                              "expected 2 (1 nodes x 2 devices)");
}

}  // namespace
}  // namespace cupcake::profile_cli
