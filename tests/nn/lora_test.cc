// LoRA in the model: the trainable parameter count follows r*(in+out) over the
// adapted modules; with B = 0 the model computes exactly its base's loss; with
// B != 0 its logits equal those of the base with the adapters merged into the
// Conv1D weights (W + (B A)^T alpha/r) to 1e-5; only adapters train.
#include <gtest/gtest.h>

#include <cmath>

#include "lib/autograd/tape.h"
#include "lib/nn/decoder.h"

namespace fd::nn {
namespace {

GptConfig tiny() { return GptConfig{2, 2, 16, 64, 16}; }

LoraConfig adapters(std::vector<std::string> targets, std::vector<int> layers = {}) {
  LoraConfig l;
  l.r = 4;
  l.alpha = 8.0f;
  l.modules = lora_modules_for_targets(gpt2_config(tiny()), targets);
  l.layers = std::move(layers);
  return l;
}

void copy_base(const Decoder& from, const Decoder& lora_model) {
  auto dst = lora_model.frozen_parameters();
  auto src = from.parameters();
  ASSERT_EQ(dst.size(), src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    ASSERT_EQ(dst[i]->name, src[i]->name);
    dst[i]->value.copy_from(src[i]->value);
  }
}

Tensor ids(int64_t B, int64_t T, int mul, int add) {
  Tensor t = Tensor::empty(Shape{B, T}, DType::kI32);
  for (int64_t i = 0; i < B * T; ++i) t.i32()[i] = int32_t((i * mul + add) % 64);
  return t;
}

TEST(Lora, TrainableCountFollowsTheFormula) {
  const GptConfig c = tiny();
  const int64_t C = c.d_model;
  struct Case {
    std::vector<std::string> targets;
    std::vector<int> layers;
    int64_t per_block;  // r * (in + out) summed over the block's adapted modules
  } cases[] = {
      {{"c_attn"}, {}, 4 * (C + 3 * C)},
      {{"c_proj"}, {}, 4 * (C + C) + 4 * (4 * C + C)},  // both projections
      {{"c_attn", "c_fc", "mlp.c_proj"}, {1}, 4 * (C + 3 * C) + 4 * (C + 4 * C) + 4 * (4 * C + C)},
  };
  for (const Case& k : cases) {
    LoraConfig l = adapters(k.targets, k.layers);
    Decoder m(c, DType::kF32, {}, l);
    const int64_t blocks = k.layers.empty() ? c.n_layer : int64_t(k.layers.size());
    EXPECT_EQ(l.num_params(gpt2_config(c)), k.per_block * blocks);
    EXPECT_EQ(m.parameter_count(), k.per_block * blocks);
    // Only adapters are trainable; the whole base is frozen.
    for (const Parameter* p : m.parameters())
      EXPECT_NE(p->name.find(".lora_"), std::string::npos) << p->name;
    int64_t frozen = 0;
    for (const Parameter* p : m.frozen_parameters()) frozen += p->value.numel();
    EXPECT_EQ(frozen, gpt2_config(c).num_params());
  }
}

TEST(Lora, WithBZeroTheLossIsExactlyTheBaseLoss) {
  Decoder base(tiny());
  base.init_weights(3);
  Decoder lora(tiny(), DType::kF32, {}, adapters({"c_attn", "c_proj", "c_fc"}));
  lora.init_weights(3);
  copy_base(base, lora);
  for (const Parameter* p : lora.parameters()) {  // A is random, B zero (PEFT init)
    if (p->name.find(".lora_B.") == std::string::npos) continue;
    for (float v : p->value.to_vector()) ASSERT_EQ(v, 0.0f);
  }
  Tensor x = ids(2, 16, 7, 3), y = ids(2, 16, 5, 1);
  autograd::NoGradGuard no_grad;
  const float a = base.loss(x, y).value().to_vector()[0];
  const float b = lora.loss(x, y).value().to_vector()[0];
  EXPECT_EQ(a, b);
}

TEST(Lora, MergedWeightsGiveTheSameLogits) {
  const GptConfig c = tiny();
  Decoder base(c);
  base.init_weights(3);
  LoraConfig l = adapters({"c_attn", "c_proj", "c_fc"});
  Decoder lora(c, DType::kF32, {}, l);
  lora.init_weights(3);
  copy_base(base, lora);
  for (const Parameter* p : lora.parameters()) {  // give B values so the adapters matter
    std::vector<float> v = p->value.to_vector();
    for (size_t i = 0; i < v.size(); ++i)
      if (p->name.find(".lora_B.") != std::string::npos) v[i] = 0.05f * std::sin(float(i) + 1.0f);
    p->value.copy_from(Tensor::from_vector(v, p->value.shape()));
  }
  // Merge: W' (in, out) = W + (B A)^T * alpha / r, computed in double.
  Decoder merged(c);
  for (size_t i = 0; i < base.parameters().size(); ++i)
    merged.parameters()[i]->value.copy_from(base.parameters()[i]->value);
  const double s = double(l.alpha) / l.r;
  for (const Parameter* a : lora.parameters()) {
    if (a->name.find(".lora_A.") == std::string::npos) continue;
    std::string module = a->name.substr(0, a->name.find(".lora_A."));
    const Parameter* b = lora.find(module + ".lora_B.weight");
    const Parameter* w = merged.find(module + ".weight");
    ASSERT_TRUE(b && w);
    const int64_t r = a->value.shape()[0], in = a->value.shape()[1], out = b->value.shape()[0];
    std::vector<float> A = a->value.to_vector(), B = b->value.to_vector(), W = w->value.to_vector();
    for (int64_t i = 0; i < in; ++i)
      for (int64_t o = 0; o < out; ++o) {
        double d = 0;
        for (int64_t k = 0; k < r; ++k) d += double(B[o * r + k]) * A[k * in + i];
        W[i * out + o] = float(W[i * out + o] + d * s);
      }
    w->value.copy_from(Tensor::from_vector(W, w->value.shape()));
  }
  Tensor x = ids(2, 16, 7, 3);
  autograd::NoGradGuard no_grad;
  std::vector<float> u = lora.forward(x).value().to_vector(), m = merged.forward(x).value().to_vector();
  double num = 0, den = 0;
  for (size_t i = 0; i < u.size(); ++i) {
    num += (double(u[i]) - m[i]) * (double(u[i]) - m[i]);
    den += double(m[i]) * m[i];
  }
  const double rel = std::sqrt(num / den);
  std::printf("LoRA unmerged vs merged logits: ||diff|| / ||logits|| = %.3e\n", rel);
  EXPECT_LE(rel, 1e-5);
  // And the adapters do change the output (the test can fail).
  std::vector<float> plain = base.forward(x).value().to_vector();
  double moved = 0;
  for (size_t i = 0; i < u.size(); ++i) moved += std::fabs(double(u[i]) - plain[i]);
  EXPECT_GT(moved, 1e-3);
}

TEST(Lora, OnlyAdaptersReceiveGradients) {
  Decoder lora(tiny(), DType::kF32, {}, adapters({"c_attn"}));
  lora.init_weights(3);
  for (const Parameter* p : lora.frozen_parameters()) EXPECT_FALSE(p->grad.defined()) << p->name;
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  autograd::Variable loss = lora.loss(ids(2, 16, 7, 3), ids(2, 16, 5, 1));
  tape.backward(loss);
  bool any_b = false;
  for (const Parameter* p : lora.parameters()) {
    if (p->name.find(".lora_B.") == std::string::npos) continue;
    for (float g : p->grad.to_vector()) any_b = any_b || g != 0.0f;
  }
  EXPECT_TRUE(any_b);  // B learns first (A's gradient is zero while B is zero)
}

}  // namespace
}  // namespace fd::nn
