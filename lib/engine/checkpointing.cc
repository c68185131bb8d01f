#include "lib/engine/checkpointing.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <csignal>
#include <fstream>
#include <map>
#include <vector>

#include "lib/base/error.h"
#include "lib/base/log.h"
#include "lib/base/strings.h"
#include "lib/ckpt/export.h"
#include "lib/config/load.h"
#include "lib/engine/run_dir.h"

namespace fd::engine {

namespace fs = std::filesystem;

namespace {

// step_* directories of `root`, newest first.
std::vector<fs::path> step_dirs_newest_first(const fs::path& root) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec))
    if (e.is_directory(ec) && e.path().filename().string().rfind("step_", 0) == 0 &&
        e.path().extension().empty())
      out.push_back(e.path());
  std::sort(out.rbegin(), out.rend());  // zero-padded names sort by step
  return out;
}

// Whether `step_dir` is one of `run_dir`'s own checkpoints.
bool belongs_to(const fs::path& step_dir, const fs::path& run_dir) {
  std::error_code ec1, ec2;
  const fs::path a = fs::weakly_canonical(step_dir, ec1).parent_path();
  const fs::path b = fs::weakly_canonical(run_dir / "checkpoints", ec2);
  return !ec1 && !ec2 && a == b;
}

// The step a `latest` or `latest.tmp` file names, or -1.
int64_t named_step(const fs::path& pointer) {
  std::ifstream in(pointer);
  std::string name;
  std::getline(in, name);
  int64_t step = -1;
  if (name.rfind("step_", 0) == 0 && name.size() > 5 &&
      name.find_first_not_of("0123456789", 5) == std::string::npos)
    step = std::stoll(name.substr(5));
  return step;
}

}  // namespace

std::vector<std::string> tidy_checkpoints(const fs::path& root) {
  std::vector<std::string> done;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return done;
  std::vector<fs::path> partial;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string n = e.path().filename().string();
    if (n.size() > 4 && n[0] == '.' && n.rfind(".step_", 0) == 0 && n.substr(n.size() - 4) == ".tmp")
      partial.push_back(e.path());
  }
  for (const fs::path& p : partial) {
    fs::remove_all(p, ec);
    done.push_back(fmt::format("removed {}, a checkpoint whose save was interrupted", p.string()));
  }
  const fs::path tmp = root / "latest.tmp";
  if (fs::exists(tmp, ec)) {
    const int64_t step = named_step(tmp);
    const fs::path dir = root / ckpt::step_dir_name(std::max<int64_t>(step, 0));
    const bool complete = step >= 0 && fs::exists(dir / "manifest.json", ec);
    if (complete && step > named_step(root / "latest")) {
      fs::rename(tmp, root / "latest", ec);
      if (ec)
        runtime_error("cannot rename {} to {}: {}", tmp.string(), (root / "latest").string(),
                      ec.message());
      done.push_back(fmt::format(
          "{} names {}, a complete checkpoint newer than `latest` (a save interrupted just "
          "before its last rename): it is now `latest`",
          tmp.string(), dir.filename().string()));
    } else {
      fs::remove(tmp, ec);
      done.push_back(fmt::format("removed {}, left by an interrupted save", tmp.string()));
    }
  }
  return done;
}

namespace {

// Opens and verifies `dir`; a step directory must be named for the step its
// manifest records (a renamed copy would resume at the wrong place).
std::unique_ptr<OpenCheckpoint> open_checked(const fs::path& dir) {
  auto ck = std::make_unique<OpenCheckpoint>(dir);
  const std::string name = fs::path(ck->dir()).filename().string();
  const std::string want = ckpt::step_dir_name(ck->meta().step);
  if (name.rfind("step_", 0) == 0 && name != want)
    usage_error("{}: the checkpoint in it is of step {}, but the directory is named {}: it was "
                "renamed or copied; rename it to {}, or give the directory of the step you mean",
                ck->dir().string(), ck->meta().step, name, want);
  return ck;
}

}  // namespace

