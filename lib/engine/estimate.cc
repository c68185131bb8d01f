#include "lib/engine/estimate.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <memory>
#include <set>

#include "lib/autograd/tape.h"
#include "lib/base/check.h"
#include "lib/base/error.h"
#include "lib/dist/counting_communicator.h"
#include "lib/engine/assemble.h"
#include "lib/engine/build_run.h"
#include "lib/engine/checkpointing.h"
#include "lib/engine/preference.h"
#include "lib/engine/process_memory.h"
#include "lib/engine/step.h"
#include "lib/engine/strategy.h"
#include "lib/engine/weights_io.h"
#include "lib/ops/vocab_parallel_cross_entropy.h"
#include "lib/pipe/schedule.h"
#include "lib/tensor/device.h"
#include "lib/tensor/memory.h"
#include "lib/tensor/storage.h"

namespace fd::engine {
namespace {

std::string human(int64_t b) {
  const double d = double(b);
  if (b == 0) return "0";
  if (b < (int64_t(1) << 20)) return fmt::format("{:.1f} KiB", d / 1024.0);
  if (b < (int64_t(1) << 30)) return fmt::format("{:.2f} MiB", d / double(1 << 20));
  return fmt::format("{:.2f} GiB", d / double(1 << 30));
}

// 1234567 -> "1,234,567" (v >= 0).
std::string grouped(int64_t v) {
  const std::string digits = std::to_string(v);
  std::string s;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) s += ',';
    s += digits[i];
  }
  return s;
}

// `text` word-wrapped to `width` columns, the first line after `first`, the others after `rest`.
std::string wrapped(const std::string& text, const std::string& first, const std::string& rest,
                    size_t width) {
  std::string out, cur = first;
  bool line_empty = true;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find(' ', start);
    if (end == std::string::npos) end = text.size();
    const std::string word = text.substr(start, end - start);
    if (!line_empty && cur.size() + 1 + word.size() > width) {
      out += cur + "\n";
      cur = rest;
      line_empty = true;
    }
    cur += (line_empty ? "" : " ") + word;
    line_empty = false;
    start = end + 1;
  }
  return out + cur + "\n";
}

const char* paper_formula(int stage, int c) {
  static const char* const f32[] = {"16Ψ", "8Ψ + 8Ψ/N", "4Ψ + 12Ψ/N", "16Ψ/N"};
  static const char* const f16[] = {"16Ψ", "4Ψ + 12Ψ/N", "2Ψ + 14Ψ/N", "16Ψ/N"};
  return c == 2 ? f16[stage] : f32[stage];
}

// The paper's per-rank model states with c-byte params and grads, fp32 master
// (c = 2; none for c = 4) and Adam m, v: K = 12 (c = 2) or 8 (c = 4).
double paper_bytes(int stage, double psi, double n, int c) {
  const double master_and_adam = c == 2 ? 12.0 : 8.0;
  switch (stage) {
    case 0:
      return (2 * c + master_and_adam) * psi;
    case 1:
      return 2 * c * psi + master_and_adam * psi / n;
    case 2:
      return c * psi + (c + master_and_adam) * psi / n;
    default:
      return (2 * c + master_and_adam) * psi / n;
  }
}

std::string comm_formula(int stage, int accumulation, int c) {
  const char* passes =
      stage == 3 ? (accumulation == 1 ? "3P" : "3aP") : (accumulation == 1 ? "2P" : "(a+1)P");
  return fmt::format("{}(N-1)/N x {} B", passes, c);
}

// One simulated rank of a run on the counting device: what its memory
// accountant and communicator record, the way the trainer measures them
// (peaks counted from the end of setup; see Trainer::setup and ::run).
struct RankRun {
  zero::ModelStateBytes states;
  int64_t frozen = 0, quantized = 0;
  int64_t activations = 0;       // peak over the training step and the evaluation batch
  int64_t eval_peak = 0;         // peak of the evaluation batch alone
  int64_t comm_step = 0;         // kComm peak over the step and evaluation
  int64_t comm_full_gather = 0;  // kComm peak of with_full_parameters (the digest at the end)
  int64_t other = 0;             // token batch and positions
  int64_t comm_bytes = 0;        // bytes sent in the step
  int64_t offload_nvme = 0;      // the optimizer state file (offload), bytes
  int64_t offload_host = 0;      // the optimizer state in host memory (host offload), bytes
  int64_t offload_pinned = 0;    // a GPU run's pinned transfer buffers (offload), bytes
  int64_t hpz_secondary = 0;     // ZeRO++'s secondary partitions, bytes
  int64_t checkpoint = 0;        // an asynchronous save's staging (kCheckpoint), bytes
  int64_t tensors_reserved = 0;  // the CPU caching allocator's peak, simulated (process_memory.h)
  int64_t save_buffers = 0, sample = 0;  // process_memory.h's saves and sample parts
  int64_t padded_params = 0, frozen_padded_params = 0, quantized_bytes = 0, num_params = 0;
  int64_t p2p_bytes = 0;  // a pipeline stage: bytes it sends to its neighbours in the step
  int64_t tp_bytes = 0;   // tensor parallelism: bytes it sends over its tp group in the step
  int64_t sp_bytes = 0;   // Ulysses: bytes it sends over its sp group in the step
  int64_t network_bytes = 0, inter_node_bytes = 0;  // every group's, the step's (family)
  // Activations of the first micro-batch's forward, after each segment that
  // recorded a node (label, bytes), then after the loss.
  std::vector<std::pair<std::string, int64_t>> after_segment;
  int64_t saved = 0;
  std::string peak_at;
  ops::HeadChunkPlan head_plan;  // the step's head + loss (rows 0: this rank holds no head)
};

// Runs segments through the ZeRO engine, noting where the activation peak
// rises: after each segment's forward, and (BackwardObserver) around each
// node of backward, named by the outer tape node (segment or loss) it runs in.
class Watch final : public nn::SegmentRunner, public autograd::BackwardObserver {
 public:
  Watch(zero::ZeroEngine& engine, const Assembly& a, int64_t act0)
      : engine_(engine), a_(a), segments_(nn::decoder_segments(a.model)), act0_(act0) {
    last_peak_ = acct().peak(MemCategory::kActivations);
  }

  autograd::Variable run(int g, const nn::SegmentFn& fn, const autograd::Variable& x,
                         const std::vector<int>& also_needs) override {
    autograd::Variable y = engine_.run(g, fn, x, also_needs);
    const std::string label = segment_label(g);
    name_nodes(autograd::current_tape().size(), label);
    note(label + " forward");
    if (first_forward_)
      after_.emplace_back(label, acct().current(MemCategory::kActivations) - act0_);
    return y;
  }

  // Between the forward and the backward: the loss's nodes on the outer tape.
  void forward_done(const autograd::Tape& tape) {
    name_nodes(tape.size(), "cross-entropy");
    note("cross-entropy forward");
    first_forward_ = false;
  }

  void node_started(const char*, int depth, size_t index) override {
    if (depth == 0) {
      outer_ = index;
      inner_started_ = false;
    } else if (!inner_started_) {
      // What the segment did before its inner tape runs: the ZeRO hooks and,
      // for a checkpointed block, the recomputed forward.
      inner_started_ = true;
      note(owner() + (checkpointed_.count(owner()) ? " backward (recompute)" : " backward"));
    }
  }

  void node_done(const char* name, int depth, size_t) override {
    note(depth == 0 ? owner() + " backward" : fmt::format("{} backward ({})", owner(), name));
  }

  const std::string& peak_at() const { return peak_at_; }
  const std::vector<std::pair<std::string, int64_t>>& after() const { return after_; }

 private:
  static MemoryAccountant& acct() { return MemoryAccountant::global(); }

  std::string segment_label(int g) const {
    const nn::SegmentInfo& s = segments_[size_t(g)];
    if (s.role == nn::SegmentRole::kEmbedding) return "embedding";
    if (s.role == nn::SegmentRole::kHead) return "head";
    const std::string block = fmt::format("block {}", s.block);
    if (std::count(a_.zero.checkpoint_segments.begin(), a_.zero.checkpoint_segments.end(), g))
      checkpointed_.insert(block);
    return block;
  }
  // Nodes [labels_.size(), end) of the outer tape belong to `label`.
  void name_nodes(size_t end, const std::string& label) {
    if (!autograd::grad_enabled()) return;
    while (labels_.size() < end) labels_.push_back(label);
  }
  std::string owner() const { return outer_ < labels_.size() ? labels_[outer_] : "?"; }
  void note(const std::string& where) {
    const int64_t p = acct().peak(MemCategory::kActivations);
    if (p > last_peak_) {
      last_peak_ = p;
      peak_at_ = where;
    }
  }

