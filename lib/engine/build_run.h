// build_run: the one wiring of a run's objects (DESIGN 16). From an assembly
// (its mesh included) and the world's communicator it makes, for this rank:
// the model (its stage's segments only under a pipeline), the PipelineStage
// with the mesh's groups, the ZeroEngine with its sharded optimizer and
// offload tiers, and the initial weights the engine fills each rank's part
// with. Trainer::setup and the estimate's simulated ranks (on the counting
// device, through a CountingCommunicator) both call it, so what the estimate
// measures is what the trainer builds.
//
//   Assembly a = assemble(recipe, world.size());
//   BuiltRun run = build_run(a, world, {.init = {.seed = a.seed}});
//   train through run.engine (and run.pipe when there is one) ...
//
// Collective over `world` (the mesh's groups are splits of it): every rank
// calls it. Nothing crosses between pipeline stages (see PipelineStage::attach).
#pragma once

#include <memory>

#include "lib/dist/communicator.h"
#include "lib/engine/assemble.h"
#include "lib/engine/pipeline.h"
#include "lib/engine/weights_io.h"
#include "lib/nn/decoder.h"
#include "lib/tensor/host_link.h"
#include "lib/zero/zero_engine.h"

namespace fd::engine {

// What a run is built with besides its assembly.
struct RunEnv {
  InitialWeights init;  // where the parameters start from (seed, init_from, adapter)
  // GPU runs: the world's device communicator (NCCL; the engine's without a
  // pipeline) and how to make one over a host group (a pipeline's groups).
  // Null / empty: collectives on `world`, host buffers.
  dist::Communicator* device_world = nullptr;
  PipelineStage::MakeComm make_device_comm;
  std::shared_ptr<HostLink> offload_link;  // zero::ZeroConfig's offload.link; null: the assembly's
};

// This rank's objects, declared in the order they are built (destroyed in
// reverse: the engine before the views and the model it points into).
struct BuiltRun {
  std::unique_ptr<nn::Decoder> model;
  std::unique_ptr<PipelineStage> pipe;       // parallel.pipeline > 1, else null
  std::unique_ptr<nn::Module> stage_module;  // the pipeline stage's view of model, else null
  std::unique_ptr<zero::ZeroEngine> engine;  // over stage_module (a pipeline) or model
};

BuiltRun build_run(const Assembly& a, dist::Communicator& world, const RunEnv& env);

}  // namespace fd::engine
