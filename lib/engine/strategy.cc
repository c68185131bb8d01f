#include "lib/engine/strategy.h"

#include "lib/engine/data_parallel.h"
#include "lib/engine/pipeline.h"
#include "lib/nn/config/segments.h"

namespace fd::engine {

std::unique_ptr<Strategy> make_strategy(const Assembly& a, dist::Communicator& world) {
  // The one place a layout is chosen: a pp axis of more than one stage is a
  // pipeline; otherwise the world is data-parallel.
  if (a.mesh.size("pp") > 1)
    return std::make_unique<PipelineStage>(a.mesh, a.stage_blocks, a.pipeline_schedule,
                                           nn::decoder_segments(a.model), a.zero.accumulation,
                                           world, a.sequence_parallel);
  return std::make_unique<DataParallel>(a.mesh, world, a.sequence_parallel);
}

}  // namespace fd::engine
