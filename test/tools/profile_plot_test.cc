// inspect --plot: the SVG is well-formed XML, has one polyline per curve with one vertex per
// point, is deterministic and written atomically; a PNG goes through the converter (a fake one,
// and rsvg-convert where installed); the errors a user can cause.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "commands.h"
#include "cupcake/profile/load.h"
#include "cupcake/proto/names.h"
#include "plot.h"
#include "test_files.h"

namespace cupcake::profile_cli {
namespace {

using testing::ExamplePath;

// A tiny XML well-formedness check, enough for what PlotSvg writes: one prolog, elements that
// nest and close, quoted attributes, no bare '<' or '&' in text. Returns "" or the problem.
std::string XmlProblem(const std::string& xml) {
  size_t i = 0;
  if (xml.rfind("<?xml ", 0) == 0) i = xml.find("?>") + 2;
  std::vector<std::string> open;
  int roots = 0;
  static const std::regex kEntity("^&(amp|lt|gt|quot|apos);");
  while (i < xml.size()) {
    if (xml[i] == '<') {
      const size_t end = xml.find('>', i);
      if (end == std::string::npos) return "unterminated tag at " + std::to_string(i);
      std::string tag = xml.substr(i + 1, end - i - 1);
      if (tag.empty()) return "empty tag at " + std::to_string(i);
      if (tag[0] == '/') {
        if (open.empty() || open.back() != tag.substr(1)) return "mismatched </" + tag.substr(1) + "> at " + std::to_string(i);
        open.pop_back();
      } else {
        const bool self_closing = tag.back() == '/';
        if (self_closing) tag.pop_back();
        const std::string name = tag.substr(0, tag.find_first_of(" \n"));
        // Attributes: name="value" pairs, nothing else.
        static const std::regex kAttrs(R"re(^[A-Za-z][\w:-]*(\s+[A-Za-z][\w:-]*="[^"<]*")*\s*$)re");
        if (!std::regex_match(tag, kAttrs)) return "bad attributes in <" + name + ">";
        if (open.empty()) ++roots;
        if (!self_closing) open.push_back(name);
      }
      i = end + 1;
    } else {
      if (xml[i] == '&' && !std::regex_search(xml.substr(i, 8), kEntity)) return "bare & at " + std::to_string(i);
      if (xml[i] == '>') return "bare > at " + std::to_string(i);
      if (open.empty() && !std::isspace(static_cast<unsigned char>(xml[i]))) return "text outside the root";
      ++i;
    }
  }
  if (!open.empty()) return "unclosed <" + open.back() + ">";
  if (roots != 1) return "expected one root element, got " + std::to_string(roots);
  return "";
}

// data-curve -> number of vertices of its polyline.
std::map<std::string, int> Polylines(const std::string& svg) {
  std::map<std::string, int> out;
  static const std::regex kLine(R"re(<polyline class="curve" data-curve="([^"]*)" points="([^"]*)")re");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), kLine); it != std::sregex_iterator(); ++it) {
    const std::string points = (*it)[2];
    int n = points.empty() ? 0 : 1;
    for (char c : points) n += c == ' ';
    EXPECT_FALSE(out.contains((*it)[1])) << "two polylines for " << (*it)[1];
    out[(*it)[1]] = n;
  }
  return out;
}

int Count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t i = s.find(what); i != std::string::npos; i = s.find(what, i + 1)) ++n;
  return n;
}

pb::Profile Example() {
  auto p = profile::LoadProfileFile(ExamplePath("profiles/v100-8x8-pcie-25g.json"));
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? *p : pb::Profile();
}

