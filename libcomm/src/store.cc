// The file store and the prefixed view of store.h.
#include "cupcake/comm/store.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <unistd.h>

namespace cupcake::comm {
namespace {

namespace fs = std::filesystem;

// A key as a file name: letters, digits, '-', '_' and '.' kept, every other byte as %XX, so
// keys with '/' (prefixes) stay one file of the directory.
std::string FileName(const std::string& key) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char ch : key) {
    if (std::isalnum(ch) != 0 || ch == '-' || ch == '_' || ch == '.') {
      out += static_cast<char>(ch);
    } else {
      out += '%';
      out += kHex[ch >> 4];
      out += kHex[ch & 15];
    }
  }
  return "key-" + out;
}

class FileStore final : public KeyValueStore {
 public:
  explicit FileStore(fs::path dir) : dir_(std::move(dir)) {}

  Status Set(const std::string& key, const std::string& value) override {
    // Unique per process and call: two writers never share a temporary file.
    const fs::path tmp = dir_ / (".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++) + "-" +
                                 FileName(key));
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out.write(value.data(), static_cast<std::streamsize>(value.size()));
      out.close();
      if (!out) return UnavailableError("file store: " + tmp.string() + ": cannot write key '" + key + "'");
    }
    std::error_code ec;
    fs::rename(tmp, dir_ / FileName(key), ec);
    if (ec) return UnavailableError("file store: " + dir_.string() + ": cannot set key '" + key + "': " + ec.message());
    return Status::Ok();
  }

  StatusOr<std::string> Get(const std::string& key) override {
    std::ifstream in(dir_ / FileName(key), std::ios::binary);
    if (!in) return NotFoundError("file store: " + dir_.string() + ": key '" + key + "' is not set");
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }

  Status Wait(std::span<const std::string> keys, std::chrono::milliseconds timeout) override {
    using Clock = std::chrono::steady_clock;
    const auto deadline = Clock::now() + timeout;
    auto pause = std::chrono::microseconds(1000);
    for (const std::string& key : keys) {
      while (!fs::exists(dir_ / FileName(key))) {
        if (Clock::now() >= deadline)
          return DeadlineExceededError("file store: " + dir_.string() + ": timed out after " +
                                       std::to_string(timeout.count()) + " ms waiting for key '" + key + "'");
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::microseconds(10000));
      }
    }
    return Status::Ok();
  }

 private:
  fs::path dir_;
  std::atomic<int64_t> counter_{0};
};

class Prefixed final : public KeyValueStore {
 public:
  Prefixed(std::shared_ptr<KeyValueStore> store, std::string prefix)
      : store_(std::move(store)), prefix_(std::move(prefix)) {}
  Status Set(const std::string& key, const std::string& value) override { return store_->Set(prefix_ + key, value); }
  StatusOr<std::string> Get(const std::string& key) override { return store_->Get(prefix_ + key); }
  Status Wait(std::span<const std::string> keys, std::chrono::milliseconds timeout) override {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const std::string& k : keys) full.push_back(prefix_ + k);
    return store_->Wait(full, timeout);
  }

 private:
  std::shared_ptr<KeyValueStore> store_;
  std::string prefix_;
};

}  // namespace

StatusOr<std::shared_ptr<KeyValueStore>> MakeFileStore(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    return InvalidArgumentError("file store: " + dir + ": cannot make the directory" +
                                (ec ? ": " + ec.message() : std::string()) + "; expected a writable directory");
  return std::shared_ptr<KeyValueStore>(std::make_shared<FileStore>(dir));
}

std::shared_ptr<KeyValueStore> PrefixStore(std::shared_ptr<KeyValueStore> store, std::string prefix) {
  return std::make_shared<Prefixed>(std::move(store), std::move(prefix));
}

}  // namespace cupcake::comm
