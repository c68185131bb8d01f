// The recipe's model section and nn::DecoderConfig, both ways (model_dir.h):
// every configuration a recipe can state survives the round trip, and what a
// recipe cannot state is refused by name.
#include "lib/config/model_dir.h"

#include <gtest/gtest.h>

#include <string>

#include "lib/base/error.h"
#include "lib/nn/config/hf_config.h"

namespace fd::config {
namespace {

std::string golden(const char* name) {
  return std::string(FD_SOURCE_DIR) + "/tests/golden/llama/" + name;
}

// The fields a DecoderConfig computes with (BOS/EOS belong to the tokenizer, not the recipe).
void expect_same_model(const nn::DecoderConfig& a, const nn::DecoderConfig& b) {
  nn::DecoderConfig x = a, y = b;
  x.bos_token_id = y.bos_token_id = std::nullopt;
  x.eos_token_ids.clear();
  y.eos_token_ids.clear();
  EXPECT_TRUE(x == y) << x.summary() << " vs " << y.summary();
}

TEST(ModelDir, HuggingFaceConfigsSurviveTheRecipe) {
  for (const char* name : {"llama3", "qwen2", "qwen3", "mistral"}) {
    SCOPED_TRACE(name);
    const nn::DecoderConfig c = nn::read_hf_config(golden(name));
    const ModelOptions m = model_options(c, name);
    expect_same_model(decoder_config(m), c);
    EXPECT_TRUE(model_options(decoder_config(m), name) == m);
  }
  const nn::DecoderConfig gpt2 = nn::gpt2_config({3, 4, 64, 300, 48});
  const ModelOptions m = model_options(gpt2, "gpt2");
  EXPECT_EQ(m.arch, Arch::kGpt2);
  EXPECT_EQ(m.n_layer, 3);
  EXPECT_EQ(m.d_model, 64);
  expect_same_model(decoder_config(m), gpt2);
}

TEST(ModelDir, WhatARecipeCannotStateIsRefused) {
  auto refusal = [](const nn::DecoderConfig& c) {
    try {
      model_options(c, "DIR/config.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  nn::DecoderConfig untied = nn::gpt2_config({2, 2, 32, 64, 16});
  untied.tie_word_embeddings = false;
  EXPECT_NE(refusal(untied).find("DIR/config.json: a gpt2 model with tie_word_embeddings false"),
            std::string::npos)
      << refusal(untied);
  nn::DecoderConfig wide = nn::gpt2_config({2, 2, 32, 64, 16});
  wide.intermediate_size = 100;
  EXPECT_NE(refusal(wide).find("n_inner 100"), std::string::npos) << refusal(wide);
  nn::DecoderConfig qwen = nn::read_hf_config(golden("qwen2"));
  qwen.mlp_bias = true;
  EXPECT_NE(refusal(qwen).find("mlp_bias outside a llama model"), std::string::npos)
      << refusal(qwen);
}

}  // namespace
}  // namespace fd::config
