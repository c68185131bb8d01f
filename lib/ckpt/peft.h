// LoRA adapters in Hugging Face PEFT's format, and merging them into a base.
//
// fdtrain names a LoRA pair after the layer it adapts, in GPT-2 a Conv1D:
//   h.{i}.<M>.lora_A.weight  (r, in)     Kaiming-uniform at init
//   h.{i}.<M>.lora_B.weight  (out, r)    zeros at init
// with <M> one of attn.c_attn (C -> 3C), attn.c_proj (C -> C), mlp.c_fc
// (C -> 4C), mlp.c_proj (4C -> C), and the adapted layer computes
//   y = x W + b + dropout(x) A^T B^T (alpha / r).
//
// A PEFT adapter directory holds
//   adapter_config.json         {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r",
//                                "lora_alpha", "lora_dropout", "target_modules",
//                                "bias": "none", "fan_in_fan_out": true,
//                                "base_model_name_or_path", "inference_mode": true,
//                                "layers_to_transform": null | [i, ...], ...}
//   adapter_model.safetensors   base_model.model.transformer.h.{i}.<M>.lora_{A,B}.weight
// with the same shapes as above (PEFT stores lora_A (r, in) and lora_B
// (out, r) for Conv1D too; fan_in_fan_out only transposes the merged delta).
// target_modules uses PEFT's suffix matching: "c_proj" names both
// attn.c_proj and mlp.c_proj.
//
// The Llama family's pairs are named after its Linear layers:
//   model.layers.{i}.<M>.lora_{A,B}.weight  A (r, in), B (out, r)
// with <M> one of self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj; PEFT's
// keys are base_model.model.model.layers.{i}.<M>.lora_{A,B}.weight,
// fan_in_fan_out is false (the weights are [out, in]: W' = W + (alpha / r) B A),
// and target_modules are the short names (q_proj, v_proj, ...).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "lib/tensor/tensor.h"

namespace fd::ckpt {

// An adapter's settings (the recipe's lora section plus the base it adapts).
struct LoraSpec {
  int r = 0;             // adapter rank, >= 1
  double alpha = 0.0;    // scaling numerator: the delta is (B A) * alpha / r, > 0
  double dropout = 0.0;  // dropout on the adapter's input while training, in [0, 1)
  // Recipe target names: c_attn, c_proj (both projections), attn.c_proj, c_fc,
  // mlp.c_proj. Written to target_modules as they are.
  std::vector<std::string> targets;
  std::vector<int> layers;  // block indices with adapters, sorted; empty = all
  std::string base;         // the base model file (base_model_name_or_path); may be ""
  bool operator==(const LoraSpec&) const = default;
};

// True for fdtrain LoRA parameter names (they contain ".lora_A." or ".lora_B.").
bool is_lora_name(const std::string& name);

// "h.3.attn.c_attn.lora_A.weight" -> "base_model.model.transformer.h.3.attn.c_attn.lora_A.weight",
// "model.layers.3.self_attn.q_proj.lora_A.weight" ->
// "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight".
// Throws fd::Error kUsage if `fdtrain_name` is not a LoRA parameter name as above.
std::string peft_key(const std::string& fdtrain_name);

// Writes DIR/adapter_config.json and DIR/adapter_model.safetensors (PEFT keys,
// each tensor in its own dtype; __metadata__ {"format": "pt"}). `lora_tensors`
// are fdtrain names -> CPU tensors: complete A/B pairs with shapes (r, in) and
// (out, r) of the layer they adapt, on modules the targets name and blocks in
// `spec.layers` (when given), all of one family. A Llama-family adapter's
// target_modules are the short names of the modules that have adapters
// (spec.targets may say all-linear or self_attn.q_proj). Everything is written into a temporary
// sibling directory that is renamed to DIR at the end, so DIR is either absent, the old adapter or
// the complete new one. Refuses an existing DIR unless `overwrite`. Throws fd::Error kUsage for bad
// input, kRuntime on I/O failure.
void write_peft_adapter(const std::string& dir, const LoraSpec& spec,
                        const std::vector<std::pair<std::string, Tensor>>& lora_tensors,
                        bool overwrite);

// A PEFT adapter read back: its settings and its tensors under fdtrain names,
// in canonical order (by block, then attn.c_attn, attn.c_proj, mlp.c_fc,
// mlp.c_proj, A before B), in the file's dtypes.
struct PeftAdapter {
  LoraSpec spec;
  std::vector<std::pair<std::string, Tensor>> tensors;
};

// Reads and validates the adapter in `dir`: peft_type "LORA", fan_in_fan_out
// true for GPT-2 and false for the Llama family, bias "none", no rsLoRA/DoRA/per-module rank or
// alpha patterns, target_modules a list of names fdtrain knows (attn.c_attn and mlp.c_fc are
// accepted for c_attn and c_fc, self_attn.q_proj for q_proj, ...), every key a
// LoRA weight of a GPT-2 or Llama-family block
// module that the targets name (and layers_to_transform lists), complete A/B
// pairs with shapes (r, in) / (out, r) that fit one model width C, and every
// targeted module present in each block that has adapters. Any problem:
// fd::Error kUsage naming the file and what is wrong.
PeftAdapter read_peft_adapter(const std::string& dir);

// `base` (Hugging Face GPT-2 names, optionally prefixed "transformer.";
// Conv1D weights (in, out); or Llama-family names, Linear weights [out, in])
// with every LoRA pair in `lora` (fdtrain names) merged into its module's
// weight:  W' = W + (B A)^T * scaling (Conv1D), W + (B A) * scaling (Linear), where
// scaling is alpha / r, by merge_lora_into (lib/tensor/lora_merge.h: float64,
// rounded once to fp32), then rounded to W's dtype. Entries without
// adapters are returned as they are (shared, not copied); the order of
// `base` is kept. Throws fd::Error kUsage if a pair is incomplete, its
// module's weight is missing from `base`, or the shapes do not fit.
std::vector<std::pair<std::string, Tensor>> merge_lora(
    const std::vector<std::pair<std::string, Tensor>>& base,
    const std::vector<std::pair<std::string, Tensor>>& lora, double scaling);

}  // namespace fd::ckpt