  zero::ZeroEngine& engine_;
  const Assembly& a_;
  const std::vector<nn::SegmentInfo> segments_;  // the model's, for the labels
  int64_t act0_;
  int64_t last_peak_;
  std::string peak_at_;
  std::vector<std::string> labels_;  // the outer tape's nodes, by index
  mutable std::set<std::string> checkpointed_;
  size_t outer_ = 0;  // backward: the outer node running now
  bool inner_started_ = false;
  bool first_forward_ = true;
  std::vector<std::pair<std::string, int64_t>> after_;
};

// One training step (`accumulation` micro-batches and the optimizer update),
// one evaluation batch and the end-of-run gather of the full parameters, of
// rank `rank` of `a.world` on the counting device, through the trainer's own
// step functions (step.h). The memory accountant is the process's: its peaks
// are reset here.
RankRun run_rank(const Assembly& a, int rank, bool staging, int nodes = 1) {
  MemoryAccountant& acct = MemoryAccountant::global();
  cpu_allocator::simulated::reset();  // a process of its own
  DeviceScope on_meta(Device::meta());
  dist::CountingCommunicator comm(rank, a.world, staging);
  if (nodes > 1) {  // `nodes` hosts of consecutive ranks
    std::vector<int> node_of(static_cast<size_t>(a.world));
    for (int r = 0; r < a.world; ++r) node_of[size_t(r)] = r / (a.world / nodes);
    comm.set_nodes(std::move(node_of));
  }
  // What this process holds already (a test's own tensors) is not the run's:
  // every figure is a peak above this base, as summary.json's are above 0.
  std::array<int64_t, kNumMemCategories> base{};
  for (int c = 0; c < kNumMemCategories; ++c) base[size_t(c)] = acct.current(MemCategory(c));
  auto above_base = [&](MemCategory c) { return acct.peak(c) - base[size_t(c)]; };
  // Built as the trainer builds it (meta tensors: the fill reads nothing):
  // the rank holds the segments its strategy holds, its engine over the
  // strategy's group.
  RunEnv env;
  env.init.seed = a.seed;
  BuiltRun run = build_run(a, comm, env);
  nn::Decoder* model = run.model.get();
  Strategy& strategy = *run.strategy;
  zero::ZeroEngine& engine = *run.engine;
  strategy.sync();  // as the trainer, once set up
  dist::Communicator& model_comm = engine.comm();
  RankRun out;
  out.num_params = model->parameter_count();
  for (const nn::FlatParamGroup* g : model->groups()) out.padded_params += g->numel();
  for (const nn::FlatParamGroup* g : model->frozen_groups())  // a 4-bit segment holds bytes
    (g->dtype() == DType::kU8 ? out.quantized_bytes : out.frozen_padded_params) += g->numel();

  // Preference training: the objective's head, as the trainer installs it (its per-position
  // log-probs and seeds are activations). Its reference costs no parameter memory: under LoRA
  // the base with the adapters off, else computed before the training run is built (or by
  // the training model before its first step) and kept as 16 bytes per pair.
  std::unique_ptr<PreferenceHead> head;
  if (a.objective) {
    head = std::make_unique<PreferenceHead>(*a.objective);
    head->install(*model);
  }

  // As Trainer::setup: peaks count from here (setup's transient blocks go back to the system),
  // then the batch buffers.
  acct.reset_peaks();
  cpu_allocator::simulated::empty_cache();
  Batch batch = make_batch(a, Device::meta());
  if (head) head->register_batch(batch);
  // As Trainer::run: the staging of checkpoints saved behind the step.
  std::unique_ptr<CheckpointStaging> ckpt_staging;
  if (a.async_checkpoints && staged_saves(engine))
    ckpt_staging = std::make_unique<CheckpointStaging>(engine, Device::meta());

  Watch watch(engine, a, base[size_t(MemCategory::kActivations)]);
  autograd::BackwardObserver* previous = autograd::set_backward_observer(&watch);
  struct Restore {
    autograd::BackwardObserver* p;
    ~Restore() { autograd::set_backward_observer(p); }
  } restore{previous};
  model_comm.reset_counters();
  comm.reset_family_counters();
  const int64_t tp_before = strategy.tensor_bytes(), sp_before = strategy.sequence_bytes();
  // The trainer's step (strategy.h), with the watch where the strategy
  // reports micro-batches.
  MicroFns fns;
  fns.load = [&](int, Batch& b) {
    if (head) head->register_batch(b);
    return count_targets(b);
  };
  fns.grad_seed = [](int, int64_t) { return 1.0f; };
  fns.dropout_seed = [](int m) { return uint64_t(m); };
  fns.new_batch = [&] { return make_batch(a, Device::meta()); };
  fns.runner = &watch;
  fns.forwarded = [&](int m, const autograd::Tape& tape, const autograd::Variable& loss) {
    if (m == 0)  // the scalar loss aside
      out.saved = acct.current(MemCategory::kActivations) -
                  base[size_t(MemCategory::kActivations)] - int64_t(loss.value().nbytes());
    watch.forward_done(tape);
  };
  Phases unused;
  PhaseClock no_clock(false, model_comm);
  strategy.train(a.zero.accumulation, fns, batch, no_clock, unused);
  engine.step(a.schedule.peak_lr, 1.0);
  strategy.sync();
  out.p2p_bytes = strategy.p2p_bytes();  // the step's, a tied head's weights' sync included
  out.tp_bytes = strategy.tensor_bytes() - tp_before;
  out.sp_bytes = strategy.sequence_bytes() - sp_before;
  out.comm_bytes = model_comm.bytes_sent();
  out.network_bytes = comm.family_bytes();
  out.inter_node_bytes = comm.family_inter_node_bytes();
  out.offload_nvme = engine.offload_file_bytes() + engine.frozen_file_bytes();
  out.offload_host = engine.offload_host_bytes();
  out.offload_pinned = engine.offload_pinned_bytes();
  out.hpz_secondary = engine.secondary_partition_bytes().total();
  out.peak_at = watch.peak_at();
  out.after_segment = watch.after();
  out.head_plan = model->head_plan();  // the step's, before the evaluation batch's
  // Peaks of each phase: the step, an evaluation batch, and the gather of the
  // full parameters at the end of the run (the weights digest); a run's
  // summary.json 'memory' holds the largest of the three.
  std::array<int64_t, kNumMemCategories> most{};
  auto keep_peaks = [&] {
    for (int c = 0; c < kNumMemCategories; ++c)
      most[size_t(c)] = std::max(most[size_t(c)], above_base(MemCategory(c)));
  };
  keep_peaks();
  const int64_t train_activations = most[size_t(MemCategory::kActivations)];
  out.comm_step = most[size_t(MemCategory::kComm)];
  acct.reset_peaks();
  strategy.eval(batch);
  out.eval_peak = above_base(MemCategory::kActivations);
  if (out.eval_peak > train_activations) out.peak_at = "evaluation";
  out.comm_step = std::max(out.comm_step, above_base(MemCategory::kComm));
  keep_peaks();
  acct.reset_peaks();
  strategy.with_full_model([&](const nn::Decoder& m) { out.sample = sample_bytes(a, m); });
  out.save_buffers = save_buffer_bytes(a, engine);
  out.comm_full_gather = above_base(MemCategory::kComm);
  keep_peaks();
  out.states = {most[size_t(MemCategory::kParams)], most[size_t(MemCategory::kGrads)],
                most[size_t(MemCategory::kMaster)], most[size_t(MemCategory::kOptimizer)]};
  out.frozen = most[size_t(MemCategory::kFrozen)];
  out.quantized = most[size_t(MemCategory::kQuantized)];
  out.activations = most[size_t(MemCategory::kActivations)];
  out.other = most[size_t(MemCategory::kOther)];
  out.checkpoint = most[size_t(MemCategory::kCheckpoint)];
  out.tensors_reserved = int64_t(cpu_allocator::simulated::peak_reserved_bytes());
  return out;
}

}  // namespace

