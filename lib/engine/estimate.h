// Estimate: the memory and communication one rank of a training run needs,
// for every ZeRO stage, found by running the run on the counting device.
//
//   Estimate e = estimate(recipe, /*world=*/4);
//   std::fputs(format_estimate(e).c_str(), stdout);   // or estimate_json(e)
//
// For each stage and each rank of the world, the model is built through the
// assembly step (assemble.h) on Device::meta(), whose tensors allocate
// nothing but are counted by the memory accountant exactly as the CPU
// backend's, with a dist::CountingCommunicator in place of MPI; then what the
// trainer runs is run: setup (peaks count from its end), one training step
// (every micro-batch's forward and backward with the ZeRO hooks, the
// optimizer update), one evaluation batch, and the gather of the full
// parameters a run ends with (the weights digest). The figures are the
// accountant's per-category peaks, the largest over ranks, as summary.json's
// 'memory' reports them; nothing here describes the model a second time, so
// any model the trainer can build is estimated exactly (estimate_test.cc and
// tests/cli/estimate.sh compare with measured runs).
//   - model states (params, grads, master, optimizer): the accountant's
//     peaks; they equal zero::model_state_bytes() at P, the padded parameter
//     count at this world size;
//   - activations: the peak of kActivations over the step and the
//     evaluation batch, with the moment it is reached (the segment and the
//     backward node);
//   - comm buffers: the peak of kComm in the step (stage 3's gathered
//     segments, gradient buckets in flight, reduce-scatter outputs, and at
//     N > 1 with 16-bit gradients the MPI comm thread's staging, fp32 copies
//     or with zero.reduce_dtype bf16/fp16 every rank's 16-bit chunk, counted
//     at each reduction's launch: the worst moment) and at the end's full gather;
//   - communication: bytes sent per rank per optimizer step, ring model, as
//     Communicator::bytes_sent() counts them.
// Precision: fp32, bf16 and fp16 (16-bit params, grads and activations, fp32 master).
// The figures are the CPU backend's (a GPU run's op scratch differs). The
// estimate uses the process's memory accountant: it resets its peaks.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lib/config/recipe.h"
#include "lib/nn/decoder.h"
#include "lib/zero/zero_engine.h"

