// Strategy: how a run's parallel layout trains (DESIGN 16). The training loop
// (trainer.cc) and the estimate's simulated rank (estimate.cc) talk to this
// interface only; each layout is one implementation, chosen once, by
// make_strategy from the assembly's mesh:
//   DataParallel   (data_parallel.h)  every rank runs the whole model on its
//                                     own micro-batches; ZeRO over the world,
//                                     or, with tensor parallelism, each tp
//                                     group runs it on one replica's micro-
//                                     batches, ZeRO over the dp groups;
//   PipelineStage  (pipeline.h)       a rank runs its stage's segments, its
//                                     ZeRO engine over its stage's replicas;
//                                     with tensor parallelism each (stage,
//                                     replica) is a tp group slicing them,
//                                     with Ulysses S sp ranks splitting its
//                                     sequences (ZeRO over replicas x sp).
//
// Life of a strategy, as build_run (build_run.h) and the trainer drive it:
//   auto s = make_strategy(a, world);        // collective: the mesh's groups are split
//   model = build_model(a, ..., s->holds, s->tensor_parallel());  // the segments (slices) held
//   s->use_device_comms(...);                // GPU runs only
//   engine = ZeroEngine(s->engine_module(*model), s->engine_comm(),
//                       s->engine_config(a.zero), fill);
//   s->attach(*model, *engine, fill);        // local: nothing crosses ranks yet
//   ...every rank set up...  s->sync();      // collective
//   per step: s->train(...); engine->step(...); s->sync();
//   s->eval(batch), s->with_full_model(fn), s->add_to_summary(summary)
//
// Every method marked collective is called by every rank of the world in the
// same order. The strategy does not own the model or the engine; it must be
// destroyed after the engine (build_run's BuiltRun declares them so).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "lib/autograd/tape.h"
#include "lib/dist/communicator.h"
#include "lib/engine/assemble.h"
#include "lib/engine/checkpointing.h"
#include "lib/engine/report.h"
#include "lib/engine/step.h"
#include "lib/nn/decoder.h"
#include "lib/nn/segment_runner.h"
#include "lib/zero/zero_engine.h"

namespace fd::engine {

// What a step's micro-batches are made of, as the caller defines them.
struct MicroFns {
  // Fills micro-batch m's batch; returns its target count.
  std::function<int64_t(int micro, Batch& batch)> load;
  // The backward's seed for micro-batch m with `targets` targets.
  std::function<float(int micro, int64_t targets)> grad_seed;
  // The adapters' dropout seed of micro-batch m.
  std::function<uint64_t(int micro)> dropout_seed;
  // A batch buffer, for strategies with several micro-batches in flight.
  std::function<Batch()> new_batch;
  // Optional (the estimate's activation watch): segments run through
  // `runner`, which wraps the engine (engine numbering), and `forwarded`
  // sees each micro-batch between its forward and its backward. A strategy
  // whose micro-batches interleave (the pipeline) runs its own runner and
  // reports no micro-batch: its figures are per stage (estimate.h).
  nn::SegmentRunner* runner = nullptr;
  std::function<void(int micro, const autograd::Tape&, const autograd::Variable& loss)> forwarded;
};

class Strategy {
 public:
  // GPU runs: makes the device communicator over a host group (collective,
  // as make_gpu_communicator is).
  using MakeComm = std::function<std::unique_ptr<dist::Communicator>(dist::Communicator& host)>;

  virtual ~Strategy() = default;

  // --- Building (build_run) ---
  // Whether this rank builds segment g's buffers.
  virtual bool holds(int segment) const = 0;
  // The tensor-parallel group the model's segments are sliced over (nn::TensorParallel; size
  // 1 without).
  virtual nn::TensorParallel tensor_parallel() const { return {}; }
  // The Ulysses group the model's sequences are split over (nn::SequenceParallel; size 1
  // without).
  virtual nn::SequenceParallel sequence_parallel() const { return {}; }
  // GPU runs, before the engine is built: the engine's and the strategy's
  // groups over device buffers; `device_world` is the world's.
  virtual void use_device_comms(const MakeComm& make, dist::Communicator& device_world) = 0;
  // What this rank's ZeroEngine partitions (`model` or a view of its
  // segments, owned by the strategy), over which group, and its
  // configuration in the module's segment numbering.
  virtual nn::Module& engine_module(nn::Decoder& model) = 0;
  virtual dist::Communicator& engine_comm() = 0;
  virtual zero::ZeroConfig engine_config(zero::ZeroConfig config) const = 0;
  // After the engine is built. Local: nothing crosses ranks until sync().
  virtual void attach(nn::Decoder& model, zero::ZeroEngine& engine, const nn::ParamFill& fill) = 0;

  // --- Training ---
  // Once every rank's setup has succeeded, and after each optimizer step:
  // whatever copies of the weights the layout keeps are made current.
  // Collective.
  virtual void sync() = 0;
  // One step's micro-batches, forward and backward, gradients into the
  // engine (the caller then steps it). `batch` is the caller's buffer, used
  // by a strategy that runs one micro-batch at a time. --profile: laps
  // `clock` into `phases`. Returns the sum over micro-batches of loss *
  // targets on the ranks that compute the loss, 0 elsewhere. Collective.
  virtual double train(int micro_batches, const MicroFns& fns, Batch& batch, PhaseClock& clock,
                       Phases& phases) = 0;
  // Whether this rank computes the loss (train's and eval's are its own).
  virtual bool computes_loss() const = 0;
  // An evaluation batch, no gradients: its loss where computes_loss(), else
  // 0 (the caller sums over ranks). Collective.
  virtual double eval(const Batch& batch) = 0;
  // Runs fn with the whole model on every rank, every parameter resident,
  // current and whole (digests, samples, exports): the model itself, or with
  // tensor parallelism its unsharded twin (gather_whole_model). Collective.
  virtual void with_full_model(const std::function<void(const nn::Decoder& model)>& fn) = 0;

  // --- Reporting ---
  // A line for the setup log saying how the layout splits the run; empty
  // when there is nothing beyond the world and ZeRO stage.
  virtual std::string describe() const = 0;
  // Adds the layout's part of a checkpoint's metadata (checkpointing.h).
  virtual void describe_save(SaveRequest& request) const = 0;
  // Adds the layout's section to summary.json (docs/RUN_DIR.md). Collective.
  virtual void add_to_summary(nlohmann::json& summary) = 0;
  // Bytes this rank sent point-to-point (between pipeline stages) so far.
  virtual int64_t p2p_bytes() const = 0;
  // Bytes this rank sent over its tensor-parallel group so far (0 without one).
  virtual int64_t tensor_bytes() const { return 0; }
  // Bytes this rank sent over its Ulysses sequence-parallel group so far (0 without one).
  virtual int64_t sequence_bytes() const { return 0; }
};

// The strategy of `a`'s layout for this rank of `world` (a.mesh's world).
// Collective: it splits the mesh's groups.
std::unique_ptr<Strategy> make_strategy(const Assembly& a, dist::Communicator& world);

}  // namespace fd::engine
