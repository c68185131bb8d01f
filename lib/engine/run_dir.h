// RunDirectory: the files a run leaves for people and scripts.
//
//   RUN/config.yaml      the fully resolved recipe (loadable again)
//   RUN/command.txt      the exact command line
//   RUN/run.json         the command line, recipe path and overrides (a list), at start
//   RUN/metrics.jsonl    one JSON object per logged step (fields: docs/RUN_DIR.md)
//   RUN/summary.json     written once at the end (atomically: temp file + rename)
//
// A directory that already holds a run (config.yaml present) is refused
// unless overwrite is set or the run resumes, so an earlier run is never
// silently clobbered; the message says whether that run finished (summary.json)
// and what to do. Replacing a run also removes its TensorBoard event files and
// logs/.
#pragma once

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

namespace fd::engine {

class RunDirectory {
 public:
  // Creates `path` (and parents). Throws fd::Error (usage) if it holds a run
  // and neither overwrite nor resuming, or if it cannot be created or written.
  // resume_step >= 0: the run resumes after that step in the same directory:
  // metrics.jsonl keeps its lines up to that step and drops later ones.
  RunDirectory(std::filesystem::path path, bool overwrite, int64_t resume_step = -1);
  ~RunDirectory();
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;

  const std::filesystem::path& path() const { return path_; }
  void write_config(const std::string& yaml);
  void write_command(const std::string& command_line);
  // run.json: what started the run (fields: docs/RUN_DIR.md).
  void write_run_info(const nlohmann::json& info);
  // Appends one line to metrics.jsonl and flushes it.
  void append_metrics(const nlohmann::json& record);
  void write_summary(const nlohmann::json& summary);

 private:
  void write_file_atomically(const std::string& name, const std::string& content);
  std::filesystem::path path_;
  std::FILE* metrics_ = nullptr;
};

}  // namespace fd::engine
