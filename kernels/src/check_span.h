// Internal: the size check every public step entry (Compressor, powersgd::Codec) runs on the
// spans it is handed before it trusts them.
#pragma once

#include <cstdint>
#include <string>

#include "cupcake/proto/status.h"

namespace cupcake::kernels::detail {

// Ok when s holds exactly `expected` elements (and is not null unless empty); else
// `<name> <stage>: <field>: wrong length; got 3 floats, expected 4` or `...: null pointer; ...`.
// Checked once per call, so the step path does not allocate.
template <typename Span>
Status CheckSpan(const std::string& name, const char* stage, const char* field, const char* unit, const Span& s,
                 int64_t expected) {
  const bool wrong_length = static_cast<int64_t>(s.size()) != expected;
  if (!wrong_length && (expected == 0 || s.data() != nullptr)) return Status::Ok();
  const std::string what = name + " " + stage + ": " + field;
  if (wrong_length) {
    return InvalidArgumentError(what + ": wrong length; got " + std::to_string(s.size()) + " " + unit + ", expected " +
                                std::to_string(expected));
  }
  return InvalidArgumentError(what + ": null pointer; got nullptr, expected " + std::to_string(expected) + " " + unit);
}

}  // namespace cupcake::kernels::detail
