// Checkpoint save and resume for the Trainer (the file format is lib/ckpt's,
// docs/FORMAT.md).
//
//   RUN/checkpoints/step_00000100/rank_00000.h5 ... manifest.json
//   RUN/checkpoints/latest            "step_00000100", written last
//
// Saving is collective and crash-safe: the step directory is written under a
// temporary name (.step_00000100.tmp), renamed into place by rank 0 only
// after every rank has written its shard and the manifest is complete; then
// `latest` is replaced (temp file + rename); only then are checkpoints beyond
// keep_last deleted. A job killed at any point leaves `latest` naming the
// previous complete checkpoint.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lib/ckpt/export.h"
#include "lib/ckpt/shard.h"
#include "lib/config/recipe.h"
#include "lib/dist/communicator.h"
#include "lib/dist/fault.h"
#include "lib/zero/zero_engine.h"

namespace fd::engine {

// An opened checkpoint (lib/ckpt's open_checkpoint: manifest, every shard
// validated and cross-checked), read by global ranges.
class OpenCheckpoint {
 public:
  explicit OpenCheckpoint(const std::filesystem::path& step_dir);
  const ckpt::ShardMeta& meta() const { return checkpoint_.meta(); }
  const std::filesystem::path& dir() const { return dir_; }
  // Fills `out` with elements [offset, offset + count) of `field` of `segment`
  // from whichever shards hold them; zero where no shard does (padding).
  void read(const std::string& segment, const std::string& field, int64_t offset, int64_t count,
            const Tensor& out) const;

 private:
  std::filesystem::path dir_;
  ckpt::Checkpoint checkpoint_;
};

// Tidies `checkpoints_dir` after an interrupted save. Call with the run
// directory's lock held (rank 0). Removes partial step directories
// (.step_N.tmp); a `latest.tmp` that names a complete step directory newer
// than `latest` (a save killed between writing the pointer and renaming it)
// becomes `latest`, any other is removed. Returns what was done, one line
// each, for the log.
std::vector<std::string> tidy_checkpoints(const std::filesystem::path& checkpoints_dir);

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

// The flat layout of `model` in checkpoint form (names, segments, offsets, shapes).
std::vector<ckpt::ParamLayout> layout_of(const nn::Module& model);

struct SaveRequest {
  std::filesystem::path run_dir;
  int64_t step = 0;  // optimizer steps completed
  int keep_last = 1;
  ckpt::ShardMeta meta;  // everything but rank (filled per rank)
  dist::FaultSpec fault;  // test hook: ckptkill at a point of the write
};
// Collective. Returns the step directory written.
std::filesystem::path save_checkpoint(const SaveRequest& request, const zero::ZeroEngine& engine,
                                      dist::Communicator& comm);

}  // namespace fd::engine
