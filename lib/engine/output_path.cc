#include "lib/engine/output_path.h"

#include <array>
#include <string>

#include "lib/base/error.h"
#include "lib/base/file_type.h"
#include "lib/engine/run_dir.h"

namespace fd::engine {
namespace {

namespace fs = std::filesystem;

// The names a run writes directly in its directory (run_dir.h, report.h),
// each also with a suffix ("config.yaml.tmp", "metrics.jsonl.1234.tmp").
constexpr std::array<const char*, 7> kRunFiles = {"config.yaml",     "command.txt",  "run.json",
                                                  "metrics.jsonl",   "summary.json", ".lock",
                                                  ".summary_reserve"};
// Directories a run manages as a whole.
constexpr std::array<const char*, 2> kRunDirs = {"checkpoints", "logs"};

bool is_run_file(const std::string& name) {
  if (name.rfind("events.out.tfevents.", 0) == 0) return true;
  for (const char* f : kRunFiles) {
    const std::string own = f;
    if (name == own || name.rfind(own + ".", 0) == 0) return true;
  }
  return false;
}

bool is_run_directory(const fs::path& dir) {
  const RunDirState s = read_run_dir_state(dir);
  return s.holds_run && !s.foreign;
}

}  // namespace

void check_output_path(const fs::path& path, OutputKind kind, std::string_view option) {
  const std::string shown = path.string();
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);  // follows links
  if (fs::exists(st)) {
    if (kind == OutputKind::kFile && !fs::is_regular_file(st))
      usage_error(
          "{} {}: it is {}, not a regular file; {} writes a file and replaces only a "
          "file, even with --overwrite; nothing was changed: choose another {}",
          option, shown, describe_file_type(shown), option, option);
    if (kind == OutputKind::kDirectory && !fs::is_directory(st))
      usage_error(
          "{} {}: it is {}, not a directory; {} writes a directory; nothing was "
          "changed: choose another {}",
          option, shown, describe_file_type(shown), option, option);
  }
  fs::path full = fs::weakly_canonical(fs::absolute(path, ec), ec);
  if (full.filename().empty()) full = full.parent_path();  // "out/" -> "out"
  if (kind == OutputKind::kDirectory && fs::is_directory(full, ec)) {
    if (is_run_directory(full))
      usage_error(
          "{} {}: it is a run directory, which an export never replaces; nothing was "
          "changed: choose a new directory (inside the run is fine, e.g. {}/hf)",
          option, shown, shown);
    if (fs::exists(full / "manifest.json", ec))
      usage_error(
          "{} {}: it is a checkpoint, which an export never replaces; nothing was "
          "changed: choose another {}",
          option, shown, option);
  }
  // Every directory above the output, nearest first.
  for (fs::path child = full, dir = full.parent_path(); !dir.empty() && child != dir;
       child = dir, dir = dir.parent_path()) {
    if (fs::exists(dir / "manifest.json", ec))
      usage_error(
          "{} {}: it is inside the checkpoint {}, whose files fdtrain checks and prunes; "
          "nothing was changed: write it outside the checkpoint",
          option, shown, dir.string());
    if (!is_run_directory(dir)) continue;
    const fs::path rel = full.lexically_relative(dir);
    const std::string first = rel.begin()->string();
    for (const char* managed : kRunDirs)
      if (first == managed)
        usage_error(
            "{} {}: it is inside {}/{}, which the run {} manages (it prunes old "
            "checkpoints, --overwrite removes them); nothing was changed: write it "
            "directly in the run directory or elsewhere",
            option, shown, dir.string(), managed, dir.string());
    if (child == full && is_run_file(first))
      usage_error(
          "{} {}: it is one of the files of the run {} ({}), which only that run "
          "writes; nothing was changed: choose a new file name (e.g. {}/model.safetensors)",
          option, shown, dir.string(), first, dir.string());
  }
}

}  // namespace fd::engine
