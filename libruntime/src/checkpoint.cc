// Checkpointer (checkpoint.h, docs/CHECKPOINT.md): snapshots in a POSIX shared-memory segment
// per rank with two slots, a background copy per commit, agreement on the newest step every rank
// holds, persisted files written durably.
#include "cupcake/runtime/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>

#include "checkpoint_format.h"
#include "cupcake/comm/topology.h"
#include "cupcake/proto/file_io.h"
#include "replica_placement.h"

namespace cupcake::runtime {
namespace internal {

namespace {
inline uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
constexpr uint64_t kPrime1 = 0x9E3779B185EBCA87ULL, kPrime2 = 0xC2B2AE3D27D4EB4FULL;
inline uint64_t Mix(uint64_t lane, uint64_t word) { return Rotl(lane + word * kPrime2, 31) * kPrime1; }

std::string Hex(uint64_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << v;
  return os.str();
}
}  // namespace

namespace {
// The striped hash's constants (checkpoint_format.h): a key word per lane and stripe position of
// a block (kKeyWords = kStripesPerBlock + kLanes - 1), odd 64-bit constants.
constexpr size_t kLanes = 8, kStripeBytes = 8 * kLanes, kStripesPerBlock = Hasher::kBlockBytes / kStripeBytes;
constexpr size_t kKeyWords = kStripesPerBlock + kLanes - 1;
constexpr std::array<uint64_t, kKeyWords> MakeKey() {
  std::array<uint64_t, kKeyWords> key{};
  uint64_t x = kPrime1;
  for (uint64_t& k : key) {  // splitmix64 from kPrime1
    x += 0x9E3779B97F4A7C15ULL;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    k = z ^ (z >> 31);
  }
  return key;
}
constexpr std::array<uint64_t, kKeyWords> kKey = MakeKey();

// Each block's end: lane_i = (lane_i ^ lane_i >> 47 ^ key[i]) * P2, so that a block's stripes
// do not commute with the next block's.
void ScrambleLanes(uint64_t* lanes) {
  for (size_t i = 0; i < kLanes; ++i) lanes[i] = (lanes[i] ^ (lanes[i] >> 47) ^ kKey[i]) * kPrime2;
}

// `blocks` whole blocks into the lanes: stripe s adds w_i + lo32(k) * hi32(k), k = w_i ^
// key[s + i], to lane i. Three implementations of the same arithmetic: AVX2 (four lanes per
// instruction), SSE2 (two; every x86-64) and portable C++; the tests hold them to a reference.
void AccumulatePortable(uint64_t* lanes, const std::byte* data, size_t blocks) {
  for (size_t b = 0; b < blocks; ++b) {
    for (size_t s = 0; s < kStripesPerBlock; ++s, data += kStripeBytes) {
      uint64_t w[kLanes];
      std::memcpy(w, data, kStripeBytes);
      for (size_t i = 0; i < kLanes; ++i) {
        const uint64_t k = w[i] ^ kKey[s + i];
        lanes[i] += w[i] + (k & 0xFFFFFFFFULL) * (k >> 32);
      }
    }
    ScrambleLanes(lanes);
  }
}

#if defined(__x86_64__)
void AccumulateSse2(uint64_t* lanes, const std::byte* data, size_t blocks) {
  __m128i acc[kLanes / 2];
  for (size_t j = 0; j < kLanes / 2; ++j) acc[j] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(lanes + 2 * j));
  for (size_t b = 0; b < blocks; ++b) {
    for (size_t s = 0; s < kStripesPerBlock; ++s, data += kStripeBytes) {
      for (size_t j = 0; j < kLanes / 2; ++j) {
        const __m128i w = _mm_loadu_si128(reinterpret_cast<const __m128i*>(data) + j);
        const __m128i k = _mm_xor_si128(w, _mm_loadu_si128(reinterpret_cast<const __m128i*>(kKey.data() + s + 2 * j)));
        acc[j] = _mm_add_epi64(acc[j], _mm_add_epi64(w, _mm_mul_epu32(k, _mm_srli_epi64(k, 32))));
      }
    }
    for (size_t j = 0; j < kLanes / 2; ++j) _mm_storeu_si128(reinterpret_cast<__m128i*>(lanes + 2 * j), acc[j]);
    ScrambleLanes(lanes);
    for (size_t j = 0; j < kLanes / 2; ++j) acc[j] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(lanes + 2 * j));
  }
}

__attribute__((target("avx2"))) void AccumulateAvx2(uint64_t* lanes, const std::byte* data, size_t blocks) {
  __m256i acc[kLanes / 4];
  for (size_t j = 0; j < kLanes / 4; ++j) acc[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lanes + 4 * j));
  for (size_t b = 0; b < blocks; ++b) {
    for (size_t s = 0; s < kStripesPerBlock; ++s, data += kStripeBytes) {
      for (size_t j = 0; j < kLanes / 4; ++j) {
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data) + j);
        const __m256i k =
            _mm256_xor_si256(w, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kKey.data() + s + 4 * j)));
        acc[j] = _mm256_add_epi64(acc[j], _mm256_add_epi64(w, _mm256_mul_epu32(k, _mm256_srli_epi64(k, 32))));
      }
    }
    for (size_t j = 0; j < kLanes / 4; ++j) _mm256_storeu_si256(reinterpret_cast<__m256i*>(lanes + 4 * j), acc[j]);
    ScrambleLanes(lanes);
    for (size_t j = 0; j < kLanes / 4; ++j)
      acc[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lanes + 4 * j));
  }
}
#endif

using AccumulateFn = void (*)(uint64_t*, const std::byte*, size_t);
AccumulateFn Accumulator(HashPath path) {
  switch (path) {
    case HashPath::kPortable: return AccumulatePortable;
#if defined(__x86_64__)
    case HashPath::kSse2: return AccumulateSse2;
    case HashPath::kAvx2: return AccumulateAvx2;
#else
    case HashPath::kSse2:
    case HashPath::kAvx2: break;
#endif
  }
  return nullptr;
}

// The fastest path this CPU runs, chosen once.
AccumulateFn FastestAccumulator() {
  static const AccumulateFn chosen = [] {
    for (HashPath p : {HashPath::kAvx2, HashPath::kSse2})
      if (HashPathAvailable(p)) return Accumulator(p);
    return Accumulator(HashPath::kPortable);
  }();
  return chosen;
}
}  // namespace

bool HashPathAvailable(HashPath path) {
  switch (path) {
    case HashPath::kPortable: return true;
#if defined(__x86_64__)
    case HashPath::kSse2: return true;
    case HashPath::kAvx2: return __builtin_cpu_supports("avx2");
#else
    case HashPath::kSse2:
    case HashPath::kAvx2: return false;
#endif
  }
  return false;
}

uint64_t ChecksumOn(HashPath path, const std::byte* data, size_t bytes) {
  Hasher hasher(Accumulator(path));
  hasher.Update(data, bytes);
  return hasher.Final();
}

Hasher::Hasher() : Hasher(FastestAccumulator()) {}

Hasher::Hasher(void (*accumulate)(uint64_t*, const std::byte*, size_t)) : accumulate_(accumulate) {
  for (size_t i = 0; i < kLanes; ++i) lanes_[i] = kKey[kKeyWords - 1 - i];
}

void Hasher::Update(const std::byte* data, size_t bytes) {
  if (bytes == 0) return;  // (an empty span's data() may be null)
  total_bytes_ += bytes;
  if (pending_bytes_ > 0) {  // complete the pending block first
    const size_t take = std::min(bytes, kBlockBytes - pending_bytes_);
    std::memcpy(pending_ + pending_bytes_, data, take);
    pending_bytes_ += take;
    data += take;
    bytes -= take;
    if (pending_bytes_ < kBlockBytes) return;
    accumulate_(lanes_, pending_, 1);
    pending_bytes_ = 0;
  }
  const size_t blocks = bytes / kBlockBytes;
  accumulate_(lanes_, data, blocks);
  pending_bytes_ = bytes - kBlockBytes * blocks;
  std::memcpy(pending_, data + kBlockBytes * blocks, pending_bytes_);
}

uint64_t Hasher::Final() const {
  // The pending bytes, zero-padded to a block, as a last block; then the lanes and the length.
  uint64_t lanes[kLanes];
  std::memcpy(lanes, lanes_, sizeof(lanes));
  if (pending_bytes_ > 0) {
    std::byte last[kBlockBytes] = {};
    std::memcpy(last, pending_, pending_bytes_);
    accumulate_(lanes, last, 1);
  }
  uint64_t h = total_bytes_ * kPrime1;
  for (uint64_t lane : lanes) h = Mix(h, lane);
  h ^= h >> 33;
  h *= kPrime2;
  h ^= h >> 29;
  return h;
}

uint64_t Checksum(const std::byte* data, size_t bytes) {
  Hasher hasher;
  hasher.Update(data, bytes);
  return hasher.Final();
}

int64_t DirectoryBytes(const std::vector<std::string>& names, size_t metadata_bytes) {
  int64_t bytes = 8 + 8 + 4 + 4 + 8 + 4 + 4;
  for (const std::string& n : names) bytes += 4 + 4 + 8 + static_cast<int64_t>(n.size());
  return bytes + static_cast<int64_t>(metadata_bytes);
}

