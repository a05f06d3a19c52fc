// libFuzzer target: the cupcake.model.v1 reader. Any input gives a model or a Status, never a
// crash, hang or sanitizer report; a model it accepts is valid and survives write + read.
#include <google/protobuf/util/message_differencer.h>

#include <string>

#include "cupcake/profile/json_io.h"
#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cupcake;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto model = profile::ParseModelJson(text, "fuzz.json");
  if (!model.ok()) return 0;
  CUPCAKE_FUZZ_CHECK(profile::ValidateModel(*model, "fuzz").ok(), "accepted an invalid model");
  auto again = profile::ParseModelJson(profile::ModelToJson(*model), "again.json");
  CUPCAKE_FUZZ_CHECK(again.ok(), again.status().message());
  CUPCAKE_FUZZ_CHECK(google::protobuf::util::MessageDifferencer::Equals(*again, *model), "round trip changed it");
  return 0;
}
