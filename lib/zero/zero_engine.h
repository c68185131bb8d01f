// ZeroEngine: ZeRO stages 0-3 over a model's flat parameter groups.
//
// Every segment (FlatParamGroup) is partitioned into `world` equal contiguous
// shards of its padded flat space; rank r owns [r*S, (r+1)*S). The model is
// built with alignment padding only; the engine pads each group for its
// communicator's size as it partitions it (FlatParamGroup::pad_for), so a
// model built once can be partitioned over any group. One reduction
// path serves every stage (docs/ZERO.md):
//   - after a segment's backward its full gradient is reduce-scattered
//     (asynchronously with overlap_comm, while backward goes on) into the
//     rank's gradient shard; micro-batch 0 writes the shard, later
//     micro-batches add to it;
//   - the global gradient norm is the square root of the per-rank partial
//     sums of squares, added in rank order; a non-finite norm skips the step
//     on every rank;
//   - stage 0 all-gathers the gradient shards and updates everything
//     (replicated); stages 1-2 update their shard and all-gather parameters;
//     stage 3 updates its persistent parameter shard, and gathers a segment's
//     full parameters only around its forward and its backward.
// Consequence, tested: at a fixed world size, stages 0-3 give bitwise
// identical weights (with 16-bit gradients summed natively, sum16 kNative,
// this holds on MPI, which adds in rank order, and is not promised on NCCL).
//
// Precision: parameters, gradients and activations live in the model's
// compute dtype (f32, bf16 or f16); with a 16-bit dtype the engine keeps fp32
// master weights for what it updates (everything for stage 0, the shard
// otherwise) and writes them back rounded to nearest even after each update.
// What each stage keeps, with c = 2 (16-bit) or 4 (fp32) bytes and fp32
// master weights only when c = 2 (in fp32 the parameters are the master):
//   stage 0: params cP, grads cP, master 4P, m+v 8P           = 16P (c=2), 16P (c=4)
//   stage 1: params cP, grads cP, master+m+v 12P/N            = 4P+12P/N, 8P+8P/N
//   stage 2: params cP, grad shard cP/N, master+m+v 12P/N     = 2P+14P/N, 4P+12P/N
//   stage 3: param shard cP/N, grad shard cP/N, 12P/N         = 16P/N
// (+cP/N of gradient accumulator for stages 0-1 when accumulation > 1), P the
// padded parameter count. Transient full-segment buffers of stages 2-3
// (gathered parameters, gradient buckets, reduce-scatter outputs) are
// accounted as MemCategory::kComm.
//
// Loss scaling (fp16): the caller seeds backward with scale/(accumulation*world)
// and passes the scale to step(), which folds its removal into the clipping
// factor (DeepSpeed's formula, REFERENCE.md) and reports non-finite gradients.
//
// Use: build the model with layout_for(stage), then per step:
//   for each micro-batch m: begin_micro_batch(m); loss = model.loss(..., this);
//                           tape.backward(loss, 1/(accumulation*world)); end_micro_batch(m);
//   StepResult r = step(lr);
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "lib/dist/communicator.h"
#include "lib/dist/hierarchical_communicator.h"
#include "lib/dist/wire_quant.h"
#include "lib/nn/module.h"
#include "lib/nn/segment_runner.h"
#include "lib/optim/adamw.h"