namespace {
// Reads fields in order from a payload, checking each against its end.
class Reader {
 public:
  Reader(std::span<const std::byte> bytes, const std::string& source) : bytes_(bytes), source_(source) {}
  template <typename T>
  Status Read(T* out, const char* field) {
    if (at_ + sizeof(T) > bytes_.size()) return Truncated(field, sizeof(T));
    std::memcpy(out, bytes_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return Status::Ok();
  }
  Status ReadString(uint64_t n, std::string* out, const std::string& field) {
    if (n > bytes_.size() - at_) return Truncated(field.c_str(), n);
    out->assign(reinterpret_cast<const char*>(bytes_.data() + at_), n);  // NOLINT: bytes as chars
    at_ += n;
    return Status::Ok();
  }
  size_t at() const { return at_; }

 private:
  Status Truncated(const char* field, uint64_t n) const {
    return DataLossError(source_ + ": " + field + ": truncated; got " + std::to_string(bytes_.size() - at_) +
                         " bytes left, expected " + std::to_string(n));
  }
  std::span<const std::byte> bytes_;
  const std::string& source_;
  size_t at_ = 0;
};
}  // namespace

namespace {
// The fields from the magic (`magic`, named `what` in the message) to the metadata's end, and the
// entries' sizes, into `s`; s.data_offset is where the entries' bytes begin.
Status ParseDirectory(Reader& r, const char (&magic)[8], const char* what, const std::string& source,
                      ParsedSnapshot* s) {
  char got[8];
  CUPCAKE_RETURN_IF_ERROR(r.Read(&got, "magic"));
  if (std::memcmp(got, magic, 8) != 0)
    return DataLossError(source + ": magic: not a Cupcake " + what + "; got '" + std::string(got, 8) +
                         "', expected '" + std::string(magic, 8) + "'");
  uint64_t metadata_bytes = 0;
  uint32_t count = 0, zero = 0;
  CUPCAKE_RETURN_IF_ERROR(r.Read(&s->step, "step"));
  CUPCAKE_RETURN_IF_ERROR(r.Read(&s->rank, "rank"));
  CUPCAKE_RETURN_IF_ERROR(r.Read(&s->world_size, "world_size"));
  CUPCAKE_RETURN_IF_ERROR(r.Read(&metadata_bytes, "metadata_bytes"));
  CUPCAKE_RETURN_IF_ERROR(r.Read(&count, "entry_count"));
  CUPCAKE_RETURN_IF_ERROR(r.Read(&zero, "entry_count"));
  for (uint32_t e = 0; e < count; ++e) {
    const std::string field = "entries[" + std::to_string(e) + "]";
    uint32_t name_bytes = 0, flags = 0;
    uint64_t size_bytes = 0;
    CUPCAKE_RETURN_IF_ERROR(r.Read(&name_bytes, (field + ".name").c_str()));
    CUPCAKE_RETURN_IF_ERROR(r.Read(&flags, (field + ".flags").c_str()));
    CUPCAKE_RETURN_IF_ERROR(r.Read(&size_bytes, (field + ".size_bytes").c_str()));
    SnapshotEntry entry;
    CUPCAKE_RETURN_IF_ERROR(r.ReadString(name_bytes, &entry.name, field + ".name"));
    if (size_bytes > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return DataLossError(source + ": " + field + ".size_bytes: out of range; got " + std::to_string(size_bytes));
    entry.size_bytes = static_cast<int64_t>(size_bytes);
    entry.shared = (flags & kEntryShared) != 0;
    s->entries.push_back(std::move(entry));
  }
  CUPCAKE_RETURN_IF_ERROR(r.ReadString(metadata_bytes, &s->metadata, "metadata"));
  s->data_offset = static_cast<int64_t>(r.at());
  return Status::Ok();
}

// Lays the entries' bytes out from s->data_offset in entry order (a replica: only those that are
// not shared), each within the `payload_bytes`; returns where the last ends.
StatusOr<int64_t> PlaceEntries(ParsedSnapshot* s, bool rank_part, int64_t payload_bytes, const std::string& source) {
  int64_t at = s->data_offset;
  for (size_t e = 0; e < s->entries.size(); ++e) {
    SnapshotEntry& entry = s->entries[e];
    if (rank_part && entry.shared) {
      entry.offset = -1;
      continue;
    }
    if (entry.size_bytes > payload_bytes - at)
      return DataLossError(source + ": entries[" + std::to_string(e) + "].size_bytes: beyond the payload; got " +
                           std::to_string(entry.size_bytes) + ", expected <= " + std::to_string(payload_bytes - at) +
                           " (bytes left)");
    entry.offset = at;
    at += entry.size_bytes;
  }
  return at;
}
}  // namespace

StatusOr<ParsedSnapshot> ParseSnapshot(std::span<const std::byte> payload, const std::string& source) {
  Reader r(payload, source);
  ParsedSnapshot s;
  CUPCAKE_RETURN_IF_ERROR(ParseDirectory(r, kSnapshotMagic, "snapshot", source, &s));
  const int64_t size = static_cast<int64_t>(payload.size());
  CUPCAKE_ASSIGN_OR_RETURN(const int64_t at, PlaceEntries(&s, false, size, source));
  if (at != size)
    return DataLossError(source + ": payload_bytes: does not match the entries; got " + std::to_string(size) +
                         ", expected " + std::to_string(at));
  return s;
}

StatusOr<ParsedSnapshot> ParseRankPart(std::span<const std::byte> payload, const std::string& source) {
  Reader r(payload, source);
  ParsedSnapshot s;
  CUPCAKE_RETURN_IF_ERROR(ParseDirectory(r, kRankPartMagic, "replica", source, &s));
  const int64_t size = static_cast<int64_t>(payload.size());
  CUPCAKE_ASSIGN_OR_RETURN(const int64_t at, PlaceEntries(&s, true, size, source));
  if (at + 8 != size)
    return DataLossError(source + ": payload_bytes: does not match the entries; got " + std::to_string(size) +
                         ", expected " + std::to_string(at + 8) + " (the entries and the snapshot's checksum)");
  std::memcpy(&s.snapshot_checksum, payload.data() + at, 8);
  return s;
}

namespace {

// A replica of `snapshot` as the pieces it is made of, in order: the magic, the snapshot's bytes
// from its step to its metadata's end, its own (not shared) entries' bytes, and the 8 bytes of
// `checksum`. They point into `snapshot` and at `checksum`.
std::vector<std::span<const std::byte>> RankPartPieces(std::span<const std::byte> snapshot,
                                                       const ParsedSnapshot& parsed, const uint64_t& checksum) {
  std::vector<std::span<const std::byte>> pieces;
  pieces.emplace_back(reinterpret_cast<const std::byte*>(kRankPartMagic), 8);  // NOLINT: chars as bytes
  pieces.push_back(snapshot.subspan(8, static_cast<size_t>(parsed.data_offset - 8)));
  for (const SnapshotEntry& e : parsed.entries)
    if (!e.shared) pieces.push_back(snapshot.subspan(static_cast<size_t>(e.offset), static_cast<size_t>(e.size_bytes)));
  pieces.emplace_back(reinterpret_cast<const std::byte*>(&checksum), 8);  // NOLINT: an integer as bytes
  return pieces;
}

}  // namespace

std::vector<std::byte> MakeRankPart(std::span<const std::byte> snapshot, const ParsedSnapshot& parsed,
                                    uint64_t checksum) {
  const std::vector<std::span<const std::byte>> pieces = RankPartPieces(snapshot, parsed, checksum);
  size_t bytes = 0;
  for (const std::span<const std::byte>& piece : pieces) bytes += piece.size();
  std::vector<std::byte> out;
  out.reserve(bytes);
  for (const std::span<const std::byte>& piece : pieces) out.insert(out.end(), piece.begin(), piece.end());
  return out;
}

std::vector<std::byte> SharedBytes(std::span<const std::byte> snapshot, const ParsedSnapshot& parsed) {
  std::vector<std::byte> out;
  for (const SnapshotEntry& e : parsed.entries)
    if (e.shared) out.insert(out.end(), snapshot.begin() + e.offset, snapshot.begin() + e.offset + e.size_bytes);
  return out;
}

StatusOr<std::vector<std::byte>> RebuildSnapshot(std::span<const std::byte> rank_part, const ParsedSnapshot& parsed,
                                                 std::span<const std::byte> shared, const std::string& source) {
  int64_t shared_bytes = 0, bytes = parsed.data_offset;
  for (const SnapshotEntry& e : parsed.entries) {
    bytes += e.size_bytes;
    if (e.shared) shared_bytes += e.size_bytes;
  }
  if (static_cast<int64_t>(shared.size()) != shared_bytes)
    return DataLossError(source + ": shared entries: not this snapshot's; got " + std::to_string(shared.size()) +
                         " bytes, expected " + std::to_string(shared_bytes));
  std::vector<std::byte> out(static_cast<size_t>(bytes));
  std::memcpy(out.data(), kSnapshotMagic, 8);
  std::memcpy(out.data() + 8, rank_part.data() + 8, static_cast<size_t>(parsed.data_offset - 8));
  std::byte* at = out.data() + parsed.data_offset;
  const std::byte* next_shared = shared.data();
  for (const SnapshotEntry& e : parsed.entries) {
    const std::byte* from = e.shared ? next_shared : rank_part.data() + e.offset;
    std::memcpy(at, from, static_cast<size_t>(e.size_bytes));
    if (e.shared) next_shared += e.size_bytes;
    at += e.size_bytes;
  }
  const uint64_t got = Checksum(out.data(), out.size());
  if (got != parsed.snapshot_checksum)
    return DataLossError(source + ": checksum: the snapshot rebuilt with another rank's shared entries is not this "
                         "rank's; got " + Hex(got) + ", expected " + Hex(parsed.snapshot_checksum) +
                         " (the entries registered Scope::kShared differ between the ranks)");
  return out;
}

ByteRange ShareOf(int64_t total, int world, int rank) {
  // floor(r T / W) without overflow: T = q W + m, so r T / W = r q + floor(r m / W), r m < W^2.
  const auto start = [&](int64_t r) { return total / world * r + total % world * r / world; };
  return {start(rank), start(rank + 1) - start(rank)};
}

uint64_t CombinePrints(const std::vector<std::pair<int, uint64_t>>& prints) {
  std::vector<uint64_t> pairs;
  for (const auto& [index, print] : prints) pairs.insert(pairs.end(), {static_cast<uint64_t>(index), print});
  return Checksum(reinterpret_cast<const std::byte*>(pairs.data()),  // NOLINT: integers as bytes
                  pairs.size() * sizeof(uint64_t));
}

uint64_t SharedFingerprint(const ParsedSnapshot& parsed, std::span<const std::byte> shared) {
  std::vector<std::pair<int, uint64_t>> prints;
  size_t at = 0;
  for (size_t e = 0; e < parsed.entries.size(); ++e) {
    const SnapshotEntry& entry = parsed.entries[e];
    if (!entry.shared) continue;
    prints.emplace_back(static_cast<int>(e), Checksum(shared.data() + at, static_cast<size_t>(entry.size_bytes)));
    at += static_cast<size_t>(entry.size_bytes);
  }
  return CombinePrints(prints);
}

void MakeShare(std::span<const std::byte> snapshot, const ParsedSnapshot& parsed, uint64_t checksum,
               uint64_t shared_print, int rank, int world, ShareFile* out) {
  out->snapshot_checksum = checksum;
  const std::vector<std::span<const std::byte>> part = RankPartPieces(snapshot, parsed, out->snapshot_checksum);
  int64_t part_bytes = 0, total = 0;
  for (const std::span<const std::byte>& piece : part) part_bytes += static_cast<int64_t>(piece.size());
  for (const SnapshotEntry& e : parsed.entries)
    if (e.shared) total += e.size_bytes;
  std::vector<std::span<const std::byte>> share;
  // The share: [range.offset, range.offset + range.bytes) of the shared entries laid end to end.
  const ByteRange range = ShareOf(total, world, rank);
  int64_t at = 0;  // where the current entry begins among the shared bytes
  for (const SnapshotEntry& e : parsed.entries) {
    if (!e.shared) continue;
    const int64_t from = std::max(range.offset, at), to = std::min(range.offset + range.bytes, at + e.size_bytes);
    if (from < to)
      share.push_back(snapshot.subspan(static_cast<size_t>(e.offset + from - at), static_cast<size_t>(to - from)));
    at += e.size_bytes;
  }
  ShareHeader& h = out->header;
  h = {};
  std::memcpy(h.magic, kShareMagic, 8);
  h.version = kPersistedFormatVersion;
  h.rank = rank;
  h.world_size = world;
  h.rank_part_bytes = static_cast<uint64_t>(part_bytes);
  h.shared_bytes = static_cast<uint64_t>(total);
  h.share_offset = static_cast<uint64_t>(range.offset);
  h.share_bytes = static_cast<uint64_t>(range.bytes);
  h.shared_print = shared_print;
  out->pieces.clear();
  out->pieces.emplace_back(reinterpret_cast<const std::byte*>(&h), sizeof(h));  // NOLINT: POD bytes
  out->pieces.insert(out->pieces.end(), part.begin(), part.end());
  out->pieces.insert(out->pieces.end(), share.begin(), share.end());
}

Status CheckShareFormat(std::span<const std::byte> payload, const std::string& source) {
  const std::string afresh = "restore with the Cupcake that wrote it, or remove the files to start afresh)";
  if (payload.size() >= 8 && std::memcmp(payload.data(), kSnapshotMagic, 8) == 0)
    return DataLossError(source +
                         ": magic: a whole snapshot of persisted format 1, which this version does not read; "
                         "got '" +
                         std::string(kSnapshotMagic, 8) + "', expected '" + std::string(kShareMagic, 8) + "' (format " +
                         std::to_string(kPersistedFormatVersion) + ": each rank's share; " + afresh);
  ShareHeader h{};
  if (payload.size() < sizeof(h) || std::memcmp(payload.data(), kShareMagic, 8) != 0) return Status::Ok();
  std::memcpy(&h, payload.data(), sizeof(h));
  if (h.version != kPersistedFormatVersion)
    return DataLossError(source + ": version: persisted format " + std::to_string(h.version) +
                         ", which this version does not read; got " + std::to_string(h.version) + ", expected " +
                         std::to_string(kPersistedFormatVersion) + " (" +
                         (h.version == 2 ? "format 2 has another checksum function; " : "") + afresh);
  return Status::Ok();
}

StatusOr<ParsedShare> ParseShare(std::span<const std::byte> payload, const std::string& source) {
  CUPCAKE_RETURN_IF_ERROR(CheckShareFormat(payload, source));
  ShareHeader h{};
  Reader r(payload, source);
  CUPCAKE_RETURN_IF_ERROR(r.Read(&h, "header"));
  if (std::memcmp(h.magic, kShareMagic, 8) != 0)
    return DataLossError(source + ": magic: not a Cupcake persisted share; got '" + std::string(h.magic, 8) +
                         "', expected '" + std::string(kShareMagic, 8) + "'");
  const uint64_t left = payload.size() - r.at();
  if (h.rank_part_bytes > left || h.share_bytes != left - h.rank_part_bytes)
    return DataLossError(source + ": rank_part_bytes, share_bytes: do not match the file; got " +
                         std::to_string(h.rank_part_bytes) + " + " + std::to_string(h.share_bytes) + ", expected " +
                         std::to_string(left) + " (the bytes after the header)");
  ParsedShare out;
  out.rank_part = payload.subspan(r.at(), h.rank_part_bytes);
  out.share = payload.subspan(r.at() + h.rank_part_bytes);
  CUPCAKE_ASSIGN_OR_RETURN(out.parsed, ParseRankPart(out.rank_part, source));
  if (h.rank != out.parsed.rank || h.world_size != out.parsed.world_size)
    return DataLossError(source + ": rank: the header's is not the snapshot's; got rank " + std::to_string(h.rank) +
                         " of " + std::to_string(h.world_size) + ", expected rank " + std::to_string(out.parsed.rank) +
                         " of " + std::to_string(out.parsed.world_size));
  int64_t total = 0;
  for (const SnapshotEntry& e : out.parsed.entries)
    if (e.shared) total += e.size_bytes;
  if (h.shared_bytes != static_cast<uint64_t>(total))
    return DataLossError(source + ": shared_bytes: does not match the shared entries; got " +
                         std::to_string(h.shared_bytes) + ", expected " + std::to_string(total));
  if (h.world_size < 1 || h.rank < 0 || h.rank >= h.world_size)
    return DataLossError(source + ": rank: out of range; got rank " + std::to_string(h.rank) + " of " +
                         std::to_string(h.world_size));
  out.range = ShareOf(total, h.world_size, h.rank);
  if (h.share_offset != static_cast<uint64_t>(out.range.offset) ||
      h.share_bytes != static_cast<uint64_t>(out.range.bytes))
    return DataLossError(source + ": share_offset, share_bytes: not rank " + std::to_string(h.rank) +
                         "'s share; got [" + std::to_string(h.share_offset) + ", +" + std::to_string(h.share_bytes) +
                         "), expected [" + std::to_string(out.range.offset) + ", +" + std::to_string(out.range.bytes) +
                         ") of " + std::to_string(total) + " bytes split among " + std::to_string(h.world_size) +
                         " ranks");
  out.shared_bytes = total;
  out.shared_print = h.shared_print;
  return out;
}

}  // namespace internal

namespace {

using internal::kHeaderBytes;
using internal::SegmentHeader;
using internal::SlotHeader;

using internal::Hex;

uint64_t LoadState(SlotHeader& slot) { return std::atomic_ref<uint64_t>(slot.state).load(std::memory_order_acquire); }
void StoreState(SlotHeader& slot, uint64_t state) {
  std::atomic_ref<uint64_t>(slot.state).store(state, std::memory_order_release);
}

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > 100) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '-';
  });
}

std::string Errno(const std::string& what, int err) { return what + " failed: " + std::strerror(err); }

