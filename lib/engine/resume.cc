#include "lib/engine/resume.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <fstream>
#include <vector>

#include "lib/base/error.h"
#include "lib/base/input_file.h"
#include "lib/ckpt/export.h"
#include "lib/ckpt/lora_base.h"
#include "lib/ckpt/manifest.h"
#include "lib/ckpt/slices.h"
#include "lib/config/diff.h"
#include "lib/config/load.h"
#include "lib/engine/checkpointing.h"
#include "lib/engine/run_dir.h"
#include "lib/precision/loss_scaler.h"

namespace fd::engine {

namespace fs = std::filesystem;

namespace {

// Whether `step_dir` is one of `run_dir`'s own checkpoints.
bool belongs_to(const fs::path& step_dir, const fs::path& run_dir) {
  std::error_code ec1, ec2;
  const fs::path a = fs::weakly_canonical(step_dir, ec1).parent_path();
  const fs::path b = fs::weakly_canonical(run_dir / "checkpoints", ec2);
  return !ec1 && !ec2 && a == b;
}

// The step a `latest` or `latest.tmp` file names, or -1.
int64_t named_step(const fs::path& pointer) {
  std::string name;
  try {
    const std::string text = read_input_file(pointer.string(), "checkpoint pointer", 4096);
    name = text.substr(0, text.find('\n'));
  } catch (const Error&) {  // not a regular file, or not a pointer fdtrain wrote
    return -1;
  }
  int64_t step = -1;
  // At most 18 digits: within int64_t, so stoll cannot throw.
  if (name.rfind("step_", 0) == 0 && name.size() > 5 && name.size() <= 5 + 18 &&
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
    if (n.size() > 4 && n[0] == '.' && n.rfind(".step_", 0) == 0 &&
        n.substr(n.size() - 4) == ".tmp")
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
    usage_error(
        "{}: the checkpoint in it is of step {}, but the directory is named {}: it was "
        "renamed or copied; rename it to {}, or give the directory of the step you mean",
        ck->dir().string(), ck->meta().step, name, want);
  return ck;
}

}  // namespace

NewestCheckpoint newest_verified_checkpoint(const fs::path& root) {
  NewestCheckpoint out;
  std::vector<fs::path> candidates;
  std::optional<std::string> latest;
  try {
    if (fs::is_directory(root)) latest = ckpt::read_latest(root.string());
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kUsage) throw;
    out.passed_over.push_back(e.what());
  }
  out.has_latest = latest.has_value();
  if (latest) candidates.push_back(*latest);
  for (const fs::path& d : ckpt::step_dirs_newest_first(root))
    if (!latest || fs::path(*latest) != d) candidates.push_back(d);
  out.tried_any = !candidates.empty();
  for (const fs::path& d : candidates) {
    try {
      out.checkpoint = open_checked(d);
      break;
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kUsage) throw;
      out.passed_over.push_back(fmt::format("passing over {}: {}", d.string(), e.what()));
    }
  }
  return out;
}

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
  if (fs::exists(root / "latest", ec) &&
      !fs::is_regular_file(fs::symlink_status(root / "latest", ec)))
    usage_error(
        "{}: is not the plain file fdtrain writes (a directory or a link); nothing was "
        "changed. Remove it: --resume auto then finds the newest checkpoint itself",
        (root / "latest").string());
  if (resume == "auto") {
    NewestCheckpoint newest = newest_verified_checkpoint(root);
    const bool fell_back = newest.fell_back();
    plan.warnings = std::move(newest.passed_over);
    plan.checkpoint = std::move(newest.checkpoint);
    if (fell_back)
      plan.warnings.push_back(
          fmt::format("--resume auto: {}; resuming from {}, the newest checkpoint that verifies",
                      newest.has_latest ? "`latest` does not verify" : "no `latest` pointer",
                      plan.checkpoint->dir().string()));
    if (!plan.checkpoint) {
      if (state.holds_run && !overwrite)
        usage_error(
            "{}: --resume auto: the run directory holds {} but no checkpoint to resume from{}; "
            "nothing was changed. Pass --overwrite to replace that run and start afresh, or "
            "choose a new --run-dir",
            run_dir.string(), state.description,
            newest.tried_any ? " (none of its checkpoints verifies, see the warnings)" : "");
      return plan;  // nothing here yet: the first run of a requeued job
    }
    plan.in_place = true;
  } else {
    if (!fs::exists(resume))
      usage_error(
          "--resume {}: no such file or directory; give a checkpoint step directory, a "
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
    for (const fs::path& d : ckpt::step_dirs_newest_first(root))
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
      state.summary &&
      ((state.summary->contains("status") && (*state.summary)["status"] == "completed") ||
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
    done.push_back(
        fmt::format("removed {}: the run continues from step {}, and this later "
                    "checkpoint belongs to the history it replaces",
                    d.string(), step));
  }
  // `latest` names the step the run continues from until its next save.
  if (named_step(root / "latest") != step) ckpt::write_latest(root.string(), step);
  return done;
}

OpenCheckpoint::OpenCheckpoint(const fs::path& step_dir)
    : dir_(step_dir), checkpoint_(ckpt::open_checkpoint(step_dir.string())) {
  const std::vector<ckpt::ParamLayout>& layout = checkpoint_.layout(0);
  for (size_t i = 0; i < layout.size(); ++i) index_.emplace(layout[i].name, i);
}

void OpenCheckpoint::read_tp(int t, const std::string& segment, const std::string& field,
                             int64_t offset, int64_t count, const Tensor& out) const {
  for (size_t s : checkpoint_.tp_shards[size_t(t)]) {
    const ckpt::ShardReader& r = checkpoint_.shards[s];
    const ckpt::ShardReader::RangeInfo* ri = r.find_range(segment);
    if (!ri) continue;
    const int64_t lo = std::max(offset, ri->offset);
    const int64_t hi = std::min({offset + count, ri->offset + ri->count, ri->segment_numel});
    if (lo >= hi) continue;
    r.read(segment, field, lo, hi - lo, out.flat_slice(lo - offset, hi - lo));
  }
}

void OpenCheckpoint::read(const nn::Module& model, const std::string& segment,
                          const std::string& field, int64_t offset, int64_t count,
                          const Tensor& out) const {
  out.zero_();
  const ckpt::Checkpoint& c = checkpoint_;
  const auto& segs = c.manifest.segments;
  if (std::none_of(segs.begin(), segs.end(),
                   [&](const ckpt::ManifestSegment& s) { return s.name == segment; }))
    usage_error("{}: holds no segment '{}'; the checkpoint is of a different model", dir_.string(),
                segment);
  const nn::FlatParamGroup* group = nullptr;
  for (const nn::FlatParamGroup* g : model.groups())
    if (g->name() == segment) group = g;
  FD_CHECK(group != nullptr, "the model has no segment '{}'", segment);
  const std::vector<nn::Parameter>& params = group->params();

  // A writer tp rank with this very flat layout of the segment: its ranges as they are.
  for (int t = 0; t < c.tensor_size(); ++t) {
    size_t k = 0;
    bool same = true;
    for (const ckpt::ParamLayout& w : c.layout(t)) {
      if (w.segment != segment) continue;
      const nn::Parameter* p = k < params.size() ? &params[k] : nullptr;
      ++k;
      same =
          p && p->name == w.name && p->offset == w.offset &&
          p->value.shape() == Shape(std::span<const int64_t>(w.shape)) &&
          p->slice.dim == w.slice_dim &&
          (w.whole() || (p->slice.offset == w.slice_offset && p->slice.global == w.slice_global &&
                         p->slice.blocks == w.slice_blocks));
      if (!same) break;
    }
    if (same && k == params.size()) return read_tp(t, segment, field, offset, count, out);
  }

  // Through the whole tensors, parameter by parameter.
  const Tensor stage = out.device().is_cpu() ? out
                                             : Tensor::zeros(Shape{count}, out.dtype(),
                                                             MemCategory::kOther, Device::cpu());
  struct Piece {
    int t;
    int64_t local, dst, n;  // writer's element offset in its parameter, out's, length
  };
  for (const nn::Parameter& p : params) {
    const int64_t lo = std::max(offset, p.offset);
    const int64_t hi = std::min(offset + count, p.offset + p.value.numel());
    if (lo >= hi) continue;
    auto at = index_.find(p.name);
    if (at == index_.end())
      usage_error("{}: holds no parameter '{}'; the checkpoint is of a different model",
                  dir_.string(), p.name);
    const std::vector<const ckpt::ParamLayout*> rows = c.rows(at->second);
    std::vector<Piece> pieces;
    nn::for_each_global_run(p, lo - p.offset, hi - lo, [&](int64_t g, int64_t l, int64_t n) {
      ckpt::for_each_writer_piece(rows, g, n, [&](int t, int64_t wl, int64_t gb, int64_t m) {
        pieces.push_back({t, wl, p.offset + l + (gb - g) - offset, m});
      });
    });
    // One read per writer tp rank of the span of its slice this needs, then the pieces.
    for (int t = 0; t < c.tensor_size(); ++t) {
      int64_t begin = INT64_MAX, end = 0;
      for (const Piece& q : pieces)
        if (q.t == t) begin = std::min(begin, q.local), end = std::max(end, q.local + q.n);
      if (begin >= end) continue;
      const ckpt::ParamLayout& w = *rows[size_t(t)];
      Tensor buf =
          Tensor::zeros(Shape{end - begin}, out.dtype(), MemCategory::kOther, Device::cpu());
      read_tp(t, w.segment, field, w.offset + begin, end - begin, buf);
      for (const Piece& q : pieces)
        if (q.t == t) stage.flat_slice(q.dst, q.n).copy_from(buf.flat_slice(q.local - begin, q.n));
    }
  }
  if (!out.device().is_cpu()) out.copy_from(stage);
}

Resumed load_for_resume(const OpenCheckpoint& ck, const config::Recipe& recipe,
                        const nn::Module& model, zero::ZeroEngine& engine,
                        precision::DynamicLossScaler* scaler, const std::string& base_sha256) {
  const std::string step_dir = ck.dir().string();
  const ckpt::ShardMeta& meta = ck.meta();
  config::LoadResult saved =
      config::try_parse_recipe(meta.recipe_yaml, step_dir + " (saved recipe)");
  if (!saved.ok()) {
    usage_error("{}: the recipe stored in the checkpoint does not load: {}", step_dir,
                saved.errors.front());
  }
  config::RecipeDiff diff = config::diff_recipes(saved.recipe, recipe);
  if (!diff.refused.empty()) {
    std::string lines;
    for (const auto& l : diff.refused) lines += "\n  " + l;
    usage_error(
        "{}: the checkpoint was saved with a different model, which cannot be resumed "
        "(saved -> now):{}\nresume with the saved model settings, or start a new run",
        step_dir, lines);
  }
  Resumed r;
  for (const auto& l : diff.warnings)
    r.warnings.push_back(fmt::format("resuming with a changed recipe (saved -> now): {}", l));
  // The same parameters at the same places of the same segments; when either side is
  // tensor-parallel, the same whole tensors in the same segments (the slices reshard).
  const std::vector<ckpt::ParamLayout> mine = layout_of(model);
  const std::vector<ckpt::ParamLayout>& theirs = ck.checkpoint().whole_layout;
  const bool tensor_parallel =
      ck.checkpoint().tensor_size() > 1 ||
      std::any_of(mine.begin(), mine.end(), [](const ckpt::ParamLayout& p) { return !p.whole(); });
  bool same = mine.size() == theirs.size();
  for (size_t i = 0; same && i < mine.size(); ++i) {
    same =
        mine[i].name == theirs[i].name && mine[i].segment == theirs[i].segment &&
        (tensor_parallel ? ckpt::global_shape(mine[i]) == theirs[i].shape
                         : mine[i].offset == theirs[i].offset && mine[i].shape == theirs[i].shape);
  }
  if (!same)
    usage_error(
        "{}: the checkpoint's parameter layout differs from this model's; it was written "
        "for a different model",
        step_dir);
  engine.load_state(
      [&](const std::string& segment, const std::string& field, int64_t offset, int64_t count,
          const Tensor& out) { ck.read(model, segment, field, offset, count, out); },
      meta.optimizer_step);
  if (scaler && meta.loss_scaler) {
    precision::LossScalerState st;
    st.scale = meta.loss_scaler->scale;
    st.iter = meta.loss_scaler->iter;
    st.last_overflow_iter = meta.loss_scaler->last_overflow_iter;
    st.hysteresis_left = meta.loss_scaler->hysteresis_left;
    scaler->set_state(st);
  }
  ckpt::check_lora_base_digest(step_dir, meta.base_sha256, recipe.model.init_from, base_sha256,
                               "resume with the same base file");
  r.step = meta.step;
  r.skipped_steps = meta.skipped_steps;
  r.dir = step_dir;
  r.info = fmt::format("resuming from {} (step {}, saved at world size {}{}, ZeRO stage {}, {})",
                       step_dir, meta.step, meta.world_size,
                       meta.tensor.size > 1 ? fmt::format(" ({} tp ranks x {} replicas)",
                                                          meta.tensor.size, meta.tensor.replicas)
                                            : std::string(),
                       meta.zero_stage, meta.precision);
  return r;
}

}  // namespace fd::engine
