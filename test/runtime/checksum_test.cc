// The snapshot checksum (checkpoint_format.h): every implementation of its block arithmetic
// this CPU runs, and the streaming Hasher over any split of the bytes, equal a reference written
// here from the format's description alone; and it sees the corruptions a torn or damaged copy
// makes (a changed bit, two stripes swapped, bytes appended).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "checkpoint_format.h"

namespace cupcake::runtime::internal {
namespace {

// The format's description, word for word, with nothing shared with the library's code.
uint64_t Reference(const std::vector<std::byte>& bytes) {
  constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL, kP2 = 0xC2B2AE3D27D4EB4FULL;
  uint64_t key[23];
  uint64_t x = kP1;
  for (uint64_t& k : key) {
    x += 0x9E3779B97F4A7C15ULL;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    k = z ^ (z >> 31);
  }
  uint64_t lane[8];
  for (int i = 0; i < 8; ++i) lane[i] = key[22 - i];
  std::vector<std::byte> padded = bytes;
  padded.resize((bytes.size() + 1023) / 1024 * 1024);
  for (size_t block = 0; block < padded.size(); block += 1024) {
    for (int s = 0; s < 16; ++s) {
      for (int i = 0; i < 8; ++i) {
        uint64_t w;
        std::memcpy(&w, padded.data() + block + 64 * s + 8 * i, 8);
        const uint64_t k = w ^ key[s + i];
        lane[i] += w + (k & 0xFFFFFFFFULL) * (k >> 32);
      }
    }
    for (int i = 0; i < 8; ++i) lane[i] = (lane[i] ^ (lane[i] >> 47) ^ key[i]) * kP2;
  }
  uint64_t h = static_cast<uint64_t>(bytes.size()) * kP1;
  for (uint64_t l : lane) {
    h += l * kP2;
    h = ((h << 31) | (h >> 33)) * kP1;
  }
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  return h;
}

std::vector<std::byte> Random(size_t n, unsigned seed) {
  std::mt19937_64 gen(seed);
  std::vector<std::byte> v(n);
  for (std::byte& b : v) b = static_cast<std::byte>(gen());
  return v;
}

constexpr size_t kSizes[] = {0, 1, 7, 8, 63, 64, 65, 1023, 1024, 1025, 4096, 70000};

TEST(Checksum, EveryPathEqualsTheReference) {
  int paths = 0;
  for (HashPath path : {HashPath::kPortable, HashPath::kSse2, HashPath::kAvx2}) {
    if (!HashPathAvailable(path)) continue;
    ++paths;
    for (size_t n : kSizes) {
      const std::vector<std::byte> bytes = Random(n, static_cast<unsigned>(n) + 1);
      EXPECT_EQ(ChecksumOn(path, bytes.data(), n), Reference(bytes))
          << "path " << static_cast<int>(path) << ", " << n << " bytes";
    }
  }
#if defined(__x86_64__)
  EXPECT_GE(paths, 2);  // portable and SSE2 on every x86-64
#endif
  const std::vector<std::byte> bytes = Random(70000, 9);
  EXPECT_EQ(Checksum(bytes.data(), bytes.size()), Reference(bytes));
}

TEST(Checksum, HasherOverPiecesEqualsTheWhole) {
  const std::vector<std::byte> bytes = Random(5000, 3);
  const uint64_t whole = Reference(bytes);
  for (size_t cut1 : {0, 1, 63, 1000, 1024, 2047}) {
    for (size_t cut2 : {cut1, cut1 + 1, cut1 + 1024, size_t{4999}, size_t{5000}}) {
      if (cut2 < cut1 || cut2 > bytes.size()) continue;
      Hasher h;
      h.Update(bytes.data(), cut1);
      h.Update(bytes.data() + cut1, cut2 - cut1);
      h.Update(bytes.data() + cut2, bytes.size() - cut2);
      EXPECT_EQ(h.Final(), whole) << "cuts at " << cut1 << " and " << cut2;
    }
  }
}

TEST(Checksum, SeesACorruptedCopy) {
  const std::vector<std::byte> bytes = Random(8192, 5);
  const uint64_t sum = Checksum(bytes.data(), bytes.size());
  for (size_t at : {size_t{0}, size_t{777}, size_t{8191}}) {
    std::vector<std::byte> flipped = bytes;
    flipped[at] ^= std::byte{0x10};
    EXPECT_NE(Checksum(flipped.data(), flipped.size()), sum) << "bit flipped at " << at;
  }
  std::vector<std::byte> swapped = bytes;  // stripes 0 and 1 of the first block
  std::memcpy(swapped.data(), bytes.data() + 64, 64);
  std::memcpy(swapped.data() + 64, bytes.data(), 64);
  EXPECT_NE(Checksum(swapped.data(), swapped.size()), sum);
  std::vector<std::byte> blocks = bytes;  // blocks 0 and 1
  std::memcpy(blocks.data(), bytes.data() + 1024, 1024);
  std::memcpy(blocks.data() + 1024, bytes.data(), 1024);
  EXPECT_NE(Checksum(blocks.data(), blocks.size()), sum);
  std::vector<std::byte> longer = bytes;  // a zero appended: the length is hashed
  longer.push_back(std::byte{0});
  EXPECT_NE(Checksum(longer.data(), longer.size()), sum);
}

}  // namespace
}  // namespace cupcake::runtime::internal