// Writes all of `bytes` to `fd`.
bool WriteAll(int fd, const std::byte* bytes, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, bytes, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    bytes += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Durable replace (the contract of proto's WriteFileAtomic, plus the directory's fsync so the
// rename itself survives a power loss): `<path>.tmp.<pid>`, written (the pieces in order, then
// their trailer: checksum, size, magic), fsync'd, renamed over `path`, then the directory
// fsync'd. A reader sees no file, the old one or the whole new one; the loader ignores *.tmp.*
// names. With `gate` and `block_bytes` > 0 (CheckpointOptions::persist_chunk_bytes) each block of
// at most that many bytes is written and fdatasync'd inside one gate transfer that begins when
// the network is idle (NetworkGate::BeginTransferWhenIdle); its checksum is taken before, outside
// the transfer.
Status WriteDurably(const std::string& dir, const std::string& file, std::span<const std::span<const std::byte>> pieces,
                    NetworkGate* gate, int64_t block_bytes) {
  const std::string path = dir + "/" + file;
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return UnavailableError(tmp + ": " + Errno("open", errno));
  const bool paced = gate != nullptr && block_bytes > 0;
  const size_t block = paced ? static_cast<size_t>(block_bytes) : std::numeric_limits<size_t>::max();
  internal::Hasher hasher;
  uint64_t total = 0;
  bool ok = true;
  int err = 0;
  for (const std::span<const std::byte>& piece : pieces) {
    for (size_t done = 0; ok && done < piece.size();) {
      const size_t n = std::min(piece.size() - done, block);
      const std::byte* bytes = piece.data() + done;
      hasher.Update(bytes, n);
      if (paced) gate->BeginTransferWhenIdle();
      ok = WriteAll(fd, bytes, n) && (!paced || ::fdatasync(fd) == 0);
      if (!ok) err = errno;
      if (paced) gate->EndTransfer();
      done += n;
      total += n;
    }
  }
  internal::Trailer trailer{hasher.Final(), total, {}};
  std::memcpy(trailer.magic, internal::kTrailerMagic, 8);
  if (ok && !WriteAll(fd, reinterpret_cast<const std::byte*>(&trailer), sizeof(trailer)))  // NOLINT: POD bytes
    ok = false, err = errno;
  if (ok && ::fsync(fd) != 0) ok = false, err = errno;
  ::close(fd);
  if (!ok) {
    ::unlink(tmp.c_str());
    return UnavailableError(tmp + ": " + Errno("write", err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    err = errno;
    ::unlink(tmp.c_str());
    return UnavailableError(path + ": " + Errno("rename", err));
  }
  // Best effort: a file system that cannot sync a directory has still synced the file's bytes.
  (void)SyncDirectory(dir);
  return Status::Ok();
}

// Whether `t` is a decimal number this file's names carry (a step or a pid: 1 to 18 digits).
bool IsNumber(const std::string& t) {
  return !t.empty() && t.size() <= 18 && std::all_of(t.begin(), t.end(), ::isdigit);
}

// Calls fn(step, rest, file) for each file in `dir` named <name>-<rank>-<step>.ckpt<rest>: this
// rank's persisted files (rest empty) and WriteDurably's temporaries of them (rest .tmp.<pid>).
template <typename Fn>
void ForEachOwnFile(const std::string& dir, const std::string& name, int rank, Fn&& fn) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;
  const std::string prefix = name + "-" + std::to_string(rank) + "-";
  while (const dirent* e = ::readdir(d)) {
    const std::string f = e->d_name;
    if (f.compare(0, prefix.size(), prefix) != 0) continue;
    const size_t at = f.find(".ckpt", prefix.size());
    if (at == std::string::npos) continue;
    const std::string step = f.substr(prefix.size(), at - prefix.size());
    if (IsNumber(step)) fn(std::stoll(step), f.substr(at + 5), f);
  }
  ::closedir(d);
}

// This rank's persisted files in `dir`, step -> file name (exactly <name>-<rank>-<digits>.ckpt).
std::map<int64_t, std::string> PersistedFiles(const std::string& dir, const std::string& name, int rank) {
  std::map<int64_t, std::string> out;
  ForEachOwnFile(dir, name, rank, [&](int64_t step, const std::string& rest, const std::string& f) {
    if (rest.empty()) out[step] = f;
  });
  return out;
}

// Whether process `pid` lives on this host (kill(2) with no signal: EPERM is another user's
// live process).
bool ProcessAlive(pid_t pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

// Removes this rank's stale temporaries in `dir`: <name>-<rank>-<digits>.ckpt.tmp.<pid> (WriteDurably's
// names) whose writer is gone, i.e. <pid> is neither this process nor a live process on this
// host. A persist killed between its open and its rename leaves one; the loader never reads it.
// Only rank `rank` writes these names, one process at a time, so a live <pid> can only be a
// writer still at work (or a process that reused the pid): its file is left alone.
void RemoveStaleTemporaries(const std::string& dir, const std::string& name, int rank) {
  const std::string tmp = ".tmp.";
  std::vector<std::string> stale;
  ForEachOwnFile(dir, name, rank, [&](int64_t, const std::string& rest, const std::string& f) {
    if (rest.compare(0, tmp.size(), tmp) != 0) return;
    const std::string pid = rest.substr(tmp.size());
    if (!IsNumber(pid)) return;
    const long long p = std::stoll(pid);
    if (p <= 0 || p > std::numeric_limits<pid_t>::max()) return;
    if (static_cast<pid_t>(p) == ::getpid() || ProcessAlive(static_cast<pid_t>(p))) return;
    stale.push_back(dir + "/" + f);
  });
  for (const std::string& path : stale) ::unlink(path.c_str());
}

constexpr int kCandidates = 4;  // per rank, whole snapshots: two slots and two outgoing slots
constexpr int kFileCandidates = 2;  // per rank: its two newest persisted files (its shares)
constexpr int kReplicaCandidates = 2;  // per source a rank keeps replicas of: its two slots
// The session's entries (Entry::session_plane indexes this), in the order they are registered
// and restored: its control state first (making the snapshot's plan active restarts that plan's
// Q and padding, which the PowerSGD entries then write back), then its compressors' state, then
// its iteration counter (GraVAC's window steps, restored before, count before it).
enum class SessionPart { kControl, kCompressor, kIteration };
struct SessionEntry {
  const char* name;
  SessionPart part;
  ControlState control = ControlState::kPlan;  // kControl
  CompressorState state = CompressorState::kErrorFeedback;  // kCompressor
};
constexpr SessionEntry kSessionEntries[] = {
    {"session.plan", SessionPart::kControl, ControlState::kPlan},
    {"session.gravac", SessionPart::kControl, ControlState::kGravacWindow},
    {"session.error_feedback", SessionPart::kCompressor, {}, CompressorState::kErrorFeedback},
    {"session.momentum", SessionPart::kCompressor, {}, CompressorState::kMomentum},
    {"session.powersgd.padding", SessionPart::kCompressor, {}, CompressorState::kPowerSgdPadding},
    {"session.powersgd.q", SessionPart::kCompressor, {}, CompressorState::kPowerSgdQ},
    {"session.iteration", SessionPart::kIteration},
};

// What a session entry whose size changed since AttachSession asks of the job.
constexpr const char* kAttachAfterPlans =
    " (at AttachSession; attach the session after its last AddPlan and EnableGravac)";

// A float per model element (error feedback, momentum): an entry of every snapshot,
// empty when no plan keeps the plane (its zeros are no state).
bool PerElementPlane(const SessionEntry& e) {
  return e.part == SessionPart::kCompressor &&
         (e.state == CompressorState::kErrorFeedback || e.state == CompressorState::kMomentum);
}

// The entry's bytes as `session` holds them now (Session::ReadControlState, ReadState,
// iteration()).
StatusOr<std::vector<std::byte>> ReadSessionEntry(const Session& session, const SessionEntry& e) {
  const auto bytes = [](const auto& values) {
    std::vector<std::byte> out(values.size() * sizeof(values[0]));
    if (!out.empty()) std::memcpy(out.data(), values.data(), out.size());  // an absent entry: data() may be null
    return out;
  };
  switch (e.part) {
    case SessionPart::kControl: {
      CUPCAKE_ASSIGN_OR_RETURN(std::vector<double> values, session.ReadControlState(e.control));
      return bytes(values);
    }
    case SessionPart::kCompressor: {
      if (PerElementPlane(e) && !session.KeepsState(e.state)) return std::vector<std::byte>();
      CUPCAKE_ASSIGN_OR_RETURN(std::vector<float> values, session.ReadState(e.state));
      return bytes(values);
    }
    case SessionPart::kIteration: break;
  }
  return bytes(std::array<uint64_t, 1>{session.iteration()});
}

// Writes a restored entry's bytes back (WriteControlState, WriteState, SetIteration).
Status WriteSessionEntry(Session& session, const SessionEntry& e, std::span<const std::byte> bytes) {
  switch (e.part) {
    case SessionPart::kControl: {
      std::vector<double> values(bytes.size() / sizeof(double));
      std::memcpy(values.data(), bytes.data(), values.size() * sizeof(double));
      return session.WriteControlState(values, e.control);
    }
    case SessionPart::kCompressor: {
      if (bytes.empty() && PerElementPlane(e) && !session.KeepsState(e.state)) return Status::Ok();
      std::vector<float> values(bytes.size() / sizeof(float));
      std::memcpy(values.data(), bytes.data(), values.size() * sizeof(float));
      return session.WriteState(values, e.state);
    }
    case SessionPart::kIteration: break;
  }
  uint64_t iteration = 0;
  std::memcpy(&iteration, bytes.data(), sizeof(iteration));
  return session.SetIteration(iteration);
}

// Whether a snapshot of `session` has the entry, `bytes` its size now: the per-element planes
// (empty when no plan keeps them) and the counter always; the plan with several plans;
// PowerSGD's parts and GraVAC's window when there are some (other snapshots keep their layout
// without them).
bool HasEntry(const Session& session, const SessionEntry& e, size_t bytes) {
  if (e.part == SessionPart::kControl && e.control == ControlState::kPlan) return session.plan_count() > 1;
  if (PerElementPlane(e)) return true;
  return e.part == SessionPart::kIteration || bytes > 0;
}

// The entry's scope at a commit. Shared, so replicas leave them out:
// - a per-element plane no plan keeps: zeros on every rank;
// - PowerSGD's Q: its first value is drawn from the seed the ranks share, and every step sets it
//   to the allreduced sum / W, which every rank receives bitwise equal (as the gradients;
//   kernels/powersgd.h);
// - PowerSGD's padding: zero at first (and whenever its plan becomes active), and every step
//   subtracts the approximation P Q^T there, computed from those same allreduced P and Q; the
//   gradient adds nothing to the padding;
// - the plan: SwitchPlan agrees on it, and GraVAC switches to the rung its controller decided.
//   The controller's state is the same on every rank bitwise: Decide's inputs that it keeps
//   (the gain and time sums) are summed in rank order from one allgather of the same doubles,
//   so every rank computes the same values; this rank's bytes and probe cost go only into the
//   decision's record. Every rank synchronizes the same steps, so the window's count is the same.
// The rank's own: the per-element planes (of its own gradients) and GraVAC's window (its gain
// sums, times and probe's Q, from its own gradients and clock). The counter is the same on every
// rank, but kRank: a replica carries its 8 bytes.
Scope SessionScope(const Session& session, const SessionEntry& e) {
  switch (e.part) {
    case SessionPart::kControl: return e.control == ControlState::kPlan ? Scope::kShared : Scope::kRank;
    case SessionPart::kCompressor:
      return PerElementPlane(e) && session.KeepsState(e.state) ? Scope::kRank : Scope::kShared;
    case SessionPart::kIteration: break;
  }
  return Scope::kRank;
}
constexpr int kStreamRow = 5;  // a replica exchange's row per rank: step, bytes, checksum, offset, most
// Commit's agreement, per rank: the step committed, the newest step completed, ok, of that
// snapshot's kShared entries (SharedPrints) the step, the count and the combined fingerprint,
// and the replica gaps' fingerprint (GapsPrint).
constexpr int kAgreementRow = 7;
// The background copy's unit: copied, then hashed while it is still in the cache.
constexpr size_t kCopyBlockBytes = size_t{256} << 10;

// The fingerprints of a snapshot's kShared entries (Copy), which every rank's must match.
struct SharedPrints {
  struct Print {
    int index = 0;  // in the snapshot's entries
    std::string name;
    uint64_t fingerprint = 0;  // internal::Checksum of the entry's bytes
  };
  int64_t step = 0;  // 0: none (no copy since the Checkpointer was made or restored)
  std::vector<Print> entries;
  // Of the (index, fingerprint) pairs in order: what the agreement compares.
  uint64_t Combined() const {
    std::vector<std::pair<int, uint64_t>> pairs;
    for (const Print& p : entries) pairs.emplace_back(p.index, p.fingerprint);
    return internal::CombinePrints(pairs);
  }
};

struct Entry {
  std::string name;
  std::span<std::byte> memory;
  Capture capture = Capture::kInBackground;
  Scope scope = Scope::kRank;
  std::vector<std::byte> staged;  // kAtCommit: the copy made in Commit
  int session_plane = -1;  // kSessionEntries[i] (memory is `staged`)
};

// One shared-memory segment of two slots (checkpoint_format.h) that holds the snapshots of rank
// `owner`: this rank's own, those it streams to its successor (outgoing), or (replicas) its ring
// predecessor's. Not thread-safe: the training
// thread and the copy thread take turns (Commit joins the copy before it touches the segment).
class SlotSegment {
 public:
  SlotSegment(std::string shm_name, int owner, int world)
      : shm_name_(std::move(shm_name)), where_("/dev/shm" + shm_name_), owner_(owner), world_(world) {}
  ~SlotSegment() { Unmap(); }
  SlotSegment(const SlotSegment&) = delete;
  SlotSegment& operator=(const SlotSegment&) = delete;

  const std::string& where() const { return where_; }
  bool mapped() const { return base_ != nullptr; }
  SegmentHeader& header() const { return *static_cast<SegmentHeader*>(base_); }
  std::byte* slot(int i) const {
    return static_cast<std::byte*>(base_) + kHeaderBytes + static_cast<int64_t>(i) * header().slot_capacity;
  }

  void Unmap() {
    if (base_ != nullptr) ::munmap(base_, mapped_bytes_);
    if (fd_ >= 0) ::close(fd_);
    base_ = nullptr;
    fd_ = -1;
    mapped_bytes_ = 0;
  }

  // Maps an existing segment if its header is the owner's; a problem goes to `refused` (nothing
  // mapped). No segment: nothing mapped, nothing refused (a fresh host).
  void OpenExisting(std::vector<std::string>* refused) {
    if (base_ != nullptr) return;
    const int fd = ::shm_open(shm_name_.c_str(), O_RDWR, 0600);
    if (fd < 0) return;
    struct stat st {};
    if (::fstat(fd, &st) != 0 || st.st_size < kHeaderBytes) {
      refused->push_back(where_ + ": size: too small for a header; got " + std::to_string(st.st_size) +
                         " bytes, expected >= " + std::to_string(kHeaderBytes));
      ::close(fd);
      return;
    }
    void* base = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
      refused->push_back(where_ + ": " + Errno("mmap", errno));
      ::close(fd);
      return;
    }
    const std::string problem = HeaderProblem(*static_cast<SegmentHeader*>(base), st.st_size);
    if (!problem.empty()) {
      refused->push_back(where_ + ": " + problem);
      ::munmap(base, static_cast<size_t>(st.st_size));
      ::close(fd);
      return;
    }
    base_ = base;
    fd_ = fd;
    mapped_bytes_ = static_cast<size_t>(st.st_size);
  }

  // A segment whose slots hold `payload` bytes: the mapped one, an existing one, or a new one
  // (replacing a smaller one: its snapshots are lost; the persisted files remain).
  Status Ensure(int64_t payload) {
    std::vector<std::string> ignored;
    OpenExisting(&ignored);
    if (base_ != nullptr && header().slot_capacity >= static_cast<uint64_t>(payload)) return Status::Ok();
    Unmap();
    const int64_t capacity = (payload + payload / 16 + 65536 + 4095) / 4096 * 4096;
    const int64_t bytes = kHeaderBytes + 2 * capacity;
    const int fd = ::shm_open(shm_name_.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) return UnavailableError(where_ + ": " + Errno("shm_open", errno));
    if (::ftruncate(fd, bytes) != 0) {
      const int err = errno;
      ::close(fd);
      return UnavailableError(where_ + ": " + Errno("ftruncate to " + std::to_string(bytes) + " bytes", err));
    }
    void* base = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return UnavailableError(where_ + ": " + Errno("mmap", err));
    }
    base_ = base;
    fd_ = fd;
    mapped_bytes_ = static_cast<size_t>(bytes);
    SegmentHeader& h = header();
    std::memset(&h, 0, sizeof(h));  // fresh from ftruncate, zero already; explicit for the format
    std::memcpy(h.magic, internal::kSegmentMagic, 8);
    h.version = internal::kFormatVersion;
    h.slot_capacity = static_cast<uint64_t>(capacity);
    h.rank = owner_;
    h.world_size = world_;
    return Status::Ok();
  }

  // The slot that does not hold the newest valid snapshot: the one BeginWrite takes.
  int TargetSlot() {
    SegmentHeader& h = header();
    int target = 0;
    for (int i = 0; i < 2; ++i)
      if (LoadState(h.slots[i]) != internal::kSlotValid) target = i;
    if (LoadState(h.slots[0]) == internal::kSlotValid && LoadState(h.slots[1]) == internal::kSlotValid)
      target = h.slots[0].step < h.slots[1].step ? 0 : 1;
    return target;
  }
  // TargetSlot, marked kSlotWriting: its bytes change now.
  int BeginWrite() {
    const int target = TargetSlot();
    StoreState(header().slots[target], internal::kSlotWriting);
    return target;
  }
  // Whether a payload of `payload` bytes fits the mapped slots (else Ensure maps anew).
  bool Fits(int64_t payload) const {
    return base_ != nullptr && header().slot_capacity >= static_cast<uint64_t>(payload);
  }
  // The slot's payload is in: its step, size and checksum, then the flip to kSlotValid (last).
  uint64_t FinishWrite(int target, int64_t step, int64_t payload_bytes) {
    SlotHeader& s = header().slots[target];
    s.step = step;
    s.payload_bytes = static_cast<uint64_t>(payload_bytes);
    s.checksum = internal::Checksum(slot(target), static_cast<size_t>(payload_bytes));
    StoreState(s, internal::kSlotValid);
    return s.checksum;
  }

  // As FinishWrite, for bytes whose checksum `checksum` is known (copied from a slot, or hashed
  // while copied; not recomputed: a restore recomputes it anyway).
  void FinishCopy(int target, int64_t step, int64_t payload_bytes, uint64_t checksum) {
    SlotHeader& s = header().slots[target];
    s.step = step;
    s.payload_bytes = static_cast<uint64_t>(payload_bytes);
    s.checksum = checksum;
    StoreState(s, internal::kSlotValid);
  }

  struct ValidSlot {
    int index = 0;
    int64_t step = 0;
    std::span<const std::byte> payload;
    uint64_t checksum = 0;
  };
  // The slots whose state is valid and size within the slot (checksums are the caller's to check).
  std::vector<ValidSlot> ValidSlots(std::vector<std::string>* refused) {
    std::vector<ValidSlot> out;
    OpenExisting(refused);
    if (base_ == nullptr) return out;
    SegmentHeader& h = header();
    for (int i = 0; i < 2; ++i) {
      SlotHeader& s = h.slots[i];
      const std::string field = where_ + ": slots[" + std::to_string(i) + "]";
      const uint64_t state = LoadState(s);
      if (state == internal::kSlotEmpty) continue;
      if (state != internal::kSlotValid) {
        refused->push_back(field + ".state: torn (a copy was interrupted); got " + std::to_string(state) +
                           ", expected " + std::to_string(internal::kSlotValid) + " (valid)");
        continue;
      }
      if (s.payload_bytes > h.slot_capacity) {
        refused->push_back(field + ".payload_bytes: beyond the slot; got " + std::to_string(s.payload_bytes) +
                           ", expected <= " + std::to_string(h.slot_capacity));
        continue;
      }
      out.push_back({i, s.step, {slot(i), static_cast<size_t>(s.payload_bytes)}, s.checksum});
    }
    return out;
  }

  // Empties the valid slots of steps after `step` (-1: all of them), of an existing segment too.
  void DropNewerThan(int64_t step) {
    std::vector<std::string> ignored;
    OpenExisting(&ignored);
    if (base_ == nullptr) return;
    for (SlotHeader& s : header().slots)
      if (LoadState(s) == internal::kSlotValid && s.step > step) StoreState(s, internal::kSlotEmpty);
  }

 private:
  std::string HeaderProblem(const SegmentHeader& h, int64_t size) const {
    if (std::memcmp(h.magic, internal::kSegmentMagic, 8) != 0)
      return "magic: not a Cupcake segment; got '" + std::string(h.magic, 8) + "', expected 'CUPCKSH1'";
    if (h.version != internal::kFormatVersion)
      return "version: segment format " + std::to_string(h.version) + ", which this version does not read; got " +
             std::to_string(h.version) + ", expected " + std::to_string(internal::kFormatVersion) +
             (h.version == 1 ? " (format 1 has another checksum function)" : "");
    if (h.rank != owner_ || h.world_size != world_)
      return "rank: not the expected rank's; got rank " + std::to_string(h.rank) + " of " +
             std::to_string(h.world_size) + ", expected rank " + std::to_string(owner_) + " of " +
             std::to_string(world_);
    if (h.slot_capacity > static_cast<uint64_t>(size) ||
        kHeaderBytes + 2 * h.slot_capacity > static_cast<uint64_t>(size))
      return "slot_capacity: beyond the segment; got " + std::to_string(h.slot_capacity) +
             ", expected <= " + std::to_string((size - kHeaderBytes) / 2);
    return "";
  }

  std::string shm_name_, where_;
  int owner_, world_;
  void* base_ = nullptr;
  int fd_ = -1;
  size_t mapped_bytes_ = 0;
};

}  // namespace

// What the ranks announced at a restore: per rank [ok, own whole steps x kCandidates, persisted
// steps x kFileCandidates, then for each of its sources (placement.sources, in order, padded to
// the most any rank has) its steps x kReplicaCandidates], -1 where none.
struct Holdings {
  static constexpr int kFiles = 1 + kCandidates;  // the first persisted step's column
  static constexpr int kReplicas = kFiles + kFileCandidates;  // the first source's
  Holdings(const internal::ReplicaPlacement* p, int ranks) : placement(p), world(ranks) {
    size_t most = 0;
    if (p != nullptr)
      for (const std::vector<int>& s : p->sources) most = std::max(most, s.size());
    row_size = kReplicas + kReplicaCandidates * static_cast<int>(most);
    rows.assign(static_cast<size_t>(row_size * ranks), -1);
  }
  const int64_t* row(int r) const { return &rows[static_cast<size_t>(row_size * r)]; }
  // Rank r holds its whole snapshot of `step` (a slot).
  bool Own(int r, int64_t step) const { return std::find(row(r) + 1, row(r) + kFiles, step) != row(r) + kFiles; }
  // Rank r holds its persisted share of `step`: its own entries and 1/W of the shared ones.
  bool File(int r, int64_t step) const {
    return std::find(row(r) + kFiles, row(r) + kReplicas, step) != row(r) + kReplicas;
  }
  bool AnyOwn(int64_t step) const {
    for (int r = 0; r < world; ++r)
      if (Own(r, step)) return true;
    return false;
  }
  bool AllFiles(int64_t step) const {
    for (int r = 0; r < world; ++r)
      if (!File(r, step)) return false;
    return true;
  }
  // Rank `holder` holds `source`'s snapshot of `step`.
  bool Replica(int holder, int source, int64_t step) const {
    if (placement == nullptr) return false;
    const std::vector<int>& from = placement->sources[static_cast<size_t>(holder)];
    const auto at = std::find(from.begin(), from.end(), source);
    if (at == from.end()) return false;
    const int64_t* steps = row(holder) + kReplicas + kReplicaCandidates * (at - from.begin());
    return std::find(steps, steps + kReplicaCandidates, step) != steps + kReplicaCandidates;
  }
  // The rank that sends r its replica of `step`: the first of r's holders that has it; -1: none.
  int Provider(int r, int64_t step) const {
    if (placement == nullptr) return -1;
    for (int h : placement->holders[static_cast<size_t>(r)])
      if (Replica(h, r, step)) return h;
    return -1;
  }
  // Whether r has its own entries of `step` without a whole copy: its persisted share, else a
  // replica (Provider).
  bool RankPart(int r, int64_t step) const { return File(r, step) || Provider(r, step) >= 0; }
  // The rank that sends r the shared entries of `step` when r rebuilds it from its persisted
  // share or a replica: its provider (a replica, no file) if that holds `step` whole itself, else
  // the first rank after r that does; -1: none (then, when every rank has its persisted share of
  // `step`, the ranks assemble the shared entries from their shares).
  int Donor(int r, int64_t step) const {
    const int provider = File(r, step) ? -1 : Provider(r, step);
    if (provider >= 0 && Own(provider, step)) return provider;
    for (int i = 1; i < world; ++i)
      if (Own((r + i) % world, step)) return (r + i) % world;
    return -1;
  }
  // Rank r can restore `step`: it holds it whole, or it has its own entries (its persisted share,
  // or a replica on a holder) and the shared entries come from a rank that holds `step` whole or
  // from every rank's persisted share.
  bool Restorable(int r, int64_t step) const {
    return Own(r, step) || (RankPart(r, step) && (Donor(r, step) >= 0 || AllFiles(step)));
  }
  // The newest step some rank has persisted and the ranks that lack their share of it (no file
  // and no whole copy); {0, {}} when no rank has persisted a step.
  std::pair<int64_t, std::vector<int>> MissingShares() const {
    int64_t newest = 0;
    for (int r = 0; r < world; ++r)
      for (int c = kFiles; c < kReplicas; ++c) newest = std::max(newest, row(r)[c]);
    std::vector<int> lacking;
    for (int r = 0; r < world && newest > 0; ++r)
      if (!File(r, newest) && !Own(r, newest)) lacking.push_back(r);
    return {newest, lacking};
  }
  int64_t NewestCommon() const {
    int64_t best = 0;
    for (int64_t step : rows) {
      if (step < 1 || step <= best) continue;
      bool everywhere = true;
      for (int r = 0; r < world && everywhere; ++r) everywhere = Restorable(r, step);
      if (everywhere) best = step;
    }
    return best;
  }
  bool Any() const {
    for (int r = 0; r < world; ++r)
      for (int c = 1; c < row_size; ++c)
        if (row(r)[c] >= 1) return true;
    return false;
  }
  // "rank 0 holds 3, 2 (persisted shares of 2) (and rank 1's 3); rank 1 holds none".
  std::string Describe() const {
    const auto list = [](const int64_t* steps, int n) {
      std::string out;
      for (int c = 0; c < n; ++c)
        if (steps[c] >= 1) out += (out.empty() ? "" : ", ") + std::to_string(steps[c]);
      return out;
    };
    std::string out;
    for (int r = 0; r < world; ++r) {
      const std::string own = list(row(r) + 1, kCandidates), files = list(row(r) + kFiles, kFileCandidates);
      out += (r ? "; rank " : "rank ") + std::to_string(r) + " holds " + (own.empty() ? "none" : own);
      if (!files.empty()) out += " (persisted shares of " + files + ")";
      if (placement == nullptr) continue;
      const std::vector<int>& from = placement->sources[static_cast<size_t>(r)];
      for (size_t i = 0; i < from.size(); ++i) {
        const std::string theirs =
            list(row(r) + kReplicas + kReplicaCandidates * static_cast<int>(i), kReplicaCandidates);
        if (!theirs.empty()) out += " (and rank " + std::to_string(from[i]) + "'s " + theirs + ")";
      }
    }
    return out;
  }
  const internal::ReplicaPlacement* placement;  // nullptr: no replicas
  int world;
  int row_size = 0;
  std::vector<int64_t> rows;
};

class Checkpointer::Impl {
 private:
  struct Candidate {
    int64_t step = 0;
    std::string source;
    // A whole snapshot in a segment's slot, or a replica (in a segment, or a persisted file's).
    std::span<const std::byte> payload;
    internal::ParsedSnapshot parsed;
    // A persisted file: its bytes (shared, so that moving the candidate keeps the spans valid),
    // its share of the shared entries' bytes and their fingerprint.
    std::shared_ptr<const std::string> file;
    std::span<const std::byte> share;
    int64_t shared_bytes = 0;  // all the shared entries' bytes, of which `share` is this rank's
    uint64_t shared_print = 0;
  };
  struct Loaded {
    bool found = false;
    Status error;  // a replica that arrived changed, shares that do not fit: Apply fails
    std::string source;
    std::vector<std::byte> rebuilt;  // a snapshot rebuilt from its replica and the shared entries
    std::span<const std::byte> payload;
    internal::ParsedSnapshot parsed;
  };

 public:
  Impl(const CheckpointOptions& options, comm::Communicator* comm)
      : options_(options),
        comm_(comm),
        own_(SegmentName(options.name, comm->rank()), comm->rank(), comm->size()),
        where_(own_.where()) {
    if (options.replicate) {
      outgoing_ =
          std::make_unique<SlotSegment>(OutgoingSegmentName(options.name, comm->rank()), comm->rank(), comm->size());
    }
  }

  ~Impl() {
    DetachGaps();
    if (copy_.joinable()) copy_.join();
    if (persist_.joinable()) persist_.join();
    {
      std::lock_guard lock(exchange_mu_);
      exchange_stop_ = true;
    }
    exchange_cv_.notify_all();
    if (exchange_thread_.joinable()) exchange_thread_.join();  // after the exchanges requested
  }

  Status Add(const std::string& name, std::span<std::byte> bytes, Capture capture, Scope scope) {
    CUPCAKE_RETURN_IF_ERROR(CheckIdle("Add"));
    for (const Entry& e : entries_)
      if (e.name == name)
        return InvalidArgumentError(where_ + ": entries: '" + name + "' registered twice; expected unique names");
    Entry e{name, bytes, capture, scope, {}, -1};
    if (capture == Capture::kAtCommit) e.staged.resize(bytes.size());
    entries_.push_back(std::move(e));
    return Status::Ok();
  }

  void Clear() {
    (void)WaitForExchanges();
    std::erase_if(entries_, [](const Entry& e) { return e.session_plane < 0; });
  }

  Status AttachSession(Session* session) {
    CUPCAKE_RETURN_IF_ERROR(CheckIdle("AttachSession"));
    std::erase_if(entries_, [](const Entry& e) { return e.session_plane >= 0; });
    session_ = nullptr;
    CUPCAKE_RETURN_IF_ERROR(AttachGaps(session));
    session_ = session;
    if (session == nullptr) return Status::Ok();
    std::vector<Entry> added;  // all or none
    for (int i = 0; i < static_cast<int>(std::size(kSessionEntries)); ++i) {
      const SessionEntry& d = kSessionEntries[i];
      CUPCAKE_ASSIGN_OR_RETURN(std::vector<std::byte> bytes, ReadSessionEntry(*session, d));
      if (!HasEntry(*session, d, bytes.size())) continue;
      Entry e{d.name, {}, Capture::kAtCommit, Scope::kRank, std::move(bytes), i};
      e.memory = e.staged;
      added.push_back(std::move(e));
    }
    std::move(added.begin(), added.end(), std::back_inserter(entries_));
    return Status::Ok();
  }

  Status Commit(int64_t step, std::string_view metadata) {
    // 1. The previous copy and the exchanges first (with the wait before the optimizer step, the
    //    only waits): this Commit reads the streams' state and starts a new one from its own slot.
    Status local = WaitForExchanges();
    SweepTemporaries();
    if (local.ok() && (step < 1 || step <= last_step_))
      local = InvalidArgumentError(where_ + ": step: not after the last commit; got " + std::to_string(step) +
                                   ", expected > " + std::to_string(std::max<int64_t>(last_step_, 0)));
    if (local.ok() && options_.replicate && !options_.replica_gaps.empty() && session_ == nullptr)
      local = FailedPreconditionError(where_ + ": replica_gaps: no session attached; got " +
                                      std::to_string(options_.replica_gaps.size()) +
                                      " gaps, expected AttachSession first (the gaps are its plan's)");
    // Collective on the first commit: every rank makes it, whatever its local state.
    const Status replica_comm = EnsureReplicaComm();
    if (local.ok()) local = replica_comm;
    // 2. The agreement: the same step everywhere; the newest step every rank completed, whose
    //    kShared entries must be the same on every rank (CheckShared).
    int64_t mine[kAgreementRow] = {step,
                                   local_step_,
                                   local.ok() ? 1 : 0,
                                   shared_prints_.step,
                                   static_cast<int64_t>(shared_prints_.entries.size()),
                                   static_cast<int64_t>(shared_prints_.Combined()),
                                   static_cast<int64_t>(GapsPrint())};
    std::vector<int64_t> all(static_cast<size_t>(kAgreementRow * comm_->size()));
    CUPCAKE_RETURN_IF_ERROR(comm_->Allgather(mine, all.data(), sizeof(mine)).WithPrefix(where_ + ": commit"));
    CUPCAKE_RETURN_IF_ERROR(local);
    std::string steps, failed;
    bool same = true;
    int64_t agreed = std::numeric_limits<int64_t>::max();
    for (int r = 0; r < comm_->size(); ++r) {
      const int64_t* a = &all[static_cast<size_t>(kAgreementRow * r)];
      if (a[2] == 0) failed += (failed.empty() ? "" : ", ") + std::to_string(r);
      steps += (r ? ", " : "") + std::to_string(a[0]) + " on rank " + std::to_string(r);
      same = same && a[0] == step;
      agreed = std::min(agreed, a[1]);
    }
    if (!failed.empty())
      return FailedPreconditionError(where_ + ": commit: failed on rank " + failed +
                                     " (see its message); no snapshot of step " + std::to_string(step));
    if (!same)
      return InvalidArgumentError(where_ + ": step: the ranks commit different steps; got " + steps +
                                  ", expected the same step on every rank");
    CUPCAKE_RETURN_IF_ERROR(CheckGaps(all));
    // From here on every rank's session hands its gaps to the exchanges: all ranks passed this
    // point of the same Commit with the same gaps (the hooks of the steps before it did nothing).
    if (options_.replicate && !options_.replica_gaps.empty()) gaps_armed_.store(true);
    CUPCAKE_RETURN_IF_ERROR(CheckShared(all));
    agreed_step_ = agreed;
    // 3. The slot (grown if the snapshot outgrew it).
    std::vector<std::string> names;
    int64_t payload = 0;
    for (const Entry& e : entries_) {
      names.push_back(e.name);
      payload += static_cast<int64_t>(e.memory.size());
    }
    payload += internal::DirectoryBytes(names, metadata.size());
    if (!own_.Fits(payload)) KeepPersistError(TakePersist(/*wait=*/true));  // it reads the mapping Ensure replaces
    const Status ensured = own_.Ensure(payload);
    if (ensured.ok() && !history_started_) {
      DropNewerThan(-1);  // another run's snapshots (no restore): never mixed with ours
      history_started_ = true;
    }
    if (options_.replicate) {
      // 4. This Commit's replica exchange, first on the network, on every rank whatever fails
      // below (so no rank waits alone in it). A new stream (when every rank's last one has ended)
      // starts from this rank's newest complete snapshot, which the copy below does not touch (it
      // writes the other slot). The gate closes here, before the job can start the next
      // iteration's collectives, and opens when the exchange has ended.
      std::optional<SlotSegment::ValidSlot> source;
      if (ensured.ok() && streams_done_) source = NewestOwnSlot();
      RequestExchange({true, source, CommitChunkBytes(step, source)});
    }
    CUPCAKE_RETURN_IF_ERROR(ensured);
    // 5. What the next iteration writes before its optimizer step, copied now; then the copy on
    // its own thread.
    CUPCAKE_ASSIGN_OR_RETURN(std::unique_ptr<StateReader> reader, CaptureAtCommit());
    last_step_ = step;
    copy_ = std::thread([this, step, payload, meta = std::string(metadata), reader = std::move(reader)] {
      copy_status_ = Copy(reader.get(), step, payload, meta);
    });
    return Status::Ok();
  }

  // The kAtCommit entries and the session's state that is not per element, into the entries'
  // own copies; the per-element planes (error feedback, momentum: the model's size) are read
  // into theirs by the returned reader on the copy thread, while the next step runs (the
  // session's encodes wait for it group by group; Session::BeginStateRead). nullptr: no session
  // or no such plane kept.
  StatusOr<std::unique_ptr<StateReader>> CaptureAtCommit() {
    std::vector<StateTarget> planes;
    std::string plane_names;
    for (Entry& e : entries_) {
      if (e.session_plane >= 0) {
        const SessionEntry& d = kSessionEntries[e.session_plane];
        e.scope = SessionScope(*session_, d);
        if (d.part == SessionPart::kCompressor) {
          if (e.staged.empty()) continue;  // a plane no plan keeps (ReadSessionEntry)
          const std::span<float> staged(reinterpret_cast<float*>(e.staged.data()), e.staged.size() / sizeof(float));
          if (PerElementPlane(d)) {
            planes.push_back({d.state, staged});
            plane_names += (plane_names.empty() ? "" : ", ") + e.name;
            continue;
          }
          if (Status read = session_->ReadState(staged, d.state); !read.ok())
            return FailedPreconditionError(where_ + ": " + e.name + ": " + read.message() + kAttachAfterPlans);
          continue;
        }
        CUPCAKE_ASSIGN_OR_RETURN(std::vector<std::byte> bytes, ReadSessionEntry(*session_, d));
        if (bytes.size() != e.staged.size())
          return FailedPreconditionError(where_ + ": " + e.name + ": size changed; got " +
                                         std::to_string(bytes.size()) + " bytes, expected " +
                                         std::to_string(e.staged.size()) + kAttachAfterPlans);
        std::memcpy(e.staged.data(), bytes.data(), e.staged.size());
      } else if (e.capture == Capture::kAtCommit && !e.memory.empty()) {
        std::memcpy(e.staged.data(), e.memory.data(), e.memory.size());
      }
    }
    if (planes.empty()) return std::unique_ptr<StateReader>();
    StatusOr<std::unique_ptr<StateReader>> reader = session_->BeginStateRead(std::move(planes));
    if (!reader.ok())
      return FailedPreconditionError(where_ + ": " + plane_names + ": " + reader.status().message() +
                                     kAttachAfterPlans);
    return reader;
  }

  // Waits for the copy; the first error of the copy, of an ended persist or of an ended exchange.
  // Not for the queued replica exchanges: they read only their own frozen copy (Freeze), never
  // the job's spans, so the job's next writes need not wait for them (Commit does).
  Status WaitForCopy() {
    if (copy_.joinable()) copy_.join();
    KeepPersistError(TakePersist(/*wait=*/false));
    std::lock_guard lock(exchange_mu_);
    Status s = copy_status_.ok() ? exchange_status_ : copy_status_;
    copy_status_ = exchange_status_ = Status::Ok();
    return s;
  }

  // WaitForCopy, after every queued replica exchange.
  Status WaitForExchanges() {
    {
      std::unique_lock lock(exchange_mu_);
      exchange_cv_.wait(lock, [&] { return exchanges_.empty(); });
    }
    return WaitForCopy();
  }

  Status WaitForPersist() {
    if (copy_.joinable()) copy_.join();
    KeepPersistError(TakePersist(/*wait=*/true));
    return WaitForExchanges();
  }

  int64_t agreed_step() const { return agreed_step_; }
  int64_t local_step() const { return local_step_; }
  int64_t persisted_step() const { return persisted_step_.load(std::memory_order_acquire); }
  int64_t replicated_step() const { return replicated_step_.load(std::memory_order_acquire); }
  int64_t replica_gaps_skipped() const { return gaps_skipped_.load(std::memory_order_relaxed); }
  int64_t replica_gaps_requested() const { return gap_requests_.load(std::memory_order_relaxed); }

  StatusOr<RestorePoint> Find() {
    Status local = WaitForPersist();  // the files it lists are complete
    SweepTemporaries();
    const Status replica_comm = EnsureReplicaComm();  // collective: every rank makes it
    if (local.ok()) local = replica_comm;
    RestorePoint point;
    std::vector<Candidate> candidates, files;
    std::map<int, std::vector<Candidate>> replicas;  // by source rank
    if (local.ok()) {
      candidates = ListCandidates(&point.refused);
      files = FileCandidates(&point.refused, &local);
      replicas = ReplicaCandidates(&point.refused);
    }
    // 1. Every rank announces whether it could look, its own whole steps, its persisted steps
    //    and the steps of its sources' snapshots it holds (-1: none).
    Holdings held(options_.replicate ? &placement_ : nullptr, comm_->size());
    std::vector<int64_t> mine(static_cast<size_t>(held.row_size), -1);
    mine[0] = local.ok() ? 1 : 0;
    for (size_t c = 0; c < candidates.size() && c < kCandidates; ++c) mine[1 + c] = candidates[c].step;
    for (size_t c = 0; c < files.size() && c < kFileCandidates; ++c) mine[Holdings::kFiles + c] = files[c].step;
    if (options_.replicate) {
      const std::vector<int>& from = placement_.sources[static_cast<size_t>(comm_->rank())];
      for (size_t i = 0; i < from.size(); ++i) {
        const std::vector<Candidate>& of = replicas[from[i]];
        for (size_t c = 0; c < of.size() && c < kReplicaCandidates; ++c)
          mine[Holdings::kReplicas + kReplicaCandidates * i + c] = of[c].step;
      }
    }
    CUPCAKE_RETURN_IF_ERROR(comm_->Allgather(mine.data(), held.rows.data(), static_cast<int64_t>(mine.size() * 8))
                                .WithPrefix(where_ + ": restore"));
    CUPCAKE_RETURN_IF_ERROR(local);
    for (int r = 0; r < comm_->size(); ++r)
      if (held.row(r)[0] == 0)
        return FailedPreconditionError(where_ + ": restore: failed on rank " + std::to_string(r) +
                                       " (see its message)");
    // 2. The newest step every rank can restore: it holds it, or its own entries are in its file
    //    or on one of its holders.
    const int64_t best = held.NewestCommon();
    if (best == 0 && held.Any()) {
      std::string refused;
      for (const std::string& line : point.refused) refused += "\n" + line;
      return FailedPreconditionError(where_ + ": restore: no step is held by every rank; got " + held.Describe() +
                                     ", expected a common step" + DescribeMissingShares(held) +
                                     " (snapshots refused on this rank: " + std::to_string(point.refused.size()) + ")" +
                                     refused);
    }
    point.step = best;
    loaded_ = {};
    if (best == 0) return point;
    // 3. This rank's copy of `best`: its slot, else rebuilt from its file or a holder's replica.
    CUPCAKE_RETURN_IF_ERROR(Load(best, held, candidates, files, replicas));
    point.metadata = loaded_.parsed.metadata;
    point.source = loaded_.source;
    for (const internal::SnapshotEntry& e : loaded_.parsed.entries) point.entries.emplace_back(e.name, e.size_bytes);
    return point;
  }

  // Step 3 of Find. A rank that holds `step` whole loads its slot. A rank without one rebuilds it
  // from its own entries (its persisted share's replica, else the replica its provider sends, the
  // first of its holders that has it, Holdings::Provider) and the shared entries of `step`:
  // - when some rank holds `step` whole, its donor (Holdings::Donor) sends them from its own
  //   snapshot: one alltoall of what each rank sends each other (replica bytes and checksum,
  //   shared bytes) and one alltoallv, in which every rank takes part;
  // - else every rank has its persisted share, and they assemble them (AssembleShares).
  // The rebuilt snapshot must match the checksum of the rank's own (kept in its replica). A
  // replica that arrives changed, shares that do not fit, or a rebuilt snapshot that does not
  // match, fail this rank's Apply, so that every rank fails together there.
  Status Load(int64_t step, const Holdings& held, std::vector<Candidate>& candidates, std::vector<Candidate>& files,
              std::map<int, std::vector<Candidate>>& replicas) {
    const int rank = comm_->rank(), world = comm_->size();
    Candidate* own_file = nullptr;
    if (held.Own(rank, step)) {
      for (Candidate& c : candidates)
        if (c.step == step) {
          loaded_.parsed = std::move(c.parsed);
          loaded_.source = c.source;
          loaded_.payload = c.payload;
          loaded_.found = true;
          break;
        }
    } else if (held.File(rank, step)) {
      for (Candidate& c : files)
        if (c.step == step) own_file = &c;
    }
    bool anyone_needs = false;
    for (int r = 0; r < world; ++r) anyone_needs = anyone_needs || !held.Own(r, step);
    if (!anyone_needs) return Status::Ok();
    if (!held.AnyOwn(step)) {
      CUPCAKE_CHECK(own_file != nullptr);  // Restorable: with no whole copy anywhere, every rank has its file
      return AssembleShares(step, *own_file);
    }
    // What this rank sends each rank q that has no copy: q's replica if it is q's provider (q has
    // no file of `step`), then the shared entries of its own snapshot of `step` (loaded above) if
    // it is q's donor. offers: per rank, the replica's bytes and checksum and the shared bytes.
    std::vector<int64_t> offers(static_cast<size_t>(3 * world), 0), offered(static_cast<size_t>(3 * world), 0);
    std::vector<int64_t> send(static_cast<size_t>(world), 0), recv(static_cast<size_t>(world), 0);
    std::vector<std::byte> outbox, shared;
    bool shared_made = false;
    for (int q = 0; q < world; ++q) {
      if (held.Own(q, step)) continue;
      int64_t* offer = &offers[static_cast<size_t>(3 * q)];
      if (!held.File(q, step) && held.Provider(q, step) == rank)
        for (const Candidate& c : replicas[q])
          if (c.step == step) {
            offer[0] = static_cast<int64_t>(c.payload.size());
            offer[1] = static_cast<int64_t>(internal::Checksum(c.payload.data(), c.payload.size()));
            outbox.insert(outbox.end(), c.payload.begin(), c.payload.end());
            break;
          }
      if (held.Donor(q, step) == rank && loaded_.found) {
        if (!shared_made) shared = internal::SharedBytes(loaded_.payload, loaded_.parsed);
        shared_made = true;
        offer[2] = static_cast<int64_t>(shared.size());
        outbox.insert(outbox.end(), shared.begin(), shared.end());
      }
      send[static_cast<size_t>(q)] = offer[0] + offer[2];
    }
    CUPCAKE_RETURN_IF_ERROR(comm_->Alltoall(offers.data(), offered.data(), 24).WithPrefix(where_ + ": restore"));
    const bool receive = !held.Own(rank, step);
    int64_t arriving = 0;
    std::vector<int64_t> at(static_cast<size_t>(world), 0);  // where each rank's block begins
    for (int q = 0; q < world && receive; ++q) {
      at[static_cast<size_t>(q)] = arriving;
      recv[static_cast<size_t>(q)] = offered[static_cast<size_t>(3 * q)] + offered[static_cast<size_t>(3 * q + 2)];
      arriving += recv[static_cast<size_t>(q)];
    }
    std::vector<std::byte> arrived(static_cast<size_t>(arriving));
    CUPCAKE_RETURN_IF_ERROR(
        comm_->Alltoallv(outbox.data(), send, arrived.data(), recv).WithPrefix(where_ + ": restore"));
    if (!receive) return Status::Ok();
    const int donor = held.Donor(rank, step);
    const int64_t* from_donor = &offered[static_cast<size_t>(3 * donor)];
    Candidate part;
    if (own_file != nullptr) {
      part = *own_file;
    } else {
      const int provider = held.Provider(rank, step);
      const int64_t* from_provider = &offered[static_cast<size_t>(3 * provider)];
      part.source =
          "rank " + std::to_string(provider) + "'s " + "/dev/shm" + ReplicaOfSegmentName(options_.name, provider, rank);
      part.payload = {arrived.data() + at[static_cast<size_t>(provider)], static_cast<size_t>(from_provider[0])};
      std::vector<std::string> problems;
      if (!Verify(&part, static_cast<uint64_t>(from_provider[1]), step, part.source + ": ", rank, &problems,
                  Parse::kRankPart)) {
        loaded_.error = DataLossError(problems.empty() ? part.source + ": not loaded" : problems[0]);
        return Status::Ok();
      }
    }
    const std::span<const std::byte> from_shared{arrived.data() + at[static_cast<size_t>(donor)] + from_donor[0],
                                                 static_cast<size_t>(from_donor[2])};
    loaded_.error = Rebuild(part, from_shared,
                            from_shared.empty() ? "" : ", its shared entries from rank " + std::to_string(donor));
    return Status::Ok();
  }

  // Load when no rank holds `step` whole and every rank has its persisted share of it (`mine`):
  // 1. an allgather of each share's shared-entry size and fingerprint, which must be the same on
  //    every rank (else every rank fails alike in Apply, naming the files);
  // 2. an allgather of the shares, each padded to the largest (internal::ShareOf), laid back
  //    into the shared entries' bytes;
  // 3. those bytes against the recorded fingerprint, then the snapshot rebuilt from them and this
  //    rank's replica against this rank's own checksum (Rebuild).
  Status AssembleShares(int64_t step, Candidate& mine) {
    const int world = comm_->size();
    const int64_t row[2] = {mine.shared_bytes, static_cast<int64_t>(mine.shared_print)};
    std::vector<int64_t> rows(static_cast<size_t>(2 * world));
    CUPCAKE_RETURN_IF_ERROR(comm_->Allgather(row, rows.data(), sizeof(row)).WithPrefix(where_ + ": restore"));
    std::string got;
    bool same = true;
    for (int r = 0; r < world; ++r) {
      const int64_t* of = &rows[static_cast<size_t>(2 * r)];
      same = same && of[0] == rows[0] && of[1] == rows[1];
      got += (r ? ", " : "") + std::to_string(of[0]) + " bytes " + Hex(static_cast<uint64_t>(of[1])) + " (" +
             PersistedPath(r, step) + ")";
    }
    if (!same) {
      loaded_.error = DataLossError(mine.source + ": shared_bytes, shared_print: the ranks' shares of step " +
                                    std::to_string(step) + " are not of the same shared entries; got " + got +
                                    ", expected the same on every rank");
      return Status::Ok();
    }
    const int64_t total = rows[0];
    std::vector<std::byte> shared(static_cast<size_t>(total));
    if (total > 0) {
      int64_t block = 0;
      for (int r = 0; r < world; ++r) block = std::max(block, internal::ShareOf(total, world, r).bytes);
      std::vector<std::byte> padded(static_cast<size_t>(block)), all(static_cast<size_t>(block * world));
      std::copy(mine.share.begin(), mine.share.end(), padded.begin());
      CUPCAKE_RETURN_IF_ERROR(comm_->Allgather(padded.data(), all.data(), block).WithPrefix(where_ + ": restore"));
      for (int r = 0; r < world; ++r) {
        const internal::ByteRange range = internal::ShareOf(total, world, r);
        std::copy_n(all.begin() + block * r, range.bytes, shared.begin() + range.offset);
      }
      const uint64_t print = internal::SharedFingerprint(mine.parsed, shared);
      if (print != mine.shared_print) {
        std::string files;
        for (int r = 0; r < world; ++r) files += (r ? ", " : "") + PersistedPath(r, step);
        loaded_.error = DataLossError(mine.source +
                                      ": shared_print: the shared entries assembled from the ranks' "
                                      "shares of step " +
                                      std::to_string(step) + " do not match it; got " + Hex(print) + ", expected " +
                                      Hex(mine.shared_print) + " (the shares: " + files + ")");
        return Status::Ok();
      }
    }
    loaded_.error = Rebuild(mine, shared, total > 0 ? ", its shared entries from every rank's persisted share" : "");
    return Status::Ok();
  }

  // This rank's snapshot into loaded_, rebuilt from `part` (its replica, verified) and the shared
  // entries' bytes `shared`; its source is part's, then `shared_from`. The problem otherwise (for
  // Apply to report on every rank).
  Status Rebuild(const Candidate& part, std::span<const std::byte> shared, const std::string& shared_from) {
    const std::string source = part.source + shared_from;
    CUPCAKE_ASSIGN_OR_RETURN(std::vector<std::byte> rebuilt,
                             internal::RebuildSnapshot(part.payload, part.parsed, shared, source));
    CUPCAKE_ASSIGN_OR_RETURN(internal::ParsedSnapshot parsed, internal::ParseSnapshot(rebuilt, source));
    loaded_.parsed = std::move(parsed);
    loaded_.source = source;
    loaded_.rebuilt = std::move(rebuilt);  // the parsed offsets stay valid: the bytes do not move
    loaded_.payload = loaded_.rebuilt;
    loaded_.found = true;
    return Status::Ok();
  }

  Status Apply(const Status& job_status) {
    // A snapshot that could not be loaded (shares that do not fit, a replica that arrived changed)
    // first: Find then returned no metadata, so the job's own error may only follow from it.
    Status local = loaded_.error;
    if (local.ok()) local = job_status;
    if (local.ok())
      local = loaded_.found ? Check()
                            : FailedPreconditionError(where_ +
                                                      ": Apply: no snapshot found; expected a Find that "
                                                      "returned a step first");
    int64_t flag = local.ok() ? 0 : 1, any = 0;
    CUPCAKE_RETURN_IF_ERROR(comm_->Allreduce(&flag, &any, 1, comm::DataType::kInt64, comm::ReduceOp::kMax)
                                .WithPrefix(where_ + ": restore"));
    CUPCAKE_RETURN_IF_ERROR(local);
    if (any != 0)
      return FailedPreconditionError(where_ + ": restore: another rank could not restore step " +
                                     std::to_string(loaded_.parsed.step) + " (see its message); nothing restored");
    for (size_t i = 0; i < entries_.size(); ++i) {
      Entry& e = entries_[i];
      const internal::SnapshotEntry& s = loaded_.parsed.entries[i];
      if (!e.memory.empty())  // an empty entry's data() may be null
        std::memcpy(e.memory.data(), loaded_.payload.data() + s.offset, e.memory.size());
      if (e.session_plane >= 0)
        CUPCAKE_RETURN_IF_ERROR(WriteSessionEntry(*session_, kSessionEntries[e.session_plane], e.staged));
    }
    const int64_t step = loaded_.parsed.step;
    DropNewerThan(step);
    stream_ = {};
    incoming_ = {};
    shared_prints_ = {};  // the restored snapshot was checked (or not) by the run that took it
    streams_done_ = true;
    history_started_ = true;
    last_step_ = local_step_ = agreed_step_ = step;
    loaded_ = {};
    return Status::Ok();
  }

 private:
  // Waits for the copy and the exchanges (their errors stay for the next WaitForCopy).
  Status CheckIdle(const char* call) {
    if (copy_.joinable()) copy_.join();
    KeepPersistError(TakePersist(/*wait=*/true));
    std::unique_lock lock(exchange_mu_);
    exchange_cv_.wait(lock, [&] { return exchanges_.empty(); });
    (void)call;
    return Status::Ok();
  }

  // replica_gaps against `session`'s active plan (every problem together), kept by group; with
  // gaps after groups, the session's hook (Session::SetAfterCollective) through a new relay. The
  // previous session's relay is emptied first, so its hook, which may outlive the attachment,
  // does nothing. Until the next Commit's agreement the hook requests nothing.
  Status AttachGaps(Session* session) {
    DetachGaps();
    gaps_armed_.store(false);
    gaps_plan_ = -1;
    gap_bytes_.clear();
    commit_gap_bytes_ = 0;
    if (session == nullptr || !options_.replicate || options_.replica_gaps.empty()) return Status::Ok();
    const int groups = session->group_count(), plan = session->active_plan();
    std::string problems;
    bool between = false;
    for (size_t i = 0; i < options_.replica_gaps.size(); ++i) {
      const ReplicaGap& g = options_.replica_gaps[i];
      if (g.after_group >= groups)
        problems += (problems.empty() ? "" : "\n") + std::string("Checkpointer: replica_gaps[") + std::to_string(i) +
                    "].after_group: not a group of the session's plan; got " + std::to_string(g.after_group) +
                    ", expected < " + std::to_string(groups) + " (the groups of plan " + std::to_string(plan) +
                    ", active at AttachSession)";
      between = between || g.after_group >= 0;
    }
    if (!problems.empty()) return InvalidArgumentError(problems);
    gap_bytes_.assign(static_cast<size_t>(groups), 0);
    gap_history_.assign(static_cast<size_t>(groups), {});
    for (const ReplicaGap& g : options_.replica_gaps)
      (g.after_group < 0 ? commit_gap_bytes_ : gap_bytes_[static_cast<size_t>(g.after_group)]) = g.bytes;
    gaps_plan_ = plan;
    if (!between) return Status::Ok();
    relay_ = std::make_shared<GapRelay>();
    relay_->impl = this;
    return session
        ->SetAfterCollective([relay = relay_](int p, int group, bool next_waiting) {
          std::lock_guard lock(relay->mutex);
          if (relay->impl != nullptr) relay->impl->AfterCollective(p, group, next_waiting);
        })
        .WithPrefix("Checkpointer: replica_gaps");
  }

  // Empties the relay: a hook still running finishes first, later calls do nothing.
  void DetachGaps() {
    if (relay_ == nullptr) return;
    std::lock_guard lock(relay_->mutex);
    relay_->impl = nullptr;
  }

  // The session's hook, on its communication thread: group `group` of plan `plan` has finished its
  // collective and the next has not started. The gap after it gets its chunk when the gaps are
  // that plan's and a Commit has armed them, unless some rank's next collective is already
  // waiting (`next_waiting` here: the exchange's agreement then sends nothing, SendChunk). A gap
  // that rests (GapResting) or finds every stream ended requests no exchange: decided here, once
  // the exchanges queued before have ended (with the gate there are none: the collective that
  // just ended waited for them), so every rank decides alike from the same history, and the
  // next collective does not wait for the exchange thread.
  void AfterCollective(int plan, int group, bool next_waiting) {
    if (!gaps_armed_.load() || plan != gaps_plan_ || group < 0 || group >= static_cast<int>(gap_bytes_.size())) return;
    const int64_t bytes = gap_bytes_[static_cast<size_t>(group)];
    if (bytes == 0) return;
    gap_requests_.fetch_add(1, std::memory_order_relaxed);
    {
      std::unique_lock lock(exchange_mu_);
      exchange_cv_.wait(lock, [&] { return exchanges_.empty(); });
      const bool resting = GapResting(group);
      if (streams_done_) return;
      if (resting) {
        gaps_skipped_.fetch_add(1, std::memory_order_relaxed);
        return;
      }
    }
    RequestExchange({false, {}, bytes, next_waiting, group});
  }

  // Commit(step)'s chunk: all that is left once the stream (in flight, or starting from `source`)
  // is replica_max_commits steps old; else gap -1's while the gaps' plan is active, else
  // replica_chunk_bytes (0: all). A rank whose stream is of another step (its copy failed) asks
  // less, and the exchange's agreement sends the least any rank asks (SendChunk).
  int64_t CommitChunkBytes(int64_t step, const std::optional<SlotSegment::ValidSlot>& source) const {
    constexpr int64_t kAll = std::numeric_limits<int64_t>::max();
    const int64_t of = streams_done_ ? (source ? source->step : -1) : stream_.step;
    if (options_.replica_max_commits > 0 && of >= 0 && step >= of + options_.replica_max_commits) return kAll;
    if (gaps_plan_ >= 0 && session_ != nullptr && session_->active_plan() == gaps_plan_) return commit_gap_bytes_;
    return options_.replica_chunk_bytes > 0 ? options_.replica_chunk_bytes : kAll;
  }

  // What the ranks must agree on for their exchanges to pair up: the gaps and their plan.
  uint64_t GapsPrint() const {
    std::vector<int64_t> values{gaps_plan_};
    for (const ReplicaGap& g : options_.replica_gaps) values.insert(values.end(), {g.after_group, g.bytes});
    return internal::Checksum(reinterpret_cast<const std::byte*>(values.data()),  // NOLINT: integers as bytes
                              values.size() * sizeof(int64_t));
  }

  // The agreement's gap fingerprints (column 6 of `all`): the same on every rank, else every rank
  // fails this Commit before any exchange (different gaps would request different exchanges).
  Status CheckGaps(const std::vector<int64_t>& all) const {
    bool same = true;
    std::string prints;
    for (int r = 0; r < comm_->size(); ++r) {
      const int64_t print = all[static_cast<size_t>(kAgreementRow * r + 6)];
      same = same && print == all[6];
      prints += (r ? ", " : "") + Hex(static_cast<uint64_t>(print)) + " on rank " + std::to_string(r);
    }
    if (same) return Status::Ok();
    return InvalidArgumentError(where_ + ": replica_gaps: the ranks pass different gaps; got fingerprint " + prints +
                                ", expected the same gaps (and the same plan active at AttachSession) on every rank");
  }

  // The placement of the replicas (the job's hosts, replica_placement.h), their segments and the
  // exchange thread's own communicator (collectives from one thread at a time): made at the first
  // Commit or Find, which every rank makes.
  Status EnsureReplicaComm() {
    if (!options_.replicate || replica_comm_ != nullptr) return Status::Ok();
    CUPCAKE_ASSIGN_OR_RETURN(comm::Topology topology, comm::DiscoverTopology(*comm_));
    placement_ = internal::PlaceReplicas(topology.host_of_rank, options_.replica_group_hosts);
    const int rank = comm_->rank();
    for (int source : placement_.sources[static_cast<size_t>(rank)])
      replicas_[source] =
          std::make_unique<SlotSegment>(ReplicaOfSegmentName(options_.name, rank, source), source, comm_->size());
    CUPCAKE_ASSIGN_OR_RETURN(replica_comm_, comm_->Split(0, rank));
    exchange_thread_ = std::thread([this] { ExchangeLoop(); });
    return Status::Ok();
  }

  // The background copy: into the slot that does not hold the newest valid snapshot (SlotSegment:
  // kSlotWriting while the bytes change, kSlotValid once they and their checksum are in); then,
  // when persisting is due, the persist of that slot on a thread of its own (StartPersist). One
  // pass over the bytes: each block is copied and then, while still in the cache, hashed into
  // the slot's checksum and (a kShared entry) into the entry's fingerprint, which the next
  // Commit's agreement compares across the ranks (CheckShared). First of all `reader` (may be
  // nullptr) reads the session's per-element state, which the next step's encodes wait for.
  // Returns the copy's error, or an earlier persist's that it waited for.
  Status Copy(StateReader* reader, int64_t step, int64_t payload_bytes, const std::string& metadata) {
    if (reader != nullptr) CUPCAKE_RETURN_IF_ERROR(reader->Run().WithPrefix(where_));
    // A persist still reading the slot this copy overwrites (two commits ago) ends first.
    Status persisted = persist_slot_ == own_.TargetSlot() ? TakePersist(/*wait=*/true) : Status::Ok();
    const int target = own_.BeginWrite();
    std::byte* out = own_.slot(target);
    internal::Hasher checksum;
    auto put = [&](const void* p, size_t n, internal::Hasher* fingerprint = nullptr) {
      const std::byte* from = static_cast<const std::byte*>(p);
      for (size_t done = 0; done < n;) {
        const size_t block = std::min(n - done, kCopyBlockBytes);
        std::memcpy(out, from + done, block);
        checksum.Update(out, block);
        if (fingerprint != nullptr) fingerprint->Update(out, block);
        out += block;
        done += block;
      }
    };
    const int32_t rank = comm_->rank(), world = comm_->size();
    const uint64_t metadata_bytes = metadata.size();
    const uint32_t count = static_cast<uint32_t>(entries_.size()), zero = 0;
    put(internal::kSnapshotMagic, 8);
    put(&step, 8);
    put(&rank, 4);
    put(&world, 4);
    put(&metadata_bytes, 8);
    put(&count, 4);
    put(&zero, 4);
    for (const Entry& e : entries_) {
      const uint32_t name_bytes = static_cast<uint32_t>(e.name.size());
      const uint32_t flags = e.scope == Scope::kShared ? internal::kEntryShared : 0;
      const uint64_t size = e.memory.size();
      put(&name_bytes, 4);
      put(&flags, 4);
      put(&size, 8);
      put(e.name.data(), e.name.size());
    }
    put(metadata.data(), metadata.size());
    SharedPrints prints;
    prints.step = step;
    for (size_t i = 0; i < entries_.size(); ++i) {
      const Entry& e = entries_[i];
      const std::byte* bytes = e.capture == Capture::kAtCommit ? e.staged.data() : e.memory.data();
      if (e.scope != Scope::kShared) {
        put(bytes, e.memory.size());
        continue;
      }
      internal::Hasher fingerprint;
      put(bytes, e.memory.size(), &fingerprint);
      prints.entries.push_back({static_cast<int>(i), e.name, fingerprint.Final()});
    }
    const uint64_t sum = checksum.Final();
    own_.FinishCopy(target, step, payload_bytes, sum);
    const std::span<const std::byte> payload(own_.slot(target), static_cast<size_t>(payload_bytes));
    if (options_.persist_every > 0 && step % options_.persist_every == 0) {
      const Status previous = TakePersist(/*wait=*/true);  // one persist at a time
      if (persisted.ok()) persisted = previous;
      StartPersist(step, target, payload, sum, prints.Combined());
    }
    shared_prints_ = std::move(prints);
    local_step_ = step;
    return persisted;
  }

  // The persist of `step` from slot `slot` (`payload`), on persist_ until it ends: the slot is
  // not written again before the copy two commits later, which waits for it (Copy), as does a
  // replaced mapping (Commit) or dropped snapshots (DropNewerThan). The thread object and the
  // slot are the copy thread's while a copy runs and the training thread's otherwise.
  void StartPersist(int64_t step, int slot, std::span<const std::byte> payload, uint64_t checksum,
                    uint64_t shared_print) {
    persist_slot_ = slot;
    persist_done_.store(false, std::memory_order_relaxed);
    persist_ = std::thread([this, step, payload, checksum, shared_print] {
      persist_status_ = Persist(step, payload, checksum, shared_print);
      if (persist_status_.ok()) persisted_step_.store(step, std::memory_order_release);
      persist_done_.store(true, std::memory_order_release);
    });
  }

  // The persist's error once it has ended (`wait`: waits for it), Ok while it runs or when none
  // ran.
  Status TakePersist(bool wait) {
    if (!persist_.joinable() || (!wait && !persist_done_.load(std::memory_order_acquire))) return Status::Ok();
    persist_.join();
    persist_slot_ = -1;
    Status s = std::move(persist_status_);
    persist_status_ = Status::Ok();
    return s;
  }

  // A persist's error taken outside WaitForCopy, for its next call to return.
  void KeepPersistError(Status s) {
    if (copy_status_.ok()) copy_status_ = std::move(s);
  }

  // The fingerprints of the kShared entries of the snapshot each rank completed last (`rows`:
  // the agreement's), equal on every rank. Cheap: the copy computed them in its one pass over the
  // bytes (Copy), and the agreement's allgather, made anyway, carries their step, count and
  // combination (24 bytes a rank), so no pass over the data and no collective is added. When
  // they differ, every rank sees it in the same rows and takes this path (SharedMismatch names
  // the entry);
  // every rank drops that snapshot (slot and file), so neither agreed_step() nor a restore ever
  // takes it, and fails. Ranks whose newest snapshots are not the same step (after a restore:
  // none yet) compare nothing.
  Status CheckShared(const std::vector<int64_t>& rows) {
    const int64_t* first = rows.data();
    const int64_t step = first[3];
    bool equal = true;
    for (int r = 0; r < comm_->size(); ++r) {
      const int64_t* row = &rows[static_cast<size_t>(kAgreementRow * r)];
      if (step < 1 || row[3] != step) return Status::Ok();
      equal = equal && row[4] == first[4] && row[5] == first[5];
    }
    if (equal) return Status::Ok();
    CUPCAKE_ASSIGN_OR_RETURN(const std::string problem, SharedMismatch(rows, " at step " + std::to_string(step)));
    DropNewerThan(step - 1);
    shared_prints_ = {};
    std::vector<std::string> ignored;
    int64_t newest = 0;
    for (const SlotSegment::ValidSlot& v : own_.ValidSlots(&ignored)) newest = std::max(newest, v.step);
    local_step_ = newest;
    return FailedPreconditionError(where_ + ": " + problem + "; the snapshot of step " + std::to_string(step) +
                                   " is dropped on every rank");
  }

  // What differs between the ranks' kShared entries (`rows`: the agreement's, whose combined
  // fingerprints differ): their numbers, else (collective: one allgather of every rank's
  // per-entry fingerprints) the first entry registered at different positions or whose bytes
  // differ.
  StatusOr<std::string> SharedMismatch(const std::vector<int64_t>& rows, const std::string& at) {
    const int world = comm_->size();
    std::string counts;
    bool same_count = true;
    for (int r = 0; r < world; ++r) {
      const int64_t n = rows[static_cast<size_t>(kAgreementRow * r + 4)];
      counts += (r ? ", " : "") + std::to_string(n) + " on rank " + std::to_string(r);
      same_count = same_count && n == rows[4];
    }
    if (!same_count)
      return "entries: the ranks register different numbers of Scope::kShared entries" + at + "; got " + counts +
             ", expected the same on every rank";
    const size_t count = shared_prints_.entries.size();
    std::vector<int64_t> mine(2 * count), all(2 * count * static_cast<size_t>(world));
    for (size_t k = 0; k < count; ++k) {
      mine[2 * k] = shared_prints_.entries[k].index;
      mine[2 * k + 1] = static_cast<int64_t>(shared_prints_.entries[k].fingerprint);
    }
    CUPCAKE_RETURN_IF_ERROR(comm_->Allgather(mine.data(), all.data(), static_cast<int64_t>(mine.size() * 8))
                                .WithPrefix(where_ + ": commit"));
    for (size_t k = 0; k < count; ++k) {
      std::string indices, prints;
      bool same_index = true, same_print = true;
      for (int r = 0; r < world; ++r) {
        const int64_t* pair = &all[2 * (count * static_cast<size_t>(r) + k)];
        indices += (r ? ", " : "") + ("entries[" + std::to_string(pair[0]) + "] on rank ") + std::to_string(r);
        prints += (r ? ", " : "") + Hex(static_cast<uint64_t>(pair[1])) + " on rank " + std::to_string(r);
        same_index = same_index && pair[0] == mine[2 * k];
        same_print = same_print && pair[1] == mine[2 * k + 1];
      }
      const SharedPrints::Print& p = shared_prints_.entries[k];
      if (!same_index)
        return "entries: the ranks register their Scope::kShared entries at different positions" + at + "; got " +
               indices + ", expected the same on every rank";
      if (!same_print)
        return "entries[" + std::to_string(p.index) + "]: registered Scope::kShared ('" + p.name +
               "'), but its bytes differ between the ranks" + at + "; got fingerprint " + prints +
               ", expected the same bytes on every rank (Scope::kRank for state each rank keeps its own of)";
    }
    return "entries: the Scope::kShared entries' combined fingerprints differ between the ranks" + at;
  }

  // This rank's newest complete snapshot in its own segment, if it is the one its last copy
  // made (a rank restored from a file or a replica has none until its next copy completes).
  std::optional<SlotSegment::ValidSlot> NewestOwnSlot() {
    if (local_step_ < 1) return std::nullopt;
    std::vector<std::string> ignored;
    std::optional<SlotSegment::ValidSlot> newest;
    for (const SlotSegment::ValidSlot& v : own_.ValidSlots(&ignored))
      if (!newest || v.step > newest->step) newest = v;
    if (!newest || newest->step != local_step_) return std::nullopt;
    return newest;
  }

  // A new stream: `source` copied into the outgoing segment's older slot (the newer one holds the
  // previous stream's snapshot, whose replica is complete), where it stays a restore candidate
  // (this rank's own and the shared entries of that step, for a restore of a lost host); what
  // streams is its replica, the snapshot without its shared entries' bytes (checkpoint_format.h).
  Status Freeze(const SlotSegment::ValidSlot& source) {
    const int64_t bytes = static_cast<int64_t>(source.payload.size());
    CUPCAKE_ASSIGN_OR_RETURN(const internal::ParsedSnapshot parsed,
                             internal::ParseSnapshot(source.payload, own_.where()));
    CUPCAKE_RETURN_IF_ERROR(outgoing_->Ensure(bytes));
    const int slot = outgoing_->BeginWrite();
    std::memcpy(outgoing_->slot(slot), source.payload.data(), source.payload.size());
    outgoing_->FinishCopy(slot, source.step, bytes, source.checksum);
    rank_part_ = internal::MakeRankPart(source.payload, parsed, source.checksum);
    stream_ = {source.step, static_cast<int64_t>(rank_part_.size()),
               internal::Checksum(rank_part_.data(), rank_part_.size()), 0};
    return Status::Ok();
  }

  // A replica exchange to run (Exchange): Commit's, or one in a gap after a group's collective.
  struct ExchangeRequest {
    bool commit = false;  // Commit's: new streams start, from `source`, when every one has ended
    std::optional<SlotSegment::ValidSlot> source;
    int64_t chunk_bytes = 0;  // the most this rank sends; 0: no chunk (Commit's may still freeze)
    // A gap's request whose network is not idle on this rank (its next collective waits):
    // every rank sends nothing in this exchange (SendChunk).
    bool behind = false;
    int gap = -1;  // the group the gap follows; -1: Commit's
  };

  // On the caller's thread (Commit's, or the session's communication thread): the gate closes
  // now, before the caller can start another collective, and opens when the exchange has ended.
  void RequestExchange(ExchangeRequest request) {
    if (options_.gate) options_.gate->BeginTransfer();
    {
      std::lock_guard lock(exchange_mu_);
      exchanges_.push_back(std::move(request));
    }
    exchange_cv_.notify_all();
  }

  // The exchange thread: the requests in order, each with the gate closed, until the Checkpointer
  // stops and none is left. Every rank requests the same exchanges in the same order (Commit's;
  // its session's gaps, after the same groups of the same plan), so their collectives pair up.
  void ExchangeLoop() {
    std::unique_lock lock(exchange_mu_);
    while (true) {
      exchange_cv_.wait(lock, [&] { return exchange_stop_ || !exchanges_.empty(); });
      if (exchanges_.empty()) return;
      const ExchangeRequest request = exchanges_.front();
      lock.unlock();
      const Status status = Exchange(request);
      lock.lock();
      exchanges_.pop_front();
      if (exchange_status_.ok()) exchange_status_ = status;
      exchange_cv_.notify_all();
      // Only now: a collective the gate held finds the queue empty at its hook (AfterCollective).
      if (options_.gate) options_.gate->EndTransfer();
    }
  }

  // One exchange (Gemini's replicas in the idle network gaps, docs/CHECKPOINT.md), on the
  // exchange thread:
  //   1. Commit's, after every rank's stream has ended: this rank starts a new one from
  //      `source` (none: an empty one), and the next exchange with a chunk runs whatever it finds;
  //   2. while some stream has bytes left, SendChunk sends this rank's next chunk of at most
  //      request.chunk_bytes (a gap's request comes only then: AfterCollective).
  Status Exchange(const ExchangeRequest& request) {
    Status status = Status::Ok();
    if (request.commit && streams_done_) {
      stream_ = {};
      rank_part_.clear();
      if (request.source) status = Freeze(*request.source);
      streams_done_ = false;
    }
    if (request.chunk_bytes == 0 || streams_done_) return status;
    bool closed = false;
    const Status sent = SendChunk(request.behind ? 0 : request.chunk_bytes, &closed);
    if (request.gap >= 0) AgreeGap(request.gap, closed);  // also after a rank's own error: see SendChunk
    return status.ok() ? sent : status;
  }

  // A gap that the agreement found closed (some rank's next collective waiting) rests: its next
  // 2^n - 1 requests make no exchange, n the exchanges in a row that found it closed, at most
  // kGapMaxClosed. So a gap that stays closed costs one agreement in 16 steps in place of one per
  // step, and one that has opened again is tried within 15 steps. Every rank keeps the same
  // history: it runs the same exchanges, each with the same agreed cap. The history is the
  // exchange thread's while an exchange is queued, the hook's (under exchange_mu_) otherwise.
  static constexpr int kGapMaxClosed = 4;
  bool GapResting(int gap) {
    GapHistory& h = gap_history_[static_cast<size_t>(gap)];
    if (h.rest == 0) return false;
    --h.rest;
    return true;
  }
  void AgreeGap(int gap, bool closed) {
    GapHistory& h = gap_history_[static_cast<size_t>(gap)];
    h.closed = closed ? std::min(h.closed + 1, kGapMaxClosed) : 0;
    h.rest = (1 << h.closed) - 1;
  }

  // The chunk's exchange, on the exchange thread's communicator; `closed`: whether the agreed cap
  // was 0 (the same on every rank once the allgather returned, whatever this rank's status):
  //   1. one allgather of each rank's (step, bytes, checksum, offset, most): every rank's chunk is
  //      then the rest of its stream, at most the smallest `most` of any rank, so a gap that has
  //      closed on one rank (`most` 0) carries no chunk on any (counted in gaps_skipped());
  //   2. unless every chunk is empty (every rank knows that alike from the rows),
  //      one alltoallv through two bounded buffers (a copy of the chunk per holder; the sources'
  //      chunks side by side): this rank's next chunk to each of its
  //      holders (the placement), each source's chunk into its replica segment's slot that does
  //      not hold the newest complete replica (kSlotWriting from the first chunk on, so a torn
  //      replica is never restored);
  //   3. after a source's last chunk the slot's checksum is computed and compared with the
  //      sender's, and the slot flips to valid.
  // Every rank makes the same collectives in every exchange, also when its own stream is empty or
  // a segment failed (it then sends nothing or drops what it receives), so no rank waits alone.
  Status SendChunk(int64_t most, bool* closed) {
    Status status = Status::Ok();
    const int world = comm_->size();
    const int64_t mine[kStreamRow] = {stream_.step, stream_.bytes, static_cast<int64_t>(stream_.checksum),
                                      stream_.offset, most};
    std::vector<int64_t> rows(static_cast<size_t>(kStreamRow * world));
    const std::string where = where_ + ": replica";
    CUPCAKE_RETURN_IF_ERROR(replica_comm_->Allgather(mine, rows.data(), sizeof(mine)).WithPrefix(where));
    int64_t cap = most;
    for (int r = 0; r < world; ++r) cap = std::min(cap, rows[static_cast<size_t>(kStreamRow * r + 4)]);
    *closed = cap == 0;
    if (cap == 0) gaps_skipped_.fetch_add(1, std::memory_order_relaxed);
    // Every rank's chunk in its row's place of `most`: the rest of its stream, at most `cap`.
    // Every rank computes the same: whether some chunk has bytes, whether every stream has then
    // been sent to its end.
    bool any = false, done = true;
    for (int r = 0; r < world; ++r) {
      int64_t* row = &rows[static_cast<size_t>(kStreamRow * r)];
      row[4] = std::max<int64_t>(0, std::min(row[1] - row[3], cap));
      any = any || row[4] > 0;
      done = done && row[3] + row[4] >= row[1];
    }
    streams_done_ = done;
    if (!any) return status;
    const int rank = comm_->rank();
    const int64_t chunk = rows[static_cast<size_t>(kStreamRow * rank + 4)];
    // 2. The bounded buffers: the chunk once per holder, the sources' chunks side by side.
    std::vector<int64_t> send(static_cast<size_t>(world), 0), recv(static_cast<size_t>(world), 0);
    const std::vector<int>& holders = placement_.holders[static_cast<size_t>(rank)];
    const std::vector<int>& sources = placement_.sources[static_cast<size_t>(rank)];
    outbox_.resize(static_cast<size_t>(chunk) * holders.size());
    for (size_t i = 0; i < holders.size() && chunk > 0; ++i) {
      send[static_cast<size_t>(holders[i])] = chunk;
      std::memcpy(outbox_.data() + i * static_cast<size_t>(chunk), rank_part_.data() + stream_.offset,
                  static_cast<size_t>(chunk));
    }
    int64_t inbox_bytes = 0;
    for (int q : sources) {
      const int64_t* in = &rows[static_cast<size_t>(kStreamRow * q)];
      recv[static_cast<size_t>(q)] = in[4];
      inbox_bytes += in[4];
      if (in[4] > 0 && in[3] == 0) {  // q's new stream
        SlotSegment& segment = *replicas_[q];
        incoming_[q] = {};
        const Status ensured = segment.Ensure(in[1]);
        if (ensured.ok())
          incoming_[q] = {segment.BeginWrite(), in[0], true};
        else if (status.ok())
          status = ensured;
      }
    }
    inbox_.resize(static_cast<size_t>(inbox_bytes));
    CUPCAKE_RETURN_IF_ERROR(replica_comm_->Alltoallv(outbox_.data(), send, inbox_.data(), recv).WithPrefix(where));
    stream_.offset += chunk;
    if (chunk > 0 && stream_.offset == stream_.bytes) replicated_step_.store(stream_.step, std::memory_order_release);
    // 3. Each source's chunk into its replica slot; a complete replica checked and made valid.
    const std::byte* at = inbox_.data();
    for (int q : sources) {
      const int64_t* in = &rows[static_cast<size_t>(kStreamRow * q)];
      const int64_t in_step = in[0], in_bytes = in[1], in_offset = in[3], in_chunk = in[4];
      const uint64_t in_checksum = static_cast<uint64_t>(in[2]);
      Incoming& incoming = incoming_[q];
      SlotSegment& segment = *replicas_[q];
      const bool ours = incoming.ok && incoming.step == in_step;
      if (in_chunk > 0 && ours) std::memcpy(segment.slot(incoming.slot) + in_offset, at, static_cast<size_t>(in_chunk));
      at += in_chunk;
      if (in_chunk == 0 || !ours || in_offset + in_chunk != in_bytes) continue;
      const uint64_t got = segment.FinishWrite(incoming.slot, in_step, in_bytes);
      incoming = {};
      if (got != in_checksum) {
        segment.DropNewerThan(in_step - 1);
        if (status.ok())
          status = DataLossError(segment.where() + ": checksum: rank " + std::to_string(q) + "'s snapshot of step " +
                                 std::to_string(in_step) + " arrived changed; got " + Hex(got) + ", expected " +
                                 Hex(in_checksum));
      }
    }
    return status;
  }

  // Writes this rank's share of the snapshot (`payload`, its checksum `checksum`, its shared
  // entries' fingerprint `shared_print`) durably: its own entries and 1/W of the shared entries'
  // bytes (internal::MakeShare). Then keeps this rank's two newest files (the agreement needs the
  // previous one while another rank may still be writing the newest).
  Status Persist(int64_t step, std::span<const std::byte> payload, uint64_t checksum, uint64_t shared_print) {
    const std::string file = PersistedName(comm_->rank(), step);
    CUPCAKE_ASSIGN_OR_RETURN(const internal::ParsedSnapshot parsed,
                             internal::ParseSnapshot(payload, where_ + ": persist of step " + std::to_string(step)));
    internal::ShareFile share;
    internal::MakeShare(payload, parsed, checksum, shared_print, comm_->rank(), comm_->size(), &share);
    CUPCAKE_RETURN_IF_ERROR(
        WriteDurably(options_.persist_dir, file, share.pieces, options_.gate.get(), options_.persist_chunk_bytes));
    std::map<int64_t, std::string> files = PersistedFiles(options_.persist_dir, options_.name, comm_->rank());
    while (files.size() > 2) {
      ::unlink((options_.persist_dir + "/" + files.begin()->second).c_str());
      files.erase(files.begin());
    }
    return Status::Ok();
  }

  // This rank's whole snapshots that verify (its slots and, with replicate, its outgoing
  // slots), newest first, one per step, at most kCandidates; what does not verify goes to
  // `refused`.
  std::vector<Candidate> ListCandidates(std::vector<std::string>* refused) {
    std::vector<Candidate> out;
    for (SlotSegment* segment : {&own_, outgoing_.get()}) {
      if (segment == nullptr) continue;
      for (const SlotSegment::ValidSlot& v : segment->ValidSlots(refused)) {
        const std::string field = "slots[" + std::to_string(v.index) + "]";
        Candidate c;
        c.source = segment->where() + " " + field;
        c.payload = v.payload;
        if (Verify(&c, v.checksum, v.step, segment->where() + ": " + field + ".", comm_->rank(), refused))
          out.push_back(std::move(c));
      }
    }
    std::stable_sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) { return a.step > b.step; });
    std::vector<Candidate> unique;
    for (Candidate& c : out)
      if ((unique.empty() || unique.back().step != c.step) && static_cast<int>(unique.size()) < kCandidates)
        unique.push_back(std::move(c));
    return unique;
  }

  // This rank's two newest persisted files that verify (complete: trailer, checksum, structure,
  // its rank and world), newest first; what does not verify goes to `refused`. A file that is
  // whole but of no use to this job, one written by a job of another world size (its shares fit
  // only that world) or in persisted format 1, sets `foreign` (when still Ok): the restore fails
  // rather than start afresh, which would drop the file at the first Commit.
  std::vector<Candidate> FileCandidates(std::vector<std::string>* refused, Status* foreign) {
    std::vector<Candidate> out;
    if (options_.persist_dir.empty()) return out;
    const std::map<int64_t, std::string> files = PersistedFiles(options_.persist_dir, options_.name, comm_->rank());
    for (auto it = files.rbegin(); it != files.rend() && static_cast<int>(out.size()) < kFileCandidates; ++it) {
      Candidate c;
      c.source = options_.persist_dir + "/" + it->second;
      ReadLimits limits;
      limits.max_bytes = std::numeric_limits<int64_t>::max() / 2;
      StatusOr<std::string> bytes = ReadFile(c.source, limits);
      if (!bytes.ok()) {
        refused->push_back(bytes.status().message());
        continue;
      }
      c.file = std::make_shared<const std::string>(std::move(bytes).value());
      internal::Trailer t{};
      if (c.file->size() < sizeof(t)) {
        refused->push_back(c.source + ": trailer: truncated; got " + std::to_string(c.file->size()) +
                           " bytes, expected >= " + std::to_string(sizeof(t)));
        continue;
      }
      std::memcpy(&t, c.file->data() + c.file->size() - sizeof(t), sizeof(t));
      const uint64_t payload = c.file->size() - sizeof(t);
      if (std::memcmp(t.magic, internal::kTrailerMagic, 8) != 0 || t.payload_bytes != payload) {
        refused->push_back(c.source + ": trailer: not a complete snapshot; got " + std::to_string(t.payload_bytes) +
                           " payload bytes recorded, expected " + std::to_string(payload));
        continue;
      }
      c.payload = {reinterpret_cast<const std::byte*>(c.file->data()), payload};  // NOLINT: bytes of the file
      if (Verify(&c, t.checksum, it->first, c.source + ": trailer.", comm_->rank(), refused, Parse::kShare, foreign))
        out.push_back(std::move(c));
    }
    return out;
  }

  // The snapshots this rank holds of its sources (replicate), by source, newest first, verified
  // as the source's own would be.
  std::map<int, std::vector<Candidate>> ReplicaCandidates(std::vector<std::string>* refused) {
    std::map<int, std::vector<Candidate>> out;
    for (const auto& [source, segment] : replicas_) {
      std::vector<Candidate>& of = out[source];
      for (const SlotSegment::ValidSlot& v : segment->ValidSlots(refused)) {
        const std::string field = "slots[" + std::to_string(v.index) + "]";
        Candidate c;
        c.source = segment->where() + " " + field;
        c.payload = v.payload;
        if (Verify(&c, v.checksum, v.step, segment->where() + ": " + field + ".", source, refused, Parse::kRankPart))
          of.push_back(std::move(c));
      }
      std::sort(of.begin(), of.end(), [](const Candidate& a, const Candidate& b) { return a.step > b.step; });
    }
    return out;
  }

  // What a candidate's payload is: a whole snapshot, a replica, or a persisted file (a share).
  enum class Parse { kSnapshot, kRankPart, kShare };
  // The checksum (`field` prefixes its name: "<segment>: slots[1]." or "<file>: trailer."), the
  // structure, the step and the owner of a candidate. A persisted file's payload becomes its
  // replica, and its share goes to c->share. A persisted file of another world size or of another
  // format (checked first: older formats compute the checksum otherwise) sets `foreign` (when
  // given and still Ok; FileCandidates) instead of a line in `refused`.
  bool Verify(Candidate* c, uint64_t stored, int64_t step, const std::string& field, int rank,
              std::vector<std::string>* refused, Parse parse = Parse::kSnapshot, Status* foreign = nullptr) {
    if (parse == Parse::kShare) {
      if (Status format = internal::CheckShareFormat(c->payload, c->source); !format.ok()) {
        if (foreign == nullptr)
          refused->push_back(format.message());
        else if (foreign->ok())
          *foreign = FailedPreconditionError(format.message());
        return false;
      }
    }
    const uint64_t got = internal::Checksum(c->payload.data(), c->payload.size());
    if (got != stored) {
      refused->push_back(field + "checksum: does not match the contents; got " + Hex(got) + ", expected " +
                         Hex(stored) + " (stored)");
      return false;
    }
    StatusOr<internal::ParsedSnapshot> parsed = InternalError("not parsed");
    if (parse == Parse::kShare) {
      StatusOr<internal::ParsedShare> share = internal::ParseShare(c->payload, c->source);
      if (share.ok()) {
        c->payload = share->rank_part;
        c->share = share->share;
        c->shared_bytes = share->shared_bytes;
        c->shared_print = share->shared_print;
        parsed = std::move(share->parsed);
      } else {
        parsed = share.status();
      }
    } else {
      parsed = parse == Parse::kRankPart ? internal::ParseRankPart(c->payload, c->source)
                                         : internal::ParseSnapshot(c->payload, c->source);
    }
    if (!parsed.ok()) {
      refused->push_back(parsed.status().message());
      return false;
    }
    if (foreign != nullptr && parsed->world_size != comm_->size() && parsed->step == step && parsed->rank == rank) {
      if (foreign->ok())
        *foreign = FailedPreconditionError(
            c->source + ": world_size: written by a job of another world size; got rank " + std::to_string(rank) +
            " of " + std::to_string(parsed->world_size) + ", expected rank " + std::to_string(rank) + " of " +
            std::to_string(comm_->size()) + " (the ranks' shares fit only the world that wrote them: restore with " +
            std::to_string(parsed->world_size) + " ranks, or remove the files to start afresh)");
      return false;
    }
    if (parsed->step != step || parsed->rank != rank || parsed->world_size != comm_->size()) {
      refused->push_back(c->source + ": step, rank: not the expected snapshot; got step " +
                         std::to_string(parsed->step) + " of rank " + std::to_string(parsed->rank) + " of " +
                         std::to_string(parsed->world_size) + ", expected step " + std::to_string(step) + " of rank " +
                         std::to_string(rank) + " of " + std::to_string(comm_->size()));
      return false;
    }
    c->step = step;
    c->parsed = std::move(parsed).value();
    return true;
  }

  // The loaded snapshot against the job's entries, every problem together.
  Status Check() const {
    const std::vector<internal::SnapshotEntry>& got = loaded_.parsed.entries;
    std::string problems;
    auto problem = [&](const std::string& line) { problems += (problems.empty() ? "" : "\n") + line; };
    if (got.size() != entries_.size())
      problem(loaded_.source + ": entries: does not match the job; got " + std::to_string(got.size()) +
              " entries, expected " + std::to_string(entries_.size()) + " (registered)");
    for (size_t i = 0; i < std::min(got.size(), entries_.size()); ++i) {
      const std::string field = loaded_.source + ": entries[" + std::to_string(i) + "]";
      if (got[i].name != entries_[i].name)
        problem(field + ".name: does not match the job; got '" + got[i].name + "', expected '" + entries_[i].name +
                "'");
      else if (got[i].size_bytes != static_cast<int64_t>(entries_[i].memory.size()))
        problem(field + ".size_bytes: does not match the job; got " + std::to_string(got[i].size_bytes) +
                ", expected " + std::to_string(entries_[i].memory.size()) + " ('" + entries_[i].name + "')");
    }
    return problems.empty() ? Status::Ok() : InvalidArgumentError(problems);
  }

  // Rank `rank`'s persisted file of `step`: its name, and its path in persist_dir.
  std::string PersistedName(int rank, int64_t step) const {
    return options_.name + "-" + std::to_string(rank) + "-" + std::to_string(step) + ".ckpt";
  }
  std::string PersistedPath(int rank, int64_t step) const {
    return options_.persist_dir + "/" + PersistedName(rank, step);
  }

  // For a restore that found no common step: the newest persisted step and the ranks whose share
  // of it is missing or was refused, e.g. "; step 4 lacks the persisted share of rank 1
  // (/ckpt/job-1-4.ckpt: missing or refused there)"; empty when no rank persisted a step.
  std::string DescribeMissingShares(const Holdings& held) const {
    const auto [step, lacking] = held.MissingShares();
    if (lacking.empty()) return "";
    std::string ranks, paths;
    for (int r : lacking) {
      ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
      paths += (paths.empty() ? "" : ", ") + PersistedPath(r, step);
    }
    return "; step " + std::to_string(step) + " lacks the persisted share of rank " + ranks + " (" + paths +
           ": missing or refused there)";
  }

  // Once, at this object's start (its first Find or Commit): the temporaries that a persist of
  // this rank killed before its rename left in persist_dir (RemoveStaleTemporaries).
  void SweepTemporaries() {
    if (temporaries_swept_ || options_.persist_dir.empty()) return;
    temporaries_swept_ = true;
    RemoveStaleTemporaries(options_.persist_dir, options_.name, comm_->rank());
  }

  // After restoring `step`: snapshots of later steps (a rank got further before the crash) are
  // dropped, so the resumed run's snapshots never sit beside the lost run's. Step -1: all of them
  // (a first commit without a restore starts a new history).
  void DropNewerThan(int64_t step) {
    KeepPersistError(TakePersist(/*wait=*/true));  // its file may be one of them
    own_.DropNewerThan(step);
    for (const auto& [source, segment] : replicas_) segment->DropNewerThan(step);
    if (outgoing_ != nullptr) outgoing_->DropNewerThan(step);
    if (!options_.persist_dir.empty())
      for (const auto& [s, file] : PersistedFiles(options_.persist_dir, options_.name, comm_->rank()))
        if (s > step) ::unlink((options_.persist_dir + "/" + file).c_str());
  }

  CheckpointOptions options_;
  comm::Communicator* comm_;
  Session* session_ = nullptr;
  SlotSegment own_;
  std::string where_;  // own_'s path, the prefix of messages
  // options_.replicate: the placement, and by source rank the segments of its snapshots.
  internal::ReplicaPlacement placement_;
  std::map<int, std::unique_ptr<SlotSegment>> replicas_;
  std::unique_ptr<SlotSegment> outgoing_;  // options_.replicate: this rank's streamed snapshots
  std::unique_ptr<comm::Communicator> replica_comm_;  // the exchange thread's (replicas)
  std::vector<Entry> entries_;
  std::thread copy_;
  Status copy_status_;  // written by copy_, read after joining it
  // The persist of a snapshot (StartPersist): persist_status_ written by persist_ before
  // persist_done_; persisted_step_ the newest step it wrote.
  std::thread persist_;
  int persist_slot_ = -1;
  Status persist_status_;
  std::atomic<bool> persist_done_{true};
  std::atomic<int64_t> persisted_step_{0};
  // The replica exchanges (ExchangeLoop) and their state, written by exchange_thread_ and read
  // by the training thread once none is requested (exchange_mu_).
  std::thread exchange_thread_;  // started with replica_comm_
  std::mutex exchange_mu_;
  std::condition_variable exchange_cv_;
  std::deque<ExchangeRequest> exchanges_;  // requested, the front one running; exchange_mu_
  bool exchange_stop_ = false;  // exchange_mu_
  Status exchange_status_;  // the first error since the last WaitForCopy; exchange_mu_
  // replica_gaps for the attached session (AttachGaps): the plan they are for, each of its groups'
  // chunk after it (0: none) and gap -1's (Commit's). The session's hook reaches this object
  // through relay_, which DetachGaps empties (the session may outlive the attachment).
  struct GapRelay {
    std::mutex mutex;
    Impl* impl = nullptr;
  };
  std::shared_ptr<GapRelay> relay_;
  int gaps_plan_ = -1;  // -1: none
  std::vector<int64_t> gap_bytes_;
  int64_t commit_gap_bytes_ = 0;
  // Set by the first Commit whose agreement every rank passed with these gaps; before it the
  // hook requests nothing (the exchange thread may not exist yet).
  std::atomic<bool> gaps_armed_{false};
  // Gap requests that carried nothing while a stream had bytes left: agreed closed (SendChunk)
  // or resting (GapResting).
  std::atomic<int64_t> gaps_skipped_{0};
  std::atomic<int64_t> replicated_step_{0};  // the step of this rank's newest stream sent to its end
  std::atomic<int64_t> gap_requests_{0};  // the hook's calls for a gap with bytes (AfterCollective)
  struct GapHistory {  // per group of gaps_plan_ (GapResting, AgreeGap)
    int closed = 0;  // exchanges in a row that found the gap closed, at most kGapMaxClosed
    int rest = 0;  // requests left that make no exchange
  };
  std::vector<GapHistory> gap_history_;
  struct Stream {  // of rank_part_
    int64_t step = 0, bytes = 0;
    uint64_t checksum = 0;
    int64_t offset = 0;  // bytes sent
  } stream_;
  std::vector<std::byte> rank_part_;  // the stream's replica (Freeze)
  struct Incoming {
    int slot = -1;  // in its source's replica segment, kSlotWriting
    int64_t step = 0;
    bool ok = false;
  };
  std::map<int, Incoming> incoming_;  // by source rank
  std::vector<std::byte> outbox_, inbox_;  // the exchange's buffers: a chunk per holder, per source
  bool streams_done_ = true;  // every rank's stream sent to its end: the next Commit starts new ones
  std::atomic<int64_t> local_step_{0};
  SharedPrints shared_prints_;  // of local_step_'s snapshot; written by copy_, read after joining it
  int64_t last_step_ = 0, agreed_step_ = 0;
  // Whether this object's snapshots continue a history: a restore's, or its own first commit's.
  bool history_started_ = false;
  bool temporaries_swept_ = false;
  Loaded loaded_;
};

