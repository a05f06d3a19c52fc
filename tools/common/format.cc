#include <cstdio>
#include <string>

#include "cupcake/proto/names.h"
#include "cupcake/tools/cli.h"

namespace cupcake::tools {
namespace {

std::string Scaled(int64_t v, const char* const units[], int n_units, const char* base_suffix) {
  if (v < 1024 && v > -1024) return std::to_string(v) + base_suffix;
  double x = static_cast<double>(v);
  int u = 0;
  while ((x >= 1024 || x <= -1024) && u < n_units - 1) {
    x /= 1024;
    ++u;
  }
  char buf[64];
  if (x == static_cast<double>(static_cast<int64_t>(x)))
    std::snprintf(buf, sizeof buf, "%lld %s", static_cast<long long>(x), units[u]);
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", x, units[u]);
  return buf;
}

}  // namespace

std::string HumanBytes(int64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  return Scaled(bytes, kUnits, 6, " B");
}

std::string HumanCount(int64_t count) {
  static const char* const kUnits[] = {"", "Ki", "Mi", "Gi", "Ti", "Pi"};
  return Scaled(count, kUnits, 6, "");
}

std::string CountOf(int64_t count, const std::string& noun) {
  return std::to_string(count) + " " + noun + (count == 1 ? "" : "s");
}

StatusOr<OutputFormat> ParseOutputFormat(const std::string& flag, const std::string& value) {
  if (value == "text") return OutputFormat::kText;
  if (value == "json") return OutputFormat::kJson;
  static const std::string_view kNames[] = {"text", "json"};
  return InvalidArgumentError(flag + ": unknown format; got \"" + value + "\"" + DidYouMean(value, kNames) +
                              ", expected one of text, json");
}

}  // namespace cupcake::tools
