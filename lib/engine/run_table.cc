#include "lib/engine/run_table.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <system_error>

#include "lib/base/error.h"
#include "lib/base/input_file.h"
#include "lib/base/strings.h"
#include "lib/config/load.h"
#include "lib/engine/run_lock.h"

namespace fd::engine {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The JSON object in `path`, or a discarded value when missing or unparsable.
json read_json(const fs::path& path) {
  json j;
  try {
    if (try_parse_json(read_input_file(path.string(), "run file"), j).empty()) return j;
  } catch (const Error&) {  // missing, not a regular file, or too large
  }
  return json(json::value_t::discarded);
}

double number_or(const json& j, const char* key, double fallback) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : fallback;
}

int64_t integer_or(const json& j, const char* key, int64_t fallback) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<int64_t>() : fallback;
}

std::string string_or(const json& j, const char* key, const std::string& fallback) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : fallback;
}

std::vector<std::string> strings_of(const json& j, const char* key) {
  std::vector<std::string> out;
  auto it = j.find(key);
  if (it == j.end() || !it->is_array()) return out;
  for (const json& s : *it)
    if (s.is_string()) out.push_back(s.get<std::string>());
  return out;
}

// Run directories under `dir` (not `dir` itself), depth levels down.
void collect_runs(const fs::path& dir, int depth, std::vector<fs::path>* out) {
  if (depth == 0) return;
  std::error_code ec;
  std::vector<fs::path> children;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_directory(ec)) children.push_back(e.path());
  std::sort(children.begin(), children.end());
  for (const fs::path& c : children) {
    const std::string n = c.filename().string();
    if (n == "checkpoints" || n == "logs" || n.rfind('.', 0) == 0) continue;
    if (is_run_dir(c))
      out->push_back(c);
    else
      collect_runs(c, depth - 1, out);
  }
}

std::string fixed_or_dash(double v, int decimals) {
  return std::isfinite(v) ? fmt::format("{:.{}f}", v, decimals) : "-";
}

json number_or_null(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

}  // namespace

bool is_run_dir(const fs::path& dir) {
  std::error_code ec;
  for (const char* f : {"config.yaml", "summary.json", "metrics.jsonl", "run.json"})
    if (fs::is_regular_file(dir / f, ec)) return true;
  return false;
}

std::vector<fs::path> find_run_dirs(const std::vector<std::string>& paths) {
  std::vector<fs::path> out;
  for (const std::string& p : paths) {
    std::error_code ec;
    if (!fs::is_directory(p, ec))
      usage_error(
          "{}: {}; pass run directories (written by fdtrain train) or a directory that "
          "holds them",
          p, fs::exists(p, ec) ? "not a directory" : "no such directory");
    if (is_run_dir(p)) {
      out.push_back(p);
      continue;
    }
    const size_t before = out.size();
    collect_runs(p, 3, &out);
    if (out.size() == before)
      usage_error(
          "{}: holds no run directory (none with config.yaml, summary.json or "
          "metrics.jsonl in it or up to three levels below); pass the --run-dir of a "
          "fdtrain train run, or its parent",
          p);
  }
  return out;
}

