#include "lib/engine/build_run.h"

#include <functional>
#include <utility>

namespace fd::engine {

BuiltRun build_run(const Assembly& a, dist::Communicator& world, const RunEnv& env) {
  BuiltRun r;
  // A pipeline stage holds its own segments only (pipeline.h).
  std::unique_ptr<PipelineStage> pipe;
  if (a.stages > 1)
    pipe = std::make_unique<PipelineStage>(a.mesh, a.stage_blocks, a.pipeline_schedule,
                                           nn::decoder_segments(a.model), world);
  PipelineStage* p = pipe.get();
  r.model = build_model(a, Init::kDeferred,
                        p ? std::function<bool(int)>([p](int g) { return p->holds(g); })
                          : std::function<bool(int)>());
  r.pipe = std::move(pipe);
  // Files are opened and checked here; each rank reads its part as the engine is built.
  const nn::ParamFill fill = initial_weights(*r.model, env.init);
  zero::ZeroConfig zc = a.zero;
  if (env.offload_link != nullptr) zc.offload.link = env.offload_link;
  if (r.pipe) {
    // The engine numbers the stage's segments from 0.
    r.stage_module = r.pipe->stage_module(*r.model);
    zc = r.pipe->stage_config(zc);
    if (env.device_world != nullptr)
      r.pipe->use_device_comms(env.make_device_comm, *env.device_world);
    r.engine = std::make_unique<zero::ZeroEngine>(*r.stage_module, r.pipe->data_comm(), zc, fill);
    r.pipe->attach(*r.model, *r.engine, fill);
  } else {
    dist::Communicator& comm = env.device_world != nullptr ? *env.device_world : world;
    r.engine = std::make_unique<zero::ZeroEngine>(*r.model, comm, zc, fill);
  }
  return r;
}

}  // namespace fd::engine
