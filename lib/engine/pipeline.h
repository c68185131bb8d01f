// PipelineStage: one rank's part of a pipeline-parallel run (parallel.pipeline
// = P > 1; docs/PIPELINE.md).
//
// The world's P x D ranks are P stages of D data-parallel replicas, stage-major
// (dist::Mesh's axes pp and dp, lib/dist/mesh.h); with tensor parallelism (the mesh's tp axis,
// size T > 1) P x D x T ranks, each (stage, replica) a tp group of T consecutive ranks that
// hold the stage's segments sliced (nn::TensorParallel) and run its micro-batches together;
// with Ulysses sequence parallelism (the sp axis, size S > 1, between dp and tp) each (stage,
// replica) is S sp ranks (each a tp group), which share its micro-batches, each computing its
// slice of every sequence (nn::SequenceParallel): what crosses a stage boundary is the rank's
// slice of the hidden state, (B, T/S, C), to and from the same sp (and tp) rank.
// Stage s holds the decoder segments of its blocks
// (the embedding with the first, the final norm and head with the last); each stage's ranks
// holding the same weights (its D replicas x S sp ranks, at one tp rank) run a ZeroEngine
// (stages 0-2) over them, so that parameters, gradients and optimizer state of a rank are those
// of its stage's segments only, and the sp ranks' partial gradients are summed by its
// reduction. Each (replica, sp rank, tp rank)'s stages form a pipeline group: hidden states go
// forward and their gradients back between neighbours, in the order the schedule
// (lib/pipe/schedule.h) gives.
//
// Exactness by construction, against the same run without a pipeline:
//   - every micro-batch is the same data (replica r reads what data-parallel
//     rank r reads at world D), and its gradients reach each segment's
//     buffer in micro-batch order, reduce-scattered over the same D ranks;
//   - a tied head (GPT-2) runs on the last stage with its own copy of the
//     embedding matrix: after each micro-batch's backward it sends the head's
//     gradient for it to the first stage over a communicator of its own,
//     which adds it to the embedding's gradient just before the embedding's
//     backward, as the unpipelined backward does; after each step the first
//     stage sends the updated matrix back (with tensor parallelism each tp
//     rank its own vocabulary rows, to and from the same tp rank; with
//     Ulysses each sp rank its partial gradient and the whole matrix);
//   - the global gradient norm adds every (segment, engine rank) partial in
//     the unpipelined order (attach()), an engine rank being a (replica, sp
//     rank): each holds its shard of the stage's gradient reduced over them;
//     with tensor parallelism each tp rank's partials of its sliced
//     parameters and tp rank 0's of the whole ones (identical on every tp
//     rank), in (engine rank, tp rank, segment) order;
//   - with Ulysses the loss is, as without a pipeline, each last-stage sp
//     rank's share of the micro-batch's (nn::SequenceParallel).
// So weights_sha256 equals the unpipelined run's (tests/mpi/pipeline_test.cc); with tensor
// parallelism (or Ulysses) the run is the unpipelined one's to fp32 rounding (its sums
// over the tp and sp ranks run in another order: T=1's losses to 1e-5,
// tests/cli/tensor_parallel.sh).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "lib/autograd/tape.h"
#include "lib/dist/communicator.h"
#include "lib/dist/mesh.h"
#include "lib/engine/step.h"
#include "lib/engine/strategy.h"
#include "lib/nn/decoder.h"
#include "lib/nn/segment_runner.h"
#include "lib/pipe/schedule.h"
#include "lib/zero/zero_engine.h"

