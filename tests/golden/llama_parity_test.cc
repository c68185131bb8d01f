// PyTorch parity for the Llama family: fdtrain's Decoder against golden data
// written by tests/golden/make_golden_llama.py (plain PyTorch with Hugging
// Face's Llama / Mistral / Qwen2 / Qwen3 semantics) from the Hugging Face
// model directories it creates under tests/golden/llama/<case>/.
//
// Per case: config.json read by nn::read_hf_config, model.safetensors loaded
// by name, then the fp32 logits, the loss (through the chunked head + loss;
// ops tests cover chunk sizes), every parameter gradient and the RoPE
// inverse frequencies, each within ||ours - ref|| / ||ref|| <= 1e-5 (printed
// with the largest elementwise difference).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "lib/autograd/tape.h"
#include "lib/nn/decoder.h"
#include "lib/nn/config/hf_config.h"
#include "lib/ops/rope.h"
#include "lib/tensor/safetensors.h"
#include "tests/golden/parity_util.h"

namespace fd {
namespace {

using golden::compare;
using golden::Diff;

std::string case_dir(const std::string& name) {
  return std::string(FD_SOURCE_DIR) + "/tests/golden/llama/" + name;
}

struct Loaded {
  std::unique_ptr<nn::Decoder> model;
  SafetensorsFile golden;
};

Loaded load(const std::string& name) {
  const nn::DecoderConfig c = nn::read_hf_config(case_dir(name));
  auto model = std::make_unique<nn::Decoder>(c);
  SafetensorsFile weights = SafetensorsFile::open(case_dir(name) + "/model.safetensors");
  size_t loaded = 0;
  for (const nn::Parameter* p : model->parameters()) {
    EXPECT_TRUE(weights.contains(p->name)) << p->name;
    if (!weights.contains(p->name)) continue;
    EXPECT_EQ(weights.shape(p->name), p->value.shape()) << p->name;
    p->value.copy_from(weights.load(p->name));
    ++loaded;
  }
  EXPECT_EQ(loaded, weights.names().size()) << "every tensor of the file is a parameter";
  return {std::move(model), SafetensorsFile::open(case_dir(name) + "/golden.safetensors")};
}

void check(const std::string& name, nn::ModelFamily family) {
  std::printf("== %s\n", name.c_str());
  Loaded l = load(name);
  nn::Decoder& m = *l.model;
  ASSERT_EQ(m.config().family, family);
  const SafetensorsFile& g = l.golden;
  const Tensor tokens = g.load("tokens"), targets = g.load("targets");

  std::vector<float> inv = ops::rope_inv_freq(
      {.head_dim = m.config().head_dim,
       .theta = m.config().rope_theta,
       .kind = m.config().rope_scaling.kind == nn::RopeScalingKind::kLlama3
                   ? ops::RopeScalingKind::kLlama3
                   : ops::RopeScalingKind::kDefault,
       .factor = m.config().rope_scaling.factor,
       .low_freq_factor = m.config().rope_scaling.low_freq_factor,
       .high_freq_factor = m.config().rope_scaling.high_freq_factor,
       .original_max_position_embeddings = m.config().rope_scaling.original_max_position_embeddings});
  Diff d = compare(inv, g.load("rope_inv_freq").to_vector());
  std::printf("%-52s rel %.3e  max|diff| %.3e\n", "rope_inv_freq", d.rel, d.max_abs);
  EXPECT_LE(d.rel, 1e-6);

  {
    autograd::NoGradGuard no_grad;
    d = compare(m.forward(tokens).value().to_vector(), g.load("logits").to_vector());
    std::printf("%-52s rel %.3e  max|diff| %.3e\n", "logits", d.rel, d.max_abs);
    EXPECT_LE(d.rel, 1e-5);
  }
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  autograd::Variable loss = m.loss(tokens, targets);
  const float ours = loss.value().to_vector()[0], ref = g.load("loss").to_vector()[0];
  std::printf("%-52s ours %.8f ref %.8f\n", "loss", ours, ref);
  EXPECT_NEAR(ours, ref, 1e-5 * std::fabs(ref));
  tape.backward(loss);
  for (const nn::Parameter* p : m.parameters()) {
    const std::string key = "grad." + p->name;
    ASSERT_TRUE(g.contains(key)) << key;
    d = compare(p->grad.to_vector(), g.load(key).to_vector());
    std::printf("%-52s rel %.3e  max|diff| %.3e\n", p->name.c_str(), d.rel, d.max_abs);
    EXPECT_LE(d.rel, 1e-5) << p->name;
  }
}

TEST(LlamaParity, Llama3WithLlama3RopeScalingAndGqa) { check("llama3", nn::ModelFamily::kLlama); }
TEST(LlamaParity, Qwen2WithQkvBiasAndTiedEmbeddings) { check("qwen2", nn::ModelFamily::kQwen2); }
TEST(LlamaParity, Qwen3WithQkNormAndWideHeads) { check("qwen3", nn::ModelFamily::kQwen3); }
TEST(LlamaParity, MistralWithMultiQueryAttention) { check("mistral", nn::ModelFamily::kMistral); }

}  // namespace
}  // namespace fd
