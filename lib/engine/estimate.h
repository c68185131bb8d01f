// Estimate: the memory and communication one rank of a training run needs,
// for every ZeRO stage, computed from the recipe alone (nothing is allocated).
//
//   Estimate e = estimate(recipe, /*world=*/4);
//   std::fputs(format_estimate(e).c_str(), stdout);   // or estimate_json(e)
//
// What each number is (docs/ZERO.md has the derivations):
//   - model states (params, grads, master, optimizer): zero::model_state_bytes()
//     at P, the padded parameter count at this world size, computed from
//     Gpt::segment_specs() and FlatParamGroup::padded_numel(): the same
//     functions the model and the engine use, so a run measures exactly these;
//   - activations: the peak of the tensors the ops save for backward, the
//     transient gradients of backward and the ops' scratch (fp32 copies of
//     16-bit tensors included), for one micro-batch, with checkpointed blocks
//     recomputed in backward: a replay of the allocations of lib/ops,
//     lib/autograd (tape, segment) and nn::Gpt with their lifetimes;
//     estimate_test.cc checks it against a measured step;
//   - comm buffers: the peak of MemCategory::kComm during a step: stage 3's
//     gathered segments and stages 2-3's full-gradient buckets (at most two
//     reduce-scatters in flight plus the one being launched), plus the
//     reduce-scatter outputs that are not the gradient shard itself, plus
//     (16-bit, N > 1) the fp32 staging of one reduce-scatter at the worst
//     moment. It mirrors ZeroEngine's protocol (lib/zero/zero_engine.cc);
//   - communication: bytes sent per rank per optimizer step, ring model, as
//     Communicator::bytes_sent() counts them.
// Precision: fp32, bf16 and fp16 (16-bit params, grads and activations, fp32 master).
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lib/config/recipe.h"
#include "lib/nn/gpt.h"
#include "lib/zero/zero_engine.h"

