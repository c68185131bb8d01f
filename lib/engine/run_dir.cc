#include "lib/engine/run_dir.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <system_error>
#include <vector>

#include "lib/base/error.h"

namespace fd::engine {

namespace fs = std::filesystem;

namespace {

// Why `dir`, which holds a run, is refused, and what to do instead.
std::string refusal_message(const fs::path& dir) {
  std::error_code ec;
  if (fs::exists(dir / "summary.json", ec)) {
    std::ifstream in(dir / "summary.json");
    auto s = nlohmann::json::parse(in, nullptr, false);
    std::string what = "a finished run (summary.json)";
    if (!s.is_discarded() && s.is_object() && s.contains("exit_reason") && s.contains("steps") &&
        s.contains("steps_planned")) {
      what = fmt::format("a finished run ({} after {} of {} steps)", s["exit_reason"].dump(),
                         s["steps"].dump(), s["steps_planned"].dump());
    }
    return fmt::format(
        "{}: the run directory already holds {}; nothing was changed. Pass --overwrite to "
        "replace it, --resume auto to continue it from its last checkpoint (with a larger "
        "steps=N), or choose another --run-dir",
        dir.string(), what);
  }
  return fmt::format(
      "{}: the run directory already holds a run that did not finish (config.yaml but no "
      "summary.json: still running, or stopped); nothing was changed. Pass --resume auto to "
      "continue it from its latest checkpoint, --overwrite to replace it, or choose another "
      "--run-dir",
      dir.string());
}

}  // namespace

RunDirectory::RunDirectory(fs::path path, bool overwrite, int64_t resume_step)
    : path_(std::move(path)) {
  std::error_code ec;
  // Lines of an earlier metrics.jsonl that a resumed run keeps.
  std::string kept;
  if (resume_step >= 0) {
    std::ifstream in(path_ / "metrics.jsonl");
    std::string line;
    while (std::getline(in, line)) {
      auto rec = nlohmann::json::parse(line, nullptr, false);
      if (!rec.is_discarded() && rec.contains("step") && rec["step"].is_number_integer() &&
          rec["step"].get<int64_t>() <= resume_step)
        kept += line + "\n";
    }
  }
  const bool held_run = fs::exists(path_ / "config.yaml", ec);
  if (resume_step < 0 && held_run && !overwrite) usage_error("{}", refusal_message(path_));
  if (fs::exists(path_, ec) && !fs::is_directory(path_, ec))
    usage_error("{}: --run-dir exists and is not a directory", path_.string());
  fs::create_directories(path_, ec);
  if (ec) usage_error("{}: cannot create the run directory: {}; choose another --run-dir", path_.string(), ec.message());
  for (const char* stale : {"metrics.jsonl", "summary.json", "command.txt", "run.json"})
    fs::remove(path_ / stale, ec);
  if (held_run && resume_step < 0) {
    // A replaced run's TensorBoard events and logs would mix with the new run's.
    std::vector<fs::path> events;
    for (const auto& e : fs::directory_iterator(path_, ec))
      if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0)
        events.push_back(e.path());
    for (const fs::path& p : events) fs::remove(p, ec);
    fs::remove_all(path_ / "logs", ec);
  }
  metrics_ = std::fopen((path_ / "metrics.jsonl").c_str(), "w");
  if (metrics_ != nullptr && !kept.empty()) std::fputs(kept.c_str(), metrics_);
  if (metrics_ == nullptr)
    usage_error("{}: cannot write metrics.jsonl in the run directory: {}; choose another --run-dir",
                path_.string(), std::strerror(errno));
}

RunDirectory::~RunDirectory() {
  if (metrics_ != nullptr) std::fclose(metrics_);
}

void RunDirectory::write_file_atomically(const std::string& name, const std::string& content) {
  fs::path final_path = path_ / name;
  fs::path tmp = path_ / (name + ".tmp");
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << content;
    out.flush();
    if (!out) runtime_error("{}: write failed (disk full or no permission?)", tmp.string());
  }
  std::error_code ec;
  fs::rename(tmp, final_path, ec);
  if (ec) runtime_error("{}: cannot rename into place: {}", final_path.string(), ec.message());
}

void RunDirectory::write_config(const std::string& yaml) {
  write_file_atomically("config.yaml", yaml);
}

void RunDirectory::write_run_info(const nlohmann::json& info) {
  write_file_atomically("run.json",
                        info.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

void RunDirectory::write_command(const std::string& command_line) {
  write_file_atomically("command.txt", command_line + "\n");
}

void RunDirectory::append_metrics(const nlohmann::json& record) {
  std::string line = record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  if (std::fwrite(line.data(), 1, line.size(), metrics_) != line.size() ||
      std::fflush(metrics_) != 0)
    runtime_error("{}: cannot append to metrics.jsonl", path_.string());
}

void RunDirectory::write_summary(const nlohmann::json& summary) {
  write_file_atomically(
      "summary.json",
      summary.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

}  // namespace fd::engine
