// RunDirectory: an existing run is refused without overwrite (usage error,
// exit code 2) and left intact; files are written atomically; metrics lines
// are on disk as soon as append_metrics returns.
#include "lib/engine/run_dir.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "lib/base/error.h"
#include "lib/engine/run_lock.h"

namespace fd::engine {
namespace {

namespace fs = std::filesystem;

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// Names of files in `dir` ending in ".tmp".
std::vector<std::string> tmp_files(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".tmp") out.push_back(e.path().filename().string());
  return out;
}

using Start = RunDirectory::Start;

// config.yaml as fdtrain writes it (its first line marks a run directory).
const std::string kOldConfig = std::string(kConfigHeader) + "\nold: 1\n";
const std::string kFirstConfig = std::string(kConfigHeader) + "\nfirst: 1\n";

// Opens `dir` and begins a run in it (the two phases the trainer goes through).
std::unique_ptr<RunDirectory> begin_run(const fs::path& dir, Start start = Start::kFresh,
                                        int64_t resume_step = -1) {
  auto rd = std::make_unique<RunDirectory>(dir);
  rd->begin(start, resume_step);
  return rd;
}

class RunDir : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = fs::temp_directory_path() /
            ("fd_run_dir_test_" + std::to_string(getpid()) + "_" + info->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  fs::path root_;
};

TEST_F(RunDir, CreatesNestedDirectoryAndWritesFiles) {
  const fs::path dir = root_ / "a" / "b" / "run";
  auto owner = begin_run(dir);
  RunDirectory& rd = *owner;
  EXPECT_EQ(rd.path(), dir);
  EXPECT_TRUE(fs::is_directory(dir));
  EXPECT_TRUE(fs::exists(dir / "metrics.jsonl"));
  rd.write_config("model:\n  n_layer: 2\n");
  rd.write_command("fdtrain --recipe r.yaml");
  EXPECT_EQ(read(dir / "config.yaml"), "model:\n  n_layer: 2\n");
  EXPECT_EQ(read(dir / "command.txt"), "fdtrain --recipe r.yaml\n");
  EXPECT_TRUE(tmp_files(dir).empty());
}

TEST_F(RunDir, RefusesAnExistingRunAndLeavesItIntact) {
  const fs::path dir = root_ / "run";
  {
    auto rd = begin_run(dir);
    rd->write_config(kOldConfig);
    rd->append_metrics({{"step", 1}});
    rd->write_summary({{"final_loss", 2.5}});
  }
  try {
    begin_run(dir);
    FAIL() << "an existing run was not refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_EQ(e.exit_code(), 2);
    const std::string msg = e.what();
    EXPECT_NE(msg.find(dir.string()), std::string::npos) << msg;   // where
    EXPECT_NE(msg.find("--overwrite"), std::string::npos) << msg;  // what to do
  }
  EXPECT_EQ(read(dir / "config.yaml"), kOldConfig);
  EXPECT_EQ(lines(read(dir / "metrics.jsonl")).size(), 1u);
  EXPECT_TRUE(fs::exists(dir / "summary.json"));
}

TEST_F(RunDir, OverwriteReplacesTheOldRunsOutputs) {
  const fs::path dir = root_ / "run";
  {
    auto rd = begin_run(dir);
    rd->write_config(kOldConfig);
    rd->write_command("old command");
    rd->append_metrics({{"step", 1}});
    rd->write_summary({{"final_loss", 2.5}});
    fs::create_directories(dir / "checkpoints" / "step_00000001");
  }
  auto rd = begin_run(dir, Start::kReplace);
  EXPECT_EQ(read(dir / "metrics.jsonl"), "");  // no line of the old run survives
  EXPECT_FALSE(fs::exists(dir / "summary.json"));
  EXPECT_FALSE(fs::exists(dir / "command.txt"));
  EXPECT_FALSE(fs::exists(dir / "checkpoints"));  // nor a checkpoint a resume would pick up
  rd->write_config("new: 2\n");
  EXPECT_EQ(read(dir / "config.yaml"), "new: 2\n");
}

// A directory with other files but no config.yaml is not a run.
TEST_F(RunDir, DirectoryWithoutConfigIsNotARun) {
  const fs::path dir = root_ / "run";
  fs::create_directories(dir);
  write(dir / "notes.txt", "keep me");
  auto rd = begin_run(dir);
  EXPECT_EQ(read(dir / "notes.txt"), "keep me");
}

TEST_F(RunDir, PathThatIsAFileIsAUsageError) {
  write(root_ / "file", "x");
  try {
    RunDirectory rd(root_ / "file");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2) << e.what();
  }
}

// The user chose the path: a usage error (exit 2) that says why and what to do.
TEST_F(RunDir, UncreatableDirectoryIsAUsageError) {
  write(root_ / "file", "x");
  try {
    RunDirectory rd(root_ / "file" / "sub");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_NE(std::string(e.what()).find("choose another --run-dir"), std::string::npos);
  }
}