RunRecord read_run(const fs::path& dir) {
  RunRecord r;
  r.path = dir;
  fs::path clean = dir.lexically_normal();
  if (!clean.has_filename()) clean = clean.parent_path();
  r.name = clean.filename().string();
  if (r.name.empty() || r.name == ".")
    r.name = fs::absolute(dir).lexically_normal().filename().string();

  // The loss curves, and the progress of a run that has not finished.
  // Only a regular file is opened (a FIFO would block).
  std::ifstream metrics;
  if (non_regular_kind((dir / "metrics.jsonl").string()).empty())
    metrics.open(dir / "metrics.jsonl");
  double last_tok_s = RunRecord::kUnknown;
  for (std::string line; std::getline(metrics, line);) {
    json m;
    if (!try_parse_json(line, m).empty() || !m.is_object()) continue;
    const int64_t step = integer_or(m, "step", -1);
    if (step < 0) continue;
    r.steps = std::max(r.steps, step);
    const double loss = number_or(m, "loss", RunRecord::kUnknown);
    if (std::isfinite(loss)) {
      r.train_loss.push_back({step, loss});
      r.final_loss = loss;
    }
    const double eval = number_or(m, "eval_loss", RunRecord::kUnknown);
    if (std::isfinite(eval)) {
      r.eval_curve.push_back({step, eval});
      r.eval_loss = eval;
    }
    last_tok_s = number_or(m, "tokens_per_s", last_tok_s);
    if (m.contains("rewards/accuracies")) {
      r.preference = true;
      r.reward_accuracy = number_or(m, "rewards/accuracies", r.reward_accuracy);
      r.reward_margin = number_or(m, "rewards/margins", r.reward_margin);
    }
    r.eval_reward_accuracy = number_or(m, "eval_rewards/accuracies", r.eval_reward_accuracy);
  }
  r.tokens_per_s = last_tok_s;

  // What started it (written at start, so also there for unfinished runs).
  json info = read_json(dir / "run.json");
  if (!info.is_discarded() && info.is_object()) {
    r.recipe = string_or(info, "recipe", "");
    r.overrides = strings_of(info, "overrides");
    r.command = string_or(info, "command", "");
    r.world_size = int(integer_or(info, "world_size", -1));
  }

  // The planned steps and the learning rate.
  std::error_code ec;
  if (fs::is_regular_file(dir / "config.yaml", ec)) {
    std::ifstream in(dir / "config.yaml");
    std::stringstream text;
    text << in.rdbuf();
    config::LoadResult lr = config::try_parse_recipe(text.str(), (dir / "config.yaml").string());
    if (lr.ok()) {
      r.steps_planned = lr.recipe.steps;
      r.lr = lr.recipe.optimizer.lr;
      r.zero_stage = lr.recipe.zero.stage;
      r.precision = std::string(config::to_string(lr.recipe.precision));
    }
  }

  // The outcome, when it finished.
  if (!fs::exists(dir / "summary.json", ec)) {
    r.exit_reason = "incomplete";
    r.status = RunLock::holder(dir) ? "running" : "killed";
    return r;
  }
  json s = read_json(dir / "summary.json");
  if (s.is_discarded() || !s.is_object()) {
    r.exit_reason = "unreadable";
    r.status = "unreadable";
    return r;
  }
  r.finished = true;
  r.exit_reason = string_or(s, "exit_reason", "unknown");
  // Summaries older than the status field: from exit_reason.
  const std::string derived =
      r.exit_reason == "completed"                                              ? "completed"
      : r.exit_reason == "signal"                                               ? "interrupted"
      : r.exit_reason == "diverged" || r.exit_reason == "loss_scale_at_minimum" ? "diverged"
                                                                                : "unknown";
  r.status = s.contains("status") ? string_or(s, "status", "unknown") : derived;
  r.steps = integer_or(s, "steps", r.steps);
  r.steps_planned = integer_or(s, "steps_planned", r.steps_planned);
  r.final_loss = number_or(s, "final_loss", r.final_loss);
  r.eval_loss = number_or(s, "eval_loss", r.eval_loss);
  r.tokens_per_s = number_or(s, "tokens_per_s", r.tokens_per_s);
  r.peak_rss_bytes = integer_or(s, "peak_rss_bytes", -1);
  if (s.contains("memory") && s["memory"].is_object())
    r.peak_memory_bytes = integer_or(s["memory"], "total", -1);
  r.zero_stage = int(integer_or(s, "zero_stage", r.zero_stage));
  r.world_size = int(integer_or(s, "world_size", r.world_size));
  r.precision = string_or(s, "precision", r.precision);
  r.recipe = string_or(s, "recipe", r.recipe);
  if (s.contains("overrides")) r.overrides = strings_of(s, "overrides");
  r.command = string_or(s, "command", r.command);
  return r;
}

