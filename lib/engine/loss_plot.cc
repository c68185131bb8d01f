#include "lib/engine/loss_plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "lib/base/error.h"

namespace fd::engine {
namespace {

// Tableau 10: distinguishable, and readable on white.
constexpr const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

std::string escape_xml(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// Ticks covering [lo, hi] at a step of 1, 2 or 5 x 10^k, about `target` of them.
struct Ticks {
  double lo, hi, step;
};

Ticks nice_ticks(double lo, double hi, int target) {
  if (!(hi > lo)) {  // one value: a unit-wide range around it
    const double pad = std::max(std::abs(lo) * 0.05, 0.5);
    lo -= pad;
    hi += pad;
  }
  const double rough = (hi - lo) / std::max(target - 1, 1);
  const double mag = std::pow(10.0, std::floor(std::log10(rough)));
  const double r = rough / mag;
  const double step = (r <= 1.0 ? 1.0 : r <= 2.0 ? 2.0 : r <= 5.0 ? 5.0 : 10.0) * mag;
  return {std::floor(lo / step + 1e-9) * step, std::ceil(hi / step - 1e-9) * step, step};
}

// A tick label without trailing noise: 0.5, 2, 1000, 2.25.
std::string tick_label(double v, double step) {
  if (std::abs(v) < step * 1e-6) v = 0.0;
  const int decimals = std::max(0, -int(std::floor(std::log10(step) + 1e-9)));
  return fmt::format("{:.{}f}", v, decimals);
}

// What fits the legend column: long names keep their end, which usually
// holds what tells sweep runs apart.
std::string legend_name(const std::string& name) {
  constexpr size_t kMax = 28;
  if (name.size() <= kMax) return name;
  return "..." + name.substr(name.size() - (kMax - 3));
}

}  // namespace

std::string loss_plot_svg(const std::vector<RunRecord>& runs, const PlotOptions& o) {
  double x_min = std::numeric_limits<double>::infinity(), x_max = -x_min;
  double y_min = x_min, y_max = -x_min;
  for (const RunRecord& r : runs) {
    for (const auto* series : {&r.train_loss, &r.eval_curve}) {
      for (const RunRecord::Point& p : *series) {
        x_min = std::min(x_min, double(p.step));
        x_max = std::max(x_max, double(p.step));
        y_min = std::min(y_min, p.value);
        y_max = std::max(y_max, p.value);
      }
    }
  }
  if (!std::isfinite(x_min)) {
    std::string names;
    for (const RunRecord& r : runs) names += (names.empty() ? "" : ", ") + r.path.string();
    usage_error(
        "{}: no loss values to plot (metrics.jsonl is missing or empty); plot runs that "
        "have logged at least one step",
        names);
  }
  const Ticks xt = nice_ticks(std::min(0.0, x_min), x_max, 8);
  const Ticks yt = nice_ticks(y_min, y_max, 7);

  // Plot area inside margins; the legend sits to the right of it.
  const double left = 70, right = 230, top = 40, bottom = 60;
  const double x0 = left, x1 = o.width - right, y0 = o.height - bottom, y1 = top;
  auto px = [&](double step) { return x0 + (step - xt.lo) / (xt.hi - xt.lo) * (x1 - x0); };
  auto py = [&](double v) { return y0 - (v - yt.lo) / (yt.hi - yt.lo) * (y0 - y1); };

  std::string svg = fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<title>{2}</title>\n"
      "<rect x=\"0\" y=\"0\" width=\"{0}\" height=\"{1}\" fill=\"white\"/>\n"
      "<text x=\"{3}\" y=\"24\" text-anchor=\"middle\" font-size=\"16\">{2}</text>\n",
      o.width, o.height, escape_xml(o.title), (x0 + x1) / 2);

