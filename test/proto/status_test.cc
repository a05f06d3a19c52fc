#include "cupcake/proto/status.h"

#include <gtest/gtest.h>

namespace cupcake {
namespace {

// A failure every rank of a job finds alike names the rank that prints it; the others do not.
TEST(StatusReporter, OnlyTheReporterPrintsAFailureEveryRankFindsAlike) {
  const Status own = InvalidArgumentError("--x: bad");
  EXPECT_EQ(own.reporter(), Status::kAnyRank);
  EXPECT_TRUE(own.PrintedBy(0));
  EXPECT_TRUE(own.PrintedBy(3));

  const Status alike = Quiet(own);
  EXPECT_EQ(alike.reporter(), 0);
  EXPECT_EQ(alike.message(), "--x: bad");
  EXPECT_EQ(alike.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(alike.PrintedBy(0));
  EXPECT_FALSE(alike.PrintedBy(1));

  const Status prefixed = own.ReportedBy(2).WithPrefix("kernels");
  EXPECT_EQ(prefixed.message(), "kernels: --x: bad");
  EXPECT_EQ(prefixed.reporter(), 2);
  EXPECT_FALSE(prefixed.PrintedBy(0));
  EXPECT_TRUE(prefixed.PrintedBy(2));

  // OK has nothing to print and no reporter.
  EXPECT_EQ(Status::Ok().ReportedBy(0).reporter(), Status::kAnyRank);
  EXPECT_FALSE(Status::Ok().PrintedBy(0));
}

}  // namespace
}  // namespace cupcake
