#include "cupcake/proto/names.h"

#include <gtest/gtest.h>

namespace cupcake {
namespace {

TEST(Names, EveryEnumRoundTripsThroughItsName) {
  for (auto v : {pb::FLOAT32, pb::FLOAT16, pb::BFLOAT16}) EXPECT_EQ(ParseDType(Name(v)), v);
  for (auto v : {pb::GPU, pb::CPU}) EXPECT_EQ(ParseDevice(Name(v)), v);
  for (auto v : {pb::COMM, pb::ENCODE, pb::DECODE, pb::COPY}) EXPECT_EQ(ParseCurveKind(Name(v)), v);
  for (auto v : {pb::ALLREDUCE, pb::ALLGATHER, pb::REDUCE_SCATTER, pb::ALLTOALL, pb::BROADCAST})
    EXPECT_EQ(ParseCommOp(Name(v)), v);
  for (auto v : {pb::PACK, pb::UNPACK, pb::D2H, pb::H2D}) EXPECT_EQ(ParseCopyOp(Name(v)), v);
  for (auto v : {pb::GLOBAL, pb::INTRA, pb::INTER}) EXPECT_EQ(ParseScope(Name(v)), v);
}

TEST(Names, FileFormatSpellings) {
  EXPECT_EQ(Name(pb::REDUCE_SCATTER), "reduce_scatter");
  EXPECT_EQ(Name(pb::DTYPE_UNSPECIFIED), "unspecified");
  EXPECT_FALSE(ParseDType("FLOAT32").has_value());
  EXPECT_FALSE(ParseDType("unspecified").has_value());
  EXPECT_EQ(DTypeNames(), "float32, float16, bfloat16");
  EXPECT_EQ(CommOpNames(), "allreduce, allgather, reduce_scatter, alltoall, broadcast");
  EXPECT_EQ(CopyOpNames(), "pack, unpack, d2h, h2d");
  EXPECT_EQ(DTypeBytes(pb::FLOAT32), 4);
  EXPECT_EQ(DTypeBytes(pb::BFLOAT16), 2);
  EXPECT_EQ(DTypeBytes(pb::DTYPE_UNSPECIFIED), 0);
}

TEST(Names, CurveKeys) {
  pb::Curve c;
  c.set_kind(pb::COMM);
  c.set_comm_op(pb::ALLGATHER);
  c.set_scope(pb::INTER);
  EXPECT_EQ(CurveKey(c), "comm allgather inter");
  c.Clear();
  c.set_kind(pb::DECODE);
  c.set_compressor("topk");
  c.set_device(pb::CPU);
  EXPECT_EQ(CurveKey(c), "decode topk cpu");
  c.Clear();
  c.set_kind(pb::COPY);
  c.set_copy_op(pb::H2D);
  c.set_device(pb::GPU);
  EXPECT_EQ(CurveKey(c), "copy h2d gpu");
}

TEST(DidYouMean, SuggestsOnlyLikelyTypos) {
  const std::string_view words[] = {"import", "export", "inspect"};
  EXPECT_EQ(DidYouMean("improt", words), " (did you mean 'import'?)");
  EXPECT_EQ(DidYouMean("inspct", words), " (did you mean 'inspect'?)");
  EXPECT_EQ(DidYouMean("frobnicate", words), "");
  EXPECT_EQ(ClosestMatch("exprot", words), "export");
  EXPECT_EQ(ClosestMatch("x", std::span<const std::string_view>()), "");
}

}  // namespace
}  // namespace cupcake