namespace fd::zero {

// ZeRO-Infinity's NVMe tier for the optimizer state: each rank's fp32 master
// weights (16-bit runs) and Adam moments live in a file under `dir` and are
// streamed through `buffer_bytes` of chunk buffers each step (optim::AdamW,
// optim::StateStream), with the same arithmetic as in memory.
struct OffloadConfig {
  bool optimizer = false;
  // GPU runs: the optimizer state in host memory instead of a file (ZeRO-Offload):
  // gradients come down and parameters go up a chunk at a time, AdamW on the CPU.
  bool host = false;
  // Stage 3 with the optimizer offloaded: each rank's parameter partition
  // lives in the optimizer's file too; a segment's partition is read for its
  // all-gather (the next one read ahead) through two staging buffers.
  bool params = false;
  // The device as the host sees it (optim::AdamWOffload::link). Null: a
  // GPU's (CUDA builds), or, on the counting device for a GPU run (`gpu`),
  // one that accounts its pinned buffers; CPU tensors need none. Tests give
  // CPU runs a thread link to exercise the GPU's ordering here.
  std::shared_ptr<HostLink> link;
  bool gpu = false;  // the run is a GPU run (what the counting device stands for)
  std::string dir;   // an existing directory
  std::string dir_setting = "zero.offload_optimizer.path";  // named in messages
  int64_t buffer_bytes = int64_t(64) << 20;
  // The rank in the files' names; -1: the engine's communicator's rank. A
  // pipeline's stages each run an engine over their own data-parallel group,
  // whose ranks repeat from stage to stage, so each names its files by its
  // global rank instead (PipelineStage::stage_config): one file per process.
  int file_rank = -1;
  // The rank's files under dir: the optimizer state (and partitions), and,
  // with offloaded parameters and a LoRA run's frozen base, the base's partition.
  std::string optimizer_file(int rank) const;
  std::string frozen_file(int rank) const;
};

struct ZeroConfig {
  int stage = 0;             // 0..3
  bool overlap_comm = true;  // reduce-scatter asynchronously during backward
  // With overlap_comm: reductions left in flight when a segment's backward
  // ends; launching one more first completes the oldest (stages 2-3 hold each
  // one's full gradient bucket until then, MemCategory::kComm). Completing
  // orders the device after the reduction (Work::order_device_after: NCCL
  // makes the compute stream wait, the host goes on; host backends wait);
  // end_micro_batch waits for all of them on the host.
  int reductions_in_flight = 2;
  // How 16-bit gradients are summed (zero.reduce_dtype; communicator.h,
  // Numerics): the engine sets it on its communicator. kFp32 keeps stages 0-3
  // bitwise identical at any world size; kNative halves the bytes and rounds
  // every partial sum to 16 bits.
  dist::Sum16 sum16 = dist::Sum16::kFp32;
  int accumulation = 1;                  // micro-batches per step
  optim::AdamWOptions adamw;             // optimizer hyper-parameters (lr is given per step)
  float grad_clip = 1.0f;                // max global gradient norm; <= 0 disables clipping
  std::vector<int> checkpoint_segments;  // segments whose activations are recomputed in backward
  OffloadConfig offload;                 // where the optimizer state lives
  // ZeRO++ (arXiv 2306.10209), stage 3 only, each on its own (docs/ZERO.md, ZeRO++). The
  // last two need the engine's communicator to be a dist::HierarchicalCommunicator (its node
  // collectives); the first works over any.
  // qwZ: every parameter gather (trainable and a 16-bit frozen base) moves kWeightCodes wire
  // codes (int8, blocks of 256, an fp32 scale each) and every rank computes with the decoded
  // values, its own shard's included; the shards and fp32 master weights are untouched.
  bool quantized_weights = false;
  // hpZ: a segment's forward gather also keeps this rank's 1/L of it (L: its node's ranks),
  // its secondary partition, in the compute dtype (MemCategory::kParams); backward gathers
  // from those inside the node. A step's update makes them stale until the next forward.
  bool hierarchical_partition = false;
  // qgZ: gradient reductions through HierarchicalCommunicator::quantized_reduce_scatter_async
  // with these codes; bits 0: the plain reduce-scatter.
  dist::WireFormat gradient_codes{0, 0};
};

// qwZ's weight codes (DeepSpeed quantizes weights to int8 in groups; blocks of 256 here).
inline constexpr dist::WireFormat kWeightCodes{8, 256};
// qgZ's gradient codes: int8 in blocks of 256, int4 in blocks of 64.
inline constexpr dist::WireFormat kGradientCodes8{8, 256};
inline constexpr dist::WireFormat kGradientCodes4{4, 64};

struct StepResult {
  double grad_norm = 0.0;  // global L2 norm before clipping, loss scale removed
                           // (rank-order sum of shard partials)
  bool skipped = false;    // non-finite gradients: no update was made (all ranks agree)
};

// How a model's flat buffers are accounted for `stage` (whatever the ranks:
// the engine pads the groups for its communicator).
nn::GroupLayout layout_for(int stage);
// The layout of a frozen base (LoRA) for `stage`: partitioned like the rest
// under stage 3 (gathered per segment), replicated otherwise.
nn::GroupLayout frozen_layout_for(int stage);

// Model-state bytes per rank that a ZeroEngine holds (fp32), as documented above.
struct ModelStateBytes {
  int64_t params = 0, grads = 0, master = 0, optimizer = 0;
  int64_t total() const { return params + grads + master + optimizer; }
};
// compute_bytes: 4 (fp32) or 2 (bf16/f16 parameters and gradients, fp32 master).
// offload_buffers >= 0: the optimizer state is offloaded (NVMe) and resident
// only as these chunk buffers (ZeroEngine::optimizer_state_bytes()); the
// master weights of a 16-bit run live in the file too. offload_params >= 0:
// stage 3's parameter partitions are offloaded too, resident only as these
// staging buffers (ZeroEngine::params_staging_bytes()).
ModelStateBytes model_state_bytes(int stage, int world, int accumulation, int64_t padded_params,
                                  int compute_bytes = 4, int64_t offload_buffers = -1,
                                  int64_t offload_params = -1);

class ZeroEngine : public nn::SegmentRunner {
 public:
  // `model` must have been built with layout_for(config.stage). First, the
  // engine pads every group (and frozen group) of `model` for comm.size()
  // shards (FlatParamGroup::pad_for: nothing is allocated for a buffer that
  // is still released), whatever it was padded for before. Without `fill`
  // the model must hold the same initial parameters on every rank (stage 3
  // copies the rank's shard out and releases the full buffers). With `fill`,
  // the engine fills what the rank holds through it: under stage 3 only the
  // rank's shard of every group, otherwise every parameter. The model may
  // then be built with its buffers released (GroupLayout::params_resident and
  // grads_resident false): the engine allocates what its stage keeps (full
  // parameters for stages 0-2, full gradients for stages 0-1) only once they
  // are padded, and under stage 3 no rank ever holds the whole model. `fill`
  // must give every rank the same values; it is not kept. Model and
  // communicator must outlive the engine.
  ZeroEngine(const nn::Module& model, dist::Communicator& comm, const ZeroConfig& config,
             const nn::ParamFill& fill = {});
  ~ZeroEngine() override;
  ZeroEngine(const ZeroEngine&) = delete;
  ZeroEngine& operator=(const ZeroEngine&) = delete;

