// The names the file formats use for the proto enums ("float32", "gpu", "allgather", ...),
// and "did you mean" suggestions for misspelled names.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "cupcake/cupcake.pb.h"

namespace cupcake {

std::string_view Name(pb::DType v);
std::string_view Name(pb::Device v);
std::string_view Name(pb::CurveKind v);
std::string_view Name(pb::CommOp v);
std::string_view Name(pb::CopyOp v);
std::string_view Name(pb::Scope v);

std::optional<pb::DType> ParseDType(std::string_view s);
std::optional<pb::Device> ParseDevice(std::string_view s);
std::optional<pb::CurveKind> ParseCurveKind(std::string_view s);
std::optional<pb::CommOp> ParseCommOp(std::string_view s);
std::optional<pb::CopyOp> ParseCopyOp(std::string_view s);
std::optional<pb::Scope> ParseScope(std::string_view s);

// The accepted names, for messages: "float32, float16, bfloat16".
std::string DTypeNames();
std::string DeviceNames();
std::string CurveKindNames();
std::string CommOpNames();
std::string CopyOpNames();
std::string ScopeNames();

// Bytes per element; 0 for DTYPE_UNSPECIFIED.
int64_t DTypeBytes(pb::DType v);

// A readable key of a curve: "comm allgather global", "comm allreduce global float16 busy",
// "encode topk gpu", "decode topk cpu ratio 0.001", "copy pack gpu".
std::string CurveKey(const pb::Curve& c);
// The shortest decimal that reads back as the same double ("0.001", "1e+13"); "nan", "inf",
// "-inf" for those.
std::string FormatDouble(double v);

// Whether `s` is well-formed UTF-8 (no overlong forms, surrogates or code points past
// U+10FFFF). Every name and text field is checked with it where it enters: JSON writers and
// viewers cannot show anything else.
bool IsValidUtf8(std::string_view s);
// `s` with every byte that is not printable ASCII shown as \xNN, for messages about bad text.
std::string EscapeBytes(std::string_view s);

// The candidate closest to `word` by edit distance when it is close enough to be a likely
// typo, else empty. Used for "did you mean" hints.
std::string ClosestMatch(std::string_view word, std::span<const std::string_view> candidates);
// " (did you mean 'x'?)" or "".
std::string DidYouMean(std::string_view word, std::span<const std::string_view> candidates);

}  // namespace cupcake
