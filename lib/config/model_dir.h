// The recipe's model section and nn::DecoderConfig, both ways.
//
// A recipe states a model by its family (model.arch) and shape keys
// (recipe.h: ModelOptions); the engine builds an nn::Decoder from an
// nn::DecoderConfig. decoder_config() is the one mapping from the first to
// the second; model_options() the inverse, used when model.init_from names a
// Hugging Face model directory: the directory's config.json
// (nn::read_hf_config) then decides the model section, so the recipe, the
// stored config.yaml and the model always agree. For every configuration the
// recipe can express, model_options(decoder_config(m)) == m and
// decoder_config(model_options(c)) == c on the fields a DecoderConfig
// computes with (tests/config/model_dir_test.cc).
#pragma once

#include <optional>
#include <string>

#include "lib/config/recipe.h"
#include "lib/nn/config/decoder_config.h"

namespace fd::config {

// The DecoderConfig of a loaded (valid) model section. Hugging Face's
// attention_bias covers o_proj too, except in Qwen2 (q, k, v only).
nn::DecoderConfig decoder_config(const ModelOptions& m);

// The model section of `c` (init_from left empty). Throws fd::Error kUsage,
// naming `where` and the field, for a configuration a recipe cannot express
// (a GPT-2 whose MLP is not 4 x its width, learned positions outside GPT-2,
// mlp_bias outside llama, ...).
ModelOptions model_options(const nn::DecoderConfig& c, const std::string& where);

// A directory transformers saved with bitsandbytes 4-bit quantization (load_in_4bit): what its
// config.json's quantization_config says of the weights. The defaults are BitsAndBytesConfig's,
// for keys a file leaves out (fp4 without double quantization, unlike model.quantize's).
struct HfQuantization {
  QuantTypeName type = QuantTypeName::kFp4;  // bnb_4bit_quant_type
  bool double_quant = false;                 // bnb_4bit_use_double_quant
};

// A Hugging Face model directory as the recipe reads it (model.init_from).
struct ModelDirectory {
  ModelOptions model;                          // model_options() of its config.json
  std::optional<HfQuantization> quantization;  // present when config.json has a
                                               // quantization_config
};

// Reads `dir`/config.json: the model through nn::parse_hf_config (without its
// quantization_config, which that parser refuses) and the quantization from the few keys the
// recipe must agree with. Throws fd::Error kUsage naming config.json for anything
// nn::read_hf_config refuses, and for a quantization_config that is not bitsandbytes 4-bit
// (another quant_method, load_in_8bit) or whose keys have the wrong type. The rest of a 4-bit
// directory (every key of quantization_config, the weights' block size and blobs) is checked
// when the weights are loaded (ckpt::Bnb4bitDir, lib/ckpt/bnb4bit.h).
ModelDirectory read_model_directory(const std::string& dir);

}  // namespace fd::config
