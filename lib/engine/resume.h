// Resuming a run: everything that finds, checks, diffs and loads a checkpoint
// for `fdtrain train --resume` (the file format is lib/ckpt's, docs/FORMAT.md;
// saving: checkpointing.h).
//
//   tidy_checkpoints(RUN/checkpoints)          rank 0, lock held: what a killed save left
//   ResumePlan plan = plan_resume(...)         every rank: fresh, resume from which, finished
//   ... build the model, engine and scaler (assemble.h) ...
//   Resumed r = load_for_resume(*plan.checkpoint, recipe, model, engine, scaler, base_sha256);
//   discard_newer(plan.newer, ...)             rank 0, once every rank has set up
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lib/ckpt/export.h"
#include "lib/ckpt/shard.h"
#include "lib/config/recipe.h"
#include "lib/nn/module.h"
#include "lib/zero/zero_engine.h"

namespace fd::precision {
class DynamicLossScaler;
}

namespace fd::engine {

// An opened checkpoint (lib/ckpt's open_checkpoint: manifest, every shard
// validated and cross-checked), read by global ranges at any layout.
class OpenCheckpoint {
 public:
  explicit OpenCheckpoint(const std::filesystem::path& step_dir);
  const ckpt::ShardMeta& meta() const { return checkpoint_.meta(); }
  const std::filesystem::path& dir() const { return dir_; }
  const ckpt::Checkpoint& checkpoint() const { return checkpoint_; }
  // Fills `out` (count elements, CPU or GPU) with elements [offset, offset + count) of `field`
  // of `model`'s segment `segment`: the loader's own flat space, whose parameters (their
  // offsets, shapes and tensor-parallel slices) are `model`'s, at any world size, ZeRO stage,
  // pipeline or tensor-parallel layout of the writer's. Zero where no parameter is (padding).
  //
  // When some writer tp rank laid the segment out as `model` does (the same tensor-parallel
  // layout, or none), its shards' ranges are read as they are (world size and ZeRO stage
  // reshard by global offsets). Otherwise each parameter's elements go through its whole
  // tensor: the loader's slice to whole-tensor runs (nn::for_each_global_run), to the writer
  // tp rank whose slice holds them (whole parameters: tp rank 0) and its flat offset, read from
  // whichever of that tp rank's shards holds it. `model`'s parameters must be the
  // checkpoint's whole tensors (load_for_resume checks).
  void read(const nn::Module& model, const std::string& segment, const std::string& field,
            int64_t offset, int64_t count, const Tensor& out) const;

 private:
  // Elements [offset, offset + count) of tp rank t's segment into `out` (CPU).
  void read_tp(int t, const std::string& segment, const std::string& field, int64_t offset,
               int64_t count, const Tensor& out) const;

