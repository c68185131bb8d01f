// Gpt: a GPT-2 style decoder of any size, with Hugging Face GPT-2 parameter
// names and layouts (Conv1D weights stored (in, out); lm head tied to wte).
//
// The model is a list of segments, each owning one FlatParamGroup:
//   segment 0      "embed"  wte.weight (V, C), wpe.weight (T, C)
//   segment 1..L   "h.i"    ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj
//   segment L+1    "final"  ln_f
// Segments are the unit of everything distributed (ZeRO partitions,
// gradient buckets, activation checkpointing; see docs/ARCHITECTURE.md).
// Forward records on the current autograd tape; parameter gradients
// accumulate into the groups' flat gradient buffers.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "lib/autograd/variable.h"
#include "lib/nn/module.h"
#include "lib/nn/parameter.h"
#include "lib/nn/segment_runner.h"

namespace fd::nn {

struct GptConfig {
  int n_layer = 4;
  int n_head = 4;
  int d_model = 128;
  int vocab_size = 256;
  int max_seq_len = 256;

  // Parameters of the model (wte counted once: the lm head is tied).
  int64_t num_params() const;
  // Training FLOPs per token, forward + backward: 6N + 12·L·T·C (nanoGPT/PaLM convention).
  double flops_per_token(int seq_len) const;
};

// Low-rank adapters (LoRA, as Hugging Face PEFT): a targeted Conv1D y = x W + b
// becomes y = x W + b + dropout(x) A^T B^T (alpha / r), A (r, in) Kaiming-uniform
// (a = sqrt 5: bound 1/sqrt(in)), B (out, r) zero. The base is frozen.
struct GptConfig;
struct LoraConfig {
  int r = 0;                         // rank; 0 = no adapters (every parameter trains)
  float alpha = 0.0f;                // scaling = alpha / r
  float dropout = 0.0f;              // on the adapter's input only
  std::vector<std::string> modules;  // attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj
  std::vector<int> layers;           // blocks with adapters; empty = all
  bool enabled() const { return r > 0; }
  bool applies(int layer, const std::string& module) const;
  // Trainable parameters for `config`: sum over adapted modules of r * (in + out).
  int64_t num_params(const GptConfig& config) const;
};

// The recipe's LoRA target names (c_attn, c_proj, attn.c_proj, c_fc, mlp.c_proj)
// as module names; "c_proj" matches both projections, as PEFT's suffix matching.
std::vector<std::string> lora_modules_for_targets(const std::vector<std::string>& targets);

// One segment's name and parameters, in layout order.
struct SegmentSpec {
  std::string name;               // "embed", "h.0" .. "h.{L-1}", "final"
  std::vector<ParamSpec> params;  // in the order the segment's flat buffer holds them
};

class Gpt : public Module {
 public:
  // The segments a Gpt of `config` is made of, without allocating anything:
  // the constructor builds its groups from exactly these, so sizes computed
  // from them (FlatParamGroup::padded_numel) are the sizes a model will have.
  // With LoRA, these are the trainable (adapter) segments; segment_specs of
  // the plain config are then the frozen base's.
  static std::vector<SegmentSpec> segment_specs(const GptConfig& config,
                                                const LoraConfig& lora = {});

  // Allocates all segments (parameters zero) in `dtype`, laid out as `layout` says.
  // With LoRA the trainable groups hold only the adapters (laid out by `layout`)
  // and the base lives in frozen groups laid out by `frozen_layout`.
  explicit Gpt(const GptConfig& config, DType dtype = DType::kF32, const GroupLayout& layout = {},
               const LoraConfig& lora = {}, const GroupLayout& frozen_layout = {});

  // Segment indices: kEmbedSegment, then 1 + layer for each block, then final_segment().
  static constexpr int kEmbedSegment = 0;
  int final_segment() const { return config_.n_layer + 1; }

  const GptConfig& config() const { return config_; }
  // Segments in forward order: embed, h.0 .. h.{L-1}, final.
  const std::vector<std::unique_ptr<FlatParamGroup>>& segments() const { return segments_; }
  // Every parameter in canonical order (the order of Hugging Face's state_dict).
  std::vector<const Parameter*> parameters() const override;
  std::vector<const FlatParamGroup*> groups() const override;
  std::vector<const Parameter*> frozen_parameters() const override;
  std::vector<const FlatParamGroup*> frozen_groups() const override;
  const LoraConfig& lora() const { return lora_; }

  // GPT-2 initialisation: weights N(0, 0.02), residual projections (attn.c_proj,
  // mlp.c_proj) N(0, 0.02/sqrt(2L)), biases 0, LayerNorm weight 1. Each element
  // is a counter-based function of (seed, parameter name, index), so the
  // result does not depend on layout, world size or order of construction.
  // With LoRA: the base as above, A Kaiming-uniform, B zero. Does nothing on
  // the meta device.
  void init_gpt2(uint64_t seed);
  // Seed of the adapters' dropout masks for the coming forward (the Trainer
  // derives it from (seed, step, micro-batch), so recompute and resume repeat it).
  void set_dropout_seed(uint64_t seed) const { dropout_seed_ = seed; }

  // tokens (B, T) i32 with T <= max_seq_len -> logits (B, T, V). Each segment runs
  // through `runner` (nullptr: directly).
  autograd::Variable forward(const Tensor& tokens, SegmentRunner* runner = nullptr) const;
  // Mean cross-entropy of forward(tokens) against targets (B, T) i32 (-1 = ignore).
  autograd::Variable loss(const Tensor& tokens, const Tensor& targets,
                          SegmentRunner* runner = nullptr) const;

 private:
  autograd::Variable block_forward(int layer, const autograd::Variable& x) const;
  // A base parameter as a Variable: trainable (bound to its gradient) without
  // LoRA, frozen (no gradient) with it.
  autograd::Variable base_var(int segment, int index) const;
  // x W + b through module `module` of block `layer`, plus its adapter if any.
  autograd::Variable linear(int layer, const std::string& module, const autograd::Variable& x,
                            int weight_index) const;
  const FlatParamGroup& base_group(int segment) const;

  GptConfig config_;
  [[maybe_unused]] DType dtype_;  // set, not read yet (clang: -Wunused-private-field)
  std::vector<std::unique_ptr<FlatParamGroup>> segments_;  // trainable
  std::vector<std::unique_ptr<FlatParamGroup>> frozen_;    // LoRA base (empty without LoRA)
  LoraConfig lora_;
  mutable uint64_t dropout_seed_ = 0;
  mutable Tensor positions_;  // (B, T) i32 position ids, cached per shape
};

}  // namespace fd::nn
