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
//   - activations: the peak of the tensors the ops save for backward plus the
//     transient gradients of backward, for one micro-batch (fp32; no
//     activation checkpointing yet). The formula mirrors lib/ops and
//     lib/autograd byte for byte; estimate_test.cc checks it against a
//     measured step;
//   - comm buffers: the peak of MemCategory::kComm during a step: stage 3's
//     gathered segments and stages 2-3's full-gradient buckets (at most two
//     reduce-scatters in flight plus the one being launched), plus the
//     reduce-scatter outputs that are not the gradient shard itself. It
//     mirrors ZeroEngine's protocol (lib/zero/zero_engine.cc);
//   - communication: bytes sent per rank per optimizer step, ring model, as
//     Communicator::bytes_sent() counts them.
// Precision: fp32 only (the engine's only precision so far).
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

// Activation memory of one micro-batch (bytes, fp32), by what holds it.
struct ActivationEstimate {
  int64_t per_block = 0;  // saved by one transformer block for backward, its output included
  int64_t embed = 0;      // the embedding's output and its copies of the token and position ids
  int64_t head = 0;     // ln_f's output and statistics, the logits, cross-entropy's lse and targets
  int64_t saved = 0;    // all of it at the end of forward: embed + n_layer * per_block + head
  int64_t peak = 0;     // the highest point of forward + backward
  std::string peak_at;  // the moment of the peak, e.g. "cross-entropy backward"
};

// Activations of `model` training on micro-batches of `micro` sequences of `seq_len` tokens.
ActivationEstimate estimate_activations(const nn::GptConfig& model, int micro, int seq_len);

// Padded elements of each segment (embed, h.0 .. h.{L-1}, final) at `world` ranks.
std::vector<int64_t> segment_padded_numel(const nn::GptConfig& model, int world);

// Peak bytes of communication buffers during one optimizer step of
// `accumulation` micro-batches; `segment_numel` as segment_padded_numel() gives
// it (the last segment also uses the first: the tied lm head).
int64_t comm_buffer_bytes(int stage, int world, int accumulation, bool overlap_comm,
                          const std::vector<int64_t>& segment_numel);

// Bytes each rank sends per optimizer step (ring model, fp32), P padded parameters:
//   stages 0-2: (a + 1) * P * (N-1)/N * 4  (a reduce-scatter per micro-batch, one all-gather)
//   stage 3:    3 * a * P * (N-1)/N * 4    (per micro-batch: gather for forward, again for
//                                           backward, reduce-scatter)
int64_t comm_bytes_per_step(int stage, int world, int accumulation, int64_t padded_params);

struct StageEstimate {
  int stage = 0;
  zero::ModelStateBytes model_states;  // params, grads, master, optimizer (exact)
  int64_t activations = 0;             // ActivationEstimate::peak (the same at every stage)
  int64_t comm_buffers = 0;            // comm_buffer_bytes()
  int64_t other = 0;                   // the token, target and position id buffers
  int64_t comm_bytes_per_step = 0;     // comm_bytes_per_step()
  double paper_bytes = 0.0;            // the ZeRO paper's formula for fp32 at Ψ (no padding)
  // Sum of the per-category peaks: an upper bound of the simultaneous peak.
  int64_t total() const { return model_states.total() + activations + comm_buffers + other; }
};

struct Estimate {
  std::string recipe_path;  // for the printed title; may be empty
  nn::GptConfig model;
  int micro = 0, seq_len = 0, accumulation = 0;
  int world = 1;
  int recipe_stage = 0;
  bool overlap_comm = true;
  int64_t num_params = 0;       // Ψ
  int64_t padded_params_1 = 0;  // P at world 1: Ψ plus the 16-element alignment of each parameter
  int64_t padded_params = 0;    // P at this world: each segment also padded to a multiple of 16N
  ActivationEstimate activations;
  std::array<StageEstimate, 4> stages;
};

// The estimate for `recipe` on `world` ranks (world >= 1; the recipe is
// assumed valid, e.g. from config::load_recipe). Throws a usage fd::Error if
// the recipe's batch.global does not fit `world` (config::check_world_size),
// or if it asks for what the estimate does not cover yet (a precision other
// than fp32, activation checkpointing).
Estimate estimate(const config::Recipe& recipe, int world);

// A table of every stage side by side (MiB/GiB), the formulas and the assumptions.
std::string format_estimate(const Estimate& e);
// The same, machine-readable: exact bytes; keys in a fixed order.
nlohmann::ordered_json estimate_json(const Estimate& e);

// The assumptions behind the numbers, one sentence each (printed by both forms).
std::vector<std::string> estimate_assumptions(const Estimate& e);

}  // namespace fd::engine
