#include "cupcake/planner/curve.h"

#include <gtest/gtest.h>

#include <random>

namespace cupcake::planner {
namespace {

TEST(Curve, InterpolatesBetweenPoints) {
  Curve c({10, 20, 40}, {100, 200, 100});
  EXPECT_DOUBLE_EQ(c.At(10), 100);
  EXPECT_DOUBLE_EQ(c.At(15), 150);
  EXPECT_DOUBLE_EQ(c.At(20), 200);
  EXPECT_DOUBLE_EQ(c.At(30), 150);
}

TEST(Curve, BelowFirstPointIsFirstTime) {
  Curve c({10, 20}, {100, 200});
  EXPECT_DOUBLE_EQ(c.At(0), 100);
  EXPECT_DOUBLE_EQ(c.At(1), 100);
}

TEST(Curve, AboveLastPointExtendsLastSlope) {
  Curve c({10, 20}, {100, 200});
  EXPECT_DOUBLE_EQ(c.At(30), 300);
}

TEST(Curve, FallingTailStopsAtZero) {
  Curve c({10, 20}, {200, 100});
  EXPECT_DOUBLE_EQ(c.At(30), 0);
  EXPECT_DOUBLE_EQ(c.At(1000), 0);
  EXPECT_DOUBLE_EQ(c.At(25), 50);
}

TEST(Curve, OnePointIsConstant) {
  Curve c({10}, {7});
  EXPECT_DOUBLE_EQ(c.At(1), 7);
  EXPECT_DOUBLE_EQ(c.At(1e9), 7);
}

TEST(Curve, EmptyIsZero) { EXPECT_DOUBLE_EQ(Curve().At(123), 0); }

TEST(CurveCursor, GivesExactlyAtsValues) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 100; ++trial) {
    std::vector<double> xs, ys;
    double x = 0;
    for (int i = 0, n = 1 + rng() % 8; i < n; ++i) {
      x += 1 + rng() % 100;
      xs.push_back(x);
      ys.push_back(static_cast<double>(rng() % 1000) / 7.0);
    }
    Curve c(xs, ys);
    CurveCursor cursor(c);
    for (double q = 0; q < x + 300; q += 0.5 + (rng() % 30)) EXPECT_EQ(cursor.At(q), c.At(q)) << q;
  }
}

}  // namespace
}  // namespace cupcake::planner