TEST_F(RunDir, MetricsLinesAreOnDiskImmediately) {
  auto owner = begin_run(root_ / "run");
  RunDirectory& rd = *owner;
  std::vector<nlohmann::json> records;
  for (int step = 1; step <= 3; ++step) {
    records.push_back({{"step", step}, {"loss", 4.0 / step}, {"lr", 1e-3}});
    rd.append_metrics(records.back());
    // Read back while rd is alive: every record so far, one compact JSON per line.
    std::vector<std::string> got = lines(read(root_ / "run" / "metrics.jsonl"));
    ASSERT_EQ(got.size(), records.size()) << "after step " << step;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(nlohmann::json::parse(got[i]), records[i]) << got[i];
      EXPECT_EQ(got[i].find('\n'), std::string::npos);
    }
  }
  EXPECT_EQ(read(root_ / "run" / "metrics.jsonl").back(), '\n');
}

TEST_F(RunDir, SummaryIsWrittenAtomicallyAndReplaced) {
  const fs::path dir = root_ / "run";
  auto owner = begin_run(dir);
  RunDirectory& rd = *owner;
  nlohmann::json s1 = {{"final_loss", 1.25}, {"weights_sha256", "ab"}, {"steps", 10}};
  rd.write_summary(s1);
  EXPECT_EQ(nlohmann::json::parse(read(dir / "summary.json")), s1);
  EXPECT_TRUE(tmp_files(dir).empty());
  nlohmann::json s2 = {{"final_loss", 0.5}};
  rd.write_summary(s2);
  EXPECT_EQ(nlohmann::json::parse(read(dir / "summary.json")), s2);
  EXPECT_TRUE(tmp_files(dir).empty());
}

