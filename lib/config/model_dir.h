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

}  // namespace fd::config