  // The group this engine shards over and reduces in (a pipeline stage's
  // data-parallel group, else the world).
  dist::Communicator& comm() const { return comm_; }

  void begin_micro_batch(int micro);
  // Completes the micro-batch's gradient reductions (accumulating into the shards).
  void end_micro_batch(int micro);
  // Norm, clipping, overflow check, AdamW, parameter all-gather. `loss_scale`
  // is the factor the loss was multiplied by (1 without loss scaling).
  StepResult step(float lr, double loss_scale = 1.0);

  // SegmentRunner: gathers parameters (stage 3) and hooks the segment's backward.
  autograd::Variable run(int segment, const nn::SegmentFn& fn, const autograd::Variable& x,
                         const std::vector<int>& also_needs) override;

  // Free-form use, for callers whose forward and backward do not go through
  // run() (the C API, lib/capi). acquire_all(), after begin_micro_batch and
  // before the forward, makes every segment's full parameters resident and
  // current (stage 3 gathers them) and its full gradient buffer resident
  // (stages 2-3: zeroed). reduce_all(), after the backward, launches every
  // segment's gradient reduce-scatter in segment order and drops what
  // acquire_all() holds; then end_micro_batch and step as usual.
  void acquire_all();
  void reduce_all();
  // Runs fn with every parameter resident and current on this rank (stage 3
  // gathers them for the call); for digests, exports and text generation.
  void with_full_parameters(const std::function<void()>& fn);

  int stage() const { return config_.stage; }
  // N: the ranks the engine partitions over (its communicator's; a pipeline
  // stage's data-parallel replicas, not the whole world).
  int world() const { return comm_.size(); }

  // The global gradient norm from this rank's per-segment squared-norm
  // partials (one per segment, in order): by default each rank adds its own
  // in segment order and the ranks' sums are added in rank order. A pipeline
  // (whose stages' engines each hold some segments) installs a combiner that
  // gathers every stage's partials and adds them in that same order, so the
  // norm is the unpipelined run's bit for bit.
  // With `split_whole` (tensor parallelism: some parameters are slices, the
  // others whole and identical on every rank of the tp group) each segment's
  // partial covers its sliced parameters only and `whole` holds, per segment,
  // the whole parameters' squares, so that the combiner counts those once;
  // otherwise `whole` is empty.
  using NormCombine =
      std::function<double(const std::vector<double>& partials, const std::vector<double>& whole)>;
  void set_norm_combine(NormCombine combine, bool split_whole = false) {
    norm_combine_ = std::move(combine);
    norm_split_whole_ = split_whole;
  }