  // Grid, ticks and tick labels.
  svg += "<g class=\"grid\" stroke=\"#e5e5e5\" stroke-width=\"1\">\n";
  for (double v = xt.lo; v <= xt.hi + xt.step * 1e-6; v += xt.step)
    svg += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\"/>\n",
                       px(v), y0, y1);
  for (double v = yt.lo; v <= yt.hi + yt.step * 1e-6; v += yt.step)
    svg += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\"/>\n", x0,
                       py(v), x1);
  svg += "</g>\n";
  svg += "<g class=\"x-axis\">\n";
  svg += fmt::format(
      "<line class=\"axis\" x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" "
      "stroke=\"black\"/>\n",
      x0, y0, x1, y0);
  for (double v = xt.lo; v <= xt.hi + xt.step * 1e-6; v += xt.step) {
    svg += fmt::format(
        "<line class=\"tick\" x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" "
        "stroke=\"black\"/>\n<text class=\"tick-label\" x=\"{0:.1f}\" y=\"{3:.1f}\" "
        "text-anchor=\"middle\">{4}</text>\n",
        px(v), y0, y0 + 5, y0 + 19, tick_label(v, xt.step));
  }
  svg += fmt::format(
      "<text class=\"axis-label\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">step</text>\n"
      "</g>\n",
      (x0 + x1) / 2, y0 + 42);
  svg += "<g class=\"y-axis\">\n";
  svg += fmt::format(
      "<line class=\"axis\" x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" "
      "stroke=\"black\"/>\n",
      x0, y0, x0, y1);
  for (double v = yt.lo; v <= yt.hi + yt.step * 1e-6; v += yt.step) {
    svg += fmt::format(
        "<line class=\"tick\" x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\" "
        "stroke=\"black\"/>\n<text class=\"tick-label\" x=\"{3:.1f}\" y=\"{4:.1f}\" "
        "text-anchor=\"end\">{5}</text>\n",
        x0 - 5, py(v), x0, x0 - 8, py(v) + 4, tick_label(v, yt.step));
  }
  svg += fmt::format(
      "<text class=\"axis-label\" x=\"{0:.1f}\" y=\"{1:.1f}\" text-anchor=\"middle\" "
      "transform=\"rotate(-90 {0:.1f} {1:.1f})\">loss</text>\n</g>\n",
      x0 - 52, (y0 + y1) / 2);

  // One polyline per series; eval points also get markers (there may be few).
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunRecord& r = runs[i];
    const char* colour = kPalette[i % std::size(kPalette)];
    const std::string name = escape_xml(r.name);
    auto polyline = [&](const std::vector<RunRecord::Point>& pts, const char* cls,
                        const char* extra) {
      if (pts.empty()) return;
      std::string points;
      for (const RunRecord::Point& p : pts)
        points += fmt::format("{}{:.1f},{:.1f}", points.empty() ? "" : " ", px(double(p.step)),
                              py(p.value));
      svg += fmt::format(
          "<polyline class=\"{}\" data-run=\"{}\" fill=\"none\" stroke=\"{}\" "
          "stroke-width=\"1.8\"{} points=\"{}\"/>\n",
          cls, name, colour, extra, points);
    };
    polyline(r.train_loss, "train", "");
    polyline(r.eval_curve, "eval", " stroke-dasharray=\"6 4\"");
    for (const RunRecord::Point& p : r.eval_curve)
      svg += fmt::format(
          "<circle class=\"eval-point\" data-run=\"{}\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" "
          "fill=\"{}\"/>\n",
          name, px(double(p.step)), py(p.value), colour);
  }

  // Legend: a sample line and the name of each run, then the line styles.
  const double lx = x1 + 20;
  double ly = top + 10;
  svg += "<g class=\"legend\">\n";
  for (size_t i = 0; i < runs.size(); ++i) {
    const char* colour = kPalette[i % std::size(kPalette)];
    svg += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" "
        "stroke-width=\"3\"/>\n<text class=\"legend-label\" x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n",
        lx, ly, lx + 24, ly, colour, lx + 30, ly + 4, escape_xml(legend_name(runs[i].name)));
    ly += 18;
  }
  ly += 8;
  svg += fmt::format(
      "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\" stroke=\"#444\" "
      "stroke-width=\"1.8\"/>\n<text x=\"{3:.1f}\" y=\"{4:.1f}\">train loss</text>\n"
      "<line x1=\"{0:.1f}\" y1=\"{5:.1f}\" x2=\"{2:.1f}\" y2=\"{5:.1f}\" stroke=\"#444\" "
      "stroke-width=\"1.8\" stroke-dasharray=\"6 4\"/>\n<text x=\"{3:.1f}\" y=\"{6:.1f}\">eval "
      "loss</text>\n</g>\n</svg>\n",
      lx, ly, lx + 24, lx + 30, ly + 4, ly + 18, ly + 22);
  return svg;
}

}  // namespace fd::engine