Estimate estimate(const config::Recipe& r, int world, int nodes) {
  FD_CHECK(world >= 1, "world size {}", world);
  if (nodes < 1 || world % nodes != 0)
    usage_error(
        "--nodes {}: the {} rank(s) must split evenly over the nodes (hosts of "
        "world / nodes ranks each); give a divisor of {}",
        nodes, world, world);
  config::check_world_size(r, world);
  const Assembly recipe_assembly = assemble(r, world);
  Estimate e;
  e.model = recipe_assembly.model;
  e.lora = recipe_assembly.lora;
  e.quantize = recipe_assembly.quantize;
  if (r.objective) {
    e.objective = std::string(config::to_string(r.objective->name));
    if (r.objective->name == config::ObjectiveName::kDpo) {
      e.objective += fmt::format(" ({})", config::to_string(r.objective->loss_type));
      e.reference = !r.objective->reference.empty()
                        ? fmt::format(
                              "objective.reference {}: a model of its weights is built, used for "
                              "the reference log-probs and freed before the training model is "
                              "built",
                              r.objective->reference)
                    : e.lora.enabled()
                        ? std::string("the base with the adapters off (the same weights)")
                        : std::string("the initial weights, before the first step");
    }
  }
  e.micro = recipe_assembly.micro;
  e.seq_len = recipe_assembly.seq_len;
  e.accumulation = recipe_assembly.zero.accumulation;
  e.world = world;
  e.nodes = nodes;
  // The process beyond its tensors: the calibrated runtime and the data, opened as training
  // opens it (once: every rank holds the same).
  e.process.ranks_per_host = world / nodes;
  {
    const RuntimeCalibration cal = read_calibration();
    e.process.runtime = cal.at(e.process.ranks_per_host);
    e.process.runtime_problem = cal.problem;
    try {
      e.process.data = measure_data_bytes(r);
    } catch (const std::exception& err) {
      e.process.data_problem = err.what();
    }
    // The figures are the CPU backend's: a GPU run's tensors live on the GPU, and its host
    // process holds the CUDA context, which the calibration (a CPU run) does not measure.
    if (r.device == config::DeviceName::kCuda) {
      e.process.runtime.reset();
      e.process.runtime_problem =
          "device: cuda: the process figure is predicted for CPU runs only (a GPU run's tensors "
          "live on the GPU and its host process holds the CUDA context)";
    }
  }
  e.recipe_stage = recipe_assembly.zero.stage;
  e.async_checkpoints = recipe_assembly.async_checkpoints;
  e.zeropp_weights = r.zero.quantized_weights;
  e.hpz = r.zero.hierarchical_partition;
  if (r.zero.quantized_gradients != config::GradientCodes::kNone)
    e.zeropp_gradients = std::string(config::to_string(r.zero.quantized_gradients));
  e.zeropp = e.zeropp_weights || e.hpz || !e.zeropp_gradients.empty();
  e.precision = r.precision;
  e.compute_bytes = int(dtype_size(recipe_assembly.dtype));
  const std::vector<nn::SegmentInfo> segments = nn::decoder_segments(recipe_assembly.model);
  for (int g : recipe_assembly.zero.checkpoint_segments)
    e.checkpointed.push_back(segments[size_t(g)].block);
  {
    // P at one rank: alignment padding only.
    DeviceScope on_meta(Device::meta());
    config::Recipe r1 = r;
    r1.parallel = config::ParallelOptions{};  // one rank holds the whole model
    const std::unique_ptr<nn::Decoder> one = build_model(assemble(r1, 1), Init::kNone);
    for (const nn::FlatParamGroup* g : one->groups()) e.padded_params_1 += g->numel();
  }
  // 16-bit reductions are staged by the MPI backend (N > 1) only: in fp32, or
  // with zero.reduce_dtype bf16/fp16 as every rank's 16-bit chunk (the
  // engine sets the counting communicator's Sum16 as the trainer's).
  const bool staging = e.compute_bytes == 2 && world > 1;
  for (int s = 0; s < 4; ++s) {
    if (!config::zero_stage_refusal(r.parallel, s).empty()) {  // the layout's refusal
      e.stages[size_t(s)].stage = s;
      e.stages[size_t(s)].refused = true;
      continue;
    }
    config::Recipe rs = r;
    rs.zero.stage = s;
    // Parameter offload and ZeRO++ apply to stage 3 only; the other stages run without them.
    if (s < 3) {
      rs.zero.offload_params.device = config::OffloadDevice::kNone;
      rs.zero.quantized_weights = rs.zero.hierarchical_partition = false;
      rs.zero.quantized_gradients = config::GradientCodes::kNone;
    }
    const Assembly a = assemble(rs, world);
    // Every rank, the largest of each figure (summary.json's 'memory' is the
    // maximum over ranks); the ranks' shards are equal, so they agree.
    RankRun most;
    for (int rank = 0; rank < world; ++rank) {
      const RankRun run = run_rank(a, rank, staging, nodes);
      if (rank == 0) {
        most = run;
        continue;
      }
      most.states.params = std::max(most.states.params, run.states.params);
      most.states.grads = std::max(most.states.grads, run.states.grads);
      most.states.master = std::max(most.states.master, run.states.master);
      most.states.optimizer = std::max(most.states.optimizer, run.states.optimizer);
      most.frozen = std::max(most.frozen, run.frozen);
      most.quantized = std::max(most.quantized, run.quantized);
      most.activations = std::max(most.activations, run.activations);
      most.eval_peak = std::max(most.eval_peak, run.eval_peak);
      if (most.head_plan.rows == 0) most.head_plan = run.head_plan;  // a pipeline's last stage
      most.comm_step = std::max(most.comm_step, run.comm_step);
      most.comm_full_gather = std::max(most.comm_full_gather, run.comm_full_gather);
      most.other = std::max(most.other, run.other);
      most.checkpoint = std::max(most.checkpoint, run.checkpoint);
      most.tensors_reserved = std::max(most.tensors_reserved, run.tensors_reserved);
      most.save_buffers = std::max(most.save_buffers, run.save_buffers);
      most.sample = std::max(most.sample, run.sample);
      most.offload_nvme = std::max(most.offload_nvme, run.offload_nvme);
      most.offload_host = std::max(most.offload_host, run.offload_host);
      most.offload_pinned = std::max(most.offload_pinned, run.offload_pinned);
      most.hpz_secondary = std::max(most.hpz_secondary, run.hpz_secondary);
      most.tp_bytes = std::max(most.tp_bytes, run.tp_bytes);
      most.sp_bytes = std::max(most.sp_bytes, run.sp_bytes);
      most.network_bytes = std::max(most.network_bytes, run.network_bytes);
      most.inter_node_bytes = std::max(most.inter_node_bytes, run.inter_node_bytes);
    }
    StageEstimate& st = e.stages[size_t(s)];
    st.stage = s;
    st.model_states = most.states;
    st.frozen = most.frozen;
    st.quantized = most.quantized;
    st.activations = most.activations;
    st.comm_step = most.comm_step;
    st.comm_staging = staging ? most.comm_step - run_rank(a, 0, false, nodes).comm_step : 0;
    st.comm_full_gather = most.comm_full_gather;
    st.comm_buffers = std::max(st.comm_step, st.comm_full_gather);
    st.other = most.other;
    st.checkpoint_staging = most.checkpoint;
    st.tensors_reserved = most.tensors_reserved;
    st.save_buffers = most.save_buffers;
    st.sample = most.sample;
    st.offload_nvme = most.offload_nvme;
    st.offload_host = most.offload_host;
    st.offload_pinned = most.offload_pinned;
    st.hpz_secondary = most.hpz_secondary;
    st.comm_bytes_per_step = most.comm_bytes;  // rank 0's, as summary.json
    st.tp_bytes_per_step = most.tp_bytes;
    st.sp_bytes_per_step = most.sp_bytes;
    st.network_bytes_per_step = most.network_bytes;
    st.inter_node_bytes_per_step = most.inter_node_bytes;
    if (s != r.zero.stage) continue;
    e.num_params = most.num_params;
    e.padded_params = most.padded_params;
    e.frozen_padded_params = most.frozen_padded_params;
    e.quantized_bytes = most.quantized_bytes;
    e.frozen_params = e.lora.enabled() ? e.model.num_params() : 0;
    ActivationEstimate& act = e.activations;
    act.checkpointed = int(e.checkpointed.size());
    act.saved = most.saved;
    act.peak = most.activations;
    act.peak_at = most.peak_at;
    act.eval_peak = most.eval_peak;
    act.head_on_gpu = r.device == config::DeviceName::kCuda;
    act.head_plan = most.head_plan;
    // What each segment's forward added to the saved set (micro-batch 0), by
    // its role: the embedding, the blocks, then the head and the loss (all
    // that was saved after the segment before it).
    const auto& after = most.after_segment;  // after[g]: segment g, in forward order
    int64_t prev = 0, before_head = 0;
    for (size_t i = 0; i < after.size() && i < segments.size(); ++i) {
      const int64_t added = after[i].second - prev;
      if (segments[i].role == nn::SegmentRole::kHead) before_head = prev;
      prev = after[i].second;
      if (segments[i].role == nn::SegmentRole::kEmbedding) {
        act.embed = added;
      } else if (segments[i].role == nn::SegmentRole::kBlock) {
        const int layer = segments[i].block;
        const bool ckpt =
            std::find(e.checkpointed.begin(), e.checkpointed.end(), layer) != e.checkpointed.end();
        int64_t& slot = ckpt ? act.per_checkpointed_block : act.per_block;
        slot = std::max(slot, added);
      }
    }
    act.head = act.saved - before_head;
  }
  for (StageEstimate& st : e.stages)
    st.paper_bytes = paper_bytes(st.stage, double(e.num_params), double(world), e.compute_bytes);
  // The ranks that hold different parts of the model, at the recipe's ZeRO
  // stage: rank 0's group over the mesh's axes other than dp (the replicas
  // of a part hold the same): a pipeline's stages, in stage order.
  const Assembly& a = recipe_assembly;
  if (const int T = a.mesh.size("tp"); T > 1) {
    Estimate::TensorParallel& t = e.tensor;
    t.size = T;
    t.replicas = a.mesh.size("dp");
    t.kv_replicated = nn::kv_heads_replicated(a.model, T);
    t.sequence_parallel = a.sequence_parallel;
    const double ring = 2.0 * double(T - 1) / double(T), half = ring / 2.0;
    // Each rank's slice of the sequence with Ulysses.
    const double tokens = double(a.micro) * double(a.seq_len) / double(a.mesh.size("sp")),
                 H = double(a.model.hidden_size);
    const double E = e.compute_bytes, act = tokens * H * E;
    // The count of a rank holding L blocks, with or without the embedding and the head (a
    // pipeline stage's part; without a pipeline all of them).
    auto per_micro = [&](double L, bool embed, bool head) {
      const double emb = embed ? 1.0 : 0.0, hd = head ? 1.0 : 0.0;
      if (!t.sequence_parallel)
        return ring * ((4.0 * L + emb) * act + hd * (3.0 * tokens + tokens * H) * 4.0);
      // Norm weights (and biases) of 2L (+ 1: the final) norms, and learned positions,
      // all-reduced.
      double whole = (2.0 * L + hd) * H * (a.model.norm == nn::NormKind::kLayerNorm ? 2.0 : 1.0);
      if (embed && a.model.positions == nn::PositionKind::kLearned)
        whole += double(a.model.max_position_embeddings) * H;
      // 8L per block, the embedding's reduce-scatter (and its all-gather backward when the
      // embedding trains), the head's all-gather (and its reduce-scatter backward).
      const double pairs = 8.0 * L + emb * (a.lora.enabled() ? 1.0 : 2.0) + 2.0 * hd;
      return half * pairs * act + ring * (hd * 3.0 * tokens * 4.0 + whole * E);
    };
    // With a pipeline: the largest of any stage's (as bytes_per_step is the largest rank's).
    const int P = int(a.stage_blocks.size());
    double most = 0.0;
    if (P <= 1) {
      most = per_micro(a.model.num_layers, true, true);
    } else {
      for (int ps = 0; ps < P; ++ps)
        most = std::max(most, per_micro(a.stage_blocks[size_t(ps)], ps == 0, ps == P - 1));
    }
    t.formula_bytes = int64_t(most * a.zero.accumulation + 0.5);
  }
  if (const int S = a.mesh.size("sp"); S > 1) {
    Estimate::SequenceParallel& q = e.sequence;
    const int T = a.mesh.size("tp");
    q.size = S;
    q.replicas = a.mesh.size("dp");
    const int hq = a.model.num_heads / T;
    const int hkv = nn::kv_heads_replicated(a.model, T) ? 1 : a.model.num_kv_heads / T;
    q.kv_gathered = hkv % S != 0;
    const double per = double(a.micro) * double(a.seq_len) / S * a.model.head_dim * e.compute_bytes;
    const double frac = double(S - 1) / S;
    const double qo = 2.0 * frac * per * hq;  // q in, the output back
    const double kv = 2.0 * (q.kv_gathered ? (S - 1) * per * hkv : frac * per * hkv);
    // With a pipeline: the stage of the most blocks (as bytes_per_step is the largest rank's).
    const int L = a.stage_blocks.size() > 1
                      ? *std::max_element(a.stage_blocks.begin(), a.stage_blocks.end())
                      : a.model.num_layers;
    q.formula_bytes = int64_t(2.0 * L * (qo + kv) * a.zero.accumulation + 0.5);
  }
  const std::vector<int> parts = a.mesh.group_ranks(0, {"pp"});
  if (parts.size() > 1) {
    Estimate::Pipeline& p = e.pipeline;
    p.stages = int(parts.size());
    p.replicas = a.mesh.size("dp");
    p.micro_batches = a.zero.accumulation;
    p.schedule = std::string(pipe::to_string(a.pipeline_schedule));
    p.blocks = a.stage_blocks;
    p.bubble_fraction = pipe::bubble_fraction(a.stages, a.zero.accumulation);
    for (int ps = 0; ps < p.stages; ++ps) {
      const RankRun run = run_rank(a, parts[size_t(ps)], staging, nodes);
      StageEstimate st;
      st.stage = ps;
      st.model_states = run.states;
      st.frozen = run.frozen;
      st.quantized = run.quantized;
      st.activations = run.activations;
      st.comm_step = run.comm_step;
      st.comm_full_gather = run.comm_full_gather;
      st.comm_buffers = std::max(run.comm_step, run.comm_full_gather);
      st.other = run.other;
      st.checkpoint_staging = run.checkpoint;
      st.tensors_reserved = run.tensors_reserved;
      st.save_buffers = run.save_buffers;
      st.sample = run.sample;
      st.comm_bytes_per_step = run.comm_bytes;
      st.p2p_bytes_per_step = run.p2p_bytes;
      st.tp_bytes_per_step = run.tp_bytes;
      st.sp_bytes_per_step = run.sp_bytes;
      p.per_stage.push_back(st);
    }
  }
  return e;
}