ResumePlan plan_resume(const std::string& resume, const fs::path& run_dir, bool overwrite,
                       int64_t steps) {
  ResumePlan plan;
  const RunDirState state = read_run_dir_state(run_dir);
  if (state.foreign) refuse_existing_run(run_dir, state);
  if (resume.empty()) {
    if (state.holds_run && !overwrite) refuse_existing_run(run_dir, state);
    return plan;
  }
  const fs::path root = run_dir / "checkpoints";
  std::error_code ec;
  if (fs::exists(root / "latest", ec) && !fs::is_regular_file(fs::symlink_status(root / "latest", ec)))
    usage_error("{}: is not the plain file fdtrain writes (a directory or a link); nothing was "
                "changed. Remove it: --resume auto then finds the newest checkpoint itself",
                (root / "latest").string());
  if (resume == "auto") {
    std::vector<fs::path> candidates;
    std::optional<std::string> latest;
    try {
      if (fs::is_directory(root)) latest = ckpt::read_latest(root.string());
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kUsage) throw;
      plan.warnings.push_back(e.what());
    }
    if (latest) candidates.push_back(*latest);
    for (const fs::path& d : step_dirs_newest_first(root))
      if (!latest || fs::path(*latest) != d) candidates.push_back(d);
    for (const fs::path& d : candidates) {
      try {
        plan.checkpoint = open_checked(d);
      } catch (const Error& e) {
        if (e.kind() != ErrorKind::kUsage) throw;
        plan.warnings.push_back(fmt::format("passing over {}: {}", d.string(), e.what()));
        continue;
      }
      if (!plan.warnings.empty() || !latest)
        plan.warnings.push_back(fmt::format(
            "--resume auto: {}; resuming from {}, the newest checkpoint that verifies",
            latest ? "`latest` does not verify" : "no `latest` pointer", d.string()));
      break;
    }
    if (!plan.checkpoint) {
      if (state.holds_run && !overwrite)
        usage_error(
            "{}: --resume auto: the run directory holds {} but no checkpoint to resume from{}; "
            "nothing was changed. Pass --overwrite to replace that run and start afresh, or "
            "choose a new --run-dir",
            run_dir.string(), state.description,
            candidates.empty() ? "" : " (none of its checkpoints verifies, see the warnings)");
      return plan;  // nothing here yet: the first run of a requeued job
    }
    plan.in_place = true;
  } else {
    if (!fs::exists(resume))
      usage_error("--resume {}: no such file or directory; give a checkpoint step directory, a "
                  "run's checkpoints/ directory, or --resume auto",
                  resume);
    plan.checkpoint = open_checked(ckpt::resolve_step_dir(resume));
    plan.in_place = belongs_to(plan.checkpoint->dir(), run_dir);
    if (!plan.in_place && state.holds_run && !overwrite)
      usage_error(
          "{}: the run directory holds {}, not the run of {}; nothing was changed. --resume PATH "
          "continues a checkpoint's run in a directory of its own: choose a --run-dir that holds "
          "no run, use --resume auto to continue the run in {}, or pass --overwrite to replace it",
          run_dir.string(), state.description, plan.checkpoint->dir().string(), run_dir.string());
  }
  plan.step = plan.checkpoint->meta().step;
  if (plan.in_place) {
    // Checkpoints after the one resumed belong to a history this run replaces
    // (its metrics after plan.step are dropped too): never two histories in
    // one directory. --resume auto passes over only those that do not verify.
    for (const fs::path& d : step_dirs_newest_first(root))
      if (d.filename().string() > ckpt::step_dir_name(plan.step)) plan.newer.push_back(d);
    if (!plan.newer.empty() && resume != "auto" && !overwrite) {
      std::vector<std::string> names;
      for (const fs::path& d : plan.newer) names.push_back(d.filename().string());
      usage_error(
          "{}: the run has checkpoints after step {} ({}); resuming from step {} in place would "
          "mix two histories in one directory; nothing was changed. Pass --overwrite to discard "
          "the later checkpoints and metrics and continue from step {}, or resume into a new "
          "--run-dir",
          run_dir.string(), plan.step, fmt::join(names, ", "), plan.step, plan.step);
    }
  }
  if (plan.step > steps)
    usage_error("{}: the checkpoint is at step {}, beyond steps = {}; raise steps to train on",
                plan.checkpoint->dir().string(), plan.step, steps);
  // At the last step: finished when the run in place said so. Without that
  // summary (killed after its last save) the run resumes with nothing left
  // to train, and ends with the summary it never wrote.
  const bool said_completed =
      state.summary && ((state.summary->contains("status") && (*state.summary)["status"] == "completed") ||
                        (!state.summary->contains("status") && state.summary->contains("exit_reason") &&
                         (*state.summary)["exit_reason"] == "completed"));
  plan.kind = plan.step == steps && plan.in_place && said_completed ? ResumePlan::Kind::kFinished
                                                                    : ResumePlan::Kind::kResume;
  return plan;
}

