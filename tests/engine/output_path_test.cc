// check_output_path (lib/engine/output_path.h): the one rule for every path a
// command writes. Only a regular file (a directory) is replaced by a file
// (directory) output; inside a run directory new names are fine, the run's
// own files and its checkpoints/ and logs/ are not; nothing inside a
// checkpoint step directory; links are followed.
#include "lib/engine/output_path.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "lib/base/error.h"
#include "lib/engine/run_dir.h"

namespace fd::engine {
namespace {

namespace fs = std::filesystem;

// <temp>/fd_output_path_test_<pid>, removed when the binary exits.
const fs::path& root() {
  struct Root {
    fs::path path =
        fs::temp_directory_path() / ("fd_output_path_test_" + std::to_string(::getpid()));
    Root() { fs::create_directories(path); }
    ~Root() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  };
  static const Root r;
  return r.path;
}

// The message check_output_path refuses `p` with ("" when it accepts it).
std::string refusal(const fs::path& p, OutputKind kind, const char* option = "--out") {
  try {
    check_output_path(p, kind, option);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
    return e.what();
  }
  return "";
}

void expect_refused(const fs::path& p, OutputKind kind, const std::string& part) {
  const std::string why = refusal(p, kind);
  EXPECT_NE(why.find(part), std::string::npos) << p << ": \"" << part << "\" not in: " << why;
  EXPECT_NE(why.find(p.string()), std::string::npos) << why;
}

// A run directory as fdtrain leaves it: config.yaml with its header, metrics, checkpoints, logs.
fs::path make_run(const std::string& name) {
  const fs::path run = root() / name;
  fs::create_directories(run / "checkpoints" / "step_00000004");
  fs::create_directories(run / "logs");
  std::ofstream(run / "config.yaml") << kConfigHeader << "\nsteps: 4\n";
  std::ofstream(run / "metrics.jsonl") << "{\"step\": 1}\n";
  std::ofstream(run / "checkpoints" / "step_00000004" / "manifest.json") << "{}";
  return run;
}

TEST(OutputPath, OnlyWhatTheCommandWritesIsReplaced) {
  const fs::path fifo = root() / "fifo.bin", dir = root() / "dir.bin", file = root() / "f.bin";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  fs::create_directories(dir);
  std::ofstream(file) << "x";
  expect_refused(fifo, OutputKind::kFile, "it is a FIFO, not a regular file");
  expect_refused(dir, OutputKind::kFile, "it is a directory, not a regular file");
  expect_refused(file, OutputKind::kDirectory, "it is a regular file, not a directory");
  EXPECT_EQ(refusal(file, OutputKind::kFile), "");
  EXPECT_EQ(refusal(dir, OutputKind::kDirectory), "");
  EXPECT_EQ(refusal(root() / "new.bin", OutputKind::kFile), "");
  if (::geteuid() == 0) {  // mknod needs root
    const fs::path dev = root() / "null.bin";
    ASSERT_EQ(::mknod(dev.c_str(), S_IFCHR | 0600, ::makedev(1, 3)), 0);
    expect_refused(dev, OutputKind::kFile, "it is a character device, not a regular file");
  }
}

TEST(OutputPath, ARunsOwnFilesAreNeverAnOutput) {
  const fs::path run = make_run("run");
  for (const char* own : {"config.yaml", "metrics.jsonl", "summary.json", "command.txt", "run.json",
                          ".lock", "config.yaml.tmp", "events.out.tfevents.1.host"})
    expect_refused(run / own, OutputKind::kFile, "it is one of the files of the run");
  expect_refused(run / "checkpoints" / "w.safetensors", OutputKind::kFile,
                 "inside " + (run / "checkpoints").string());
  expect_refused(run / "logs" / "hf", OutputKind::kDirectory, "inside " + (run / "logs").string());
  expect_refused(run, OutputKind::kDirectory, "it is a run directory");
  expect_refused(run / "checkpoints" / "step_00000004", OutputKind::kDirectory,
                 "it is a checkpoint");
  // New names directly in the run (the Makefile's demos), and below a directory of the user's.
  EXPECT_EQ(refusal(run / "model.safetensors", OutputKind::kFile), "");
  EXPECT_EQ(refusal(run / "hf", OutputKind::kDirectory), "");
  EXPECT_EQ(refusal(run / "mine" / "config.yaml", OutputKind::kFile), "");
  // A link to a run's file is the run's file.
  const fs::path link = root() / "link.yaml";
  fs::create_symlink(run / "config.yaml", link);
  expect_refused(link, OutputKind::kFile, "it is one of the files of the run");
}

TEST(OutputPath, NothingInsideACheckpointAndNoForeignRun) {
  const fs::path step = root() / "copied_step";
  fs::create_directories(step);
  std::ofstream(step / "manifest.json") << "{}";
  expect_refused(step / "w.safetensors", OutputKind::kFile, "inside the checkpoint");
  // Another program's config.yaml does not make a run directory.
  const fs::path project = root() / "project";
  fs::create_directories(project);
  std::ofstream(project / "config.yaml") << "name: my project\n";
  EXPECT_EQ(refusal(project / "config.yaml", OutputKind::kFile), "");
}

}  // namespace
}  // namespace fd::engine
