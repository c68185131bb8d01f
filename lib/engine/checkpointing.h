// Checkpoint saving for the Trainer (the file format is lib/ckpt's,
// docs/FORMAT.md; finding, checking and loading one to resume: resume.h).
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
#include <string>
#include <vector>

#include "lib/ckpt/export.h"
#include "lib/ckpt/shard.h"
#include "lib/dist/communicator.h"
#include "lib/dist/fault.h"
#include "lib/zero/zero_engine.h"

namespace fd::engine {

// The flat layout of `model` in checkpoint form (names, segments, offsets, shapes).
std::vector<ckpt::ParamLayout> layout_of(const nn::Module& model);

struct SaveRequest {
  std::filesystem::path run_dir;
  int64_t step = 0;  // optimizer steps completed
  int keep_last = 1;
  ckpt::ShardMeta meta;  // everything but rank (filled per rank)
  dist::FaultSpec fault;  // test hook: ckptkill at a point of the write
  // The manifest's segments when rank 0's engine holds only some (a
  // pipeline's first stage): every segment with trainable elements, in
  // forward order, the same list on every rank (with tensor parallelism each
  // rank's numels are its tp rank's, and the manifest takes tp rank t's from
  // world rank t). Empty: rank 0's ranges.
  std::vector<ckpt::ManifestSegment> segments;
};
// Collective. Returns the step directory written.
std::filesystem::path save_checkpoint(const SaveRequest& request, const zero::ZeroEngine& engine,
                                      dist::Communicator& comm);

}  // namespace fd::engine