std::vector<std::string> discard_newer(const std::vector<fs::path>& newer, int64_t step,
                                       const fs::path& root) {
  std::vector<std::string> done;
  std::error_code ec;
  for (const fs::path& d : newer) {
    fs::remove_all(d, ec);
    if (ec)
      runtime_error("cannot remove {}: {}; remove it, then resume again", d.string(), ec.message());
    done.push_back(fmt::format("removed {}: the run continues from step {}, and this later "
                               "checkpoint belongs to the history it replaces",
                               d.string(), step));
  }
  // `latest` names the step the run continues from until its next save.
  if (named_step(root / "latest") != step) ckpt::write_latest(root.string(), step);
  return done;
}

OpenCheckpoint::OpenCheckpoint(const fs::path& step_dir)
    : dir_(step_dir), checkpoint_(ckpt::open_checkpoint(step_dir.string())) {}

void OpenCheckpoint::read(const std::string& segment, const std::string& field, int64_t offset,
                          int64_t count, const Tensor& out) const {
  out.zero_();
  bool found = false;
  for (const ckpt::ShardReader& r : checkpoint_.shards) {
    for (const ckpt::ShardReader::RangeInfo& ri : r.ranges()) {
      if (ri.segment != segment) continue;
      found = true;
      const int64_t lo = std::max(offset, ri.offset);
      const int64_t hi = std::min({offset + count, ri.offset + ri.count, ri.segment_numel});
      if (lo >= hi) continue;
      r.read(segment, field, lo, hi - lo, out.flat_slice(lo - offset, hi - lo));
    }
  }
  if (!found)
    usage_error("{}: holds no segment '{}'; the checkpoint is of a different model",
                dir_.string(), segment);
}

std::vector<ckpt::ParamLayout> layout_of(const nn::Module& model) {
  std::vector<ckpt::ParamLayout> out;
  for (const nn::FlatParamGroup* g : model.groups()) {
    for (const nn::Parameter& p : g->params()) {
      ckpt::ParamLayout l;
      l.name = p.name;
      l.segment = g->name();
      l.offset = p.offset;
      for (int i = 0; i < p.value.shape().ndim(); ++i) l.shape.push_back(p.value.shape()[i]);
      l.decay = p.decay;
      out.push_back(std::move(l));
    }
  }
  return out;
}

namespace {
void maybe_kill(const dist::FaultSpec& f, int rank, int64_t step, int point) {
  if (dist::fault_fires(f, dist::FaultSpec::kCkptKill, rank, step) && f.point == point) {
    std::fprintf(stderr,
                 "fdtrain: rank %d: injected fault: SIGKILL while writing the checkpoint of step "
                 "%lld (point %d)\n",
                 rank, (long long)step, point);
    std::fflush(stderr);
    std::raise(SIGKILL);
  }
}
}  // namespace

