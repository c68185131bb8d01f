#include "lib/engine/run_dir.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <system_error>
#include <vector>

#include "lib/base/error.h"
#include "lib/base/log.h"
#include "lib/engine/run_lock.h"

namespace fd::engine {

namespace fs = std::filesystem;

namespace {

// Writes `content` to `path` through a temporary file (`path`.tmp, or
// `path`.<pid>.tmp for a writer that may race rank 0): write, fsync, rename,
// then fsync the directory. Returns "" or what failed.
std::string write_atomically(const fs::path& path, const std::string& content,
                             bool unique_tmp = false) {
  const fs::path tmp = unique_tmp ? fmt::format("{}.{}.tmp", path.string(), ::getpid())
                                  : fmt::format("{}.tmp", path.string());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return fmt::format("cannot create {}: {}", tmp.string(), std::strerror(errno));
  size_t done = 0;
  while (done < content.size()) {
    ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      std::error_code ec;
      fs::remove(tmp, ec);  // a partial file would only take space
      return fmt::format("cannot write {}: {}", tmp.string(),
                         n == 0 ? "short write" : std::strerror(err));
    }
    done += size_t(n);
  }
  const bool synced = ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  std::error_code ec;
  if (!synced) {
    fs::remove(tmp, ec);
    return fmt::format("cannot write {} to disk: {}", tmp.string(), std::strerror(err));
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return fmt::format("cannot rename {} into place: {}", tmp.string(), ec.message());
  }
  int dfd = ::open(path.parent_path().empty() ? "." : path.parent_path().c_str(),
                   O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return "";
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string describe(const RunDirState& s) {
  if (!s.holds_run) return "no run";
  if (!s.summary) return "a run that did not finish (config.yaml but no summary.json)";
  const nlohmann::json& j = *s.summary;
  auto field = [&](const char* k) { return j.contains(k) ? j[k].dump() : std::string("?"); };
  const std::string reason = j.contains("exit_reason") && j["exit_reason"].is_string()
                                 ? j["exit_reason"].get<std::string>()
                                 : "?";
  const std::string status = j.contains("status") && j["status"].is_string()
                                 ? j["status"].get<std::string>()
                                 : reason;
  if (status == "completed")
    return fmt::format("a finished run (completed after {} of {} steps)", field("steps"),
                       field("steps_planned"));
  std::string why = reason;
  if (j.contains("signal") && j["signal"].is_string()) why = j["signal"].get<std::string>();
  return fmt::format("a run that ended {} ({}) after {} of {} steps", status, why, field("steps"),
                     field("steps_planned"));
}

}  // namespace

RunDirState read_run_dir_state(const fs::path& dir) {
  RunDirState s;
  std::error_code ec;
  s.holds_run = fs::exists(dir / "config.yaml", ec);
  if (fs::exists(dir / "summary.json", ec)) {
    auto j = nlohmann::json::parse(read_file(dir / "summary.json"), nullptr, false);
    if (!j.is_discarded() && j.is_object()) s.summary = std::move(j);
  }
  s.description = describe(s);
  return s;
}

void refuse_existing_run(const fs::path& dir, const RunDirState& state) {
  usage_error(
      "{}: the run directory already holds {}; nothing was changed. Pass --overwrite to "
      "replace it, --resume auto to continue it from its last checkpoint (with a larger "
      "steps=N when it finished), or choose another --run-dir",
      dir.string(), state.description);
}

RunDirectory::RunDirectory(fs::path path) : path_(std::move(path)) {
  std::error_code ec;
  if (fs::exists(path_, ec) && !fs::is_directory(path_, ec))
    usage_error("{}: --run-dir exists and is not a directory; choose another --run-dir",
                path_.string());
  created_ = !fs::exists(path_, ec);
  fs::create_directories(path_, ec);
  if (ec)
    usage_error("{}: cannot create the run directory: {}; choose another --run-dir",
                path_.string(), ec.message());
  lock_ = std::make_unique<RunLock>(path_);
  // Holding the lock, any *.tmp here is a write an interrupted job left.
  std::vector<fs::path> stale;
  for (const auto& e : fs::directory_iterator(path_, ec))
    if (e.path().extension() == ".tmp") stale.push_back(e.path());
  for (const fs::path& p : stale) fs::remove(p, ec);
  state_ = read_run_dir_state(path_);
}

RunDirectory::~RunDirectory() {
  if (metrics_ != nullptr) std::fclose(metrics_);
  if (created_ && !begun_) {
    // Refused before it began: take away the directory this made (only if it
    // holds nothing but the lock file).
    std::error_code ec;
    fs::remove(path_ / ".lock", ec);
    lock_.reset();
    fs::remove(path_, ec);
  }
}

void RunDirectory::begin(Start start, int64_t resume_step) {
  begun_ = true;
  std::error_code ec;
  std::string kept;  // metrics.jsonl's lines a resumed run keeps
  switch (start) {
    case Start::kFresh:
      if (state_.holds_run) refuse_existing_run(path_, state_);
      break;
    case Start::kReplace: {
      // The old run's results, its checkpoints included: a replaced run's
      // `latest` would otherwise be resumed into the new run's metrics.
      for (const char* name : {"metrics.jsonl", "summary.json", "command.txt", "run.json",
                               "config.yaml"})
        fs::remove(path_ / name, ec);
      std::vector<fs::path> events;
      for (const auto& e : fs::directory_iterator(path_, ec))
        if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0)
          events.push_back(e.path());
      for (const fs::path& p : events) fs::remove(p, ec);
      fs::remove_all(path_ / "logs", ec);
      fs::remove_all(path_ / "checkpoints", ec);
      if (ec)
        runtime_error("{}: cannot remove the replaced run's files: {}", path_.string(),
                      ec.message());
      break;
    }
    case Start::kResume: {
      std::ifstream in(path_ / "metrics.jsonl");
      for (std::string line; std::getline(in, line);) {
        auto rec = nlohmann::json::parse(line, nullptr, false);
        if (!rec.is_discarded() && rec.contains("step") && rec["step"].is_number_integer() &&
            rec["step"].get<int64_t>() <= resume_step)
          kept += line + "\n";
      }
      break;
    }
  }
  // Never truncated in place: the kept lines (or nothing) replace the file whole.
  const std::string failed = write_atomically(path_ / "metrics.jsonl", kept);
  if (!failed.empty())
    runtime_error("{}; nothing else in {} was changed. Free space on its disk or fix its "
                  "permissions, then run the same command again",
                  failed, path_.string());
  metrics_ = std::fopen((path_ / "metrics.jsonl").c_str(), "ae");
  if (metrics_ == nullptr)
    runtime_error("{}: cannot append to metrics.jsonl: {}", path_.string(), std::strerror(errno));
  // A resumed run ends with a summary of its own; until then there is none,
  // so that summary.json present means "the latest segment ended".
  if (start == Start::kResume) fs::remove(path_ / "summary.json", ec);
}

void RunDirectory::write_file_atomically(const std::string& name, const std::string& content) {
  const std::string failed = write_atomically(path_ / name, content);
  if (!failed.empty()) runtime_error("{} (disk full or no permission?)", failed);
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
  if (metrics_ == nullptr || std::fwrite(line.data(), 1, line.size(), metrics_) != line.size() ||
      std::fflush(metrics_) != 0)
    runtime_error("{}: cannot append to metrics.jsonl: {}", path_.string(),
                  errno == ENOSPC ? "no space left on device" : std::strerror(errno));
}

void RunDirectory::write_summary(const nlohmann::json& summary) {
  write_file_atomically(
      "summary.json",
      summary.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

bool write_summary_file(const fs::path& dir, const nlohmann::json& summary) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return false;
  return write_atomically(dir / "summary.json",
                          summary.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) +
                              "\n",
                          /*unique_tmp=*/true)
      .empty();
}

}  // namespace fd::engine