std::vector<std::string> estimate_assumptions(const Estimate& e) {
  const bool mixed = e.compute_bytes == 2;
  const std::string prec(config::to_string(e.precision));
  std::string ckpt = "no activation checkpointing";
  if (!e.checkpointed.empty()) {
    std::string list;
    for (int l : e.checkpointed) list += (list.empty() ? "" : ", ") + std::to_string(l);
    ckpt = fmt::format(
        "blocks [{}] checkpointed: forward keeps only their output (their input is the previous "
        "segment's output); their backward recomputes the block's forward with recording, so its "
        "saved set, its recomputed output and the output gradient held by the segment's node are "
        "alive again for that block's backward",
        list);
  }
  std::vector<std::string> a = {
      mixed ? fmt::format("Precision {}: parameters, gradients and activations in 16 bits (c = 2 "
                          "bytes); AdamW updates fp32 master weights (4 bytes) and m, v (8 bytes) "
                          "for what the rank updates (everything at stage 0, its 1/N shard "
                          "otherwise); with P = Ψ these are the paper's mixed-precision figures.",
                          prec)
            : "Precision fp32: the (sharded) parameters are the master weights (master = 0); Adam "
              "keeps m and v (8 bytes per parameter).",
      fmt::format("Padding: every parameter starts on a {}-element boundary and each segment is "
                  "padded to a multiple of {} x N elements, so that it splits into N equal "
                  "shards; model states are counted on P (padded), not on Ψ.",
                  nn::FlatParamGroup::kAlignElems, nn::FlatParamGroup::kAlignElems),
      "Model states (params, grads, master, optimizer) are what a run of this recipe measures "
      "in summary.json 'memory', to the byte.",
      fmt::format(
          "Activations: what the ops allocate at micro batch B = {} and sequence T = {}, "
          "counted by running the step on the counting device: the tensors saved for backward, "
          "the gradients and scratch alive at the highest point of backward{}; one micro-batch "
          "at a time (accumulation does not add); {}. Nothing describes the model a second "
          "time: the estimate is the run (tests/engine/estimate_test.cc compares it with "
          "measured steps).",
          e.micro, e.seq_len,
          mixed ? ", in 16 bits except the fp32 statistics (mean, rstd, logsumexp), the i32 ids "
                  "and the fp32 copies every op makes of its 16-bit inputs and outputs while it "
                  "runs"
                : "",
          ckpt),
      fmt::format(
          "Comm buffers: stage 3's gathered full segments (the current one, and the embedding "
          "kept from the tied head's forward to its own backward) and stages 2-3's full-gradient "
          "buckets (at most 2 reduce-scatters in flight plus the one being launched), plus "
          "reduce-scatter outputs that are not the gradient shard itself (stages 0-1, and every "
          "micro-batch after the first){}; for stage 3 at least the full parameters (cP), "
          "which the end of a run gathers once for the weights digest (and the sample).",
          mixed && e.world > 1
              ? "; in 16 bits, plus the fp32 copies (input and shard, 4 bytes an element) of the "
                "one reduce-scatter the MPI comm thread runs at a time, counted at the worst "
                "moment: when the comm thread stages it is timing-dependent, so a run measures "
                "this much or less"
              : ""),
      "Not counted: setup's transient buffers (a tensor being read from model.init_from and "
      "converted; under stage 3 each rank reads or draws only its shard, so setup holds no "
      "more parameters than the run; summary.json's peaks start after setup), the optional sample "
      "at the end, the BLAS "
      "library's own buffers and the MPI library's memory. An evaluation batch (no grad) is run "
      "too; its peak is below training's.",
      "Total = the sum of the per-category peaks, an upper bound of the simultaneous peak.",
      fmt::format(
          "Communication per step and rank, ring model (what summary.json 'comm_bytes_per_step' "
          "counts, {} bytes an element{}): stages 0-2 reduce-scatter the gradients each "
          "micro-batch and all-gather once (gradients for stage 0, parameters for 1-2); stage 3 "
          "all-gathers each segment for its forward and again for its backward and "
          "reduce-scatters its gradient, every micro-batch.",
          e.compute_bytes,
          mixed ? "; the MPI reduce-scatter itself moves its 16-bit values as fp32, so on the "
                  "wire the reductions carry twice the bytes counted"
                : ""),
  };
  if (e.lora.enabled())
    a.push_back(
        "LoRA: Ψ and P count the trainable adapters only (their model states as above); the "
        "frozen base (no gradients, no optimizer state) is cP_base per rank at stages 0-2 and "
        "cP_base/N at stage 3, where it is gathered with each segment's adapters for its forward "
        "(the embedding again for the tied head) and its backward (none for the embedding, which "
        "records nothing): stage 3 sends 3P + 2P_base elements per micro-batch; activations "
        "hold the adapter path (dropout, x A^T, (.) B^T, scale, add) and what the frozen ops "
        "keep once a gradient flows, as the step on the counting device allocates them.");
  if (e.zeropp)
    a.push_back(fmt::format(
        "ZeRO++ at stage 3 (stages 0-2 are shown without it){}{}{}.",
        e.zeropp_weights ? "; qwZ: parameters gathered as int8 codes, blocks of 256 with an fp32 "
                           "scale each (1 + 4/256 bytes an element)"
                         : "",
        e.hpz ? "; hpZ: each rank keeps 1/L of every gathered segment (L ranks per host; "
                "'hpZ secondary partitions', counted in 'params' and, for a LoRA base, in "
                "'frozen' or '4-bit base') and backward gathers inside the host"
              : "",
        e.zeropp_gradients.empty()
            ? std::string()
            : fmt::format("; qgZ: gradients reduced as {} codes through an all-to-all inside "
                          "each host, then one across hosts",
                          e.zeropp_gradients)));
  if (e.stages[0].offload_host > 0)
    a.push_back(
        "Offload (zero.offload_optimizer host, GPU runs): the fp32 master weights and Adam m, v "
        "live in host memory ('state in host memory', counted in 'optimizer' as summary.json "
        "counts it) and AdamW runs on the CPU; the GPU holds the parameters and gradients.");
  if (e.stages[0].offload_pinned > 0)
    a.push_back(
        "Offload on a GPU: two page-locked host buffers the size of the rank's shards ('pinned "
        "transfer buffers', 2cP/N, in 'optimizer') receive each gradient shard as its "
        "reduce-scatter completes, while backward goes on, and send each parameter shard back "
        "as soon as the CPU has updated it.");
  if (e.stages[0].offload_nvme > 0)
    a.push_back(fmt::format(
        "Offload (zero.offload_optimizer nvme): the {} and Adam m, v live in one file per rank "
        "('on NVMe': a 4 KiB header and the state, chunk by chunk, each field padded to 4 KiB); "
        "resident are three chunk buffers ('optimizer (buffers)', within "
        "zero.offload_optimizer.buffer_mib, never more than the largest shard needs), through "
        "which each step reads, updates and writes the state.",
        mixed ? "fp32 master weights" : "(no master weights in fp32: the parameters are)"));
  return a;
}