  // Checkpointing. Every stage saves and restores the same thing: for each
  // segment, the rank's contiguous range [rank*S, (rank+1)*S) of the fp32
  // master weights, Adam moments and compute-dtype parameters (stage 0 holds
  // everything, but each rank writes only its range). Loading fills whatever
  // this rank's layout needs (its range; everything for stage 0) from any
  // source through `read`, so a checkpoint from another world size or stage
  // loads directly.
  struct SegmentState {
    std::string segment;    // the group's name
    int64_t segment_numel;  // padded numel in this layout
    int64_t offset;         // this rank's range
    int64_t count;
    Tensor master;      // fp32 (the parameters themselves for fp32 models)
    Tensor exp_avg;     // fp32
    Tensor exp_avg_sq;  // fp32
    Tensor params;      // compute dtype; undefined for fp32 models (master is the parameters)
    // Offloaded state: master, exp_avg and exp_avg_sq are undefined and
    // stream(fn) hands them over a piece at a time instead, in order: fn(offset
    // within the range, master, exp_avg, exp_avg_sq, params), fp32 host
    // tensors, and with offloaded 16-bit parameters (`params` undefined, and
    // stream_params set) the piece's parameters in the compute dtype.
    using PieceFn = std::function<void(int64_t offset, const Tensor& master, const Tensor& exp_avg,
                                       const Tensor& exp_avg_sq, const Tensor& params)>;
    std::function<void(const PieceFn&)> stream;
    std::optional<DType> stream_params;
  };
  // Views of the state, not copies: only step() (and load_state) writes them. Saves behind the
  // step rely on it: the checkpoint writer copies these views beside the next step's forward and
  // backward, and the trainer holds step() until the copy is done (engine/checkpointing.h).
  std::vector<SegmentState> saved_state() const;
  // read(segment, field, offset, count, out) must fill `out` (count elements of
  // out's dtype) with elements [offset, offset + count) of field "master",
  // "exp_avg" or "exp_avg_sq" (fp32), zero-filling what lies beyond the
  // source's padded segment. Collective (parameters are re-gathered).
  using StateReader = std::function<void(const std::string& segment, const std::string& field,
                                         int64_t offset, int64_t count, const Tensor& out)>;
  void load_state(const StateReader& read, int64_t optimizer_step);
  int64_t optimizer_steps() const { return optimizer_->steps_taken(); }
  // Padded parameter elements over all segments (P above).
  int64_t padded_params() const;
  // The optimizer state file's bytes (offload), 0 when the state is in memory.
  int64_t offload_file_bytes() const { return optimizer_->file_bytes(); }
  // Host offload (GPU runs): the optimizer state's bytes in host memory.
  int64_t offload_host_bytes() const { return optimizer_->host_bytes(); }
  // Offloaded state of a GPU run: the page-locked host buffers that carry the
  // rank's gradient shards down and its parameter shards up.
  int64_t offload_pinned_bytes() const { return optimizer_->link_bytes(); }
  // Offloaded parameters of a LoRA run: the frozen base's file and its resident
  // buffers (0 otherwise).
  int64_t frozen_file_bytes() const { return frozen_ ? frozen_->file_bytes() : 0; }
  int64_t frozen_resident_bytes() const {
    return frozen_ ? frozen_->buffer_bytes() + frozen_->staging_bytes() : 0;
  }
  bool optimizer_offloaded() const { return optimizer_->offloaded(); }
  // hpZ: this rank's secondary partitions, bytes, by where they count: `params` (kParams, the
  // trainable segments), `frozen` (kFrozen, a 16-bit LoRA base), `quantized` (kQuantized, a
  // 4-bit base); all 0 without hpZ.
  struct SecondaryBytes {
    int64_t params = 0, frozen = 0, quantized = 0;
    int64_t total() const { return params + frozen + quantized; }
  };
  SecondaryBytes secondary_partition_bytes() const;
  bool params_offloaded() const { return params_offloaded_; }
  // Resident parameter bytes with offloaded parameters: the staging buffers.
  int64_t params_staging_bytes() const { return optimizer_->params_staging_bytes(); }
  // Resident optimizer state: Adam moments, or the chunk buffers when offloaded.
  int64_t optimizer_state_bytes() const { return optimizer_->state_bytes(); }