namespace fd::engine {

// Activation memory of one micro-batch (bytes), by what holds it.
struct ActivationEstimate {
  int checkpointed = 0;  // blocks whose activations are recomputed in backward
  // What forward keeps for backward, measured after each segment's forward
  // (the largest block where blocks differ):
  int64_t per_block = 0;  // a block that is not checkpointed, its output included (0: none)
  int64_t per_checkpointed_block = 0;  // a checkpointed block: its output, cRC (0: none)
  int64_t embed = 0;                   // the embedding segment
  int64_t head = 0;                    // the head segment (ln_f, logits) and the loss
  int64_t saved = 0;                   // all of it at the end of forward (the scalar loss aside)
  int64_t peak = 0;       // the highest point of forward + backward (and of evaluation)
  std::string peak_at;    // the moment of the peak, e.g. "block 1 backward (matmul)"
  int64_t eval_peak = 0;  // the highest point of an evaluation batch (no grad)
  // The training step's head + loss: its rows, chunks and logits (ops::head_chunk_plan; rows 0
  // when no rank ran one). The GPU plans alike (Decoder::head_chunk_rows).
  ops::HeadChunkPlan head_plan;
  bool head_on_gpu = false;  // device: cuda (what is kept: the logits in the compute dtype)
};

// The head_plan object of summary.json and `estimate --json` (docs/RUN_DIR.md): rows, vocab,
// chunk_rows, chunks, logits_bytes, budget_bytes, kept (one chunk: the logits are kept for the
// backward, no second logits GEMM); null when rows is 0 (no head on this rank).
nlohmann::ordered_json head_plan_json(const ops::HeadChunkPlan& h);

struct StageEstimate {
  int stage = 0;
  zero::ModelStateBytes model_states;  // params, grads, master, optimizer (exact)
  int64_t activations = 0;             // ActivationEstimate::peak (the same at every stage)
  // Peak of MemCategory::kComm over a run: the larger of a training step's
  // (comm_step) and, for stage 3, the full parameters (cP) gathered once at the
  // end for the weights digest (and for the sample, checkpoints and exports).
  int64_t comm_buffers = 0;
  int64_t comm_step = 0;         // kComm peak of a step, worst-case fp32 staging included
  int64_t comm_staging = 0;      // of comm_step, the 16-bit reduce-scatter's staging (MPI's)
  int64_t comm_full_gather = 0;  // stage 3: cP (with_full_parameters); 0 otherwise
  int64_t other = 0;             // the token, target and position id buffers (kOther)
  // checkpoint.async (with checkpoint.every > 0): the staging of saves behind the step
  // (MemCategory::kCheckpoint): the rank's saved state (master, Adam m and v, and 16-bit
  // parameters). 0 for synchronous saves.
  int64_t checkpoint_staging = 0;
  // The process (process_memory.h): the CPU caching allocator's peak over the run (blocks in use
  // and blocks kept for reuse; setup included), simulated through the run's allocations. The
  // tensors' part of the predicted peak RSS.
  int64_t tensors_reserved = 0;
  // Its saves part (ckpt::write_buffer_bytes for the rank's largest range; 0 without saves) and
  // sample part (the end-of-run sample's KvDecoder; 0 without a sample), process_memory.h.
  int64_t save_buffers = 0, sample = 0;
  // LoRA: the frozen base (MemCategory::kFrozen): cP_base (stages 0-2) or
  // cP_base/N (stage 3, the rank's shard); 0 without LoRA.
  int64_t frozen = 0;
  // QLoRA (model.quantize): the 4-bit base (MemCategory::kQuantized): the block segments' encoded
  // bytes (codes, block statistics, the blocks' norms and biases), whole at stages 0-2 or the
  // rank's shard at stage 3, and the 4-bit matmul's dequantization scratch (the decoded absmax
  // and one fp32 panel of the weight). 0 without quantization.
  int64_t quantized = 0;
  // ZeRO-Infinity (zero.offload_optimizer nvme): the bytes of this rank's state
  // file; its resident part is model_states.optimizer (the chunk buffers). 0
  // without offload.
  int64_t offload_nvme = 0;
  // zero.offload_optimizer host (GPU runs): of model_states.optimizer, the bytes
  // of state held in host memory (master weights and moments); 0 otherwise.
  int64_t offload_host = 0;
  // An offloaded optimizer of a GPU run: of model_states.optimizer, the
  // page-locked host buffers carrying the rank's gradient shards down and its
  // parameter shards up (2cP/N); 0 otherwise.
  int64_t offload_pinned = 0;
  // ZeRO++'s hpZ (zero.hierarchical_partition, stage 3): of model_states.params (and frozen,
  // quantized for a base), the secondary partitions: 1/L of the model per rank, L the ranks
  // on a host. 0 otherwise.
  int64_t hpz_secondary = 0;
  int64_t comm_bytes_per_step = 0;  // bytes this rank sends in the step (ring model)
  // A pipeline (parallel.pipeline > 1): ZeRO-3 is refused (the column is
  // empty); per pipeline stage (Estimate::pipeline), the bytes the stage
  // sends its neighbours in a step (hidden states, their gradients, a tied
  // head's embedding gradient and weights).
  bool refused = false;
  int64_t p2p_bytes_per_step = 0;
  // Tensor parallelism: the bytes this rank sends over its tp group in a step (ring model):
  // the f/g all-reduces of every layer and the embedding, the vocabulary-parallel loss's
  // statistics and dh (Estimate::TensorParallel::formula). 0 without.
  int64_t tp_bytes_per_step = 0;
  // Ulysses: the bytes this rank sends over its sp group in a step (the all-to-alls around
  // attention, Estimate::SequenceParallel::formula_bytes; with a pipeline, per pipeline stage
  // its first rank's). 0 without.
  int64_t sp_bytes_per_step = 0;
  // Nodes (Estimate::nodes > 1): over every group of a rank, the bytes it sends in the step
  // (ring model, Communicator::family_bytes) and of them to ranks on other nodes, the largest
  // over ranks. Without --nodes: the total, none across.
  int64_t network_bytes_per_step = 0;
  int64_t inter_node_bytes_per_step = 0;
  double paper_bytes = 0.0;  // the ZeRO paper's formula for this precision at Ψ (no padding)
  // Sum of the per-category peaks: an upper bound of the simultaneous peak.
  int64_t total() const {
    return model_states.total() + frozen + quantized + activations + comm_buffers + other +
           checkpoint_staging;
  }
};

struct Estimate {
  std::string recipe_path;  // for the printed title; may be empty
  nn::DecoderConfig model;
  int micro = 0, seq_len = 0, accumulation = 0;
  int world = 1;
  int nodes = 1;  // --nodes: the world's ranks in `nodes` equal, consecutive groups (hosts)
  int recipe_stage = 0;
  bool async_checkpoints = false;  // Assembly::async_checkpoints: the staging row is shown
  // A rank's process beyond its tensors (process_memory.h); its predicted peak RSS at a stage is
  // runtime + data + StageEstimate::tensors_reserved + save_buffers + sample.
  struct Process {
    int ranks_per_host = 1;          // world / nodes
    std::optional<int64_t> runtime;  // calibrated for this build and host; nullopt: not
    std::string runtime_problem;     // why not (and how to calibrate)
    std::optional<int64_t> data;     // measured by opening the data; nullopt: could not
    std::string data_problem;
    std::optional<int64_t> predicted(const StageEstimate& s) const {
      if (!runtime || !data) return std::nullopt;
      return *runtime + *data + s.tensors_reserved + s.save_buffers + s.sample;
    }
  } process;
  // ZeRO++ (recipe zero.quantized_weights / hierarchical_partition / quantized_gradients), applied
  // to the stage-3 column only; zeropp_gradients "int8" / "int4", or empty.
  bool zeropp = false, zeropp_weights = false, hpz = false;
  std::string zeropp_gradients;
  config::Precision precision = config::Precision::kFp32;
  int compute_bytes = 4;          // c: bytes of a parameter, gradient or activation
  std::vector<int> checkpointed;  // activation_checkpointing.layers
  int64_t num_params = 0;         // Ψ
  int64_t padded_params_1 = 0;  // P at world 1: Ψ plus the 16-element alignment of each parameter
  int64_t padded_params = 0;    // P at this world: each segment also padded to a multiple of 16N
  // LoRA (lora.enabled()): Ψ, P above are the trainable adapters'; the frozen base's:
  nn::LoraConfig lora;
  int64_t frozen_params = 0;         // Ψ_base
  int64_t frozen_padded_params = 0;  // P_base at this world (as the engine pads it)
  // QLoRA: the base's block segments in their 4-bit form, bytes at this world (as the engine pads
  // them); those segments' parameters are not in frozen_padded_params. 0 without quantization.
  std::optional<quant::QuantOptions> quantize;
  int64_t quantized_bytes = 0;
  // Preference training (an objective section): which objective, and where DPO's reference
  // comes from (in words). The reference holds no parameter memory in any layout: under LoRA it
  // is the base with the adapters off; otherwise its log-probs are computed before the training
  // model is built (or by it before its first step) and kept, 16 bytes per pair.
  std::string objective;  // "" without; else "dpo (sigmoid)", "simpo", "orpo"
  std::string reference;  // DPO: the reference, in words; "" otherwise
  ActivationEstimate activations;
  // Per ZeRO stage, the largest figure of any rank (with a pipeline: of any
  // pipeline stage's).
  std::array<StageEstimate, 4> stages;
  // Pipeline parallelism at the recipe's ZeRO stage, one entry per pipeline
  // stage (StageEstimate::stage is then the pipeline stage); empty without.
  struct Pipeline {
    int stages = 1, replicas = 1, micro_batches = 1;
    std::string schedule;
    std::vector<int> blocks;
    double bubble_fraction = 0.0;  // (P - 1) / (M + P - 1)
    std::vector<StageEstimate> per_stage;
  } pipeline;
  // Tensor parallelism (parallel.tensor > 1): the layout and its traffic; size 1 without.
  struct TensorParallel {
    int size = 1, replicas = 1;
    bool kv_replicated = false;      // fewer key/value heads than ranks: all of them on every rank
    bool sequence_parallel = false;  // parallel.sequence_parallel
    // With sequence parallelism each block's all-reduces are reduce-scatter + all-gather pairs
    // of the same B*T*H elements ((T-1)/T of the bytes each), the embedding's a reduce-scatter
    // (its backward an all-gather when the embedding trains), the head's input an all-gather
    // (its backward a reduce-scatter) and no dh all-reduce; the
    // norms' (and learned positions') weights get their gradients all-reduced, as they see a
    // slice of the sequence.
    // Megatron-LM's count for this model at this micro-batch (B x T tokens, width H, L blocks,
    // E bytes per element), per step of a micro-batches: a * (4L + 1) all-reduces of B*T*H
    // elements (per block two forward, g after attention and the MLP, and two backward, f
    // before them; one forward for the embedding), and the loss's 3 B*T f32 statistics and
    // B*T*H f32 dh, each all-reduce 2(T-1)/T of its bytes on the wire. With a pipeline the
    // largest of any stage's count (L its blocks; the embedding's terms the first stage's, the
    // head's and the final norm's the last's), as bytes_per_step is the largest rank's.
    int64_t formula_bytes = 0;
  } tensor;
  // Ulysses sequence parallelism (parallel.sequence > 1); size 1 without.
  struct SequenceParallel {
    int size = 1, replicas = 1;
    bool kv_gathered = false;  // key/value heads (per tp rank) fewer than S: all-gathered whole
    // DeepSpeed-Ulysses' count per step of a micro-batches: per block, forward and backward
    // alike, one all-to-all of q and one of the attention output (B*(T/S)*Hq*D elements each,
    // Hq the rank's query heads before the exchange) and one each of k and v (Hkv/Hq of that
    // size), each (S-1)/S of its bytes on the wire; with kv_gathered, k and v are all-gathered
    // forward and reduce-scattered backward instead ((S-1) B*(T/S)*Hkv*D elements each).
    // With a pipeline the count of the stage of the most blocks (L its blocks: the
    // all-to-alls are the blocks'), as bytes_per_step is the largest rank's.
    int64_t formula_bytes = 0;
  } sequence;
};

// The estimate for `recipe` on `world` ranks (world >= 1; the recipe is
// assumed valid, e.g. from config::load_recipe). Throws a usage fd::Error if
// the recipe's batch.global does not fit `world` (config::check_world_size).
// `nodes` (>= 1, dividing world: a usage fd::Error otherwise): the ranks as `nodes` hosts of
// world / nodes consecutive ranks each (mpirun's by-slot placement), which the network figures
// split into bytes inside a node and across nodes.
Estimate estimate(const config::Recipe& recipe, int world, int nodes = 1);

// A table of every stage side by side (MiB/GiB), the formulas and the assumptions.
std::string format_estimate(const Estimate& e);
// The same, machine-readable: exact bytes; keys in a fixed order.
nlohmann::ordered_json estimate_json(const Estimate& e);

// The assumptions behind the numbers, one sentence each (printed by both forms).
std::vector<std::string> estimate_assumptions(const Estimate& e);

}  // namespace fd::engine