namespace {
nlohmann::ordered_json optional_json(const std::optional<int64_t>& v) {
  return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(nullptr);
}
}  // namespace

std::string format_estimate(const Estimate& e) {
  std::string out;
  auto line = [&](const std::string& s) { out += s + "\n"; };
  const nn::DecoderConfig& m = e.model;
  line(fmt::format("fdtrain estimate{}: bytes per rank at world size N = {}",
                   e.recipe_path.empty() ? "" : " for " + e.recipe_path, e.world));
  line(fmt::format("model: {}; micro batch {} x {} tokens, accumulation {}; precision {}{}",
                   m.summary(), e.micro, e.seq_len, e.accumulation, config::to_string(e.precision),
                   e.checkpointed.empty() ? ""
                                          : fmt::format("; {} of {} blocks checkpointed",
                                                        e.checkpointed.size(), m.num_layers)));
  line(fmt::format(
      "Ψ = {} parameters; P = {} padded at N = {} (+{}: +{} aligning each parameter "
      "to 16 elements, +{} splitting segments into {} shard{})",
      grouped(e.num_params), grouped(e.padded_params), e.world,
      grouped(e.padded_params - e.num_params), grouped(e.padded_params_1 - e.num_params),
      grouped(e.padded_params - e.padded_params_1), e.world, e.world == 1 ? "" : "s"));
  if (e.lora.enabled()) {
    const StageEstimate& rs = e.stages[size_t(e.recipe_stage)];
    line(
        fmt::format("LoRA r = {} alpha = {} dropout = {} on [{}]: Ψ, P above are the trainable "
                    "adapters; the frozen base has Ψ_base = {}, P_base = {} (no gradients, no "
                    "optimizer state; replicated at stages 0-2, sharded at stage 3)",
                    e.lora.r, e.lora.alpha, e.lora.dropout, fmt::join(e.lora.modules, ", "),
                    grouped(e.frozen_params), grouped(e.frozen_padded_params)));
    if (e.quantize)
      line(fmt::format(
          "model.quantize {} block {}{}: the blocks' base is {} in 4 bits (P_base above is the "
          "embedding and final segments, kept in {}){}",
          quant::quant_type_name(e.quantize->type), e.quantize->block_size,
          e.quantize->double_quant ? ", double quant" : "", human(e.quantized_bytes),
          config::to_string(e.precision),
          e.tensor.size > 1 ? "; each tensor-parallel slice holds the whole weight's blocks "
                              "with their absmax in fp32 (docs/QUANTIZATION.md)"
                            : ""));
    line(fmt::format("at stage {}: frozen base: {}; trainable (adapters) states: {}",
                     e.recipe_stage, human(rs.frozen + rs.quantized),
                     human(rs.model_states.total())));
  }
  if (!e.objective.empty())
    line(fmt::format("objective {}{}", e.objective,
                     e.reference.empty()
                         ? std::string(": no reference model")
                         : fmt::format("; reference: {}: no parameter memory (its log-probs are "
                                       "computed once and kept, 16 bytes per pair)",
                                       e.reference)));
  line("");
  const int w0 = 26, w = 14;
  auto row = [&](const std::string& label, auto cell) {
    std::string s = fmt::format("{:<{}}", label, w0);
    for (const StageEstimate& st : e.stages)
      s += fmt::format("{:>{}}", st.refused && !label.empty() ? std::string("-") : cell(st), w);
    line(s);
  };
  row("", [&](const StageEstimate& st) {
    return fmt::format("{}stage {}", st.stage == e.recipe_stage ? "*" : "", st.stage);
  });
  row("params", [](const StageEstimate& s) { return human(s.model_states.params); });
  row("grads", [](const StageEstimate& s) { return human(s.model_states.grads); });
  row("master", [](const StageEstimate& s) { return human(s.model_states.master); });
  const bool offload = e.stages[0].offload_nvme > 0;
  const bool host = e.stages[0].offload_host > 0;
  row(offload ? "optimizer (buffers)"
      : host  ? "optimizer (master, m, v)"
              : "optimizer (Adam m+v)",
      [](const StageEstimate& s) { return human(s.model_states.optimizer); });
  if (host)
    row("  state in host memory", [](const StageEstimate& s) { return human(s.offload_host); });
  if (e.stages[0].offload_pinned > 0)
    row("  pinned transfer buffers",
        [](const StageEstimate& s) { return human(s.offload_pinned); });
  if (e.stages[3].hpz_secondary > 0)
    row("  hpZ secondary partitions",
        [](const StageEstimate& s) { return human(s.hpz_secondary); });
  row(e.lora.enabled() ? "= trainable states" : "= model states",
      [](const StageEstimate& s) { return human(s.model_states.total()); });
  if (e.lora.enabled()) row("frozen base", [](const StageEstimate& s) { return human(s.frozen); });
  if (e.quantize)
    row("4-bit base + scratch", [](const StageEstimate& s) { return human(s.quantized); });
  row("activations", [](const StageEstimate& s) { return human(s.activations); });
  row("comm buffers", [](const StageEstimate& s) { return human(s.comm_buffers); });
  row("other (token batch)", [](const StageEstimate& s) { return human(s.other); });
  if (e.async_checkpoints)
    row("checkpoint staging", [](const StageEstimate& s) { return human(s.checkpoint_staging); });
  row("total", [](const StageEstimate& s) { return human(s.total()); });
  // The process (process_memory.h): what the rank's resident memory peaks at.
  {
    const Estimate::Process& p = e.process;
    row(fmt::format("process: runtime ({}/host)", p.ranks_per_host),
        [&](const StageEstimate&) { return p.runtime ? human(*p.runtime) : std::string("?"); });
    row("  data", [&](const StageEstimate&) { return p.data ? human(*p.data) : std::string("?"); });
    row("  tensors (allocator)", [](const StageEstimate& s) { return human(s.tensors_reserved); });
    row("  save buffers", [](const StageEstimate& s) { return human(s.save_buffers); });
    row("  sample (decoder)", [](const StageEstimate& s) { return human(s.sample); });
    row("= peak RSS (predicted)", [&](const StageEstimate& s) {
      const std::optional<int64_t> v = p.predicted(s);
      return v ? human(*v) : std::string("?");
    });
    if (!p.runtime) line("  runtime unknown: " + p.runtime_problem);
    if (!p.data) line("  data not measured: " + p.data_problem);
  }
  if (offload)
    row("on NVMe (state file)", [](const StageEstimate& s) { return human(s.offload_nvme); });
  line("");
  const int c = e.compute_bytes;
  row(c == 2 ? "paper, mixed precision" : "paper, fp32",
      [&](const StageEstimate& s) { return std::string(paper_formula(s.stage, c)); });
  row("  at Ψ", [](const StageEstimate& s) { return human(int64_t(s.paper_bytes + 0.5)); });
  row("comm per step", [](const StageEstimate& s) { return human(s.comm_bytes_per_step); });
  line(fmt::format("{:<{}}stages 0-2: {}; stage 3: {}", "", w0, comm_formula(0, e.accumulation, c),
                   comm_formula(3, e.accumulation, c)));
  if (e.nodes > 1) {
    row("network per step", [](const StageEstimate& s) { return human(s.network_bytes_per_step); });
    row("  inside a node", [](const StageEstimate& s) {
      return human(s.network_bytes_per_step - s.inter_node_bytes_per_step);
    });
    row("  across nodes",
        [](const StageEstimate& s) { return human(s.inter_node_bytes_per_step); });
    line(fmt::format(
        "{:<{}}--nodes {}: {} hosts of {} consecutive ranks; every group's traffic of the rank "
        "that sends the most, ring model: a ring collective's bytes go to the next rank of its "
        "group, across when that rank is on another host",
        "", w0, e.nodes, e.nodes, e.world / e.nodes));
  }
  line(fmt::format("(* the recipe's stage, zero.stage = {}{})", e.recipe_stage,
                   e.stages[3].refused ? "; stage 3 is refused with a pipeline" : ""));
  line("");
  if (e.sequence.size > 1) {
    const Estimate::SequenceParallel& q = e.sequence;
    line(fmt::format(
        "Ulysses sequence parallel: {} ranks per sequence x {} data-parallel replica{} (ZeRO over "
        "the {} ranks holding the same weights); each rank computes {} of every {}-token "
        "sequence, attention the whole sequence for 1/{} of the heads{}",
        q.size, q.replicas, q.replicas == 1 ? "" : "s", q.size * q.replicas, e.seq_len / q.size,
        e.seq_len, q.size,
        q.kv_gathered ? " (key/value heads fewer than the ranks: gathered whole)" : ""));
    line(fmt::format(
        "sequence-parallel traffic per step: {} per rank over its sp group, counted (DeepSpeed-"
        "Ulysses: per block 4 all-to-alls forward (q, k, v, output) and 4 backward of B x T/S "
        "x heads x head_dim{}: {})",
        human(e.stages[size_t(e.recipe_stage)].sp_bytes_per_step),
        e.pipeline.stages > 1 ? "; with a pipeline the largest of any stage's, L its blocks" : "",
        human(q.formula_bytes)));
    line("");
  }
  if (e.tensor.size > 1) {
    const Estimate::TensorParallel& t = e.tensor;
    const nn::DecoderConfig& m = e.model;
    const ops::VocabRange rows = ops::vocab_shard_range(m.vocab_size, 0, t.size);
    line(fmt::format(
        "tensor parallel: {} ranks per layer{} x {} data-parallel replica{} (ZeRO over the {} "
        "replica{} holding the same slices); per rank {} of {} query heads, {}, {} of the "
        "MLP's {} features, {} of {} vocabulary rows (the first {} ranks one more); norms "
        "whole on every rank (the columns above are per rank)",
        t.size,
        t.sequence_parallel ? " with sequence parallelism (norm regions 1/T of the sequence)" : "",
        t.replicas, t.replicas == 1 ? "" : "s", t.replicas, t.replicas == 1 ? "" : "s",
        m.num_heads / t.size, m.num_heads,
        t.kv_replicated
            ? fmt::format("all {} key/value heads (fewer than the ranks: replicated, each rank "
                          "attending with the one its query heads share)",
                          m.num_kv_heads)
            : fmt::format("{} of {} key/value heads", m.num_kv_heads / t.size, m.num_kv_heads),
        m.intermediate_size / t.size, m.intermediate_size, rows.count, m.vocab_size,
        m.vocab_size % t.size));
    line(fmt::format(
        "tensor-parallel traffic per step: {} per rank over its tp group{}, counted (Megatron-LM: "
        "{}: {}{})",
        human(e.stages[size_t(e.recipe_stage)].tp_bytes_per_step),
        e.pipeline.stages > 1 ? " (the largest of any pipeline stage's; L its blocks, the "
                                "embedding's term the first stage's, the loss's the last's)"
                              : "",
        t.sequence_parallel
            ? "per micro-batch 8L + 4 reduce-scatters or all-gathers of B x T x H (8L + 3 when "
              "the embedding is frozen), the loss's statistics and the norms' gradients"
            : "per micro-batch (4L + 1) all-reduces of B x T x H, and the loss's statistics and "
              "dh",
        human(t.formula_bytes),
        t.kv_replicated || e.lora.enabled() || m.o_proj_bias || m.mlp_bias
            ? "; the count adds the gradients of whole parameters used in part on each rank: "
              "replicated k/v projections, q/k norms, a split linear's whole LoRA factor, "
              "row-parallel biases"
            : ""));
    line("");
  }
  if (e.pipeline.stages > 1) {
    const Estimate::Pipeline& p = e.pipeline;
    line(fmt::format(
        "pipeline: {} stages x {} data-parallel replica{}{}{} (N = {} ranks), {} schedule, {} "
        "micro-batches per step; bubble (P-1)/(M+P-1) = {:.1f}%; per pipeline stage at ZeRO "
        "stage {} (the columns above are the largest of any stage):",
        p.stages, p.replicas, p.replicas == 1 ? "" : "s",
        e.sequence.size > 1 ? fmt::format(" x {} sequence-parallel ranks", e.sequence.size) : "",
        e.tensor.size > 1 ? fmt::format(" x {} tensor-parallel ranks", e.tensor.size) : "", e.world,
        p.schedule, p.micro_batches, 100.0 * p.bubble_fraction, e.recipe_stage));
    std::string head = fmt::format("{:<{}}", "", w0);
    for (const StageEstimate& st : p.per_stage)
      head += fmt::format("{:>{}}", fmt::format("pipe {}", st.stage), w);
    line(head);
    auto prow = [&](const std::string& label, auto cell) {
      std::string s = fmt::format("{:<{}}", label, w0);
      for (const StageEstimate& st : p.per_stage) s += fmt::format("{:>{}}", cell(st), w);
      line(s);
    };
    prow("blocks",
         [&](const StageEstimate& st) { return std::to_string(p.blocks[size_t(st.stage)]); });
    prow("model states", [](const StageEstimate& st) { return human(st.model_states.total()); });
    if (e.lora.enabled())
      prow("frozen base", [](const StageEstimate& st) { return human(st.frozen); });
    if (e.quantize)
      prow("4-bit base + scratch", [](const StageEstimate& st) { return human(st.quantized); });
    prow("activations", [](const StageEstimate& st) { return human(st.activations); });
    prow("comm buffers", [](const StageEstimate& st) { return human(st.comm_buffers); });
    prow("total", [](const StageEstimate& st) { return human(st.total()); });
    prow("sent to neighbours/step",
         [](const StageEstimate& st) { return human(st.p2p_bytes_per_step); });
    prow("data-parallel/step",
         [](const StageEstimate& st) { return human(st.comm_bytes_per_step); });
    if (e.tensor.size > 1)
      prow("tensor-parallel/step",
           [](const StageEstimate& st) { return human(st.tp_bytes_per_step); });
    if (e.sequence.size > 1)
      prow("sequence-parallel/step",
           [](const StageEstimate& st) { return human(st.sp_bytes_per_step); });
    line("");
  }
  if (c == 2) {
    line(fmt::format("Model states per rank, {} (P padded parameters, N ranks, a = accumulation):",
                     config::to_string(e.precision)));
    line("  stage 0: params 2P + grads 2P + master 4P + Adam 8P      = 16P");
    line("  stage 1: params 2P + grads 2P + (master + Adam) 12P/N    = 4P + 12P/N");
    line("  stage 2: params 2P + grad shard 2P/N + 12P/N             = 2P + 14P/N");
    line("  stage 3: param shard 2P/N + grad shard 2P/N + 12P/N      = 16P/N");
    line("  stages 0-1 with a > 1 add a 2P/N gradient accumulator; with P = Ψ and a = 1 these are");
    line("  the paper's mixed-precision figures.");
  } else {
    line("Model states per rank, fp32 (P padded parameters, N ranks, a = accumulation):");
    line("  stage 0: params 4P + grads 4P + Adam 8P            = 16P");
    line("  stage 1: params 4P + grads 4P + Adam 8P/N          = 8P + 8P/N");
    line("  stage 2: params 4P + grad shard 4P/N + Adam 8P/N   = 4P + 12P/N");
    line("  stage 3: param shard 4P/N + grad 4P/N + Adam 8P/N  = 16P/N");
    line("  stages 0-1 with a > 1 add a 4P/N gradient accumulator; with P = Ψ and a = 1 these are");
    line("  the paper's fp32 figures (its mixed-precision ones, 16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N and");
    line("  16Ψ/N, apply with precision bf16 or fp16).");
  }
  if (e.pipeline.stages > 1) {
    out +=
        wrapped(fmt::format("Activations (pipeline): per stage in the table above, the peak of its "
                            "program: {} holds the activations of at most {} micro-batches at once "
                            "on the first stage (1F1B: min(P - s, M) on stage s; GPipe: all M).",
                            e.pipeline.schedule,
                            e.pipeline.schedule == "gpipe"
                                ? e.pipeline.micro_batches
                                : std::min(e.pipeline.stages, e.pipeline.micro_batches)),
                "", "  ", 96);
  } else if (e.lora.enabled()) {
    out += wrapped(
        fmt::format("Activations (LoRA: the frozen base saves only what a gradient "
                    "flowing to an adapter needs): {} saved at the end of forward; "
                    "peak {} at {}.",
                    human(e.activations.saved), human(e.activations.peak), e.activations.peak_at),
        "", "  ", 96);
  } else {
    const int plain = m.num_layers - e.activations.checkpointed;
    std::string blocks;
    if (plain > 0) blocks = fmt::format("{} per block x {}", human(e.activations.per_block), plain);
    if (e.activations.checkpointed > 0)
      blocks +=
          fmt::format("{}{} per checkpointed block x {}", blocks.empty() ? "" : " + ",
                      human(e.activations.per_checkpointed_block), e.activations.checkpointed);
    out += wrapped(
        fmt::format("Activations: {} + embedding {} + head {} = {} saved at the end of "
                    "forward; peak {} at {}.",
                    blocks, human(e.activations.embed), human(e.activations.head),
                    human(e.activations.saved), human(e.activations.peak), e.activations.peak_at),
        "", "  ", 96);
  }
  if (const ops::HeadChunkPlan& h = e.activations.head_plan; h.rows > 0) {
    const std::string budget = fmt::format(
        "budget {}: 16 x hidden x layers x rows fp32 words, about what the blocks keep without "
        "checkpointing, at least {}",
        human(h.budget_bytes), human(ops::kHeadMinBudgetBytes));
    const char* kept = e.activations.head_on_gpu
                           ? "kept in the compute dtype and turned into the gradient in place"
                           : "kept as the softmax";
    out += wrapped(
        h.one_chunk()
            ? fmt::format("Head + loss: {} rows x {} logits in one chunk ({} as fp32 logits; {}), "
                          "{} for the backward (no second logits GEMM; dW over every row).",
                          h.rows, h.vocab, human(h.logits_bytes), budget, kept)
            : fmt::format("Head + loss: {} rows x {} logits in {} chunks of {} rows ({} of fp32 "
                          "logits each; {}), each chunk's logits recomputed in backward.",
                          h.rows, h.vocab, h.chunks, h.chunk_rows, human(h.logits_bytes), budget),
        "", "  ", 96);
  }
  line("");
  line("Assumptions:");
  for (const std::string& a : estimate_assumptions(e)) out += wrapped(a, "  - ", "    ", 96);
  return out;
}

