// Reading run directories back: what `fdtrain runs` tabulates and `fdtrain
// plot` draws.
//
//   std::vector<RunRecord> runs;
//   for (const auto& dir : find_run_dirs({"runs/sweep"})) runs.push_back(read_run(dir));
//   std::fputs(format_run_table(runs).c_str(), stdout);
//
// A run directory is read from the files docs/RUN_DIR.md describes:
// summary.json (a finished run), run.json (recipe, overrides and command, from
// the start), metrics.jsonl (the loss curves; the progress of an unfinished
// run) and config.yaml (the planned steps and the learning rate). A missing or
// unreadable file leaves its fields unknown rather than failing, so that one
// broken run does not hide the others.
#pragma once

#include <cstdint>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace fd::engine {

struct RunRecord {
  struct Point {
    int64_t step;
    double value;
  };
  static constexpr double kUnknown = std::numeric_limits<double>::quiet_NaN();

  std::filesystem::path path;  // as found
  std::string name;            // the directory's name
  bool finished = false;       // summary.json present and readable
  // summary.json's exit_reason; "incomplete" when there is no summary.json
  // (still running, or killed); "unreadable" when it does not parse.
  std::string exit_reason;
  std::string recipe;                  // recipe path as given
  std::vector<std::string> overrides;  // as given, in order
  std::string command;                 // the command line
  // How it ended (summary.json "status": completed, interrupted, diverged,
  // failed; derived from exit_reason for summaries older than the field), or
  // "running" (no summary, its job holds the directory's lock) or "killed" (no
  // summary and nobody holds the lock: the process died without one), or
  // "unreadable".
  std::string status;
  int64_t steps = 0;               // finished steps (an unfinished run: last logged step)
  int64_t steps_planned = -1;      // -1: unknown
  double final_loss = kUnknown;    // training loss of the last (logged) step
  double eval_loss = kUnknown;     // the last validation loss
  double tokens_per_s = kUnknown;  // summary's steady-state throughput, else the last line's
  int64_t peak_memory_bytes = -1;  // summary memory.total: peak tracked bytes, max over ranks
  int64_t peak_rss_bytes = -1;     // summary peak_rss_bytes (rank 0's process)
  int zero_stage = -1;
  int world_size = -1;
  double lr = kUnknown;  // optimizer.lr (config.yaml)
  std::string precision;
  // Preference training (metrics.jsonl's TRL metrics): the last logged step's reward accuracy
  // and margin, and the last evaluation's accuracy; unknown for other runs.
  bool preference = false;
  double reward_accuracy = kUnknown;
  double reward_margin = kUnknown;
  double eval_reward_accuracy = kUnknown;
  std::vector<Point> train_loss;  // metrics.jsonl: loss at every logged step
  std::vector<Point> eval_curve;  // metrics.jsonl: eval_loss where it was measured
};

// True when `dir` looks like a run directory (it has config.yaml,
// summary.json, metrics.jsonl or run.json).
bool is_run_dir(const std::filesystem::path& dir);

// The run directories named by `paths`, in the order given: each path is a run
// directory, or a directory holding run directories (found up to three levels
// down, sorted by path). Throws fd::Error (usage) for a path that does not
// exist or holds no run.
std::vector<std::filesystem::path> find_run_dirs(const std::vector<std::string>& paths);

// Reads what `dir` records about its run (see the top of this file).
RunRecord read_run(const std::filesystem::path& dir);

// The table `fdtrain runs` prints: one line per run with its name, the
// overrides that tell it apart from the others (those common to every run are
// listed once below the table), steps, final train loss, eval loss, tok/s,
// peak memory and exit reason. Unknown values show as "-".
std::string format_run_table(const std::vector<RunRecord>& runs);

// The same as a JSON array of objects (`fdtrain runs --json`), with every
// override and unknown numbers as null.
nlohmann::json run_table_json(const std::vector<RunRecord>& runs);

}  // namespace fd::engine