  std::filesystem::path dir_;
  ckpt::Checkpoint checkpoint_;
  std::map<std::string, size_t> index_;  // parameter name -> its place in the canonical order
};

// Tidies `checkpoints_dir` after an interrupted save. Call with the run
// directory's lock held (rank 0). Removes partial step directories
// (.step_N.tmp); a `latest.tmp` that names a complete step directory newer
// than `latest` (a save killed between writing the pointer and renaming it)
// becomes `latest`, any other is removed. Returns what was done, one line
// each, for the log.
std::vector<std::string> tidy_checkpoints(const std::filesystem::path& checkpoints_dir);

// The newest checkpoint of a run that verifies: `latest` if it names one,
// else the step directories of `checkpoints_dir`, newest first; the rule of
// `--resume auto` and of `eval`/`generate` given a run.
struct NewestCheckpoint {
  std::unique_ptr<OpenCheckpoint> checkpoint;  // opened and verified; null when none does
  bool has_latest = false;                     // `latest` named a step directory
  bool tried_any = false;                      // there was at least one checkpoint to try
  // Why each checkpoint passed over (and an unreadable `latest`) was refused,
  // one line each; when not empty, `checkpoint` is not the one `latest` names.
  std::vector<std::string> passed_over;
  // The checkpoint chosen is not `latest` (damaged or missing).
  bool fell_back() const { return checkpoint && (!passed_over.empty() || !has_latest); }
};
// Throws for what is not a damaged checkpoint (I/O failures); reads only.
NewestCheckpoint newest_verified_checkpoint(const std::filesystem::path& checkpoints_dir);

// How a run starts with respect to checkpoints (`fdtrain train --resume`).
struct ResumePlan {
  enum class Kind {
    kFresh,     // no checkpoint: train from step 0
    kResume,    // continue from `checkpoint`
    kFinished,  // in place, at the recipe's last step, and summary.json says completed
  };
  Kind kind = Kind::kFresh;
  std::unique_ptr<OpenCheckpoint> checkpoint;  // kResume, kFinished: opened and verified
  int64_t step = 0;                            // the checkpoint's step
  // The checkpoint belongs to the run in `run_dir` (under its checkpoints/):
  // the run continues in place.
  bool in_place = false;
  // Lines for rank 0's log: a damaged `latest` passed over, and why.
  std::vector<std::string> warnings;
  // in_place: the run's step directories after `step` (--resume auto: those
  // that do not verify; --resume PATH: only with overwrite). They belong to a
  // history this run replaces: discard_newer() removes them when it starts.
  std::vector<std::filesystem::path> newer;
};

// Decides how the run in `run_dir` starts. `resume`: "" (fresh), "auto"
// (RUN/checkpoints: `latest`, or when it is missing or does not verify, the
// newest step directory that does, with a warning), or a checkpoint path
// (step, checkpoints or run directory). Usage errors, each saying what is
// there and what to do:
//   - "": `run_dir` holds a run and !overwrite;
//   - "auto", no checkpoint: `run_dir` holds a run and !overwrite (a fresh
//     start would replace it); with no run there, kFresh;
//   - a path that holds no checkpoint that verifies;
//   - a path outside `run_dir` while `run_dir` holds another run and !overwrite;
//   - a checkpoint beyond `steps`;
//   - a path in `run_dir` with later checkpoints beside it and !overwrite
//     (resuming it in place would mix two histories);
//   - `run_dir`/checkpoints/latest that is not a plain file; a step
//     directory whose name is not its checkpoint's step.
// Pure: reads, never writes. Every rank computes the same plan.
ResumePlan plan_resume(const std::string& resume, const std::filesystem::path& run_dir,
                       bool overwrite, int64_t steps);

// Rank 0, when a run resumed in place starts: removes `newer` (ResumePlan)
// and points `checkpoints_dir`/latest at `step`, the resumed one. Returns
// what was done, one line each, for the log.
std::vector<std::string> discard_newer(const std::vector<std::filesystem::path>& newer,
                                       int64_t step, const std::filesystem::path& checkpoints_dir);

// What load_for_resume() restored besides the engine's and scaler's state.
struct Resumed {
  int64_t step = 0;           // optimizer steps the checkpoint had completed
  int64_t skipped_steps = 0;  // of those, skipped for non-finite gradients
  std::string dir;            // the step directory read
  // For rank 0's log: settings that changed and may change (warnings), and
  // where the run resumes from (info).
  std::vector<std::string> warnings;
  std::string info;
};

// Loads `checkpoint` into a run built from `recipe`: its stored recipe is
// compared with `recipe` field by field (config::diff_recipes: a changed
// model is refused, a changed optimizer or schedule warned about), its
// parameters must be `model`'s (the same flat layout, or when either is
// tensor-parallel the same whole tensors: names, global shapes, segments), then the ZeRO state
// (parameters, master weights, optimizer moments, step counts) goes into `engine` and the loss
// scaler's state into `scaler` (fp16; may be null), and a LoRA base's digest must be the one the
// adapters were trained on (`base_sha256`, of model.init_from). Usage errors name the step
// directory and what to do.
Resumed load_for_resume(const OpenCheckpoint& checkpoint, const config::Recipe& recipe,
                        const nn::Module& model, zero::ZeroEngine& engine,
                        precision::DynamicLossScaler* scaler, const std::string& base_sha256);

}  // namespace fd::engine
