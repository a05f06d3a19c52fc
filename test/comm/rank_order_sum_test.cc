// The in-process communicator's collectives: allreduce in place (send == recv) gives bitwise
// what out of place gives, the sum in rank order, for float32 and fp16 payloads, with counts
// that span several blocks and do not divide by the world size.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "cupcake/kernels/compressor.h"
#include "cupcake/comm/communicator.h"
#include "kernels/scalar_reference.h"

namespace cupcake::comm {
namespace {


// Rank r's input: `bytes` bytes that are varied fp32 values (or valid fp16 bit patterns).
std::vector<std::byte> Input(int rank, int64_t count, DataType type) {
  std::vector<std::byte> out(static_cast<size_t>(count * (type == DataType::kFloat16 ? 2 : 4)));
  for (int64_t i = 0; i < count; ++i) {
    if (type == DataType::kFloat32) {
      const float v = 0.1f * static_cast<float>((i * 7 + rank * 13) % 101) - 3.3f + 1e-3f * static_cast<float>(rank);
      std::memcpy(out.data() + 4 * i, &v, 4);
    } else {
      // Finite halves of both signs and several exponents: sign | exponent 10..20 | mantissa.
      const uint16_t h = static_cast<uint16_t>(((i + rank) % 2) << 15 | (10 + (i * 3 + rank) % 11) << 10 |
                                               (i * 37 + rank * 101) % 1024);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

// The sum in rank order, by the test's own loops (kernels/scalar_reference.h: float adds, or
// every partial sum rounded to a half): what every rank must get.
std::vector<std::byte> RankOrderSum(int world, int64_t count, DataType type) {
  std::vector<std::vector<std::byte>> inputs;
  for (int r = 0; r < world; ++r) inputs.push_back(Input(r, count, type));
  return type == DataType::kFloat16 ? kernels::reference::SumHalves(inputs) : kernels::reference::SumFloats(inputs);
}

TEST(InProcessGroup, AllreduceInPlaceEqualsOutOfPlaceAndTheRankOrderSum) {
  for (DataType type : {DataType::kFloat32, DataType::kFloat16}) {
    for (int world : {1, 2, 3}) {
      for (int64_t count : {int64_t{1}, int64_t{2}, int64_t{3001}, int64_t{5000}}) {
        const std::vector<std::byte> want = RankOrderSum(world, count, type);
        InProcessGroup group(world);
        std::vector<std::unique_ptr<Communicator>> comms;
        for (int r = 0; r < world; ++r) comms.push_back(group.Rank(r));
        std::vector<std::vector<std::byte>> in_place(static_cast<size_t>(world)), out(static_cast<size_t>(world));
        std::vector<std::thread> threads;
        for (int r = 0; r < world; ++r)
          threads.emplace_back([&, r] {
            Communicator& c = *comms[static_cast<size_t>(r)];
            std::vector<std::byte>& buf = in_place[static_cast<size_t>(r)];
            buf = Input(r, count, type);
            EXPECT_TRUE(c.Allreduce(buf.data(), buf.data(), count, type, ReduceOp::kSum).ok());
            const std::vector<std::byte> send = Input(r, count, type);
            out[static_cast<size_t>(r)].assign(send.size(), std::byte{0});
            EXPECT_TRUE(c.Allreduce(send.data(), out[static_cast<size_t>(r)].data(), count, type, ReduceOp::kSum).ok());
          });
        for (auto& t : threads) t.join();
        for (int r = 0; r < world; ++r) {
          EXPECT_TRUE(in_place[static_cast<size_t>(r)] == want)
              << (type == DataType::kFloat16 ? "fp16" : "fp32") << ", world " << world << ", count " << count
              << ", rank " << r << ": in place";
          EXPECT_TRUE(out[static_cast<size_t>(r)] == want)
              << (type == DataType::kFloat16 ? "fp16" : "fp32") << ", world " << world << ", count " << count
              << ", rank " << r << ": out of place";
        }
      }
    }
  }
}

}  // namespace
}  // namespace cupcake::comm
