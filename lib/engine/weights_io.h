// Filling a model's parameters from a weights file (model.init_from, a LoRA
// run's base, `fdtrain eval`/`generate` of an export). The file is read by
// lib/ckpt (WeightsFile, lib/ckpt/weights_file.h); this matches its tensors
// to the model's parameters.
#pragma once

#include <string>
#include <vector>

#include "lib/nn/decoder.h"
#include "lib/nn/module.h"

namespace fd::engine {

// Copies the weights in `file` into `model`'s parameters, converting dtype
// (round to nearest even). `file` is a Hugging Face model directory (its
// model.safetensors or sharded index, lib/ckpt/hf_dir.h; names as the
// family's, for GPT-2 with or without "transformer."), an fdtrain export
// (.safetensors or .h5) or a Hugging Face GPT-2 model.safetensors. An
// optional "transformer." prefix is stripped, the causal-mask buffers
// h.N.attn.bias / masked_bias are skipped, and lm_head.weight beside a tied
// head is not used (a note is logged if it differs from the embedding); an
// untied head (lm_head.weight a parameter) is loaded like any other. A LoRA model gets its frozen base
// (the adapters keep their own values). Every such parameter must be present
// with its shape and nothing else may be: otherwise fd::Error kUsage,
// prefixed with `where` (e.g. "recipes/x.yaml:3:14: model.init_from"),
// naming the file, the tensor, both shapes and the recipe change that would
// fit the file.
void load_weights(const std::string& file, const nn::Module& model, const std::string& where);

// Copies a PEFT adapter directory (`lora.adapter`: adapter_config.json +
// adapter_model.safetensors, lib/ckpt/peft.h) into `model`'s adapters. The
// adapter must have `lora`'s r, modules and layers (`recipe_targets`: the
// targets as the recipe names them, for the message) and hold every adapter
// parameter with its shape; otherwise fd::Error (kUsage) prefixed with `where`.
void load_peft_adapter(const std::string& dir, const nn::Decoder& model, const nn::LoraConfig& lora,
                       const std::vector<std::string>& recipe_targets, const std::string& where);

}  // namespace fd::engine
