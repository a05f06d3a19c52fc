// Whole-file reads that are bounded and read each input once, and atomic writes (write a
// temporary beside the target, then rename), so an interrupted write never leaves a
// half-written file.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "cupcake/proto/limits.h"
#include "cupcake/proto/status.h"

namespace cupcake {

struct ReadLimits {
  int64_t max_bytes = kMaxInputBytes;
  double wait_s = kInputWaitS;  // for FIFOs, pipes and devices: the longest wait for more data
};

// Reads the whole input once, so a pipe such as `<(cat m.json)` works. NotFound when it does
// not exist; InvalidArgument for a directory or an input larger than `limits.max_bytes`
// (read no further than that: /dev/zero ends there); Unavailable when a FIFO, pipe or device
// gives no data for `limits.wait_s` seconds (a FIFO with no writer). Every message names the path.
StatusOr<std::string> ReadFile(const std::string& path, const ReadLimits& limits = {});

// Writes `contents` to `path`. A regular file or a new path is written through
// `<file>.tmp.<pid>` and rename(2), so it holds the old contents or the new, never a part; a
// symbolic link is followed and its target replaced that way (the link stays). A FIFO, a device
// or a socket is written straight (`-o /dev/null` discards); a FIFO with no reader is an error,
// not a wait. "-" writes to stdout; a directory or an empty path is an error.
Status WriteFileAtomic(const std::string& path, std::string_view contents);

// fsync(2) of the directory `dir`, so that a rename into it (WriteFileAtomic's) survives a power
// loss: the file's own fsync makes its bytes durable, not its name. Unavailable naming `dir`
// when it cannot be opened as a directory or synced.
Status SyncDirectory(const std::string& dir);

}  // namespace cupcake
