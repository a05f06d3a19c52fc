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
// Persisted file <name>-<rank>-<step>.ckpt: the payload, then a Trailer.
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
#include <vector>

#include "cupcake/proto/status.h"

namespace cupcake::runtime::internal {

inline constexpr char kSegmentMagic[8] = {'C', 'U', 'P', 'C', 'K', 'S', 'H', '1'};
inline constexpr char kSnapshotMagic[8] = {'C', 'U', 'P', 'C', 'K', 'S', 'N', '1'};
inline constexpr char kTrailerMagic[8] = {'C', 'U', 'P', 'C', 'K', 'E', 'N', 'D'};
inline constexpr char kRankPartMagic[8] = {'C', 'U', 'P', 'C', 'K', 'R', 'K', '1'};
inline constexpr uint32_t kEntryShared = 1;
inline constexpr uint32_t kFormatVersion = 1;
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

struct Trailer {
  uint64_t checksum;
  uint64_t payload_bytes;
  char magic[8];
};

// A fast 64-bit checksum of the bytes (four multiply-rotate lanes over 8-byte words, then the
// tail and the length): it catches torn and corrupted copies, not adversaries.
uint64_t Checksum(const std::byte* data, size_t bytes);

// Checksum over bytes that arrive in pieces: Update(a), Update(b), ..., then Final() is
// Checksum of the pieces laid end to end. Lets one pass over a snapshot's bytes give its
// checksum and its kShared entries' fingerprints (each a Hasher of its own) at once.
class Hasher {
 public:
  Hasher();
  void Update(const std::byte* data, size_t bytes);
  uint64_t Final() const;

 private:
  void MixBlocks(const std::byte* data, size_t blocks);  // whole 32-byte blocks into the lanes

  uint64_t lanes_[4];
  std::byte pending_[32];  // the bytes after the last whole 32-byte block
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

}  // namespace cupcake::runtime::internal
