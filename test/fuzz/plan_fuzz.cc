// libFuzzer target: the plan loader. Any bytes give a valid plan or a Status; a plan it
// accepts converts to JSON, survives serialize + parse unchanged, and its views (show's summary,
// the trace, a diff against itself, a simulation on the sample profile where that profile has
// the plan's curves) print finite numbers only.
#include <google/protobuf/util/message_differencer.h>

#include <cmath>
#include <string>

#include <sstream>

#include "commands.h"
#include "cupcake/planner/planner.h"
#include "cupcake/planner/report.h"
#include "cupcake/profile/load.h"
#include "cupcake/proto/plan_io.h"
#include "fuzz_check.h"

namespace {

// "nan" or "inf" as printed by printf or a JSON writer: a non-finite number reached a view.
bool PrintsNonFinite(const std::string& text) {
  return text.find("nan") != std::string::npos || text.find("inf") != std::string::npos;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cupcake;
  auto plan = ParsePlan(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.pb");
  if (!plan.ok()) return 0;
  CUPCAKE_FUZZ_CHECK(!PlanToJson(*plan).empty(), "no JSON view");
  auto again = ParsePlan(SerializePlan(*plan), "again.pb");
  CUPCAKE_FUZZ_CHECK(again.ok(), again.status().message());
  CUPCAKE_FUZZ_CHECK(google::protobuf::util::MessageDifferencer::Equals(*again, *plan), "round trip changed it");
  // Names and other text of the plan may hold the letters; the numbers are what is checked.
  pb::Plan plain = *plan;
  plain.mutable_model()->mutable_model()->set_name("m");
  plain.set_profile_name("p");
  for (pb::Tensor& t : *plain.mutable_model()->mutable_model()->mutable_tensors()) t.set_name("t");
  for (pb::Baseline& b : *plain.mutable_baselines()) b.set_name("b");
  plain.mutable_search()->set_algorithm("branch_and_bound");
  CUPCAKE_FUZZ_CHECK(!PrintsNonFinite(planner::ChromeTrace(plain)), "the trace prints a non-finite number");
  std::ostringstream summary;
  plan_cli::internal::PrintSummary(plain, summary);
  CUPCAKE_FUZZ_CHECK(!PrintsNonFinite(summary.str()), "show's summary prints a non-finite number");
  // The sample profile (GPU curves of every compressor): loaded once.
  static const StatusOr<pb::Profile> sample =
      profile::LoadProfileFile(std::string(CUPCAKE_SOURCE_DIR) + "/examples/profiles/v100-8x8-pcie-25g.json");
  CUPCAKE_FUZZ_CHECK(sample.ok(), sample.status().message());
  auto simulated = planner::Simulate(*plan, plan->model().model(), *sample);
  if (simulated.ok()) {
    bool finite = std::isfinite(simulated->iteration_us);
    for (const planner::GroupTimes& g : simulated->groups)
      finite = finite && std::isfinite(g.cost.enc_us) && std::isfinite(g.cost.com_us) &&
               std::isfinite(g.cost.com_busy_us) && std::isfinite(g.cost.dec_us) && std::isfinite(g.decode_end_us);
    CUPCAKE_FUZZ_CHECK(finite, "a simulation gives a non-finite time");
  }
  const planner::PlanDiff same = planner::DiffPlans(*plan, *plan, 0);
  CUPCAKE_FUZZ_CHECK(!same.different && std::isfinite(same.time_change_pct), "a plan differs from itself");
  return 0;
}