// Within a panel no two curves share colour and dash pattern, and each is labelled at its end.
TEST(PlotSvg, CurvesOfAPanelAreDistinguishableAndLabelled) {
  const pb::Profile p = Example();
  auto svg = PlotSvg(p, "styles", nullptr);
  ASSERT_TRUE(svg.ok()) << svg.status().ToString();
  static const std::regex kStyle(R"re(<polyline class="curve" data-curve="([^"]*)" points="[^"]*" fill="none" )re"
                                 R"re(stroke="([^"]*)" stroke-width="1.5"( stroke-dasharray="[^"]*")?/>)re");
  // Panels by plain search: a lazy regex over a whole panel recurses once per character
  // (libstdc++'s executor), which overflows the stack under AddressSanitizer.
  const std::string open = "<g class=\"panel\" data-title=\"";
  int panels = 0;
  for (size_t at = svg->find(open); at != std::string::npos; at = svg->find(open, at + 1)) {
    ++panels;
    const size_t title_end = svg->find("\">", at + open.size());
    const size_t body_end = svg->find("</g>", title_end);
    ASSERT_NE(body_end, std::string::npos);
    const std::string title = svg->substr(at + open.size(), title_end - at - open.size());
    const std::string body = svg->substr(title_end + 2, body_end - title_end - 2);
    std::map<std::string, std::string> seen;  // colour + dash -> curve
    int curves = 0;
    size_t line_at = 0;
    for (size_t end; (line_at = body.find("<polyline", line_at)) != std::string::npos; line_at = end) {
      end = body.find("/>", line_at) + 2;
      std::smatch c;
      const std::string line = body.substr(line_at, end - line_at);
      if (!std::regex_match(line, c, kStyle)) continue;
      ++curves;
      const std::string style = std::string(c[2]) + std::string(c[3]);
      EXPECT_FALSE(seen.contains(style)) << title << ": " << c[1] << " drawn as " << seen[style];
      seen[style] = c[1];
    }
    EXPECT_GT(curves, 0) << title;
    EXPECT_EQ(Count(body, "<text class=\"legend\""), curves) << title;
  }
  EXPECT_EQ(panels, 6);
  EXPECT_NE(svg->find(">qsgd (cpu)</text>"), std::string::npos);
  EXPECT_NE(svg->find(">unpack (gpu)</text>"), std::string::npos);
}

TEST(PlotSvg, OnePolylinePerCurveWithEveryPoint) {
  const pb::Profile p = Example();
  ASSERT_GT(p.curves_size(), 0);
  PlotSummary summary;
  auto svg = PlotSvg(p, "v100 & friends <8x8>", &summary);
  ASSERT_TRUE(svg.ok()) << svg.status().ToString();
  EXPECT_EQ(XmlProblem(*svg), "");
  const auto lines = Polylines(*svg);
  ASSERT_EQ(static_cast<int>(lines.size()), p.curves_size());
  for (const pb::Curve& c : p.curves()) {
    ASSERT_TRUE(lines.contains(CurveKey(c))) << CurveKey(c);
    EXPECT_EQ(lines.at(CurveKey(c)), c.points_size()) << CurveKey(c);
  }
  // Panels: comm per collective (3 here), encode, decode, copy.
  EXPECT_EQ(summary.panels, 6);
  EXPECT_EQ(summary.curves, p.curves_size());
  EXPECT_EQ(Count(*svg, "<g class=\"panel\""), 6);
  EXPECT_NE(svg->find("data-title=\"comm allreduce (per scope)\""), std::string::npos);
  EXPECT_NE(svg->find("v100 &amp; friends &lt;8x8&gt;"), std::string::npos);
  // Human units on the axes and the scopes as series.
  EXPECT_NE(svg->find(">1 MiB</text>"), std::string::npos);
  EXPECT_NE(svg->find(" ms</text>"), std::string::npos);
  EXPECT_NE(svg->find(">intra</text>"), std::string::npos);
  // Deterministic.
  EXPECT_EQ(*PlotSvg(p, "v100 & friends <8x8>"), *svg);
}

TEST(PlotSvg, SinglePointsAndEmptyCurves) {
  pb::Profile p;
  p.mutable_cluster()->set_name("one");
  pb::Curve* c = p.add_curves();
  c->set_kind(pb::COPY);
  c->set_copy_op(pb::PACK);
  c->set_device(pb::CPU);
  pb::Point* pt = c->add_points();
  pt->set_size(4096);
  pt->set_us(0);  // sits on the bottom axis
  pb::Curve* empty = p.add_curves();
  empty->set_kind(pb::COPY);
  empty->set_copy_op(pb::UNPACK);
  empty->set_device(pb::CPU);
  PlotSummary summary;
  auto svg = PlotSvg(p, "t", &summary);
  ASSERT_TRUE(svg.ok()) << svg.status().ToString();
  EXPECT_EQ(XmlProblem(*svg), "");
  EXPECT_EQ(Polylines(*svg), (std::map<std::string, int>{{"copy pack cpu", 1}}));
  EXPECT_EQ(summary.panels, 1);
  EXPECT_EQ(summary.curves, 1);
  EXPECT_NE(svg->find("unpack (cpu) (no points)"), std::string::npos);
  EXPECT_EQ(svg->find("nan"), std::string::npos);
  EXPECT_EQ(svg->find("inf"), std::string::npos);

  p.mutable_curves(0)->clear_points();
  EXPECT_EQ(PlotSvg(p, "t").status().message(), "the profile has no measured points to plot");
}

// A converter script: `body` runs with $2 the PNG to write and $3 the SVG.
std::string Converter(const testing::TempDir& dir, const std::string& body) {
  const std::string path = dir.File("convert.sh");
  std::ofstream(path) << "#!/bin/sh\n" << body;
  ::chmod(path.c_str(), 0755);
  return path;
}

int FilesIn(const testing::TempDir& dir) {
  int files = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.path())) ++files;
  return files;
}

TEST(InspectPlot, WritesTheFileAtomically) {
  testing::TempDir dir;
  const std::string out_path = dir.File("curves.svg");
  std::ofstream(out_path) << "old";
  std::ostringstream out;
  // A failing run leaves the old file.
  InspectOptions bad{dir.File("missing.db"), tools::OutputFormat::kText, out_path};
  EXPECT_FALSE(RunInspect(bad, out).ok());
  EXPECT_EQ(*ReadFile(out_path), "old");
  // A good one replaces it whole and leaves no temporary beside it.
  InspectOptions good{ExamplePath("profiles/v100-8x8-pcie-25g.json"), tools::OutputFormat::kText, out_path};
  Status s = RunInspect(good, out);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(out.str(), "plot: " + out_path + ": 6 panels, 53 curves\n");
  auto written = ReadFile(out_path);
  ASSERT_TRUE(written.ok());
  EXPECT_EQ(XmlProblem(*written), "");
  EXPECT_EQ(written->rfind("<?xml", 0), 0u);
  EXPECT_EQ(FilesIn(dir), 1);
}

TEST(InspectPlot, ErrorsNameTheFlagOrTheFile) {
  testing::TempDir dir;
  std::ostringstream out;
  InspectOptions o{ExamplePath("profiles/v100-8x8-pcie-25g.json"), tools::OutputFormat::kText, dir.File("c.pdf")};
  EXPECT_EQ(RunInspect(o, out).message(),
            "--plot: unknown picture format; got '" + dir.File("c.pdf") + "', expected a file name ending in .svg or .png");
  o.plot = dir.File("noext");
  EXPECT_EQ(RunInspect(o, out).message(),
            "--plot: unknown picture format; got '" + dir.File("noext") + "', expected a file name ending in .svg or .png");
  o.plot = dir.File("CAPS.SVG");
  EXPECT_TRUE(RunInspect(o, out).ok());
  o.plot = dir.File("no/such/dir/c.svg");
  EXPECT_FALSE(RunInspect(o, out).ok());
}

TEST(InspectPlot, PngIsTheSvgThroughTheConverter) {
  testing::TempDir dir;
  std::ostringstream out;
  InspectOptions o{ExamplePath("profiles/v100-8x8-pcie-25g.json"), tools::OutputFormat::kText, dir.File("c.PNG")};
  o.png_converter = Converter(dir, "test \"$1\" = -o && cp \"$3\" \"$2\"\n");
  ASSERT_TRUE(RunInspect(o, out).ok());
  EXPECT_EQ(out.str(), "plot: " + o.plot + ": 6 panels, 53 curves\n");
  auto written = ReadFile(o.plot);
  ASSERT_TRUE(written.ok());
  EXPECT_EQ(XmlProblem(*written), "");  // the fake converter copied the SVG
  EXPECT_EQ(FilesIn(dir), 2);             // the picture and the script: no temporaries
}

TEST(InspectPlot, PngConverterProblemsLeaveTheOldFile) {
  testing::TempDir dir;
  std::ostringstream out;
  InspectOptions o{ExamplePath("profiles/v100-8x8-pcie-25g.json"), tools::OutputFormat::kText, dir.File("c.png")};
  std::ofstream(o.plot) << "old";
  o.png_converter = dir.File("no-such-converter");
  Status s = RunInspect(o, out);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "--plot: " + o.plot + ": a PNG needs " + o.png_converter +
                             " (Debian: librsvg2-bin); got none that runs, expected it on PATH (or a file name "
                             "ending in .svg)");
  o.png_converter = Converter(dir, "echo 'cannot render' >&2; touch \"$2\"; exit 3\n");
  EXPECT_EQ(RunInspect(o, out).message(),
            "--plot: " + o.plot + ": " + o.png_converter + " failed; got exit status 3, expected exit status 0");
  EXPECT_EQ(*ReadFile(o.plot), "old");
  EXPECT_EQ(FilesIn(dir), 2);  // the old picture and the script
}

TEST(InspectPlot, RsvgConvertWritesARealPng) {
  if (std::system("command -v rsvg-convert > /dev/null 2>&1") != 0) GTEST_SKIP() << "rsvg-convert is not installed";
  testing::TempDir dir;
  std::ostringstream out;
  InspectOptions o{ExamplePath("profiles/v100-8x8-pcie-25g.json"), tools::OutputFormat::kText, dir.File("c.png")};
  ASSERT_TRUE(RunInspect(o, out).ok());
  auto written = ReadFile(o.plot);
  ASSERT_TRUE(written.ok());
  EXPECT_EQ(written->substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
}

TEST(InspectPlot, UnknownExtensionIsAUsageError) {
  std::ostringstream out, err;
  const std::string example = ExamplePath("profiles/v100-8x8-pcie-25g.json");
  tools::Invocation inv{"cupcake-profile", "inspect", {"--db", example, "--plot", "x.jpg"}, out, err};
  EXPECT_EQ(InspectMain(inv), tools::kExitUsage);
  EXPECT_NE(err.str().find("--plot: unknown picture format; got 'x.jpg', expected a file name ending in .svg or .png"),
            std::string::npos)
      << err.str();
}

}  // namespace
}  // namespace cupcake::profile_cli