namespace fd::engine {

// The pipeline's Strategy (strategy.h): make_strategy builds one when the
// mesh's pp axis has more than one stage.
class PipelineStage final : public nn::SegmentRunner, public Strategy {
 public:
  // blocks[s]: transformer blocks of stage s (sum = the model's blocks;
  // mesh.size("pp") stages, at least 2); `segments`: the model's, as it
  // publishes them (nn::decoder_segments), which place the stages and the
  // tied head's weights; micro_batches per optimizer step; `sequence_parallel`:
  // Megatron's sequence parallelism over the tp group (mesh.size("tp") > 1).
  // Splits `world` into the mesh's {"dp", "sp"} and "pp" groups, with an sp axis "sp", and
  // with a tp axis "tp" and {"pp", "dp", "sp"} (collective): every rank constructs one. Any
  // backend, the counting one of `fdtrain estimate` included.
  PipelineStage(const dist::Mesh& mesh, std::vector<int> blocks, pipe::Schedule schedule,
                std::vector<nn::SegmentInfo> segments, int micro_batches, dist::Communicator& world,
                bool sequence_parallel = false);
  ~PipelineStage() override;

  int stages() const { return int(blocks_.size()); }
  int replicas() const { return replicas_; }
  int stage() const { return stage_; }
  int replica() const { return replica_; }
  int tensor_rank() const { return tp_rank_; }
  int tensor_size() const { return tp_size_; }
  int sequence_rank() const { return sp_rank_; }
  int sequence_size() const { return sp_size_; }
  bool first_stage() const { return stage_ == 0; }
  bool last_stage() const { return stage_ == stages() - 1; }
  // Decoder segments this stage runs: first_segment()..last_segment().
  int first_segment() const { return first_; }
  int last_segment() const { return last_; }
  // Whether this rank holds segment g's buffers (its own, and those its own
  // are tied to: on the last stage of a tied model the embedding for the head).
  bool holds(int segment) const override;
  // The tp group the stage's segments are sliced over (size 1 without).
  nn::TensorParallel tensor_parallel() const override;
  // The Ulysses group the stage's sequences are split over (size 1 without).
  nn::SequenceParallel sequence_parallel() const override;
  // The stage whose own segments include `segment`.
  int owner_stage(int segment) const;
  // The stage's ranks holding the same weights, its replicas x sp ranks (the ZeroEngine's
  // communicator).
  dist::Communicator& data_comm() { return *data_; }
  dist::Communicator& engine_comm() override { return *data_; }
  // GPU runs: the groups' communicators for device buffers, made by `make`
  // over each host group (collective, as make_gpu_communicator is), and the
  // world's (the caller's, for with_full_parameters' broadcasts). Before attach().
  // Not with tensor or sequence parallelism (CPU only: FD_CHECK).
  void use_device_comms(const MakeComm& make, dist::Communicator& device_world) override;

  // A view of `model` with this stage's own segments, for the ZeroEngine,
  // and the engine's configuration in its numbering (engine index = segment
  // - first: the checkpointed segments that are the stage's; offload files
  // named by the global rank).
  std::unique_ptr<nn::Module> stage_module(const nn::Decoder& model) const;
  zero::ZeroConfig stage_config(zero::ZeroConfig config) const;
  // Strategy: the stage's view of `model` (kept by the stage) and stage_config.
  nn::Module& engine_module(nn::Decoder& model) override;
  zero::ZeroConfig engine_config(zero::ZeroConfig config) const override {
    return stage_config(std::move(config));
  }
  // After the engine is built: pads the segments outside it for the stage's
  // replicas as their owners' engines pad them (FlatParamGroup::pad_for),
  // allocates and fills the tied copy through `fill` (the same values the
  // first stage starts with) and installs the norm combiner (with tensor
  // parallelism over split and whole partials). Local:
  // nothing crosses between stages until the first sync_tied(), which the
  // trainer calls only once every rank has agreed that its setup succeeded
  // (a stage waiting on a neighbour whose setup failed would wait until
  // dist.timeout_s).
  void attach(nn::Decoder& model, zero::ZeroEngine& engine, const nn::ParamFill& fill) override;

  // SegmentRunner: segment g through the engine (index g - first); the
  // first stage's embedding adds the tied head's gradient in its backward.
  autograd::Variable run(int segment, const nn::SegmentFn& fn, const autograd::Variable& x,
                         const std::vector<int>& also_needs) override;

