#include <sys/wait.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.h"
#include "cupcake/profile/load.h"
#include "cupcake/proto/file_io.h"
#include "cupcake/proto/names.h"
#include "cupcake/tools/subprocess.h"
#include "plot.h"

namespace cupcake::profile_cli {
namespace po = boost::program_options;
namespace {

// Sizes of comm and copy curves are bytes; of encode and decode, elements (docs/FORMATS.md).
bool SizesAreBytes(const pb::Curve& c) { return c.kind() == pb::COMM || c.kind() == pb::COPY; }

std::string SizeRange(const pb::Curve& c) {
  if (c.points_size() == 0) return "-";
  int64_t lo = c.points(0).size(), hi = c.points(c.points_size() - 1).size();
  if (SizesAreBytes(c)) return tools::HumanBytes(lo) + " .. " + tools::HumanBytes(hi);
  return tools::HumanCount(lo) + " .. " + tools::HumanCount(hi) + " elements";
}

int64_t Parameters(const pb::Model& m) {
  int64_t n = 0;
  for (const auto& t : m.tensors()) n += t.numel();
  return n;
}

int64_t GradientBytes(const pb::Model& m) {
  int64_t n = 0;
  for (const auto& t : m.tensors()) n += t.numel() * DTypeBytes(t.dtype());
  return n;
}

void Text(const std::string& db, const pb::Profile& p, std::ostream& out) {
  const pb::Cluster& c = p.cluster();
  out << "profile " << db << "\n";
  out << "cluster " << c.name() << ": " << tools::CountOf(c.nodes(), "node") << " x "
      << tools::CountOf(c.devices_per_node(), "device") << " ("
      << tools::CountOf(int64_t{c.nodes()} * c.devices_per_node(), "rank") << ")\n";
  std::vector<std::pair<std::string, std::string>> facts;
  if (c.has_device()) facts.emplace_back("device", c.device());
  if (c.has_interconnect()) facts.emplace_back("interconnect", c.interconnect());
  if (c.has_network()) facts.emplace_back("network", c.network());
  if (c.has_source()) facts.emplace_back("source", c.source());
  std::map<std::string, std::string> meta(c.meta().begin(), c.meta().end());
  for (const auto& [k, v] : meta) facts.emplace_back("meta." + k, v);
  size_t width = 0;
  for (const auto& f : facts) width = std::max(width, f.first.size());
  for (const auto& [k, v] : facts) out << "  " << k << ":" << std::string(width - k.size() + 1, ' ') << v << "\n";

  out << "curves: " << p.curves_size() << "\n";
  size_t key_width = 0;
  for (const auto& curve : p.curves()) key_width = std::max(key_width, CurveKey(curve).size());
  for (const auto& curve : p.curves()) {
    std::string key = CurveKey(curve);
    std::string points = std::to_string(curve.points_size()) + (curve.points_size() == 1 ? " point" : " points");
    out << "  " << key << std::string(key_width - key.size() + 2, ' ')
        << std::string(10 - std::min<size_t>(10, points.size()), ' ') << points << "  " << SizeRange(curve);
    if (curve.has_method()) out << "  (" << curve.method() << ")";
    if (curve.has_wrong() && curve.wrong() > 0) out << "  WRONG RESULTS: " << curve.wrong();
    out << "\n";
  }
  out << "models: " << p.models_size() << "\n";
  size_t name_width = 0;
  for (const auto& m : p.models()) name_width = std::max(name_width, m.name().size());
  for (const auto& m : p.models()) {
    out << "  " << m.name() << std::string(name_width - m.name().size() + 2, ' ') << m.tensors_size() << " tensors, "
        << Parameters(m) << " parameters (" << tools::HumanBytes(GradientBytes(m)) << " of gradients)\n";
  }
}

void Json(const std::string& db, const pb::Profile& p, std::ostream& out) {
  using nlohmann::ordered_json;
  const pb::Cluster& c = p.cluster();
  ordered_json j;
  j["profile"] = db;
  ordered_json cluster;
  cluster["name"] = c.name();
  cluster["nodes"] = c.nodes();
  cluster["devices_per_node"] = c.devices_per_node();
  if (c.has_device()) cluster["device"] = c.device();
  if (c.has_interconnect()) cluster["interconnect"] = c.interconnect();
  if (c.has_network()) cluster["network"] = c.network();
  if (c.has_source()) cluster["source"] = c.source();
  j["cluster"] = cluster;
  ordered_json curves = ordered_json::array();
  for (const auto& curve : p.curves()) {
    ordered_json jc;
    jc["key"] = CurveKey(curve);
    jc["points"] = curve.points_size();
    jc["unit"] = SizesAreBytes(curve) ? "bytes" : "elements";
    if (curve.points_size() > 0) {
      jc["min_size"] = curve.points(0).size();
      jc["max_size"] = curve.points(curve.points_size() - 1).size();
    }
    curves.push_back(jc);
  }
  j["curves"] = curves;
  ordered_json models = ordered_json::array();
  for (const auto& m : p.models()) {
    ordered_json jm;
    jm["name"] = m.name();
    jm["tensors"] = m.tensors_size();
    jm["parameters"] = Parameters(m);
    jm["gradient_bytes"] = GradientBytes(m);
    models.push_back(jm);
  }
  j["models"] = models;
  out << j.dump(2) << "\n";
}

}  // namespace

// Whether `path` asks for a PNG (else an SVG); InvalidArgument for any other ending.
static StatusOr<bool> PlotIsPng(const std::string& path) {
  const size_t dot = path.rfind('.');
  std::string ext = dot == std::string::npos || path.find('/', dot) != std::string::npos ? "" : path.substr(dot);
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (ext == ".svg" || ext == ".png") return ext == ".png";
  return InvalidArgumentError("--plot: unknown picture format; got '" + path +
                              "', expected a file name ending in .svg or .png");
}

// `svg` rendered to a PNG at `path` by `converter` (rsvg-convert's command line) through
// temporaries beside it, then renamed: a failure leaves `path` as it was.
static Status WritePng(const std::string& svg, const std::string& path, const std::string& converter) {
  const std::string svg_tmp = path + ".tmp.svg", png_tmp = path + ".tmp.png";
  CUPCAKE_RETURN_IF_ERROR(WriteFileAtomic(svg_tmp, svg));
  auto wstatus = tools::RunChild({converter, "-o", png_tmp, svg_tmp}, {}, "--plot",
                                 "cupcake-profile inspect: --plot: cannot run the PNG converter: ");
  std::error_code ec;
  std::filesystem::remove(svg_tmp, ec);
  Status s = wstatus.status();
  if (s.ok() && WIFEXITED(*wstatus) && WEXITSTATUS(*wstatus) == 127) {
    s = FailedPreconditionError("--plot: " + path + ": a PNG needs " + converter +
                                " (Debian: librsvg2-bin); got none that runs, expected it on PATH (or a file name "
                                "ending in .svg)");
  } else if (s.ok() && !(WIFEXITED(*wstatus) && WEXITSTATUS(*wstatus) == 0)) {
    s = InternalError("--plot: " + path + ": " + converter + " failed; got " +
                      (WIFEXITED(*wstatus) ? "exit status " + std::to_string(WEXITSTATUS(*wstatus))
                                           : "signal " + std::to_string(WTERMSIG(*wstatus))) +
                      ", expected exit status 0");
  }
  if (s.ok()) std::filesystem::rename(png_tmp, path, ec);
  if (s.ok() && ec) s = InternalError("--plot: " + path + ": rename from " + png_tmp + ": " + ec.message());
  if (!s.ok()) std::filesystem::remove(png_tmp, ec);
  return s;
}

Status RunInspect(const InspectOptions& options, std::ostream& out) {
  bool png = false;
  if (!options.plot.empty()) {
    CUPCAKE_ASSIGN_OR_RETURN(png, PlotIsPng(options.plot));
  }
  CUPCAKE_ASSIGN_OR_RETURN(pb::Profile p, profile::LoadProfileFile(options.db));
  if (!options.plot.empty()) {
    PlotSummary summary;
    auto svg = PlotSvg(p, "profile " + p.cluster().name() + " (" + options.db + ")", &summary);
    if (!svg.ok()) return svg.status().WithPrefix(options.db);
    CUPCAKE_RETURN_IF_ERROR(png ? WritePng(*svg, options.plot, options.png_converter)
                                : WriteFileAtomic(options.plot, *svg));
    out << "plot: " << options.plot << ": " << summary.panels << (summary.panels == 1 ? " panel, " : " panels, ")
        << summary.curves << (summary.curves == 1 ? " curve" : " curves") << "\n";
    return Status::Ok();
  }
  if (options.format == tools::OutputFormat::kJson)
    Json(options.db, p, out);
  else
    Text(options.db, p, out);
  return Status::Ok();
}

int InspectMain(tools::Invocation& inv) {
  InspectOptions options;
  std::string format;
  po::options_description flags("options");
  flags.add_options()("db", po::value(&options.db)->required(), "the profile DB (or a profile JSON file)")(
      "format", po::value(&format)->default_value("text"), "text or json")(
      "plot", po::value(&options.plot),
      "draw the curves into this .svg or .png file instead (log-log, one panel per kind; PNG through rsvg-convert)");
  po::variables_map vm;
  if (auto code = tools::ParseFlags(inv, flags, {}, "--db DB [--format text|json] [--plot FILE.svg|FILE.png]", vm))
    return *code;
  auto f = tools::ParseOutputFormat("--format", format);
  if (!f.ok()) return tools::UsageError(inv, f.status().message());
  options.format = *f;
  if (!options.plot.empty()) {
    if (Status s = PlotIsPng(options.plot).status(); !s.ok()) return tools::UsageError(inv, s.message());
  }
  return tools::Finish(inv, RunInspect(options, inv.out));
}

}  // namespace cupcake::profile_cli
