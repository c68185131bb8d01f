// fdtrain runs | plot: compare finished (or running) runs.
//
//   fdtrain runs DIR... [--json]     one table row per run directory: name, the overrides that
//                                    tell it apart, steps, final train loss, eval loss, tok/s,
//                                    peak memory, exit reason
//   fdtrain plot DIR... --out F.svg  train (solid) and eval (dashed) loss vs step, one colour
//                                    per run
//
// DIR is a run directory or a directory holding run directories (a sweep).
// The reading and drawing live in lib/engine (run_table.h, loss_plot.h).
#include <fmt/format.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "apps/fdtrain/subcommand.h"
#include "lib/base/atomic_file.h"
#include "lib/base/error.h"
#include "lib/engine/loss_plot.h"
#include "lib/engine/output_path.h"
#include "lib/engine/run_table.h"

namespace fd::cli {
namespace {

namespace fs = std::filesystem;

std::vector<engine::RunRecord> read_runs(const std::vector<std::string>& dirs) {
  std::vector<engine::RunRecord> runs;
  for (const fs::path& d : engine::find_run_dirs(dirs)) runs.push_back(engine::read_run(d));
  return runs;
}

int run_plot(const std::vector<std::string>& dirs, const std::string& out,
             const std::string& title) {
  if (fs::path(out).extension() != ".svg")
    usage_error("--out {}: the plot is an SVG file; name it with .svg", out);
  std::vector<engine::RunRecord> runs = read_runs(dirs);
  engine::PlotOptions o;
  if (!title.empty()) o.title = title;
  const std::string svg = engine::loss_plot_svg(runs, o);
  // Only a regular file, never a run's own (docs/RUN_DIR.md, Outputs); written
  // beside its destination under a fresh name and renamed into place.
  engine::check_output_path(out, engine::OutputKind::kFile, "--out");
  fs::path tmp;
  ::close(make_temp_file_beside(out, &tmp));
  const std::string failed = write_file_atomically(out, svg, tmp);
  if (!failed.empty()) usage_error("--out {}: cannot write the plot there: {}", out, failed);
  std::printf("%s: loss of %zu run%s\n", out.c_str(), runs.size(), runs.size() == 1 ? "" : "s");
  return 0;
}

}  // namespace

void add_runs_commands(CLI::App& app, std::vector<Subcommand>* out) {
  struct RunsOptions {
    std::vector<std::string> dirs;
    bool json = false;
  };
  auto runs_opts = std::make_shared<RunsOptions>();
  CLI::App* runs = app.add_subcommand(
      "runs", "tabulate run directories: overrides, losses, tok/s, peak memory, exit reason");
  runs->add_option("dirs", runs_opts->dirs,
                   "run directories, or directories holding them (e.g. a sweep)")
      ->required();
  runs->add_flag("--json", runs_opts->json, "a JSON array, one object per run");
  out->push_back({runs, [runs_opts] {
                    std::vector<engine::RunRecord> r = read_runs(runs_opts->dirs);
                    std::fputs(runs_opts->json ? (engine::run_table_json(r).dump(2) + "\n").c_str()
                                               : engine::format_run_table(r).c_str(),
                               stdout);
                    return 0;
                  }});

  struct PlotOptions {
    std::vector<std::string> dirs;
    std::string out;
    std::string title;
  };
  auto plot_opts = std::make_shared<PlotOptions>();
  CLI::App* plot =
      app.add_subcommand("plot", "draw train and eval loss vs step of one or more runs as an SVG");
  plot->add_option("dirs", plot_opts->dirs,
                   "run directories, or directories holding them (e.g. a sweep)")
      ->required();
  plot->add_option("--out", plot_opts->out, "the SVG file to write (replaced if it exists)")
      ->required();
  plot->add_option("--title", plot_opts->title, "title above the plot (default: loss)");
  out->push_back(
      {plot, [plot_opts] { return run_plot(plot_opts->dirs, plot_opts->out, plot_opts->title); }});
}

}  // namespace fd::cli
