#include "cupcake/proto/names.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <utility>
#include <vector>

namespace cupcake {
namespace {

template <typename E, size_t N>
using Table = std::array<std::pair<E, std::string_view>, N>;

constexpr Table<pb::DType, 3> kDTypes{{{pb::FLOAT32, "float32"}, {pb::FLOAT16, "float16"}, {pb::BFLOAT16, "bfloat16"}}};
constexpr Table<pb::Device, 2> kDevices{{{pb::GPU, "gpu"}, {pb::CPU, "cpu"}}};
constexpr Table<pb::CurveKind, 4> kKinds{
    {{pb::COMM, "comm"}, {pb::ENCODE, "encode"}, {pb::DECODE, "decode"}, {pb::COPY, "copy"}}};
constexpr Table<pb::CommOp, 5> kCommOps{{{pb::ALLREDUCE, "allreduce"},
                                         {pb::ALLGATHER, "allgather"},
                                         {pb::REDUCE_SCATTER, "reduce_scatter"},
                                         {pb::ALLTOALL, "alltoall"},
                                         {pb::BROADCAST, "broadcast"}}};
constexpr Table<pb::CopyOp, 4> kCopyOps{
    {{pb::PACK, "pack"}, {pb::UNPACK, "unpack"}, {pb::D2H, "d2h"}, {pb::H2D, "h2d"}}};
constexpr Table<pb::Scope, 3> kScopes{{{pb::GLOBAL, "global"}, {pb::INTRA, "intra"}, {pb::INTER, "inter"}}};

template <typename E, size_t N>
std::string_view NameIn(const Table<E, N>& t, E v) {
  for (const auto& [e, n] : t)
    if (e == v) return n;
  return "unspecified";
}

template <typename E, size_t N>
std::optional<E> ParseIn(const Table<E, N>& t, std::string_view s) {
  for (const auto& [e, n] : t)
    if (n == s) return e;
  return std::nullopt;
}

template <typename E, size_t N>
std::string NamesIn(const Table<E, N>& t) {
  std::string out;
  for (const auto& [e, n] : t) {
    if (!out.empty()) out += ", ";
    out += n;
  }
  return out;
}

// Bytes of the UTF-8 sequence that `lead` starts, with the range its second byte must lie in
// (RFC 3629 table 3-7); 0 for a byte that cannot start one.
struct Utf8Lead {
  int length;
  unsigned char second_min, second_max;
};

Utf8Lead Classify(unsigned char lead) {
  if (lead < 0x80) return {1, 0, 0};
  if (lead >= 0xc2 && lead <= 0xdf) return {2, 0x80, 0xbf};
  if (lead == 0xe0) return {3, 0xa0, 0xbf};
  if (lead == 0xed) return {3, 0x80, 0x9f};  // no surrogates
  if (lead >= 0xe1 && lead <= 0xef) return {3, 0x80, 0xbf};
  if (lead == 0xf0) return {4, 0x90, 0xbf};
  if (lead >= 0xf1 && lead <= 0xf3) return {4, 0x80, 0xbf};
  if (lead == 0xf4) return {4, 0x80, 0x8f};  // <= U+10FFFF
  return {0, 0, 0};
}

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string_view Name(pb::DType v) { return NameIn(kDTypes, v); }
std::string_view Name(pb::Device v) { return NameIn(kDevices, v); }
std::string_view Name(pb::CurveKind v) { return NameIn(kKinds, v); }
std::string_view Name(pb::CommOp v) { return NameIn(kCommOps, v); }
std::string_view Name(pb::CopyOp v) { return NameIn(kCopyOps, v); }
std::string_view Name(pb::Scope v) { return NameIn(kScopes, v); }

std::optional<pb::DType> ParseDType(std::string_view s) { return ParseIn(kDTypes, s); }
std::optional<pb::Device> ParseDevice(std::string_view s) { return ParseIn(kDevices, s); }
std::optional<pb::CurveKind> ParseCurveKind(std::string_view s) { return ParseIn(kKinds, s); }
std::optional<pb::CommOp> ParseCommOp(std::string_view s) { return ParseIn(kCommOps, s); }
std::optional<pb::CopyOp> ParseCopyOp(std::string_view s) { return ParseIn(kCopyOps, s); }
std::optional<pb::Scope> ParseScope(std::string_view s) { return ParseIn(kScopes, s); }

std::string DTypeNames() { return NamesIn(kDTypes); }
std::string DeviceNames() { return NamesIn(kDevices); }
std::string CurveKindNames() { return NamesIn(kKinds); }
std::string CommOpNames() { return NamesIn(kCommOps); }
std::string CopyOpNames() { return NamesIn(kCopyOps); }
std::string ScopeNames() { return NamesIn(kScopes); }

int64_t DTypeBytes(pb::DType v) {
  switch (v) {
    case pb::FLOAT32: return 4;
    case pb::FLOAT16:
    case pb::BFLOAT16: return 2;
    default: return 0;
  }
}

std::string CurveKey(const pb::Curve& c) {
  std::string key(Name(c.kind()));
  switch (c.kind()) {
    case pb::COMM:
      return key + " " + std::string(Name(c.comm_op())) + " " + std::string(Name(c.scope())) +
             (c.dtype() == pb::DTYPE_UNSPECIFIED ? "" : " " + std::string(Name(c.dtype()))) +
             (c.busy() ? " busy" : "") + (c.chained() ? " chained" : "");
    case pb::ENCODE:
    case pb::DECODE:
      return key + " " + c.compressor() + " " + std::string(Name(c.device())) +
             (c.has_ratio() ? " ratio " + FormatDouble(c.ratio()) : "");
    case pb::COPY: return key + " " + std::string(Name(c.copy_op())) + " " + std::string(Name(c.device()));
    default: return key;
  }
}

std::string FormatDouble(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    Utf8Lead lead = Classify(static_cast<unsigned char>(s[i]));
    if (lead.length == 0 || i + lead.length > s.size()) return false;
    for (int k = 1; k < lead.length; ++k) {
      unsigned char c = static_cast<unsigned char>(s[i + k]);
      unsigned char lo = k == 1 ? lead.second_min : 0x80, hi = k == 1 ? lead.second_max : 0xbf;
      if (c < lo || c > hi) return false;
    }
    i += static_cast<size_t>(lead.length);
  }
  return true;
}

std::string EscapeBytes(std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (char ch : s) {
    unsigned char c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7f) {
      out += ch;
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::string ClosestMatch(std::string_view word, std::span<const std::string_view> candidates) {
  std::string best;
  size_t best_distance = std::max<size_t>(2, word.size() / 3) + 1;
  for (std::string_view c : candidates) {
    size_t d = EditDistance(word, c);
    if (d < best_distance) {
      best_distance = d;
      best = std::string(c);
    }
  }
  return best;
}

std::string DidYouMean(std::string_view word, std::span<const std::string_view> candidates) {
  std::string m = ClosestMatch(word, candidates);
  return m.empty() ? "" : " (did you mean '" + m + "'?)";
}

}  // namespace cupcake