std::string format_run_table(const std::vector<RunRecord>& runs) {
  // Overrides every run shares say nothing about the differences: listed once.
  std::vector<std::string> common;
  if (runs.size() > 1) {
    for (const std::string& o : runs.front().overrides) {
      bool everywhere = std::all_of(runs.begin() + 1, runs.end(), [&](const RunRecord& r) {
        return std::find(r.overrides.begin(), r.overrides.end(), o) != r.overrides.end();
      });
      if (everywhere && std::find(common.begin(), common.end(), o) == common.end())
        common.push_back(o);
    }
  }
  // Preference runs (any): their reward accuracy (train / eval) and margin, before status.
  const bool preference =
      std::any_of(runs.begin(), runs.end(), [](const RunRecord& r) { return r.preference; });
  std::vector<std::vector<std::string>> rows;
  rows.push_back(
      {"run", "overrides", "steps", "train loss", "eval loss", "tok/s", "peak mem", "status"});
  if (preference) rows.back().insert(rows.back().end() - 1, {"reward acc", "margin"});
  for (const RunRecord& r : runs) {
    std::string key;
    for (const std::string& o : r.overrides)
      if (std::find(common.begin(), common.end(), o) == common.end())
        key += (key.empty() ? "" : " ") + o;
    rows.push_back({r.name, key.empty() ? "-" : key,
                    r.steps_planned >= 0 ? fmt::format("{}/{}", r.steps, r.steps_planned)
                                         : fmt::format("{}", r.steps),
                    fixed_or_dash(r.final_loss, 4), fixed_or_dash(r.eval_loss, 4),
                    fixed_or_dash(r.tokens_per_s, 0),
                    r.peak_memory_bytes >= 0 ? format_bytes(double(r.peak_memory_bytes)) : "-",
                    r.status});
    if (preference)
      rows.back().insert(rows.back().end() - 1,
                         {std::isfinite(r.eval_reward_accuracy)
                              ? fmt::format("{} / {}", fixed_or_dash(r.reward_accuracy, 3),
                                            fixed_or_dash(r.eval_reward_accuracy, 3))
                              : fixed_or_dash(r.reward_accuracy, 3),
                          fixed_or_dash(r.reward_margin, 4)});
  }
  std::vector<size_t> width(rows.front().size(), 0);
  for (const auto& row : rows)
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  // Text columns left-aligned, numbers right-aligned.
  const std::set<size_t> left = {0, 1, rows.front().size() - 1};
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      if (c > 0) line += "  ";
      line += left.count(c) ? fmt::format("{:<{}}", row[c], width[c])
                            : fmt::format("{:>{}}", row[c], width[c]);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  if (!common.empty()) {
    std::string all;
    for (const std::string& o : common) all += " " + o;
    out += "common overrides:" + all + "\n";
  }
  return out;
}

json run_table_json(const std::vector<RunRecord>& runs) {
  json out = json::array();
  for (const RunRecord& r : runs) {
    auto integer_or_null = [](int64_t v) { return v >= 0 ? json(v) : json(nullptr); };
    out.push_back({{"name", r.name},
                   {"path", r.path.string()},
                   {"finished", r.finished},
                   {"exit_reason", r.exit_reason},
                   {"status", r.status},
                   {"recipe", r.recipe},
                   {"overrides", r.overrides},
                   {"command", r.command},
                   {"steps", r.steps},
                   {"steps_planned", integer_or_null(r.steps_planned)},
                   {"final_loss", number_or_null(r.final_loss)},
                   {"eval_loss", number_or_null(r.eval_loss)},
                   {"tokens_per_s", number_or_null(r.tokens_per_s)},
                   {"peak_memory_bytes", integer_or_null(r.peak_memory_bytes)},
                   {"peak_rss_bytes", integer_or_null(r.peak_rss_bytes)},
                   {"zero_stage", integer_or_null(r.zero_stage)},
                   {"world_size", integer_or_null(r.world_size)},
                   {"precision", r.precision.empty() ? json(nullptr) : json(r.precision)},
                   {"lr", number_or_null(r.lr)},
                   {"rewards_accuracies", number_or_null(r.reward_accuracy)},
                   {"rewards_margins", number_or_null(r.reward_margin)},
                   {"eval_rewards_accuracies", number_or_null(r.eval_reward_accuracy)}});
  }
  return out;
}

}  // namespace fd::engine
