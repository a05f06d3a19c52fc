// The profile's curves as a picture (inspect --plot): an SVG written directly, no plotting
// dependency, byte-identical for the same profile.
#pragma once

#include <string>

#include "cupcake/cupcake.pb.h"
#include "cupcake/proto/status.h"

namespace cupcake::profile_cli {

// What PlotSvg drew, for the command's report line and for tests.
struct PlotSummary {
  int panels = 0;
  int curves = 0;
};

// Draws the curves of `profile` in panels, two per row, each with log-log axes, human units
// (bytes or elements on x, us/ms/s on y) and a legend:
//   - comm: one panel per collective, one series per scope;
//   - encode, decode: one panel each, one series per compressor (and device);
//   - copy: one panel, one series per copy op (and device).
// Each curve is one <polyline class="curve" data-curve="KEY"> with one vertex per point, in
// size order; curves without points are listed in the legend only. Times <= 0 sit on the
// bottom axis. `title` heads the picture (XML-escaped).
// FailedPrecondition when the profile has no curve with points.
StatusOr<std::string> PlotSvg(const pb::Profile& profile, const std::string& title, PlotSummary* summary = nullptr);

}  // namespace cupcake::profile_cli
