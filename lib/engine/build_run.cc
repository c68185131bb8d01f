#include "lib/engine/build_run.h"

#include <functional>
#include <utility>

namespace fd::engine {

BuiltRun build_run(const Assembly& a, dist::Communicator& world, const RunEnv& env) {
  BuiltRun r;
  std::unique_ptr<Strategy> strategy = make_strategy(a, world);
  Strategy* s = strategy.get();
  r.model = build_model(
      a, Init::kDeferred, [s](int g) { return s->holds(g); }, s->tensor_parallel(),
      s->sequence_parallel());
  r.strategy = std::move(strategy);
  // Files are opened and checked here; each rank reads its part as the engine is built.
  const nn::ParamFill fill = initial_weights(*r.model, env.init);
  zero::ZeroConfig zc = a.zero;
  if (env.offload_link != nullptr) zc.offload.link = env.offload_link;
  if (env.device_world != nullptr) s->use_device_comms(env.make_device_comm, *env.device_world);
  dist::Communicator* comm = &s->engine_comm();
  if (a.hierarchical || zc.hierarchical_partition || zc.gradient_codes.bits != 0) {
    const std::string setting = a.hierarchical              ? "dist.hierarchical"
                                : zc.hierarchical_partition ? "zero.hierarchical_partition"
                                                            : "zero.quantized_gradients";
    // The engine's group is the mesh's {dp, sp} group in every strategy: its world ranks name
    // the hosts in a refusal.
    r.node_comm = dist::HierarchicalCommunicator::make(
        *comm, a.hierarchical, setting, a.mesh.group_ranks(world.rank(), {"dp", "sp"}));
    comm = r.node_comm.get();
  }
  r.engine = std::make_unique<zero::ZeroEngine>(s->engine_module(*r.model), *comm,
                                                s->engine_config(zc), fill);
  s->attach(*r.model, *r.engine, fill);
  return r;
}

}  // namespace fd::engine
