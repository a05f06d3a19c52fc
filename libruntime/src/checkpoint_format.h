// The bytes of a checkpoint (docs/CHECKPOINT.md): the shared-memory segment's header and slots,
// and the snapshot payload that a slot holds and a persisted file holds followed by a trailer.
// Private to libruntime; the tests include it to tear and corrupt snapshots on purpose.
//
// Segment /dev/shm/cupcake-<name>-<rank>:
//   [SegmentHeader, padded to kHeaderBytes][slot 0: slot_capacity bytes][slot 1: slot_capacity bytes]
// A slot's SlotHeader lives in the segment header; its state is written with release order
// (atomic_ref) and flips to kValid only after the payload, its size and checksum are written.
// Payload (native byte order; a snapshot is read back on the machine that wrote it):
//   char magic[8] = kSnapshotMagic; int64 step; int32 rank; int32 world_size;
//   uint64 metadata_bytes; uint32 entry_count; uint32 zero;
//   entry_count x {uint32 name_bytes; uint32 flags; uint64 size_bytes; name_bytes bytes of name}
//   metadata; then each entry's bytes in entry order.
// An entry's flags: kEntryShared (Scope::kShared: the same bytes on every rank), else 0.
// Persisted file <name>-<rank>-<step>.ckpt (format 3): this rank's share of its snapshot, so that
// the W ranks together write the shared entries once:
//   ShareHeader; this rank's replica (below, rank_part_bytes); bytes [ShareOf(T, W, rank)) of the
//   shared entries' bytes laid end to end in entry order (T bytes in all; share_bytes); Trailer
//   (the checksum and size of everything before it).
// Format 1 (each rank's whole snapshot payload, then a Trailer; it begins with kSnapshotMagic) and
// format 2 (format 3's layout with the checksum of segment format 1) are refused by name.
// A replica (what a rank streams to the ranks that keep its replicas; docs/CHECKPOINT.md): its
// snapshot's payload without the shared entries' bytes, which a restore takes from another rank:
//   char magic[8] = kRankPartMagic; the snapshot's bytes from its step to its metadata's end;
//   then the bytes of each entry without kEntryShared, in entry order;
//   uint64 the checksum of the whole snapshot (so the snapshot rebuilt with another rank's shared
//   entries is verified against the lost rank's own).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cupcake/proto/status.h"

