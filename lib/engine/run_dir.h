// RunDirectory: the files a run leaves for people and scripts (rank 0 only).
//
//   RUN/.lock            held (flock) by the job for its whole life (run_lock.h)
//   RUN/config.yaml      the fully resolved recipe (loadable again)
//   RUN/command.txt      the exact command line
//   RUN/run.json         the command line, recipe path and overrides (a list), at start
//   RUN/metrics.jsonl    one JSON object per logged step (fields: docs/RUN_DIR.md)
//   RUN/summary.json     written once at the end, however the run ended
//   RUN/.summary_reserve 256 KiB held from begin() until the summary is written,
//                        so that a run stopped by a full disk can still write it
//
// Two phases, so that nothing is changed before the whole job agrees to run:
//   1. The constructor creates the directory if needed (not `/`, not inside
//      another run directory) and takes the lock. It reads what the directory
//      holds (state()) and changes nothing else.
//   2. begin() makes the directory the new run's: it removes the temporary
//      files of its own writes an interrupted job left (config.yaml.tmp, ...);
//      kFresh needs a directory that holds no run; kReplace (--overwrite)
//      removes the old run's files by name (checkpoints' step directories and
//      `latest`, rank logs, event files; nothing else a user put there);
//      a config.yaml fdtrain did not write is never replaced; kResume keeps metrics.jsonl's lines up to the
//      resumed step, rewritten through a temporary file, fsync and rename, so
//      a failure (a full disk) leaves the old file whole.
// Every write is checked; a failed one throws fd::Error (kRuntime) naming the
// file. Whole files are replaced atomically (temp file, fsync, rename).
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "lib/config/load.h"

namespace fd::engine {

class RunLock;

// What a directory holds before a run starts in it.
struct RunDirState {
  bool holds_run = false;                // config.yaml present
  bool foreign = false;  // a config.yaml fdtrain did not write: never used as a run directory
  std::optional<nlohmann::json> summary;  // summary.json, when present and readable
  // "a finished run (completed after 7 of 7 steps)", "a run that did not
  // finish (no summary.json)", ... for messages.
  std::string description;
};

// The first line of every config.yaml fdtrain writes begins so (config::to_yaml).
inline constexpr const char* kConfigHeader = config::kResolvedHeader;

// Reads what `dir` holds without changing or locking anything.
RunDirState read_run_dir_state(const std::filesystem::path& dir);

// Throws the usage error for starting a new run in `dir`, which holds the run
// `state` describes: what is there and the ways forward.
[[noreturn]] void refuse_existing_run(const std::filesystem::path& dir, const RunDirState& state);

class RunDirectory {
 public:
  enum class Start {
    kFresh,    // a directory that holds no run
    kReplace,  // --overwrite: the old run's files are removed first
    kResume,   // the run continues here after resume_step
  };

  // Phase 1 (above). Throws fd::Error kUsage when `path` cannot be created or
  // is locked by another job. A directory this made is removed again if the
  // object goes away before begin() (a run refused during setup leaves nothing).
  explicit RunDirectory(std::filesystem::path path);
  ~RunDirectory();
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // What the directory held when it was opened.
  const RunDirState& state() const { return state_; }

  // Phase 2 (above). kFresh on a directory that holds a run is a usage error
  // saying what is there and what to do. resume_step: kResume only.
  void begin(Start start, int64_t resume_step = -1);

  void write_config(const std::string& yaml);
  void write_command(const std::string& command_line);
  // run.json: what started the run (fields: docs/RUN_DIR.md).
  void write_run_info(const nlohmann::json& info);
  // Appends one line to metrics.jsonl and flushes it. Requires begin().
  void append_metrics(const nlohmann::json& record);
  void write_summary(const nlohmann::json& summary);
  // kResume: the last metrics.jsonl record kept (nullopt when none).
  const std::optional<nlohmann::json>& last_metrics() const { return last_metrics_; }

 private:
  void write_file_atomically(const std::string& name, const std::string& content);
  std::filesystem::path path_;
  std::unique_ptr<RunLock> lock_;
  RunDirState state_;
  std::FILE* metrics_ = nullptr;
  std::optional<nlohmann::json> last_metrics_;
  bool created_ = false;  // the constructor made the directory
  bool begun_ = false;    // begin() was called
};

// Writes `dir`/summary.json atomically, for a process that has no
// RunDirectory: a rank other than 0 whose failure ends the job. Best effort:
// returns false (and writes nothing) on any failure.
bool write_summary_file(const std::filesystem::path& dir, const nlohmann::json& summary);

}  // namespace fd::engine