  // One step's micro-batches in schedule order. load(m, batch) fills micro
  // m's batch (one per micro-batch in flight, made by new_batch) and returns
  // its target count; grad_seed(m, targets) and dropout_seed(m) as the
  // unpipelined step gives them. Returns the sum over micro-batches of loss *
  // targets (the last stage's tp rank 0, with Ulysses each sp rank's share; 0
  // elsewhere). fns.runner and fns.forwarded are
  // not used: micro-batches interleave. --profile: the stage times its loads
  // and forwards, the waits for its neighbours are communication waits, and
  // the rest (backwards, the ZeRO hand-off, posting exchanges) is backward.
  double train(int micro_batches, const MicroFns& fns, Batch& batch, PhaseClock& clock,
               Phases& phases) override;
  // The last stage (its tp rank 0: a tp group computes one replica's loss; its sp rank 0:
  // eval() sums the sp ranks' shares there).
  bool computes_loss() const override { return last_stage() && tp_rank_ == 0 && sp_rank_ == 0; }
  // Totals over train() calls: wall seconds, seconds blocked waiting for a
  // neighbour (point-to-point and the tied head's transfers: the bubble plus
  // transfer time not hidden), bytes this rank sent point-to-point, steps;
  // and of the wall time, the seconds in load() (data_s) and in the stage's
  // forwards (forward_s; the rest is backwards, exchanges and waits).
  struct Totals {
    double train_s = 0.0, idle_s = 0.0, data_s = 0.0, forward_s = 0.0;
    int64_t p2p_bytes = 0, steps = 0;
  };
  const Totals& totals() const { return totals_; }
  // After setup (a checkpoint loaded or not) and after each optimizer step:
  // the first stage's embedding to the last stage's copy (tied heads).
  void sync_tied();
  void sync() override { sync_tied(); }
  // An evaluation batch through the stages (no gradients): the loss where
  // computes_loss() (with Ulysses the shares summed over the last stage's sp
  // group), 0 elsewhere (the caller sums over ranks).
  double eval(const Batch& batch) override;
  // Runs fn with every segment resident and current on every rank (each
  // owner stage's first rank broadcasts over the world; with tensor parallelism
  // its first rank at this tp rank over the ranks of this tp rank, then the
  // whole model is assembled over the tp group: gather_whole_model; every sp
  // rank holds the same whole weights), then releases what is not this rank's.
  void with_full_model(const std::function<void(const nn::Decoder& model)>& fn) override;

  // Strategy's reports: the setup line (stages, replicas, tp ranks,
  // schedule, blocks, bubble); the checkpoint's pipeline and tensor metadata
  // (its replicas the stage's engine ranks: replicas x sp ranks, as the
  // checkpoint sees a stage's ZeRO partitions) and the manifest's segments
  // (rank 0 holds only the first stage's); summary.json 'pipeline' (per stage,
  // the mean over its ranks of the share of the step spent waiting for a
  // neighbour, and the bytes sent point-to-point per step) and with tensor
  // parallelism 'tensor_parallel', with Ulysses 'sequence_parallel' (as
  // DataParallel's; bytes_per_step the largest of any rank's).
  std::string describe() const override;
  void describe_save(SaveRequest& request) const override;
  void add_to_summary(nlohmann::json& summary) override;
  int64_t p2p_bytes() const override { return totals_.p2p_bytes; }
  int64_t tensor_bytes() const override { return tp_ ? tp_->bytes_sent() : 0; }
  int64_t sequence_bytes() const override { return sp_ ? sp_->bytes_sent() : 0; }

