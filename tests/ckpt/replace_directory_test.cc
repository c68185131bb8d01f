// replace_directory(): how a checkpoint step directory (or a PEFT adapter) is
// put into place. A directory already there is swapped out atomically and
// only then removed, so a crash never leaves the step missing.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "lib/ckpt/manifest.h"
#include "tests/ckpt/ckpt_test_util.h"

namespace fd::ckpt {
namespace {

using testing::error_of;
using testing::TempDir;
namespace fs = std::filesystem;

void write_file(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(ReplaceDirectory, MovesIntoAnEmptyPlace) {
  TempDir tmp;
  write_file(tmp.path(".step.tmp/manifest.json"), "new");
  replace_directory(tmp.path(".step.tmp"), tmp.path("step"));
  EXPECT_EQ(read_file(tmp.path("step/manifest.json")), "new");
  EXPECT_FALSE(fs::exists(tmp.path(".step.tmp")));
}

TEST(ReplaceDirectory, ReplacesAnExistingDirectoryAndLeavesNothingBehind) {
  TempDir tmp;
  write_file(tmp.path("step/manifest.json"), "old");
  write_file(tmp.path("step/rank_00001.h5"), "old shard only the old step had");
  write_file(tmp.path(".step.tmp/manifest.json"), "new");
  replace_directory(tmp.path(".step.tmp"), tmp.path("step"));
  EXPECT_EQ(read_file(tmp.path("step/manifest.json")), "new");
  EXPECT_FALSE(fs::exists(tmp.path("step/rank_00001.h5"))) << "the old directory's files are gone";
  EXPECT_FALSE(fs::exists(tmp.path(".step.tmp")));
  EXPECT_FALSE(fs::exists(tmp.path("step.old")));
  int entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(tmp.path())) ++entries;
  EXPECT_EQ(entries, 1);
}

TEST(ReplaceDirectory, AMissingSourceIsAnErrorAndKeepsTheTarget) {
  TempDir tmp;
  write_file(tmp.path("step/manifest.json"), "old");
  std::string message = error_of([&] { replace_directory(tmp.path("absent"), tmp.path("step")); });
  EXPECT_NE(message.find(tmp.path("absent")), std::string::npos) << message;
  EXPECT_EQ(read_file(tmp.path("step/manifest.json")), "old");
}

}  // namespace
}  // namespace fd::ckpt
