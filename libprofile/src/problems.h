// Collects validation problems so one pass reports them all, one per line.
#pragma once

#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "cupcake/proto/status.h"

namespace cupcake::profile::internal {

// Field paths: Join("tensors[3]", "numel") == "tensors[3].numel"; Index("tensors", 3).
std::string Join(const std::string& path, std::string_view key);
std::string Index(const std::string& path, size_t i);

class Problems {
 public:
  explicit Problems(std::string origin) : origin_(std::move(origin)) {}

  // Adds "<origin>: <path>: <text>". Only the first problem at a path is kept, so a field
  // reported missing or mistyped is not reported again by a later check.
  void Add(const std::string& path, const std::string& text);
  // Marks a path as reported without a message: a problem already said covers it.
  void Cover(const std::string& path) { paths_.insert(path); }
  bool empty() const { return lines_.empty(); }
  const std::string& origin() const { return origin_; }
  // InvalidArgument with every line (the first kMaxLines, then a count), or OK.
  Status ToStatus(StatusCode code = StatusCode::kInvalidArgument) const;

  static constexpr size_t kMaxLines = 25;

 private:
  std::string origin_;
  std::set<std::string> paths_;
  std::vector<std::string> lines_;
};

// "a, b, c" of a list of names.
std::string JoinNames(const std::vector<std::string_view>& names);

}  // namespace cupcake::profile::internal