 private:
  struct InFlight;
  double run_program(int micro_batches, const MicroFns& fns);
  void forward(int micro);
  void backward(int micro);
  InFlight& slot(int micro);
  // Checks the partition, places this rank (stage, replica, segments) and the tied weights.
  void place(const dist::Mesh& mesh);
  void wait_tied_send();
  // One point-to-point op on the pipeline group, posted: send and/or receive
  // (null: none); null when there is neither.
  dist::WorkPtr exchange(const Tensor* send, int dst, const Tensor* recv, int src);
  void ensure_slots(int micro_batches);
  Shape hidden_shape(const Batch& b) const;
  // The stage's engine ranks (replicas x sp ranks), and this rank's: replica * S + sp rank.
  int engine_ranks() const { return replicas_ * sp_size_; }
  int engine_rank() const { return replica_ * sp_size_ + sp_rank_; }

  std::vector<int> blocks_;
  pipe::Schedule schedule_;
  int micro_batches_ = 0;                     // per optimizer step
  std::unique_ptr<nn::Module> stage_module_;  // engine_module's view
  std::vector<pipe::Instruction> program_;    // this stage's, for program_micro_batches_
  int program_micro_batches_ = -1;
  int grad_out_micro_ = -1;  // the micro-batch whose output gradient grad_out_ holds
  int replicas_ = 1, stage_ = 0, replica_ = 0, first_ = 0, last_ = 0;
  int tp_rank_ = 0, tp_size_ = 1, sp_rank_ = 0, sp_size_ = 1;
  bool sequence_parallel_ = false;
  // rank_of_[s][e][t]: the world rank of stage s, engine rank e (replica e / S, sp rank e % S),
  // tp rank t (from the mesh).
  std::vector<std::vector<std::vector<int>>> rank_of_;
  // Tensor parallelism: per stage, the rank of its first rank at this tp rank within full_.
  std::vector<int> full_root_;
  std::vector<nn::SegmentInfo> segments_;  // the model's
  std::vector<int> segment_stage_;         // per segment, its owner stage
  bool tied_ = false;
  int tied_segment_ = -1;  // tied_: the segment whose matrix the head reads (the first stage's)
  dist::Communicator& world_;
  dist::Communicator* device_world_ = nullptr;  // GPU runs: the world's NCCL communicator
  // The groups (over device buffers on a GPU), and on a GPU the host groups they ride on.
  std::unique_ptr<dist::Communicator> data_, pipe_, tie_;
  // Tensor parallelism: the tp group, and the ranks of this tp rank ({"pp", "dp", "sp"}: every
  // stage's replicas and sp ranks), over which with_full_model's segments are broadcast.
  // Ulysses: the sp group.
  std::unique_ptr<dist::Communicator> tp_, full_, sp_;
  std::unique_ptr<dist::Communicator> data_host_, pipe_host_, tie_host_;
  nn::Decoder* model_ = nullptr;
  zero::ZeroEngine* engine_ = nullptr;
  const MicroFns* fns_ = nullptr;
  std::vector<std::unique_ptr<InFlight>> in_flight_;  // micro m at m % size
  Tensor grad_out_;    // the gradient of this stage's output (received)
  Tensor eval_input_;  // an evaluation batch's hidden state (received)
  Tensor tied_grad_;   // first stage: the head's embedding gradient (received)
  // A tied head's matrix within the embedding segment's flat space (count 0:
  // none, or frozen under LoRA), and that range of one of its flat buffers.
  int64_t tied_offset_ = 0, tied_count_ = 0;
  Tensor tied(const Tensor& flat) const { return flat.flat_slice(tied_offset_, tied_count_); }
  double loss_sum_ = 0.0;                    // last stage
  dist::WorkPtr tied_send_;                  // last stage: the head's embedding gradient on its way
  std::vector<double> norm_row_, norm_all_;  // the norm combiner's gather, per segment
  Totals totals_;
  int64_t tp_train_bytes_ = 0;  // sent over tp_ by train() calls (summary.json)
  int64_t sp_train_bytes_ = 0;  // sent over sp_ by train() calls
};

}  // namespace fd::engine
