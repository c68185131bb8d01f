// Reading run directories back (fdtrain runs / plot): finished, unfinished and
// broken runs, a sweep directory, the table and its JSON, the SVG's structure.
#include "lib/engine/run_table.h"
#include "lib/engine/run_lock.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "lib/base/error.h"
#include "lib/engine/loss_plot.h"

namespace fd::engine {
namespace {

namespace fs = std::filesystem;

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

class RunTable : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = fs::temp_directory_path() /
            ("fd_run_table_test_" + std::to_string(getpid()) + "_" + info->name());
    fs::remove_all(root_);
    // A sweep of two finished runs that differ in the learning rate, and one
    // that is still running (no summary.json).
    for (const char* lr : {"1e-3", "3e-3"}) {
      const fs::path d = root_ / "sweep" / (std::string("lr") + lr);
      write(d / "run.json", fmt::format(R"({{"recipe": "r.yaml", "overrides": ["steps=4",
            "optimizer.lr={}"], "command": "fdtrain train r.yaml"}})",
                                        lr));
      write(d / "metrics.jsonl",
            "{\"step\": 2, \"loss\": 5.0, \"tokens_per_s\": 100.0}\n"
            "{\"step\": 4, \"loss\": 4.5, \"tokens_per_s\": 120.0, \"eval_loss\": 4.75}\n");
      write(d / "summary.json",
            fmt::format(R"({{"exit_reason": "completed", "steps": 4, "steps_planned": 4,
              "final_loss": 4.5, "eval_loss": 4.75, "tokens_per_s": 123.4,
              "memory": {{"total": 3145728}}, "peak_rss_bytes": 1000, "zero_stage": 2,
              "world_size": 2, "precision": "fp32", "recipe": "r.yaml",
              "overrides": ["steps=4", "optimizer.lr={}"], "command": "c"}})",
                        lr));
    }
    const fs::path running = root_ / "sweep" / "running";
    write(running / "run.json", R"({"overrides": ["steps=4", "zero.stage=3"]})");
    write(running / "metrics.jsonl", "{\"step\": 2, \"loss\": 5.5, \"tokens_per_s\": 90.0}\n");
    write(root_ / "sweep" / "notes" / "readme.txt", "not a run");
  }
  void TearDown() override { fs::remove_all(root_); }
  fs::path root_;
};

TEST_F(RunTable, FindsTheRunsOfASweepInOrder) {
  std::vector<fs::path> dirs = find_run_dirs({(root_ / "sweep").string()});
  ASSERT_EQ(dirs.size(), 3u);
  EXPECT_EQ(dirs[0].filename(), "lr1e-3");
  EXPECT_EQ(dirs[1].filename(), "lr3e-3");
  EXPECT_EQ(dirs[2].filename(), "running");
  // A run directory itself, given twice, in the order given.
  dirs = find_run_dirs(
      {(root_ / "sweep" / "running").string(), (root_ / "sweep" / "lr1e-3").string()});
  ASSERT_EQ(dirs.size(), 2u);
  EXPECT_EQ(dirs[0].filename(), "running");
}

TEST_F(RunTable, MissingOrEmptyPathsAreUsageErrors) {
  for (const fs::path& p : {root_ / "nope", root_ / "sweep" / "notes"}) {
    try {
      find_run_dirs({p.string()});
      FAIL() << p;
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), 2);
      EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos) << e.what();
    }
  }
}