nlohmann::ordered_json head_plan_json(const ops::HeadChunkPlan& h) {
  if (h.rows == 0) return nullptr;
  return {{"rows", h.rows},
          {"vocab", h.vocab},
          {"chunk_rows", h.chunk_rows},
          {"chunks", h.chunks},
          {"logits_bytes", h.logits_bytes},
          {"budget_bytes", h.budget_bytes},
          {"kept", h.one_chunk()}};
}

nlohmann::ordered_json estimate_json(const Estimate& e) {
  nlohmann::ordered_json j;
  j["recipe"] = e.recipe_path;
  j["world_size"] = e.world;
  j["nodes"] = e.nodes;
  j["recipe_stage"] = e.recipe_stage;
  if (e.zeropp)
    j["zeropp"] = {
        {"quantized_weights", e.zeropp_weights},
        {"hierarchical_partition", e.hpz},
        {"quantized_gradients", e.zeropp_gradients.empty() ? "none" : e.zeropp_gradients}};
  j["precision"] = std::string(config::to_string(e.precision));
  j["compute_bytes"] = e.compute_bytes;
  j["checkpointed_layers"] = e.checkpointed;
  const nn::DecoderConfig& m = e.model;
  j["model"] = {{"family", nn::family_name(m.family)},
                {"n_layer", m.num_layers},
                {"n_head", m.num_heads},
                {"n_kv_head", m.num_kv_heads},
                {"head_dim", m.head_dim},
                {"d_model", m.hidden_size},
                {"intermediate_size", m.intermediate_size},
                {"vocab_size", m.vocab_size},
                {"max_seq_len", m.max_position_embeddings},
                {"tied_head", m.tie_word_embeddings}};
  j["micro"] = e.micro;
  j["seq_len"] = e.seq_len;
  j["accumulation"] = e.accumulation;
  j["num_params"] = e.num_params;
  j["padded_params"] = e.padded_params;
  j["padding"] = e.padded_params - e.num_params;
  j["alignment_padding"] = e.padded_params_1 - e.num_params;
  j["world_padding"] = e.padded_params - e.padded_params_1;
  if (e.lora.enabled()) {
    j["lora"] = {{"r", e.lora.r},
                 {"alpha", e.lora.alpha},
                 {"dropout", e.lora.dropout},
                 {"modules", e.lora.modules},
                 {"layers", e.lora.layers},
                 {"trainable_params", e.num_params},
                 {"trainable_padded_params", e.padded_params},
                 {"frozen_params", e.frozen_params},
                 {"frozen_padded_params", e.frozen_padded_params}};
  }
  if (!e.objective.empty())
    j["objective"] = {
        {"name", e.objective},
        {"reference", e.reference.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.reference)},
        {"reference_param_bytes", 0}};
  if (e.quantize) {
    j["quantize"] = {{"type", quant::quant_type_name(e.quantize->type)},
                     {"block_size", e.quantize->block_size},
                     {"double_quant", e.quantize->double_quant},
                     {"quantized_bytes", e.quantized_bytes}};
  }
  j["activations"] = {{"per_block", e.activations.per_block},
                      {"per_checkpointed_block", e.activations.per_checkpointed_block},
                      {"checkpointed", e.activations.checkpointed},
                      {"embed", e.activations.embed},
                      {"head", e.activations.head},
                      {"saved", e.activations.saved},
                      {"peak", e.activations.peak},
                      {"peak_at", e.activations.peak_at},
                      {"eval_peak", e.activations.eval_peak}};
  if (e.activations.head_plan.rows > 0) j["head_plan"] = head_plan_json(e.activations.head_plan);
  // The per-rank memory figures both tables give, in this order.
  auto memory = [](nlohmann::ordered_json& o, const StageEstimate& s) {
    o["params"] = s.model_states.params;
    o["grads"] = s.model_states.grads;
    o["master"] = s.model_states.master;
    o["optimizer"] = s.model_states.optimizer;
    o["model_states"] = s.model_states.total();
    o["frozen"] = s.frozen;
    o["quantized"] = s.quantized;
    o["activations"] = s.activations;
    o["comm_buffers"] = s.comm_buffers;
  };
  nlohmann::ordered_json stages = nlohmann::ordered_json::array();
  for (const StageEstimate& s : e.stages) {
    nlohmann::ordered_json o;
    o["stage"] = s.stage;
    if (s.refused) {  // ZeRO-3 with a pipeline
      o["refused"] = true;
      stages.push_back(o);
      continue;
    }
    memory(o, s);
    o["comm_step"] = s.comm_step;
    o["comm_staging"] = s.comm_staging;
    o["comm_full_gather"] = s.comm_full_gather;
    o["other"] = s.other;
    o["checkpoint_staging"] = s.checkpoint_staging;
    o["total"] = s.total();
    o["tensors_reserved"] = s.tensors_reserved;
    o["save_buffers"] = s.save_buffers;
    o["sample_decoder"] = s.sample;
    o["predicted_peak_rss"] = optional_json(e.process.predicted(s));
    o["offload_nvme"] = s.offload_nvme;
    o["offload_host"] = s.offload_host;
    o["offload_pinned"] = s.offload_pinned;
    o["hpz_secondary"] = s.hpz_secondary;
    o["paper_formula"] = paper_formula(s.stage, e.compute_bytes);
    o["paper_bytes"] = s.paper_bytes;
    o["comm_bytes_per_step"] = s.comm_bytes_per_step;
    o["comm_formula"] = comm_formula(s.stage, e.accumulation, e.compute_bytes);
    o["network_bytes_per_step"] = s.network_bytes_per_step;
    o["inter_node_bytes_per_step"] = s.inter_node_bytes_per_step;
    stages.push_back(o);
  }
  j["stages"] = stages;
  j["process"] = {{"ranks_per_host", e.process.ranks_per_host},
                  {"runtime_bytes", optional_json(e.process.runtime)},
                  {"runtime_problem", e.process.runtime_problem},
                  {"data_bytes", optional_json(e.process.data)},
                  {"data_problem", e.process.data_problem}};
  if (e.pipeline.stages > 1) {
    const Estimate::Pipeline& p = e.pipeline;
    nlohmann::ordered_json per = nlohmann::ordered_json::array();
    for (const StageEstimate& s : p.per_stage) {
      nlohmann::ordered_json o;
      o["stage"] = s.stage;
      o["blocks"] = p.blocks[size_t(s.stage)];
      memory(o, s);
      o["other"] = s.other;
      o["checkpoint_staging"] = s.checkpoint_staging;
      o["total"] = s.total();
      o["tensors_reserved"] = s.tensors_reserved;
      o["save_buffers"] = s.save_buffers;
      o["sample_decoder"] = s.sample;
      o["predicted_peak_rss"] = optional_json(e.process.predicted(s));
      o["p2p_bytes_per_step"] = s.p2p_bytes_per_step;
      o["comm_bytes_per_step"] = s.comm_bytes_per_step;
      if (e.tensor.size > 1) o["tp_bytes_per_step"] = s.tp_bytes_per_step;
      if (e.sequence.size > 1) o["sp_bytes_per_step"] = s.sp_bytes_per_step;
      per.push_back(o);
    }
    j["pipeline"] = {{"stages", p.stages},       {"replicas", p.replicas},
                     {"schedule", p.schedule},   {"micro_batches", p.micro_batches},
                     {"stage_blocks", p.blocks}, {"bubble_fraction", p.bubble_fraction},
                     {"per_stage", per}};
  }
  if (e.sequence.size > 1) {
    const Estimate::SequenceParallel& q = e.sequence;
    j["sequence_parallel"] = {
        {"size", q.size},
        {"replicas", q.replicas},
        {"kv_heads_gathered", q.kv_gathered},
        {"bytes_per_step", e.stages[size_t(e.recipe_stage)].sp_bytes_per_step},
        {"formula_bytes_per_step", q.formula_bytes}};
  }
  if (e.tensor.size > 1) {
    const Estimate::TensorParallel& t = e.tensor;
    j["tensor_parallel"] = {{"size", t.size},
                            {"replicas", t.replicas},
                            {"kv_heads_replicated", t.kv_replicated},
                            {"sequence_parallel", t.sequence_parallel},
                            {"bytes_per_step", e.stages[size_t(e.recipe_stage)].tp_bytes_per_step},
                            {"formula_bytes_per_step", t.formula_bytes}};
  }
  j["assumptions"] = estimate_assumptions(e);
  return j;
}

}  // namespace fd::engine