namespace cupcake::runtime::internal {

inline constexpr char kSegmentMagic[8] = {'C', 'U', 'P', 'C', 'K', 'S', 'H', '1'};
inline constexpr char kSnapshotMagic[8] = {'C', 'U', 'P', 'C', 'K', 'S', 'N', '1'};
inline constexpr char kTrailerMagic[8] = {'C', 'U', 'P', 'C', 'K', 'E', 'N', 'D'};
inline constexpr char kRankPartMagic[8] = {'C', 'U', 'P', 'C', 'K', 'R', 'K', '1'};
inline constexpr uint32_t kEntryShared = 1;
inline constexpr uint32_t kFormatVersion = 2;  // 1: another checksum function
inline constexpr char kShareMagic[8] = {'C', 'U', 'P', 'C', 'K', 'P', 'E', 'R'};
// 1: whole snapshots (no ShareHeader); 2: another checksum function
inline constexpr uint32_t kPersistedFormatVersion = 3;
inline constexpr int64_t kHeaderBytes = 4096;

enum SlotState : uint64_t { kSlotEmpty = 0, kSlotWriting = 1, kSlotValid = 2 };

struct SlotHeader {
  uint64_t state;  // SlotState, through std::atomic_ref
  int64_t step;
  uint64_t payload_bytes;
  uint64_t checksum;
};

struct SegmentHeader {
  char magic[8];
  uint32_t version;
  uint32_t zero;
  uint64_t slot_capacity;
  int32_t rank;
  int32_t world_size;
  SlotHeader slots[2];
};
static_assert(sizeof(SegmentHeader) <= kHeaderBytes);

// The head of a persisted file (format 3).
struct ShareHeader {
  char magic[8];  // kShareMagic
  uint32_t version;  // kPersistedFormatVersion
  int32_t rank;
  int32_t world_size;
  uint32_t zero;
  uint64_t rank_part_bytes;  // the replica that follows
  uint64_t shared_bytes;  // T: all the shared entries' bytes, of which this file holds a share
  uint64_t share_offset;  // ShareOf(T, world_size, rank)
  uint64_t share_bytes;
  uint64_t shared_print;  // SharedFingerprint of the T bytes, the same in every rank's file
};

struct Trailer {
  uint64_t checksum;
  uint64_t payload_bytes;
  char magic[8];
};

// A fast 64-bit checksum of the bytes: it catches torn and corrupted copies, not adversaries.
// P1 = 0x9E3779B185EBCA87, P2 = 0xC2B2AE3D27D4EB4F; key: 23 words of splitmix64 seeded with P1.
// Striped: 8 lanes of uint64, lane i starting at key[22 - i]; the bytes in blocks of 1 KiB, each
// of 16 stripes of 8 native words w_0..w_7; stripe s adds w_i + lo32(k) * hi32(k), k = w_i ^
// key[s + i], to lane i; each block ends with lane_i = (lane_i ^ lane_i >> 47 ^ key[i]) * P2.
// The last partial block is zero-padded. Then h = length * P1, h = rotl(h + lane * P2, 31) * P1
// for each lane in order, and h ^= h >> 33, h *= P2, h ^= h >> 29. Its 32-bit multiplies
// vectorize (AVX2, SSE2): the copy hashes each block it has just copied, and should not be held
// up by the hash.
uint64_t Checksum(const std::byte* data, size_t bytes);

// The implementations of the blocks' arithmetic, the same result each (Checksum takes the fastest
// available); for the tests.
enum class HashPath { kPortable, kSse2, kAvx2 };
bool HashPathAvailable(HashPath path);
uint64_t ChecksumOn(HashPath path, const std::byte* data, size_t bytes);

// Checksum over bytes that arrive in pieces: Update(a), Update(b), ..., then Final() is
// Checksum of the pieces laid end to end. Lets one pass over a snapshot's bytes give its
// checksum and its kShared entries' fingerprints (each a Hasher of its own) at once.
class Hasher {
 public:
  static constexpr size_t kBlockBytes = 1024;
  Hasher();  // the fastest path this CPU has
  void Update(const std::byte* data, size_t bytes);
  uint64_t Final() const;

 private:
  friend uint64_t ChecksumOn(HashPath path, const std::byte* data, size_t bytes);
  explicit Hasher(void (*accumulate)(uint64_t* lanes, const std::byte* data, size_t blocks));