 private:
  struct Segment {
    const nn::FlatParamGroup* group;
    int64_t shard;              // S: elements per rank
    Tensor grad_shard;          // the rank's reduced gradient (S elements, compute dtype)
    Tensor master;              // 16-bit models: fp32 master weights (S elements; all for stage 0)
    bool checkpointed = false;  // recompute activations in backward
    bool grad_shard_own;        // a separate buffer (not a view of the full gradient buffer)
    Tensor param_shard;  // stage 3: the rank's persistent parameters (S elements, compute dtype)
    const nn::FlatParamGroup* frozen = nullptr;  // LoRA: the segment's frozen base
    Tensor frozen_shard;                         // stage 3: the rank's part of the frozen base
    int param_pins = 0;                          // stage 3: users of the gathered full parameters
    int deferred_unpins = 0;  // pins held by later segments, dropped after this one's backward
    Tensor secondary;         // hpZ: this rank's 1/L of the gathered parameters
    Tensor frozen_secondary;  // hpZ: the same of the frozen base
    bool secondary_current = false;  // hpZ: secondary holds the parameters as they are now
  };
  struct Pending {
    int segment;
    dist::WorkPtr work;
    Tensor recv;      // where the reduce-scatter wrote
    bool into_shard;  // recv is the grad shard itself (no copy or add needed)
  };

  // How a stage-3 gather is made (ZeRO++).
  enum class Gather {
    kForward,   // as configured (qwZ: codes); hpZ keeps the secondary partition
    kBackward,  // hpZ: from the secondary partition, inside the node, when it is current
    kExact,     // the parameters as they are, no codes (digests, exports, samples)
  };
  void pin_params(int g, Gather how = Gather::kForward);
  // One stage-3 gather of `count` elements per rank from `shard` into `full`: inside the node
  // from `secondary` (kBackward, when current), or as wire codes (qwZ, floating point, not
  // kExact), or plain; then (hpZ, kForward) this rank's part of `full` into `secondary`.
  void gather(const Tensor& shard, const Tensor& full, int64_t count, const Tensor& secondary,
              Gather how, bool from_secondary);
  void unpin_params(int g);
  void ensure_grads(int g);
  void launch_reduce(int g);
  // Completes the oldest reductions beyond zero.reductions_in_flight (none without overlap).
  void complete_beyond_limit();
  // Orders the device after p's reduction, folds it into the shard and frees
  // its buffers; the host waits for it later (drain).
  void complete(Pending& p);
  void drain();
  int64_t begin_of(const Segment& s) const { return int64_t(comm_.rank()) * s.shard; }
  // Device work from now on sees every shard as the last step left it (host offload).
  void settle_params() const;

  dist::Communicator& comm_;
  ZeroConfig config_;
  std::vector<Segment> segments_;
  std::deque<Pending> pending_;
  std::vector<dist::WorkPtr> ordered_;  // completed on the device, not yet waited for by the host
  bool staging_kept_ = false;  // the communicator told the largest reduction (launch_reduce)
  dist::HierarchicalCommunicator* node_ = nullptr;  // comm_ as one, when it is one
  Tensor weight_wire_;  // qwZ: every rank's codes of one gather (kComm, grown to the largest)
  std::unique_ptr<optim::AdamW> optimizer_;
  // Offloaded parameters of a LoRA run under stage 3: the frozen base's
  // partitions, written once, fetched per segment like the adapters'.
  std::unique_ptr<optim::StateStream> frozen_;
  DType dtype_ = DType::kF32;  // the model's compute dtype
  int micro_ = 0;
  bool params_offloaded_ = false;      // stage 3's partitions live in the optimizer's file
  int last_pinned_ = -1;               // the segment gathered last (the direction of prefetches)
  NormCombine norm_combine_;           // empty: over comm_ (set_norm_combine)
  std::vector<double> norm_partials_;  // step()'s per-segment squared norms
  bool norm_split_whole_ = false;      // set_norm_combine's split_whole
  std::vector<double> norm_whole_;     // with it: the whole parameters' squares per segment
};

}  // namespace fd::zero
