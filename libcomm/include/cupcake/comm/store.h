// KeyValueStore: the rendezvous seam. Ranks that share no communicator yet meet through a store
// of keys and values (a directory, torch.distributed's c10d store, ...): each rank sets its
// keys and waits for its peers'. gloo and NCCL communicators are bootstrapped through one
// (gloo.h). Only set-up uses it (making a communicator, Split), never a collective.
#pragma once

#include <chrono>
#include <memory>
#include <span>
#include <string>

#include "cupcake/proto/status.h"

namespace cupcake::comm {

// A store shared by the ranks of a job. Values are byte strings; a key is set once.
// Thread-safety: implementations are safe to call from several threads at once.
class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  virtual Status Set(const std::string& key, const std::string& value) = 0;
  // The value of `key`, which must be set (after Wait); NotFound when it is not.
  virtual StatusOr<std::string> Get(const std::string& key) = 0;
  // Waits until every key of `keys` is set; DeadlineExceeded naming the first missing key after
  // `timeout`.
  virtual Status Wait(std::span<const std::string> keys, std::chrono::milliseconds timeout) = 0;
};

// A store in the directory `dir` (made if missing), one file per key, written to a temporary
// name and renamed into place, so a reader sees a whole value or none. Processes of one host,
// or of several on a shared file system, meet in the same directory. Wait polls the directory
// (every millisecond at first, backing off to every 10 ms). InvalidArgument naming `dir` when it
// cannot be made.
StatusOr<std::shared_ptr<KeyValueStore>> MakeFileStore(const std::string& dir);

// A view of `store` whose keys are prefixed with `prefix` (one store, several rendezvous).
std::shared_ptr<KeyValueStore> PrefixStore(std::shared_ptr<KeyValueStore> store, std::string prefix);

}  // namespace cupcake::comm