  void (*accumulate_)(uint64_t* lanes, const std::byte* data, size_t blocks);
  uint64_t lanes_[8];
  std::byte pending_[kBlockBytes];  // the bytes after the last whole block
  size_t pending_bytes_ = 0;
  uint64_t total_bytes_ = 0;
};

struct SnapshotEntry {
  std::string name;
  int64_t size_bytes = 0;
  int64_t offset = 0;  // of its bytes in the payload; -1: a shared entry of a replica (not in it)
  bool shared = false;  // kEntryShared
};

struct ParsedSnapshot {
  int64_t step = 0;
  int32_t rank = 0, world_size = 0;
  std::string metadata;
  std::vector<SnapshotEntry> entries;
  int64_t data_offset = 0;  // where the entries' bytes begin
  uint64_t snapshot_checksum = 0;  // a replica's: the checksum of the whole snapshot
};

// Checks the payload's structure (magic, every size within the payload) and reads its directory;
// DataLoss naming `source` and the field otherwise.
StatusOr<ParsedSnapshot> ParseSnapshot(std::span<const std::byte> payload, const std::string& source);
// The same for a replica (kRankPartMagic): its shared entries have offset -1.
StatusOr<ParsedSnapshot> ParseRankPart(std::span<const std::byte> payload, const std::string& source);
// A snapshot's replica: `snapshot` (parsed as `parsed`, its checksum `checksum`) without its
// shared entries' bytes.
std::vector<std::byte> MakeRankPart(std::span<const std::byte> snapshot, const ParsedSnapshot& parsed,
                                    uint64_t checksum);
// The bytes of a snapshot's shared entries, in entry order.
std::vector<std::byte> SharedBytes(std::span<const std::byte> snapshot, const ParsedSnapshot& parsed);
// The snapshot a replica was made from: its bytes with `shared` (the shared entries' bytes, in
// entry order) put back; DataLoss naming `source` when `shared` has another size or the result
// does not match the replica's snapshot_checksum.
StatusOr<std::vector<std::byte>> RebuildSnapshot(std::span<const std::byte> rank_part, const ParsedSnapshot& parsed,
                                                 std::span<const std::byte> shared, const std::string& source);

// The bytes of the payload before the entries' data, for these names and metadata.
int64_t DirectoryBytes(const std::vector<std::string>& names, size_t metadata_bytes);

// Rank `rank`'s share of `total` bytes split among `world` ranks: [floor(rank T / W),
// floor((rank + 1) T / W)). Contiguous, in rank order, covering [0, T); shares differ by at most
// one byte. Depends only on (T, W, rank). 0 <= rank < world.
struct ByteRange {
  int64_t offset = 0, bytes = 0;
};
ByteRange ShareOf(int64_t total, int world, int rank);

// The fingerprint of a snapshot's shared entries: the checksum of their (index in the snapshot's
// entries, Checksum of the entry's bytes) pairs as uint64, in entry order. Commit's agreement
// compares it between the ranks; a persisted share records it.
uint64_t CombinePrints(const std::vector<std::pair<int, uint64_t>>& prints);
// CombinePrints of `shared` (the shared entries' bytes laid end to end, in entry order) for the
// entries of `parsed` (a snapshot or replica directory); `shared` must hold their bytes exactly.
uint64_t SharedFingerprint(const ParsedSnapshot& parsed, std::span<const std::byte> shared);

// Rank `rank`'s persisted file of `snapshot` (parsed as `parsed`, its checksum `checksum`, the
// fingerprint of its shared entries `shared_print`) in a world of `world`: ShareHeader, replica,
// share, as pieces to write in order (the Trailer is the writer's). `pieces` point into
// `snapshot` and into this object, which must stay where it is while they are used.
struct ShareFile {
  ShareHeader header{};
  uint64_t snapshot_checksum = 0;
  std::vector<std::span<const std::byte>> pieces;
};
void MakeShare(std::span<const std::byte> snapshot, const ParsedSnapshot& parsed, uint64_t checksum,
               uint64_t shared_print, int rank, int world, ShareFile* out);

// A persisted file's payload (the bytes before its Trailer), parsed: its replica (parsed, with
// the whole snapshot's checksum) and its share.
struct ParsedShare {
  ParsedSnapshot parsed;  // the replica's directory (ParseRankPart)
  std::span<const std::byte> rank_part;
  std::span<const std::byte> share;
  ByteRange range;  // of the shared bytes: ShareOf(shared_bytes, world, rank)
  int64_t shared_bytes = 0;
  uint64_t shared_print = 0;
};
// A persisted file's format, read before its checksum (older formats compute that otherwise): Ok
// for this version's files and for bytes that are no persisted file at all (the checksum and the
// structure refuse those); DataLoss naming `source` and the format for a file of format 1 or of
// another version.
Status CheckShareFormat(std::span<const std::byte> payload, const std::string& source);
// Checks the header (magic, version: CheckShareFormat), the sizes, the
// replica's structure, that the header's rank and world are the replica's, that shared_bytes is
// the sum of its shared entries' sizes and that the share is ShareOf(shared_bytes, world, rank);
// DataLoss naming `source` and the field otherwise.
StatusOr<ParsedShare> ParseShare(std::span<const std::byte> payload, const std::string& source);

}  // namespace cupcake::runtime::internal
