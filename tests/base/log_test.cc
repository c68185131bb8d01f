// Logging: the log file gets every message (also those logged before it was
// opened, and file-only ones); the terminal of a rank other than 0 gets only
// warnings and errors, prefixed with the rank.
#include "lib/base/log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "lib/base/error.h"

namespace fd::log {
namespace {

namespace fs = std::filesystem;

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// One test for the whole life of the process-wide log (early buffer, open,
// rank, close), so that the order is fixed.
TEST(Log, FileGetsEverythingTerminalShowsRankZeroAndProblems) {
  const fs::path dir = fs::temp_directory_path() / ("fd_log_test_" + std::to_string(getpid()));
  fs::remove_all(dir);
  const fs::path file = dir / "logs" / "rank1.log";

  testing::internal::CaptureStderr();
  info("early message {}", 1);  // before the file is open: kept for it
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(err, "fdtrain: early message 1\n");

  open_file(file, false);
  set_rank(1);
  testing::internal::CaptureStderr();
  info("rank one info");
  warn("rank one warning");
  error("rank one error {}", "x");
  write_file_only(Level::kInfo, "file only");
  err = testing::internal::GetCapturedStderr();
  // The terminal: rank 1's problems only, with its rank.
  EXPECT_EQ(err,
            "fdtrain[rank 1]: warning: rank one warning\n"
            "fdtrain[rank 1]: error: rank one error x\n");

  set_rank(0);
  testing::internal::CaptureStderr();
  info("rank zero info");
  err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(err, "fdtrain: rank zero info\n");
  close_file();
  set_rank(-1);
  info("after close");  // terminal only

  const std::string text = read(file);
  for (const char* m :
       {"fdtrain: early message 1", "fdtrain[rank 1]: rank one info",
        "fdtrain[rank 1]: warning: rank one warning", "fdtrain[rank 1]: error: rank one error x",
        "fdtrain[rank 1]: file only", "fdtrain: rank zero info"})
    EXPECT_EQ(count(text, m), 1u) << m << "\n" << text;
  EXPECT_EQ(count(text, "after close"), 0u);
  // Each line starts with a UTC time stamp: 2024-05-01T12:34:56.789Z
  EXPECT_EQ(text.substr(10, 1), "T");
  EXPECT_EQ(text.substr(23, 2), "Z ");

  // Appending keeps the old lines; truncating does not.
  open_file(file, true);
  info("appended");
  close_file();
  EXPECT_EQ(count(read(file), "\n"), count(text, "\n") + 1);
  open_file(file, false);
  close_file();
  EXPECT_EQ(read(file), "");

  // A file that cannot be created is a runtime error naming it.
  std::ofstream(dir / "plain") << "x";
  try {
    open_file(dir / "plain" / "rank0.log", false);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 1);
    EXPECT_NE(std::string(e.what()).find("plain/rank0.log"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace fd::log
