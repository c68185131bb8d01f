// QLoRA in the model (issue 37): a Decoder whose frozen base keeps its block linears in 4 bits
// computes what a plain LoRA Decoder computes over the dequantized base (loss, adapter gradients,
// to float rounding: the 4-bit path runs the same fp32 GEMMs panel by panel); its block segments
// hold the encoded bytes (quant::encoded_layout) in one u8 buffer each, counted as
// MemCategory::kQuantized; the embedding and final segments stay in the compute dtype.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "lib/autograd/tape.h"
#include "lib/base/rng.h"
#include "lib/nn/decoder.h"
#include "lib/nn/kv_decoder.h"

namespace fd::nn {
namespace {

DecoderConfig llama(bool bias) {
  DecoderConfig c;
  c.family = ModelFamily::kLlama;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 50;
  c.max_position_embeddings = 64;
  c.norm_eps = 1e-6;
  c.rope_theta = 10000.0;
  c.attention_bias = bias;
  return c;
}

LoraConfig all_linear(const DecoderConfig& c) {
  LoraConfig l;
  l.r = 4;
  l.alpha = 8.0f;
  l.modules = lora_modules_for_targets(c, {"all-linear"});
  return l;
}

Tensor ids(int64_t B, int64_t T, int mul, int add, int vocab) {
  Tensor t = Tensor::empty(Shape{B, T}, DType::kI32);
  for (int64_t i = 0; i < B * T; ++i) t.i32()[i] = int32_t((i * mul + add) % vocab);
  return t;
}

// B away from zero so the adapters (and their gradients to A) matter.
void give_b_values(const Decoder& m) {
  for (const Parameter* p : m.parameters()) {
    if (p->name.find(".lora_B.") == std::string::npos) continue;
    std::vector<float> v = p->value.to_vector();
    for (size_t i = 0; i < v.size(); ++i) v[i] = 0.05f * std::sin(float(i) + 1.0f);
    p->value.copy_from(Tensor::from_vector(v, p->value.shape()));
  }
}

// The plain twin's base: every frozen parameter of `q`, a 4-bit weight dequantized.
void copy_dequantized_base(const Decoder& q, const Decoder& plain) {
  const std::vector<const Parameter*> src = q.frozen_parameters(), dst = plain.frozen_parameters();
  ASSERT_EQ(src.size(), dst.size());
  for (size_t i = 0; i < src.size(); ++i) {
    ASSERT_EQ(src[i]->name, dst[i]->name);
    const std::vector<float> v =
        q.quantized(*src[i]) ? q.dequantized(*src[i]) : src[i]->value.to_vector();
    dst[i]->value.copy_from(Tensor::from_vector(v, dst[i]->value.shape()));
  }
}

double rel(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    n += double(b[i]) * b[i];
  }
  return n == 0 ? std::sqrt(d) : std::sqrt(d / n);
}

TEST(Qlora, LossAndAdapterGradientsEqualTheDequantizedTwin) {
  for (const quant::QuantOptions& o :
       {quant::QuantOptions{quant::QuantType::kNF4, 64, true},
        quant::QuantOptions{quant::QuantType::kFP4, 128, false}}) {
    for (bool bias : {false, true}) {
      const DecoderConfig c = llama(bias);
      Decoder q(c, DType::kF32, {}, all_linear(c), {}, {}, o);
      q.init_weights(5);
      give_b_values(q);
      Decoder plain(c, DType::kF32, {}, all_linear(c));
      plain.init_weights(5);
      give_b_values(plain);
      copy_dequantized_base(q, plain);
      // Quantization moved the weights (the test can fail): the twin is not the fp32 init.
      Decoder fp(c, DType::kF32, {}, all_linear(c));
      fp.init_weights(5);
      for (size_t i = 0; i < fp.frozen_parameters().size(); ++i) {
        const Parameter* w = fp.frozen_parameters()[i];
        if (w->name != "model.layers.1.self_attn.q_proj.weight") continue;
        EXPECT_GT(rel(plain.frozen_parameters()[i]->value.to_vector(), w->value.to_vector()), 1e-2);
      }

      const Tensor x = ids(2, 12, 7, 3, 50), y = ids(2, 12, 5, 1, 50);
      std::vector<float> losses;
      for (const Decoder* m : {&q, &plain}) {
        autograd::Tape tape;
        autograd::TapeScope scope(tape);
        autograd::Variable loss = m->loss(x, y);
        tape.backward(loss);
        losses.push_back(loss.value().to_vector()[0]);
      }
      std::printf("  %s block %lld dq %d bias %d: loss %.7f vs twin %.7f\n",
                  std::string(quant::quant_type_name(o.type)).c_str(), (long long)o.block_size,
                  int(o.double_quant), int(bias), losses[0], losses[1]);
      EXPECT_LE(std::fabs(losses[0] - losses[1]), 1e-5 * std::fabs(losses[1]));
      for (size_t i = 0; i < q.parameters().size(); ++i) {
        const Parameter* a = q.parameters()[i];
        const Parameter* b = plain.parameters()[i];
        ASSERT_EQ(a->name, b->name);
        EXPECT_LE(rel(a->grad.to_vector(), b->grad.to_vector()), 1e-5) << a->name;
      }
      // Generation reads the same dequantized base (KvDecoder).
      KvDecoder dq(q, 16), dp(plain, 16);
      const std::vector<int32_t> seq = {3, 14, 15, 9, 2, 6};
      std::span<const float> lq = dq.append(std::span<const int32_t>(seq));
      std::vector<float> a(lq.begin(), lq.end());
      std::span<const float> lp = dp.append(std::span<const int32_t>(seq));
      EXPECT_LE(rel(a, std::vector<float>(lp.begin(), lp.end())), 1e-6);
    }
  }
}

// GPT-2's Conv1D weights, stored (in, out), are quantized transposed ([out, in], as transformers
// stores a quantized Conv1D); the forward and the dequantized view agree with the twin.
TEST(Qlora, Gpt2Conv1dWeightsQuantizedTransposed) {
  const DecoderConfig c = gpt2_config(GptConfig{2, 2, 64, 50, 32});
  const quant::QuantOptions o{quant::QuantType::kNF4, 64, true};
  Decoder q(c, DType::kF32, {}, all_linear(c), {}, {}, o);
  // The base from a fill with biases and norm weights away from 0 and 1, so they matter.
  auto value = [&q](const Parameter& p, int64_t begin, int64_t count, const Tensor& out) {
    q.init_values(4, p, begin, count, out);
    if (p.decay) return;
    std::vector<float> v = out.to_vector();
    for (size_t i = 0; i < v.size(); ++i) v[i] += 0.2f * std::sin(float(begin + int64_t(i)) * 0.7f);
    out.copy_from(Tensor::from_vector(v, out.shape()));
  };
  const ParamFill fill = q.storage_fill(value);
  std::vector<const FlatParamGroup*> groups = q.frozen_groups();
  for (const FlatParamGroup* g : q.groups()) groups.push_back(g);  // the adapters: A random
  for (const FlatParamGroup* g : groups)
    for (const Parameter& p : g->params())
      fill(p, 0, p.value.numel(), p.value.flat_slice(0, p.value.numel()));
  give_b_values(q);
  for (const Parameter* p : q.frozen_parameters()) {
    if (p->name != "h.0.attn.c_attn.weight") continue;
    ASSERT_NE(q.quantized(*p), nullptr);
    EXPECT_EQ(p->value.shape(), (Shape{64, 192}));
    EXPECT_EQ(q.quantized(*p)->shape(), (std::vector<int64_t>{192, 64}));
    // The transpose's codes: quantize() of the (in, out) value transposed.
    Tensor v = Tensor::empty(Shape{64 * 192}, DType::kF32);
    q.init_values(4, *p, 0, 64 * 192, v);
    const std::vector<float> w = v.to_vector();
    std::vector<float> t(w.size());
    for (int64_t i = 0; i < 64; ++i)
      for (int64_t j = 0; j < 192; ++j) t[size_t(j * 64 + i)] = w[size_t(i * 192 + j)];
    EXPECT_EQ(q.quantized(*p)->to_quantized4bit().packed,
              quant::quantize(t, {192, 64}, o, p->name).packed);
  }
  Decoder plain(c, DType::kF32, {}, all_linear(c));
  plain.init_weights(4);
  give_b_values(plain);
  copy_dequantized_base(q, plain);
  bool moved = false;  // the biases did move
  for (const Parameter* p : plain.frozen_parameters())
    if (p->name == "h.1.mlp.c_fc.bias") moved = p->value.to_vector()[3] != 0.0f;
  EXPECT_TRUE(moved);
  const Tensor x = ids(2, 12, 7, 3, 50), y = ids(2, 12, 5, 1, 50);
  autograd::NoGradGuard no_grad;
  const float a = q.loss(x, y).value().to_vector()[0], b = plain.loss(x, y).value().to_vector()[0];
  std::printf("  gpt2: loss %.8f vs twin %.8f\n", a, b);
  EXPECT_LE(std::fabs(a - b), 1e-6 * std::fabs(b));
}

TEST(Qlora, BlockSegmentsHoldTheEncodedBytesInTheirOwnCategory) {
  const DecoderConfig c = llama(true);
  const quant::QuantOptions o{quant::QuantType::kNF4, 64, true};
  MemoryAccountant& acct = MemoryAccountant::global();
  const int64_t before = acct.current(MemCategory::kQuantized);
  Decoder q(c, DType::kBF16, {}, all_linear(c), {}, {}, o);
  q.init_weights(9);
  const std::vector<const FlatParamGroup*> groups = q.frozen_groups();
  ASSERT_EQ(groups.size(), 4u);  // embed, h.0, h.1, final
  EXPECT_EQ(groups[0]->dtype(), DType::kBF16);
  EXPECT_EQ(groups[3]->dtype(), DType::kBF16);
  int64_t block_bytes = 0;
  for (int g : {1, 2}) {
    const FlatParamGroup& grp = *groups[size_t(g)];
    EXPECT_EQ(grp.dtype(), DType::kU8);
    block_bytes += grp.numel();
    // Each member: a linear's encoded form, or a norm's / bias's bf16 bytes.
    for (const Parameter& p : grp.params()) {
      const bool linear = p.name.ends_with("_proj.weight");
      const Parameter* l = nullptr;
      for (const Parameter* f : q.frozen_parameters())
        if (f->name == p.name) l = f;
      ASSERT_NE(l, nullptr) << p.name;
      EXPECT_EQ(q.quantized(*l) != nullptr, linear) << p.name;
      EXPECT_EQ(l->value.dtype(), DType::kBF16) << p.name;
      const int64_t n = l->value.numel();
      EXPECT_EQ(p.value.numel(), linear ? quant::encoded_layout(n, o).bytes : 2 * n) << p.name;
      if (!linear) {  // the logical view reads the bytes
        EXPECT_EQ(l->value.storage(), grp.flat_params().storage());
      } else {  // the stored codes are quantize() of the bf16 initial value
        Tensor v = Tensor::empty(Shape{n}, DType::kBF16);
        q.init_values(9, *l, 0, n, v);
        const quant::Quantized4bit want =
            quant::quantize(v.to_vector(), q.quantized(*l)->shape(), o, p.name);
        const quant::Quantized4bit got = q.quantized(*l)->to_quantized4bit();
        EXPECT_EQ(got.packed, want.packed) << p.name;
        EXPECT_EQ(got.nested->codes, want.nested->codes) << p.name;
        EXPECT_EQ(got.nested->absmax, want.nested->absmax) << p.name;
        EXPECT_EQ(got.nested->offset, want.nested->offset) << p.name;
      }
    }
  }
  EXPECT_EQ(acct.current(MemCategory::kQuantized) - before, block_bytes);
  // About a quarter of the blocks' bf16 bytes (4.127 bits per weight with double quant).
  int64_t bf16 = 0;
  for (const SegmentSpec& s : Decoder::segment_specs(c))
    if (s.name.starts_with("h."))
      for (const ParamSpec& p : s.params) bf16 += 2 * p.shape.numel();
  std::printf("  blocks: %lld bytes in 4 bits vs %lld in bf16 (%.3f)\n", (long long)block_bytes,
              (long long)bf16, double(block_bytes) / double(bf16));
  EXPECT_LT(double(block_bytes) / double(bf16), 0.28);
}

TEST(Qlora, RefusedWithoutAdapters) {
  const DecoderConfig c = llama(false);
  EXPECT_DEATH(Decoder(c, DType::kF32, {}, {}, {}, {}, quant::QuantOptions{}), "needs LoRA");
}

}  // namespace
}  // namespace fd::nn
