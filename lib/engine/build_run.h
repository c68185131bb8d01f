// build_run: the one wiring of a run's objects (DESIGN 16). From an assembly
// (its mesh included) and the world's communicator it makes, for this rank:
// the layout's Strategy (strategy.h) with the mesh's groups, the model (the
// segments the strategy holds), the ZeroEngine with its sharded optimizer and
// offload tiers over the strategy's group, and the initial weights the engine
// fills each rank's part with. Trainer::setup and the estimate's simulated ranks (on the counting
// device, through a CountingCommunicator) both call it, so what the estimate
// measures is what the trainer builds.
//
//   Assembly a = assemble(recipe, world.size());
//   BuiltRun run = build_run(a, world, {.init = {.seed = a.seed}});
//   ...every rank set up...  run.strategy->sync();
//   train through run.strategy and run.engine ...
//
// Collective over `world` (the mesh's groups are splits of it): every rank
// calls it. Nothing crosses between ranks' weights until Strategy::sync.
#pragma once

#include <memory>

#include "lib/dist/communicator.h"
#include "lib/engine/assemble.h"
#include "lib/engine/strategy.h"
#include "lib/engine/weights_io.h"
#include "lib/nn/decoder.h"
#include "lib/tensor/host_link.h"
#include "lib/zero/zero_engine.h"

namespace fd::engine {

// What a run is built with besides its assembly.
struct RunEnv {
  InitialWeights init;  // where the parameters start from (seed, init_from, adapter)
  // GPU runs: the world's device communicator (NCCL) and how to make one over
  // a host group (the strategy's groups: Strategy::use_device_comms). Null /
  // empty: collectives on `world`, host buffers.
  dist::Communicator* device_world = nullptr;
  Strategy::MakeComm make_device_comm;
  std::shared_ptr<HostLink> offload_link;  // zero::ZeroConfig's offload.link; null: the assembly's
};

// This rank's objects, destroyed in reverse order: the engine before the
// strategy (which owns the engine's view of the model) and the model.
struct BuiltRun {
  std::unique_ptr<nn::Decoder> model;
  std::unique_ptr<Strategy> strategy;  // the layout (make_strategy)
  // dist.hierarchical, hpZ or qgZ: the engine's communicator, over strategy->engine_comm()
  // (dist::HierarchicalCommunicator); null otherwise.
  std::unique_ptr<dist::HierarchicalCommunicator> node_comm;
  std::unique_ptr<zero::ZeroEngine> engine;  // over strategy->engine_module(*model)
};

BuiltRun build_run(const Assembly& a, dist::Communicator& world, const RunEnv& env);

}  // namespace fd::engine