namespace fd::engine {

// Activation memory of one micro-batch (bytes), by what holds it.
struct ActivationEstimate {
  int compute_bytes = 4;  // c: 2 for bf16/fp16 activations, 4 for fp32
  int checkpointed = 0;   // blocks whose activations are recomputed in backward
  int64_t per_block = 0;  // saved by one (not checkpointed) block for backward, its output included
  int64_t per_checkpointed_block = 0;  // kept by a checkpointed block: its output (cRC)
  int64_t embed = 0;      // the embedding's output and its copies of the token and position ids
  int64_t head = 0;     // ln_f's output and statistics, the logits, cross-entropy's lse and targets
  int64_t saved = 0;    // all of it at the end of forward (the scalar loss aside)
  int64_t peak = 0;     // the highest point of forward + backward (and of evaluation)
  std::string peak_at;  // the moment of the peak, e.g. "cross-entropy backward"
  int64_t eval_peak = 0;  // the highest point of an evaluation batch (no grad)
};

// Activations of `model` training on micro-batches of `micro` sequences of
// `seq_len` tokens, activations in `compute_bytes` (4 fp32, 2 bf16/fp16; the
// ops' fp32 statistics and 16-bit tensors' fp32 scratch copies included),
// blocks `checkpointed` (0-based) recomputed in backward.
ActivationEstimate estimate_activations(const nn::GptConfig& model, int micro, int seq_len,
                                        int compute_bytes = 4,
                                        const std::vector<int>& checkpointed = {});
// The same with LoRA adapters (lora.enabled()): the frozen base saves only
// what a trainable input needs (layernorm inputs and statistics, attention's
// qkv, GELU inputs once a gradient flows), the adapters save their input (the
// dropout output when dropout > 0) and the rank-r product; the embedding
// segment records nothing. per_block, embed and head are 0 (no closed form);
// saved and peak come from the replay. `has_backward` (optional) receives, per
// segment, whether its backward runs (a node was recorded): the embedding's
// never does under LoRA.
ActivationEstimate estimate_lora_activations(const nn::GptConfig& model, const nn::LoraConfig& lora,
                                             int micro, int seq_len, int compute_bytes = 4,
                                             const std::vector<int>& checkpointed = {},
                                             std::vector<bool>* has_backward = nullptr);

// Padded elements of each segment (embed, h.0 .. h.{L-1}, final) at `world` ranks.
std::vector<int64_t> segment_padded_numel(const nn::GptConfig& model, int world);

// Peak bytes of communication buffers during one optimizer step of
// `accumulation` micro-batches; `segment_numel` as segment_padded_numel() gives
// it (the last segment also uses the first: the tied lm head).
// Buffers are in the compute dtype (compute_bytes); fp32_staging adds the
// fp32 copies MpiCommunicator makes of a 16-bit reduce-scatter (its input and
// output) for the one reduction its comm thread runs at a time, at the worst
// moment (world > 1 with 16-bit gradients; the world-1 LocalCommunicator
// reduces in place).
// LoRA: `frozen_numel` (per segment, the frozen base padded by frozen_layout_for)
// is gathered with the segment's adapters under stage 3; `has_backward` marks
// the segments whose backward runs (empty = all); a segment without trainable
// elements launches no reduce-scatter.
int64_t comm_buffer_bytes(int stage, int world, int accumulation, bool overlap_comm,
                          const std::vector<int64_t>& segment_numel, int compute_bytes = 4,
                          bool fp32_staging = false,
                          const std::vector<int64_t>& frozen_numel = {},
                          const std::vector<bool>& has_backward = {});

// Padded elements of each frozen base segment (LoRA) at `world` ranks.
std::vector<int64_t> frozen_padded_numel(const nn::GptConfig& model, int world);
// Padded elements of each trainable (adapter) segment at `world` ranks.
std::vector<int64_t> lora_segment_padded_numel(const nn::GptConfig& model,
                                               const nn::LoraConfig& lora, int world);
// Stage 3 with LoRA, bytes each rank sends per optimizer step: per micro-batch
// every segment's adapters and frozen base are gathered for its forward (the
// embedding's again for the tied head) and again for its backward when it has
// one (the embedding's has none), and the adapters' gradients reduce-scattered.
int64_t lora_stage3_comm_bytes_per_step(int world, int accumulation,
                                        const std::vector<int64_t>& segment_numel,
                                        const std::vector<int64_t>& frozen_numel,
                                        const std::vector<bool>& has_backward,
                                        int element_bytes = 4);

// Bytes each rank sends per optimizer step (ring model), P padded parameters of
// e bytes (the compute dtype, as Communicator::bytes_sent() counts them):
//   stages 0-2: (a + 1) * P * (N-1)/N * e  (a reduce-scatter per micro-batch, one all-gather)
//   stage 3:    3 * a * P * (N-1)/N * e    (per micro-batch: gather for forward, again for
//                                           backward, reduce-scatter)
int64_t comm_bytes_per_step(int stage, int world, int accumulation, int64_t padded_params,
                            int element_bytes = 4);

struct StageEstimate {
  int stage = 0;
  zero::ModelStateBytes model_states;  // params, grads, master, optimizer (exact)
  int64_t activations = 0;             // ActivationEstimate::peak (the same at every stage)
  // Peak of MemCategory::kComm over a run: the larger of a training step's
  // (comm_step) and, for stage 3, the full parameters (cP) gathered once at the
  // end for the weights digest (and for the sample, checkpoints and exports).
  int64_t comm_buffers = 0;
  int64_t comm_step = 0;        // comm_buffer_bytes(), worst-case fp32 staging included
  int64_t comm_staging = 0;     // of comm_step, the 16-bit reduce-scatter's fp32 staging
  int64_t comm_full_gather = 0;  // stage 3: cP (with_full_parameters); 0 otherwise
  int64_t other = 0;                   // the token, target and position id buffers
  // LoRA: the frozen base (MemCategory::kFrozen): cP_base (stages 0-2) or
  // cP_base/N (stage 3, the rank's shard); 0 without LoRA.
  int64_t frozen = 0;
  int64_t comm_bytes_per_step = 0;     // comm_bytes_per_step()
  double paper_bytes = 0.0;  // the ZeRO paper's formula for this precision at Ψ (no padding)
  // Sum of the per-category peaks: an upper bound of the simultaneous peak.
  int64_t total() const {
    return model_states.total() + frozen + activations + comm_buffers + other;
  }
};

struct Estimate {
  std::string recipe_path;  // for the printed title; may be empty
  nn::GptConfig model;
  int micro = 0, seq_len = 0, accumulation = 0;
  int world = 1;
  int recipe_stage = 0;
  bool overlap_comm = true;
  config::Precision precision = config::Precision::kFp32;
  int compute_bytes = 4;              // c: bytes of a parameter, gradient or activation
  std::vector<int> checkpointed;      // activation_checkpointing.layers
  int64_t num_params = 0;       // Ψ
  int64_t padded_params_1 = 0;  // P at world 1: Ψ plus the 16-element alignment of each parameter
  int64_t padded_params = 0;    // P at this world: each segment also padded to a multiple of 16N
  // LoRA (lora.enabled()): Ψ, P above are the trainable adapters'; the frozen base's:
  nn::LoraConfig lora;
  int64_t frozen_params = 0;         // Ψ_base
  int64_t frozen_padded_params = 0;  // P_base at this world (frozen_layout_for)
  ActivationEstimate activations;
  std::array<StageEstimate, 4> stages;
};

// The estimate for `recipe` on `world` ranks (world >= 1; the recipe is
// assumed valid, e.g. from config::load_recipe). Throws a usage fd::Error if
// the recipe's batch.global does not fit `world` (config::check_world_size).
Estimate estimate(const config::Recipe& recipe, int world);

// A table of every stage side by side (MiB/GiB), the formulas and the assumptions.
std::string format_estimate(const Estimate& e);
// The same, machine-readable: exact bytes; keys in a fixed order.
nlohmann::ordered_json estimate_json(const Estimate& e);

// The assumptions behind the numbers, one sentence each (printed by both forms).
std::vector<std::string> estimate_assumptions(const Estimate& e);

}  // namespace fd::engine
