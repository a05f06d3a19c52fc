// libFuzzer target: the cupcake.profile.v1 reader (with embedded models). Any input gives a
// profile or a Status; a profile it accepts is valid and survives write + read.
#include <google/protobuf/util/message_differencer.h>

#include <string>

#include "cupcake/profile/json_io.h"
#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cupcake;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto profile = profile::ParseProfileJson(text, "fuzz.json");
  if (!profile.ok()) return 0;
  CUPCAKE_FUZZ_CHECK(profile::ValidateProfile(*profile, "fuzz").ok(), "accepted an invalid profile");
  auto again = profile::ParseProfileJson(profile::ProfileToJson(*profile), "again.json");
  CUPCAKE_FUZZ_CHECK(again.ok(), again.status().message());
  CUPCAKE_FUZZ_CHECK(google::protobuf::util::MessageDifferencer::Equals(*again, *profile), "round trip changed it");
  return 0;
}
