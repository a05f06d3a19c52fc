// libFuzzer target: the plan loader. Any bytes give a valid plan or a Status; a plan it
// accepts converts to JSON and survives serialize + parse unchanged.
#include <google/protobuf/util/message_differencer.h>

#include <string>

#include "cupcake/proto/plan_io.h"
#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cupcake;
  auto plan = ParsePlan(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.pb");
  if (!plan.ok()) return 0;
  CUPCAKE_FUZZ_CHECK(!PlanToJson(*plan).empty(), "no JSON view");
  auto again = ParsePlan(SerializePlan(*plan), "again.pb");
  CUPCAKE_FUZZ_CHECK(again.ok(), again.status().message());
  CUPCAKE_FUZZ_CHECK(google::protobuf::util::MessageDifferencer::Equals(*again, *plan), "round trip changed it");
  return 0;
}
