#include "lib/engine/run_dir.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <system_error>

#include "lib/base/error.h"

namespace fd::engine {

namespace fs = std::filesystem;

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
  if (resume_step < 0 && fs::exists(path_ / "config.yaml", ec) && !overwrite) {
    usage_error(
        "{}: the run directory already holds a run; pass --overwrite to replace it or choose "
        "another --run-dir",
        path_.string());
  }
  if (fs::exists(path_, ec) && !fs::is_directory(path_, ec))
    usage_error("{}: --run-dir exists and is not a directory", path_.string());
  fs::create_directories(path_, ec);
  if (ec) usage_error("{}: cannot create the run directory: {}; choose another --run-dir", path_.string(), ec.message());
  for (const char* stale : {"metrics.jsonl", "summary.json", "command.txt"})
    fs::remove(path_ / stale, ec);
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