// The refusal says whether the run finished, and offers --resume and --overwrite.
TEST_F(RunDir, RefusalSaysWhetherTheRunFinishedAndWhatToDo) {
  const fs::path dir = root_ / "run";
  {
    auto rd = begin_run(dir);
    rd->write_config(kOldConfig);
  }
  auto refusal = [&] {
    try {
      begin_run(dir);
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), 2);
      return std::string(e.what());
    }
    ADD_FAILURE() << "not refused";
    return std::string();
  };
  std::string msg = refusal();  // config.yaml, no summary.json: did not finish
  EXPECT_NE(msg.find("did not finish"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--resume auto"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--overwrite"), std::string::npos) << msg;
  write(dir / "summary.json",
        R"({"exit_reason": "completed", "steps": 6, "steps_planned": 6})");
  msg = refusal();
  EXPECT_NE(msg.find(dir.string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("a finished run (completed after 6 of 6 steps)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("nothing was changed"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--resume auto"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--overwrite"), std::string::npos) << msg;
}

// Replacing a run removes its event files and logs; resuming keeps them.
TEST_F(RunDir, OverwriteRemovesEventsAndLogsResumeKeepsThem) {
  const fs::path dir = root_ / "run";
  auto make_old_run = [&] {
    auto rd = begin_run(dir, Start::kReplace);
    rd->write_config(kOldConfig);
    rd->write_run_info({{"overrides", {"steps=2"}}});
    write(dir / "events.out.tfevents.1.host", "x");
    fs::create_directories(dir / "logs");
    write(dir / "logs" / "rank0.log", "old log");
  };
  make_old_run();
  EXPECT_EQ(nlohmann::json::parse(read(dir / "run.json"))["overrides"][0], "steps=2");
  {
    auto resumed = begin_run(dir, Start::kResume, /*resume_step=*/0);
    EXPECT_TRUE(fs::exists(dir / "events.out.tfevents.1.host"));
    EXPECT_EQ(read(dir / "logs" / "rank0.log"), "old log");
  }
  make_old_run();
  auto replaced = begin_run(dir, Start::kReplace);
  EXPECT_FALSE(fs::exists(dir / "events.out.tfevents.1.host"));
  EXPECT_FALSE(fs::exists(dir / "logs"));
  EXPECT_FALSE(fs::exists(dir / "run.json"));
}

// A second job on the same directory is refused, naming the holder, and
// changes nothing; the lock goes with its holder.
TEST_F(RunDir, SecondJobIsRefusedWhileTheFirstHoldsTheLock) {
  const fs::path dir = root_ / "run";
  auto first = begin_run(dir);
  first->write_config(kFirstConfig);
  first->append_metrics({{"step", 1}});
  ASSERT_TRUE(RunLock::holder(dir).has_value());
  EXPECT_NE(RunLock::holder(dir)->find("pid " + std::to_string(getpid())), std::string::npos);
  try {
    RunDirectory second(dir);
    FAIL() << "a second job on a locked directory was not refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("in use by another fdtrain job"), std::string::npos) << msg;
    EXPECT_NE(msg.find("pid " + std::to_string(getpid())), std::string::npos) << msg;
  }
  EXPECT_EQ(read(dir / "config.yaml"), kFirstConfig);
  EXPECT_EQ(lines(read(dir / "metrics.jsonl")).size(), 1u);
  first.reset();
  EXPECT_FALSE(RunLock::holder(dir).has_value());
  RunDirectory again(dir);  // the lock went with its holder
  EXPECT_TRUE(again.state().holds_run);
}

// A resume keeps the lines up to its step, rewrites the file whole (never
// truncating it first), and leaves no temporary file; stale ones are removed.
TEST_F(RunDir, ResumeKeepsMetricsUpToItsStepAndTidiesTemporaryFiles) {
  const fs::path dir = root_ / "run";
  {
    auto rd = begin_run(dir);
    rd->write_config(kOldConfig);
    for (int step = 1; step <= 5; ++step) rd->append_metrics({{"step", step}});
    rd->write_summary({{"status", "interrupted"}, {"steps", 5}});
  }
  write(dir / "metrics.jsonl.tmp", "partial");
  write(dir / "summary.json.tmp", "partial");
  RunDirectory rd(dir);
  EXPECT_EQ(tmp_files(dir).size(), 2u);  // opening changes nothing
  ASSERT_TRUE(rd.state().summary.has_value());
  EXPECT_EQ((*rd.state().summary)["status"], "interrupted");
  EXPECT_TRUE(fs::exists(dir / "summary.json"));  // opening changes nothing else
  EXPECT_EQ(lines(read(dir / "metrics.jsonl")).size(), 5u);
  write(dir / "user_notes.tmp", "not fdtrain's");
  rd.begin(Start::kResume, 3);
  // fdtrain's own temporary files are tidied, under the lock; the user's stay.
  EXPECT_EQ(tmp_files(dir), std::vector<std::string>{"user_notes.tmp"});
  fs::remove(dir / "user_notes.tmp");
  std::vector<std::string> got = lines(read(dir / "metrics.jsonl"));
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(nlohmann::json::parse(got[2])["step"], 3);
  rd.append_metrics({{"step", 4}});
  EXPECT_EQ(lines(read(dir / "metrics.jsonl")).size(), 4u);
  EXPECT_TRUE(tmp_files(dir).empty());
}

TEST_F(RunDir, SummaryFileOfAnotherRankUsesItsOwnTemporaryName) {
  const fs::path dir = root_ / "run";
  fs::create_directories(dir);
  EXPECT_TRUE(write_summary_file(dir, {{"status", "failed"}}));
  EXPECT_EQ(nlohmann::json::parse(read(dir / "summary.json"))["status"], "failed");
  EXPECT_TRUE(tmp_files(dir).empty());
  EXPECT_FALSE(write_summary_file(root_ / "missing", {{"status", "failed"}}));
  EXPECT_FALSE(fs::exists(root_ / "missing"));
}

// A directory with another program's config.yaml is not a run: refused even
// with --overwrite (kReplace), and left as it was.
TEST_F(RunDir, ForeignConfigIsNeverReplaced) {
  const fs::path dir = root_ / "project";
  fs::create_directories(dir / "logs");
  write(dir / "config.yaml", "name: my project\n");
  write(dir / "logs" / "rank0.log", "mine");
  RunDirectory rd(dir);
  EXPECT_TRUE(rd.state().foreign);
  for (Start start : {Start::kFresh, Start::kReplace, Start::kResume}) {
    try {
      rd.begin(start, 0);
      FAIL() << "a foreign directory was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), 2);
      EXPECT_NE(std::string(e.what()).find("config.yaml that fdtrain did not write"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(read(dir / "config.yaml"), "name: my project\n");
  EXPECT_EQ(read(dir / "logs" / "rank0.log"), "mine");
}

// Not the root, not inside another run directory; a directory made for a
// refused run is taken away again.
TEST_F(RunDir, NoRunDirectoryInsideAnother) {
  const fs::path outer = root_ / "outer";
  {
    auto rd = begin_run(outer);
    rd->write_config(kOldConfig);
  }
  for (const fs::path& inner : {outer / "checkpoints" / "step_00000001", outer / "logs" / "x"}) {
    try {
      RunDirectory rd(inner);
      FAIL() << inner << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("is inside the run directory"), std::string::npos)
          << e.what();
    }
    EXPECT_FALSE(fs::exists(inner));
  }
  EXPECT_THROW(RunDirectory rd("/"), Error);
  { RunDirectory refused(root_ / "made"); }  // never begun
  EXPECT_FALSE(fs::exists(root_ / "made"));
}

}  // namespace
}  // namespace fd::engine
