#include "plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "cupcake/proto/names.h"
#include "cupcake/tools/cli.h"

namespace cupcake::profile_cli {
namespace {

// Panel geometry, in SVG pixels.
constexpr int kColumns = 2;
constexpr double kPanelWidth = 620;
constexpr double kMinPanelHeight = 360;
constexpr double kLeft = 72, kRight = 190, kTop = 34, kBottom = 52;  // plot-area margins
constexpr double kLegendLine = 16;
constexpr double kTitleHeight = 34;

// Series i of a panel draws in colour i % 8, dash pattern (i + i / 8) % 4 and marker i % 5:
// neighbours differ in all three and no two of the first 32 series share colour and dash, so
// curves that lie on top of each other (qsgd and randk, pack and unpack) stay apart.
constexpr const char* kColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                    "#9467bd", "#17becf", "#8c564b", "#e377c2"};
constexpr int kColourCount = sizeof kColours / sizeof kColours[0];
constexpr const char* kDashes[] = {"", "7,3", "2,2", "8,3,2,3"};
constexpr int kDashCount = sizeof kDashes / sizeof kDashes[0];
enum class Marker { kCircle, kSquare, kTriangle, kDiamond, kCross };
constexpr int kMarkerCount = 5;

struct Style {
  const char* colour;
  std::string dash;  // a stroke-dasharray attribute, or empty
  Marker marker;
};

Style StyleOf(size_t i) {
  const char* dash = kDashes[(i + i / kColourCount) % kDashCount];
  return {kColours[i % kColourCount], *dash ? std::string(" stroke-dasharray=\"") + dash + "\"" : std::string(),
          static_cast<Marker>(i % kMarkerCount)};
}

struct Series {
  std::string label;
  const pb::Curve* curve;
};

struct Panel {
  std::string title;
  std::string x_label;
  bool bytes = true;  // x in bytes, else elements
  std::vector<Series> series;
};

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

std::string Us(double us) {
  char buf[32];
  if (us >= 1e6)
    std::snprintf(buf, sizeof buf, "%g s", us / 1e6);
  else if (us >= 1e3)
    std::snprintf(buf, sizeof buf, "%g ms", us / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%g us", us);
  return buf;
}

// The panels, in the order comm (per collective, as first seen), encode, decode, copy.
std::vector<Panel> Panels(const pb::Profile& profile) {
  std::vector<Panel> comm;
  std::map<int, size_t> comm_index;
  Panel encode{"encode (per compressor)", "elements", false, {}};
  Panel decode{"decode (per compressor)", "elements", false, {}};
  Panel copy{"copy", "bytes", true, {}};
  for (const pb::Curve& c : profile.curves()) {
    switch (c.kind()) {
      case pb::COMM: {
        auto [it, added] = comm_index.try_emplace(static_cast<int>(c.comm_op()), comm.size());
        if (added)
          comm.push_back({"comm " + std::string(Name(c.comm_op())) + " (per scope)", "bytes per rank", true, {}});
        // The key after "comm <op> ": the scope, the element type when it is not float32, busy.
        const std::string prefix = "comm " + std::string(Name(c.comm_op())) + " ";
        const std::string key = CurveKey(c);
        comm[it->second].series.push_back({key.starts_with(prefix) ? key.substr(prefix.size()) : key, &c});
        break;
      }
      case pb::ENCODE:
      case pb::DECODE: {
        // "topk 0.001 (cpu)": a compressor's curves at several ratios are several series.
        const std::string ratio = c.has_ratio() ? " " + FormatDouble(c.ratio()) : "";
        (c.kind() == pb::ENCODE ? encode : decode)
            .series.push_back({c.compressor() + ratio + " (" + std::string(Name(c.device())) + ")", &c});
        break;
      }
      case pb::COPY:
        copy.series.push_back({std::string(Name(c.copy_op())) + " (" + std::string(Name(c.device())) + ")", &c});
        break;
      default: break;
    }
  }
  std::vector<Panel> panels = std::move(comm);
  for (Panel* p : {&encode, &decode, &copy})
    if (!p->series.empty()) panels.push_back(std::move(*p));
  return panels;
}

// One marker of `style` centred at (x, y).
std::string MarkerSvg(const Style& style, double x, double y) {
  const double r = 3;
  const std::string fill = std::string("\" fill=\"") + style.colour + "\"/>\n";
  switch (style.marker) {
    case Marker::kCircle: return "<circle cx=\"" + Num(x) + "\" cy=\"" + Num(y) + "\" r=\"" + Num(r) + fill;
    case Marker::kSquare:
      return "<rect x=\"" + Num(x - r) + "\" y=\"" + Num(y - r) + "\" width=\"" + Num(2 * r) + "\" height=\"" +
             Num(2 * r) + fill;
    case Marker::kTriangle:
      return "<polygon points=\"" + Num(x) + "," + Num(y - r - 1) + " " + Num(x - r - 1) + "," + Num(y + r) + " " +
             Num(x + r + 1) + "," + Num(y + r) + fill;
    case Marker::kDiamond:
      return "<polygon points=\"" + Num(x) + "," + Num(y - r - 1) + " " + Num(x + r + 1) + "," + Num(y) + " " + Num(x) +
             "," + Num(y + r + 1) + " " + Num(x - r - 1) + "," + Num(y) + fill;
    case Marker::kCross:
      return "<path d=\"M" + Num(x - r) + "," + Num(y - r) + "L" + Num(x + r) + "," + Num(y + r) + "M" + Num(x - r) +
             "," + Num(y + r) + "L" + Num(x + r) + "," + Num(y - r) + "\" stroke=\"" + style.colour +
             "\" stroke-width=\"1.5\"/>\n";
  }
  return "";
}

// Spreads label positions (sorted by their wanted y) so that neighbours are at least `gap`
// apart, keeping each as close to its wanted y as the order allows; within [lo, hi] when they fit.
std::vector<double> SpreadLabels(std::vector<double> y, double gap, double lo, double hi) {
  for (size_t i = 1; i < y.size(); ++i) y[i] = std::max(y[i], y[i - 1] + gap);
  if (!y.empty() && y.back() > hi) {
    y.back() = std::max(hi, lo + gap * static_cast<double>(y.size() - 1));
    for (size_t i = y.size() - 1; i-- > 0;) y[i] = std::min(y[i], y[i + 1] - gap);
  }
  return y;
}

// A log axis: [lo, hi] in log units (base 2 for sizes, base 10 for times), ticks at the
// exponents that are multiples of a stride keeping at most 8 of them.
struct Axis {
  double lo = 0, hi = 1;
  std::vector<int> ticks;
};

Axis LogAxis(double min_value, double max_value, double base, std::initializer_list<int> strides) {
  Axis a;
  a.lo = std::floor(std::log(min_value) / std::log(base) + 1e-9);
  a.hi = std::ceil(std::log(max_value) / std::log(base) - 1e-9);
  if (a.hi <= a.lo) {
    a.lo -= 1;
    a.hi += 1;
  }
  int stride = *(strides.end() - 1);
  for (int s : strides)
    if ((a.hi - a.lo) / s <= 8) {
      stride = s;
      break;
    }
  for (int e = static_cast<int>(a.lo); e <= static_cast<int>(a.hi); ++e)
    if (e % stride == 0) a.ticks.push_back(e);
  return a;
}

void DrawPanel(const Panel& panel, double x0, double y0, double height, int& curves, std::string& svg) {
  const double plot_w = kPanelWidth - kLeft - kRight, plot_h = height - kTop - kBottom;
  const double px = x0 + kLeft, py = y0 + kTop;
  double min_size = 0, max_size = 0, min_us = 0, max_us = 0;
  bool any = false;
  for (const Series& s : panel.series)
    for (const pb::Point& p : s.curve->points()) {
      const double size = std::max<double>(1, static_cast<double>(p.size()));
      if (!any) min_size = max_size = size;
      min_size = std::min(min_size, size);
      max_size = std::max(max_size, size);
      if (p.us() > 0) {
        if (min_us == 0 || p.us() < min_us) min_us = p.us();
        max_us = std::max(max_us, p.us());
      }
      any = true;
    }
  if (!any) min_size = max_size = 1;
  if (min_us == 0) min_us = max_us = 1;
  const Axis xa = LogAxis(min_size, max_size, 2, {1, 2, 5, 10});
  const Axis ya = LogAxis(min_us, max_us, 10, {1, 2, 3});
  auto X = [&](double size) { return px + (std::log2(std::max(1.0, size)) - xa.lo) / (xa.hi - xa.lo) * plot_w; };
  auto Y = [&](double us) {
    const double e = us > 0 ? std::max(ya.lo, std::log10(us)) : ya.lo;
    return py + plot_h - (e - ya.lo) / (ya.hi - ya.lo) * plot_h;
  };

  svg += "<g class=\"panel\" data-title=\"" + Escape(panel.title) + "\">\n";
  svg += "<text x=\"" + Num(px + plot_w / 2) + "\" y=\"" + Num(y0 + 20) +
         "\" text-anchor=\"middle\" font-size=\"14\" font-weight=\"bold\">" + Escape(panel.title) + "</text>\n";
  // Grid and tick labels.
  for (int e : xa.ticks) {
    const double x = X(std::ldexp(1.0, e));
    const auto v = static_cast<int64_t>(std::ldexp(1.0, e));
    svg += "<line x1=\"" + Num(x) + "\" y1=\"" + Num(py) + "\" x2=\"" + Num(x) + "\" y2=\"" + Num(py + plot_h) +
           "\" stroke=\"#e0e0e0\"/>\n";
    svg += "<text x=\"" + Num(x) + "\" y=\"" + Num(py + plot_h + 16) + "\" text-anchor=\"middle\" font-size=\"11\">" +
           Escape(panel.bytes ? tools::HumanBytes(v) : tools::HumanCount(v)) + "</text>\n";
  }
  for (int e : ya.ticks) {
    const double y = Y(std::pow(10.0, e));
    svg += "<line x1=\"" + Num(px) + "\" y1=\"" + Num(y) + "\" x2=\"" + Num(px + plot_w) + "\" y2=\"" + Num(y) +
           "\" stroke=\"#e0e0e0\"/>\n";
    svg += "<text x=\"" + Num(px - 6) + "\" y=\"" + Num(y + 4) + "\" text-anchor=\"end\" font-size=\"11\">" +
           Us(std::pow(10.0, e)) + "</text>\n";
  }
  svg += "<rect x=\"" + Num(px) + "\" y=\"" + Num(py) + "\" width=\"" + Num(plot_w) + "\" height=\"" + Num(plot_h) +
         "\" fill=\"none\" stroke=\"#333333\"/>\n";
  svg += "<text x=\"" + Num(px + plot_w / 2) + "\" y=\"" + Num(py + plot_h + 36) +
         "\" text-anchor=\"middle\" font-size=\"12\">" + Escape(panel.x_label) + " (log)</text>\n";
  svg += "<text x=\"" + Num(x0 + 16) + "\" y=\"" + Num(py + plot_h / 2) +
         "\" text-anchor=\"middle\" font-size=\"12\" "
         "transform=\"rotate(-90 " +
         Num(x0 + 16) + " " + Num(py + plot_h / 2) + ")\">time (log)</text>\n";
  // Curves, then each curve's label at the height where it ends, in the right margin (spread
  // apart where ends are close), behind a sample of its line and marker.
  struct EndLabel {
    double want_y;
    size_t series;
  };
  std::vector<EndLabel> labels;
  for (size_t i = 0; i < panel.series.size(); ++i) {
    const Series& s = panel.series[i];
    const Style style = StyleOf(i);
    const std::string key = Escape(CurveKey(*s.curve));
    double end_y = py + 8 + kLegendLine * static_cast<double>(i);
    if (s.curve->points_size() > 0) {
      std::string points;
      for (const pb::Point& p : s.curve->points())
        points += (points.empty() ? "" : " ") + Num(X(static_cast<double>(p.size()))) + "," + Num(Y(p.us()));
      svg += "<polyline class=\"curve\" data-curve=\"" + key + "\" points=\"" + points + "\" fill=\"none\" stroke=\"" +
             style.colour + "\" stroke-width=\"1.5\"" + style.dash + "/>\n";
      for (const pb::Point& p : s.curve->points()) svg += MarkerSvg(style, X(static_cast<double>(p.size())), Y(p.us()));
      end_y = Y(s.curve->points(s.curve->points_size() - 1).us());
      ++curves;
    }
    labels.push_back({end_y, i});
  }
  std::stable_sort(labels.begin(), labels.end(),
                   [](const EndLabel& a, const EndLabel& b) { return a.want_y < b.want_y; });
  std::vector<double> want;
  for (const EndLabel& l : labels) want.push_back(l.want_y);
  const std::vector<double> at = SpreadLabels(want, kLegendLine - 3, py + 4, py + plot_h);
  for (size_t k = 0; k < labels.size(); ++k) {
    const Series& s = panel.series[labels[k].series];
    const Style style = StyleOf(labels[k].series);
    const double lx = px + plot_w + 6, ly = at[k];
    svg += "<line x1=\"" + Num(px + plot_w) + "\" y1=\"" + Num(labels[k].want_y) + "\" x2=\"" + Num(lx) + "\" y2=\"" +
           Num(ly) + "\" stroke=\"#999999\" stroke-width=\"0.5\"/>\n";
    svg += "<line x1=\"" + Num(lx) + "\" y1=\"" + Num(ly) + "\" x2=\"" + Num(lx + 22) + "\" y2=\"" + Num(ly) +
           "\" stroke=\"" + style.colour + "\" stroke-width=\"2\"" + style.dash + "/>\n";
    svg += MarkerSvg(style, lx + 11, ly);
    svg += "<text class=\"legend\" x=\"" + Num(lx + 28) + "\" y=\"" + Num(ly + 4) + "\" font-size=\"11\">" +
           Escape(s.label) + (s.curve->points_size() == 0 ? " (no points)" : "") + "</text>\n";
  }
  svg += "</g>\n";
}

}  // namespace

StatusOr<std::string> PlotSvg(const pb::Profile& profile, const std::string& title, PlotSummary* summary) {
  bool any_points = false;
  for (const pb::Curve& c : profile.curves()) any_points = any_points || c.points_size() > 0;
  if (!any_points) return FailedPreconditionError("the profile has no measured points to plot");
  const std::vector<Panel> panels = Panels(profile);
  size_t most_series = 0;
  for (const Panel& p : panels) most_series = std::max(most_series, p.series.size());
  const double panel_h =
      std::max(kMinPanelHeight, kTop + 16 + kLegendLine * static_cast<double>(most_series) + kBottom);
  const int rows = (static_cast<int>(panels.size()) + kColumns - 1) / kColumns;
  const double width = kPanelWidth * kColumns;
  const double height = kTitleHeight + panel_h * rows;

  std::string svg = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  svg += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + Num(width) + "\" height=\"" + Num(height) +
         "\" viewBox=\"0 0 " + Num(width) + " " + Num(height) + "\" font-family=\"sans-serif\">\n";
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  svg += "<text x=\"" + Num(width / 2) + "\" y=\"22\" text-anchor=\"middle\" font-size=\"16\">" + Escape(title) +
         "</text>\n";
  int curves = 0;
  for (size_t i = 0; i < panels.size(); ++i) {
    const double x0 = kPanelWidth * static_cast<double>(i % kColumns);
    const double y0 = kTitleHeight + panel_h * static_cast<double>(i / kColumns);
    DrawPanel(panels[i], x0, y0, panel_h, curves, svg);
  }
  svg += "</svg>\n";
  if (summary != nullptr) *summary = {static_cast<int>(panels.size()), curves};
  return svg;
}

}  // namespace cupcake::profile_cli