StatusOr<std::unique_ptr<Checkpointer>> Checkpointer::Create(const CheckpointOptions& options,
                                                             comm::Communicator* communicator) {
  std::string problems;
  auto problem = [&](const std::string& line) { problems += (problems.empty() ? "" : "\n") + line; };
  if (!ValidName(options.name))
    problem("Checkpointer: name: not a segment name; got '" + options.name +
            "', expected 1 to 100 letters, digits, '.', '_' or '-'");
  if (options.persist_every < 0)
    problem("Checkpointer: persist_every: out of range; got " + std::to_string(options.persist_every) +
            ", expected >= 0");
  if (options.persist_every > 0 && options.persist_dir.empty())
    problem("Checkpointer: persist_dir: empty; got persist_every " + std::to_string(options.persist_every) +
            ", expected a directory to persist to");
  if (!options.persist_dir.empty()) {
    struct stat st {};
    if (::stat(options.persist_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      problem(options.persist_dir + ": persist_dir: not a directory; expected an existing directory");
  }
  if (options.replica_chunk_bytes < 0)
    problem("Checkpointer: replica_chunk_bytes: out of range; got " + std::to_string(options.replica_chunk_bytes) +
            ", expected >= 0 (0: whole replicas)");
  if (options.persist_chunk_bytes < 0)
    problem("Checkpointer: persist_chunk_bytes: out of range; got " + std::to_string(options.persist_chunk_bytes) +
            ", expected >= 0 (0: the whole file in one write)");
  else if (options.persist_chunk_bytes > 0 && options.persist_every == 0)
    problem("Checkpointer: persist_chunk_bytes: given without persist_every; got " +
            std::to_string(options.persist_chunk_bytes) + ", expected persist_every > 0 (the pieces are a persist's)");
  else if (options.persist_chunk_bytes > 0 && options.gate == nullptr)
    problem("Checkpointer: persist_chunk_bytes: given without a gate; got " +
            std::to_string(options.persist_chunk_bytes) +
            ", expected the gate of the session's communicator (GateCommunicator), whose idle time the pieces take");
  if (options.replica_max_commits < 0)
    problem("Checkpointer: replica_max_commits: out of range; got " + std::to_string(options.replica_max_commits) +
            ", expected >= 0 (0: no bound)");
  for (size_t i = 0; i < options.replica_gaps.size(); ++i) {
    const ReplicaGap& g = options.replica_gaps[i];
    const std::string field = "Checkpointer: replica_gaps[" + std::to_string(i) + "]";
    if (g.after_group < -1)
      problem(field + ".after_group: out of range; got " + std::to_string(g.after_group) +
              ", expected >= -1 (-1: the gap before the first collective)");
    else if (i > 0 && g.after_group <= options.replica_gaps[i - 1].after_group)
      problem(field + ".after_group: not after the previous gap's; got " + std::to_string(g.after_group) + " after " +
              std::to_string(options.replica_gaps[i - 1].after_group) + ", expected increasing (one entry per gap)");
    if (g.bytes < 0)
      problem(field + ".bytes: out of range; got " + std::to_string(g.bytes) + ", expected >= 0 (0: none)");
  }
  if (!options.replica_gaps.empty() && !options.replicate)
    problem("Checkpointer: replica_gaps: given without replicate; got " + std::to_string(options.replica_gaps.size()) +
            " gaps, expected replicate (the gaps carry replica chunks)");
  if (options.replica_group_hosts < 2)
    problem("Checkpointer: replica_group_hosts: out of range; got " + std::to_string(options.replica_group_hosts) +
            ", expected >= 2 (a host and at least one that keeps its replicas)");
  if (options.replicate && communicator != nullptr && communicator->size() < 2)
    problem("Checkpointer: replicate: needs a peer; got " + std::to_string(communicator->size()) +
            " rank, expected at least 2");
  if (communicator == nullptr)
    problem("Checkpointer: communicator: null; expected the job's communicator");
  else if (communicator->memory() != comm::MemoryKind::kHost)
    problem("Checkpointer: communicator: device memory; expected a host-memory communicator (MPI, in-process)");
  if (!problems.empty()) return InvalidArgumentError(problems);
  return std::unique_ptr<Checkpointer>(new Checkpointer(std::make_unique<Impl>(options, communicator)));
}

Checkpointer::Checkpointer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Checkpointer::~Checkpointer() = default;

Status Checkpointer::Add(const std::string& name, std::span<std::byte> bytes, Capture capture, Scope scope) {
  return impl_->Add(name, bytes, capture, scope);
}
Status Checkpointer::AddFloats(const std::string& name, std::span<float> values, Capture capture, Scope scope) {
  return impl_->Add(name, std::as_writable_bytes(values), capture, scope);
}
void Checkpointer::Clear() { impl_->Clear(); }
Status Checkpointer::AttachSession(Session* session) { return impl_->AttachSession(session); }
Status Checkpointer::Commit(int64_t step, std::string_view metadata) { return impl_->Commit(step, metadata); }
Status Checkpointer::WaitForCopy() { return impl_->WaitForCopy(); }
int64_t Checkpointer::agreed_step() const { return impl_->agreed_step(); }
int64_t Checkpointer::local_step() const { return impl_->local_step(); }
int64_t Checkpointer::persisted_step() const { return impl_->persisted_step(); }
int64_t Checkpointer::replicated_step() const { return impl_->replicated_step(); }
int64_t Checkpointer::replica_gaps_skipped() const { return impl_->replica_gaps_skipped(); }
int64_t Checkpointer::replica_gaps_requested() const { return impl_->replica_gaps_requested(); }
Status Checkpointer::WaitForPersist() { return impl_->WaitForPersist(); }
StatusOr<RestorePoint> Checkpointer::Find() { return impl_->Find(); }
Status Checkpointer::Apply(const Status& job_status) { return impl_->Apply(job_status); }
StatusOr<RestorePoint> Checkpointer::Restore() {
  CUPCAKE_ASSIGN_OR_RETURN(RestorePoint point, impl_->Find());
  if (point.step > 0) CUPCAKE_RETURN_IF_ERROR(impl_->Apply(Status::Ok()));
  return point;
}

std::string Checkpointer::SegmentName(const std::string& name, int rank) {
  return "/cupcake-" + name + "-" + std::to_string(rank);
}

std::string Checkpointer::ReplicaSegmentName(const std::string& name, int rank) {
  return SegmentName(name, rank) + "-replica";
}

std::string Checkpointer::ReplicaOfSegmentName(const std::string& name, int rank, int source) {
  return ReplicaSegmentName(name, rank) + "-" + std::to_string(source);
}

std::string Checkpointer::OutgoingSegmentName(const std::string& name, int rank) {
  return SegmentName(name, rank) + "-outgoing";
}

Status Checkpointer::RemoveSegment(const std::string& name, int rank) {
  // The prefix itself: the one replica segment of older versions, the ring predecessor's.
  std::vector<std::string> segments = {SegmentName(name, rank), OutgoingSegmentName(name, rank),
                                       ReplicaSegmentName(name, rank)};
  // The replicas of any source: <replica prefix>-<digits>, listed from /dev/shm (Linux).
  const std::string prefix = ReplicaSegmentName(name, rank).substr(1) + "-";
  if (DIR* d = ::opendir("/dev/shm")) {
    while (const dirent* e = ::readdir(d)) {
      const std::string f = e->d_name;
      if (f.size() > prefix.size() && f.compare(0, prefix.size(), prefix) == 0 &&
          std::all_of(f.begin() + static_cast<std::ptrdiff_t>(prefix.size()), f.end(), ::isdigit))
        segments.push_back("/" + f);
    }
    ::closedir(d);
  }
  for (const std::string& segment : segments)
    if (::shm_unlink(segment.c_str()) != 0 && errno != ENOENT)
      return UnavailableError("/dev/shm" + segment + ": " + Errno("shm_unlink", errno));
  return Status::Ok();
}

}  // namespace cupcake::runtime