fs::path save_checkpoint(const SaveRequest& req, const zero::ZeroEngine& engine,
                         dist::Communicator& comm) {
  const fs::path root = req.run_dir / "checkpoints";
  const std::string name = ckpt::step_dir_name(req.step);
  const fs::path tmp = root / ("." + name + ".tmp");
  const fs::path final_dir = root / name;
  const bool rank0 = comm.rank() == 0;
  std::error_code ec;
  if (rank0) {
    fs::create_directories(root, ec);
    fs::remove_all(tmp, ec);
    fs::create_directories(tmp, ec);
    if (ec)
      runtime_error(
          "cannot save the checkpoint of step {}: cannot create {}: {}; make {} writable (or "
          "free space on its disk), then resume with --resume auto",
          req.step, tmp.string(), ec.message(), root.string());
  }
  comm.barrier();
  maybe_kill(req.fault, comm.rank(), req.step, 1);
  ckpt::ShardMeta meta = req.meta;
  meta.rank = comm.rank();
  meta.world_size = comm.size();
  std::vector<ckpt::SegmentRange> ranges;
  // GPU state is staged through host copies (HDF5 reads and writes host memory).
  auto host = [](const Tensor& t) {
    return t.defined() && t.is_cuda() ? t.to_device(Device::cpu(), MemCategory::kOther) : t;
  };
  for (const zero::ZeroEngine::SegmentState& s : engine.saved_state()) {
    ranges.push_back({s.segment, s.segment_numel, s.offset, s.count, host(s.master),
                      host(s.exp_avg), host(s.exp_avg_sq), host(s.params)});
  }
  const std::string shard = (tmp / ckpt::shard_file_name(comm.rank())).string();
  try {
    ckpt::write_shard(shard, meta, ranges);
  } catch (const Error&) {
    // A partial checkpoint only takes space (a full disk stays full): rank 0
    // removes it before the job ends, so that the summary can still be written.
    if (rank0) fs::remove_all(tmp, ec);
    throw;
  }
  // Every shard's size and CRC-32 go into the manifest (read back from the
  // page cache: ~0.1 s per GiB), so a damaged shard is refused before HDF5
  // parses it. The gather is also the barrier after the writes.
  const ckpt::FileDigest digest = ckpt::file_digest(shard);
  maybe_kill(req.fault, comm.rank(), req.step, 2);
  const double mine[2] = {double(digest.bytes), double(digest.crc32)};  // both exact in a double
  std::vector<double> digests(2 * size_t(comm.size()));
  comm.all_gather_f64(mine, digests.data(), 2);
  if (rank0) {
    ckpt::Manifest m;
    m.step = req.step;
    m.world_size = comm.size();
    m.zero_stage = meta.zero_stage;
    m.precision = meta.precision;
    for (int r = 0; r < comm.size(); ++r) m.files.push_back(ckpt::shard_file_name(r));
    for (const auto& r : ranges) m.segments.push_back({r.segment, r.segment_numel});
    for (int r = 0; r < comm.size(); ++r)
      m.digests.push_back(
          {uint64_t(digests[2 * size_t(r)]), uint32_t(digests[2 * size_t(r) + 1])});
    try {
      ckpt::write_manifest(tmp.string(), m);
      maybe_kill(req.fault, 0, req.step, 3);
      // A step saved again after a resume replaces the old directory atomically.
      ckpt::replace_directory(tmp.string(), final_dir.string());
      maybe_kill(req.fault, 0, req.step, 4);
      ckpt::write_latest(root.string(), req.step);
    } catch (const Error&) {
      // As for a shard: a partial checkpoint (or pointer) only takes space.
      fs::remove_all(tmp, ec);
      fs::remove(root / "latest.tmp", ec);
      throw;
    }
    // Only now that the new checkpoint is complete: drop the oldest beyond keep_last.
    std::vector<fs::path> steps;
    for (const auto& e : fs::directory_iterator(root, ec))
      if (e.is_directory() && e.path().filename().string().rfind("step_", 0) == 0)
        steps.push_back(e.path());
    std::sort(steps.begin(), steps.end());
    while (int(steps.size()) > req.keep_last) {
      if (steps.front() != final_dir) fs::remove_all(steps.front(), ec);
      steps.erase(steps.begin());
    }
  }
  comm.barrier();
  return final_dir;
}

}  // namespace fd::engine
