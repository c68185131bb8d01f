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

#include "lib/base/atomic_file.h"
#include "lib/base/error.h"
#include "lib/base/input_file.h"
#include "lib/base/log.h"
#include "lib/engine/run_lock.h"

namespace fd::engine {

namespace fs = std::filesystem;

namespace {

// The summary's reserved space (begin(), write_summary()).
constexpr const char* kSummaryReserve = ".summary_reserve";
constexpr off_t kSummaryReserveBytes = 256 * 1024;

// Writes `content` to `path` atomically (lib/base/atomic_file.h) through
// `path`.tmp, or `path`.<pid>.tmp for a writer that may race rank 0.
std::string write_atomically(const fs::path& path, const std::string& content,
                             bool unique_tmp = false) {
  const fs::path tmp = unique_tmp ? fmt::format("{}.{}.tmp", path.string(), ::getpid())
                                  : fmt::format("{}.tmp", path.string());
  return fd::write_file_atomically(path, content, tmp);
}

// A run's own small file ("" when missing, unreadable, not a regular file or
// over the cap: a FIFO put in its place must not block the command).
std::string read_file(const fs::path& p) {
  try {
    return read_input_file(p.string(), "run file");
  } catch (const Error&) {
    return "";
  }
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
  if (s.holds_run) {
    // fdtrain writes config.yaml with this first line; another program's
    // config.yaml (a project directory given as --run-dir) is not a run.
    const std::string text = read_file(dir / "config.yaml");
    const std::string first = text.substr(0, text.find('\n'));
    s.foreign = first.rfind(kConfigHeader, 0) != 0 && !fs::exists(dir / "run.json", ec);
  }
  if (fs::exists(dir / "summary.json", ec)) {
    auto j = nlohmann::json::parse(read_file(dir / "summary.json"), nullptr, false);
    if (!j.is_discarded() && j.is_object()) s.summary = std::move(j);
  }
  s.description = describe(s);
  return s;
}

void refuse_existing_run(const fs::path& dir, const RunDirState& state) {
  if (state.foreign)
    usage_error("{}: the directory holds a config.yaml that fdtrain did not write, so it is not a "
                "run directory, and fdtrain would not replace it even with --overwrite; nothing "
                "was changed. Choose another --run-dir",
                dir.string());
  usage_error(
      "{}: the run directory already holds {}; nothing was changed. Pass --overwrite to "
      "replace it, --resume auto to continue it from its last checkpoint (with a larger "
      "steps=N when it finished), or choose another --run-dir",
      dir.string(), state.description);
}

RunDirectory::RunDirectory(fs::path path) : path_(std::move(path)) {
  std::error_code ec;
  if (fs::is_symlink(path_, ec) && !fs::exists(path_, ec))
    usage_error("{}: --run-dir is a symbolic link to nothing ({}); choose another --run-dir",
                path_.string(), fs::read_symlink(path_, ec).string());
  if (fs::exists(path_, ec) && !fs::is_directory(path_, ec))
    usage_error("{}: --run-dir exists and is not a directory; choose another --run-dir",
                path_.string());
  // Not the root, and not inside another run directory (its checkpoints/ or
  // logs/, which that run prunes and --overwrite removes).
  const fs::path full = fs::weakly_canonical(fs::absolute(path_, ec), ec);
  if (full == full.root_path())
    usage_error("{}: --run-dir is the root of the file system; choose a directory of its own",
                path_.string());
  for (fs::path p = full.parent_path(); !p.empty() && p != p.root_path(); p = p.parent_path()) {
    const RunDirState outer = read_run_dir_state(p);
    if (outer.holds_run && !outer.foreign)
      usage_error("{}: --run-dir is inside the run directory {}, whose files fdtrain manages "
                  "(checkpoints are pruned, --overwrite removes them); nothing was changed. "
                  "Choose a directory outside it",
                  path_.string(), p.string());
  }
  created_ = !fs::exists(path_, ec);
  fs::create_directories(path_, ec);
  if (ec)
    usage_error("{}: cannot create the run directory: {}; choose another --run-dir",
                path_.string(), ec.message());
  lock_ = std::make_unique<RunLock>(path_);
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
  std::error_code ec;
  if (state_.foreign) refuse_existing_run(path_, state_);
  if (start == Start::kFresh && state_.holds_run) refuse_existing_run(path_, state_);
  begun_ = true;
  // Temporary files of fdtrain's own writes that an interrupted job left.
  std::vector<fs::path> stale;
  for (const auto& e : fs::directory_iterator(path_, ec)) {
    const std::string n = e.path().filename().string();
    for (const char* own : {"config.yaml.", "command.txt.", "run.json.", "metrics.jsonl.",
                            "summary.json."})
      if (n.rfind(own, 0) == 0 && e.path().extension() == ".tmp") stale.push_back(e.path());
  }
  for (const fs::path& p : stale) fs::remove(p, ec);
  std::string kept;  // metrics.jsonl's lines a resumed run keeps
  switch (start) {
    case Start::kFresh:
      break;
    case Start::kReplace: {
      // The old run's results, its checkpoints included (a replaced run's
      // `latest` would otherwise be resumed into the new run's metrics): what
      // fdtrain wrote, by name, and nothing else a user put there.
      for (const char* name : {"metrics.jsonl", "summary.json", "command.txt", "run.json",
                               "config.yaml"})
        fs::remove(path_ / name, ec);
      auto remove_own = [&](const fs::path& dir, auto&& ours) {
        std::vector<fs::path> doomed;
        for (const auto& e : fs::directory_iterator(dir, ec))
          if (ours(e.path().filename().string())) doomed.push_back(e.path());
        for (const fs::path& p : doomed) fs::remove_all(p, ec);
      };
      remove_own(path_, [](const std::string& n) { return n.rfind("events.out.tfevents.", 0) == 0; });
      remove_own(path_ / "logs", [](const std::string& n) {
        return n.rfind("rank", 0) == 0 && n.size() > 4 && n.substr(n.size() - 4) == ".log";
      });
      remove_own(path_ / "checkpoints", [](const std::string& n) {
        return n.rfind("step_", 0) == 0 || n.rfind(".step_", 0) == 0 || n == "latest" ||
               n == "latest.tmp";
      });
      // The directories go when nothing of the user's is left in them.
      fs::remove(path_ / "logs", ec);
      fs::remove(path_ / "checkpoints", ec);
      ec.clear();
      break;
    }
    case Start::kResume: {
      std::ifstream in;
      if (non_regular_kind((path_ / "metrics.jsonl").string()).empty())
        in.open(path_ / "metrics.jsonl");
      for (std::string line; std::getline(in, line);) {
        nlohmann::json rec;
        if (try_parse_json(line, rec).empty() && rec.is_object() && rec.contains("step") && rec["step"].is_number_integer() &&
            rec["step"].get<int64_t>() <= resume_step) {
          kept += line + "\n";
          last_metrics_ = std::move(rec);
        }
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
  // Room for the summary, kept from the start: a run that fails because its
  // disk filled up can still say so (write_summary frees it first).
  int fd = ::open((path_ / kSummaryReserve).c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd >= 0) {
    if (::posix_fallocate(fd, 0, kSummaryReserveBytes) != 0) {
      std::error_code ignored;
      fs::remove(path_ / kSummaryReserve, ignored);  // no room for it: do without
    }
    ::close(fd);
  }
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
  std::error_code ec;
  fs::remove(path_ / kSummaryReserve, ec);
  write_file_atomically(
      "summary.json",
      summary.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

bool write_summary_file(const fs::path& dir, const nlohmann::json& summary) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return false;
  fs::remove(dir / kSummaryReserve, ec);
  return write_atomically(dir / "summary.json",
                          summary.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) +
                              "\n",
                          /*unique_tmp=*/true)
      .empty();
}

}  // namespace fd::engine