TEST_F(RunTable, ReadsFinishedAndUnfinishedRuns) {
  RunRecord done = read_run(root_ / "sweep" / "lr3e-3");
  EXPECT_TRUE(done.finished);
  EXPECT_EQ(done.name, "lr3e-3");
  EXPECT_EQ(done.exit_reason, "completed");
  EXPECT_EQ(done.steps, 4);
  EXPECT_EQ(done.steps_planned, 4);
  EXPECT_DOUBLE_EQ(done.final_loss, 4.5);
  EXPECT_DOUBLE_EQ(done.eval_loss, 4.75);
  EXPECT_DOUBLE_EQ(done.tokens_per_s, 123.4);  // the summary's, not the last line's
  EXPECT_EQ(done.peak_memory_bytes, 3145728);
  EXPECT_EQ(done.zero_stage, 2);
  EXPECT_EQ(done.overrides, (std::vector<std::string>{"steps=4", "optimizer.lr=3e-3"}));
  ASSERT_EQ(done.train_loss.size(), 2u);
  EXPECT_EQ(done.train_loss[1].step, 4);
  ASSERT_EQ(done.eval_curve.size(), 1u);
  EXPECT_DOUBLE_EQ(done.eval_curve[0].value, 4.75);

  RunRecord running = read_run(root_ / "sweep" / "running");
  EXPECT_FALSE(running.finished);
  EXPECT_EQ(running.exit_reason, "incomplete");
  EXPECT_EQ(running.status, "killed");  // no summary, and nobody holds its lock
  {
    RunLock held(root_ / "sweep" / "running");
    EXPECT_EQ(read_run(root_ / "sweep" / "running").status, "running");
  }
  EXPECT_EQ(done.status, "completed");  // derived from exit_reason (no status field)
  EXPECT_EQ(running.steps, 2);
  EXPECT_DOUBLE_EQ(running.final_loss, 5.5);
  EXPECT_TRUE(std::isnan(running.eval_loss));
  EXPECT_DOUBLE_EQ(running.tokens_per_s, 90.0);
  EXPECT_EQ(running.overrides, (std::vector<std::string>{"steps=4", "zero.stage=3"}));

  write(root_ / "odd" / "summary.json", R"({"status": 5, "exit_reason": "completed"})");
  EXPECT_EQ(read_run(root_ / "odd").status, "unknown");  // not a string: not guessed
  write(root_ / "broken" / "summary.json", "{not json");
  EXPECT_EQ(read_run(root_ / "broken").exit_reason, "unreadable");
}

TEST_F(RunTable, TableShowsWhatTellsRunsApart) {
  std::vector<RunRecord> runs;
  for (const fs::path& d : find_run_dirs({(root_ / "sweep").string()})) runs.push_back(read_run(d));
  const std::string t = format_run_table(runs);
  // Header, three rows, and the overrides every run shares listed once.
  EXPECT_EQ(count(t, "\n"), 5u) << t;
  EXPECT_NE(t.find("optimizer.lr=1e-3"), std::string::npos) << t;
  EXPECT_NE(t.find("zero.stage=3"), std::string::npos) << t;
  EXPECT_EQ(count(t, "steps=4"), 1u) << t;
  EXPECT_NE(t.find("common overrides: steps=4"), std::string::npos) << t;
  EXPECT_NE(t.find("4.5000"), std::string::npos) << t;
  EXPECT_NE(t.find("3.00 MiB"), std::string::npos) << t;
  EXPECT_NE(t.find("killed"), std::string::npos) << t;
  EXPECT_NE(t.find("4/4"), std::string::npos) << t;

  const nlohmann::json j = run_table_json(runs);
  ASSERT_EQ(j.size(), 3u);
  EXPECT_EQ(j[0]["name"], "lr1e-3");
  EXPECT_EQ(j[0]["overrides"].size(), 2u);  // every override, not just the distinguishing ones
  EXPECT_EQ(j[0]["peak_memory_bytes"], 3145728);
  EXPECT_TRUE(j[2]["eval_loss"].is_null());
  EXPECT_EQ(j[2]["exit_reason"], "incomplete");
  EXPECT_EQ(j[2]["status"], "killed");
}

TEST_F(RunTable, PlotHasOnePolylinePerSeriesAndEscapesNames) {
  std::vector<RunRecord> runs;
  for (const fs::path& d : find_run_dirs({(root_ / "sweep").string()})) runs.push_back(read_run(d));
  runs[0].name = "a<b&c";
  const std::string svg = loss_plot_svg(runs);
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_EQ(count(svg, "<polyline class=\"train\""), 3u);
  EXPECT_EQ(count(svg, "<polyline class=\"eval\""), 2u);  // the running run has no eval yet
  EXPECT_NE(svg.find("a&lt;b&amp;c"), std::string::npos);
  EXPECT_EQ(svg.find("a<b"), std::string::npos);
  EXPECT_NE(svg.find(">step</text>"), std::string::npos);
  EXPECT_NE(svg.find(">loss</text>"), std::string::npos);

  std::vector<RunRecord> empty(1);
  empty[0].path = root_ / "empty";
  EXPECT_THROW(loss_plot_svg(empty), Error);
}

}  // namespace
}  // namespace fd::engine
