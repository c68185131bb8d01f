// KvDecoder against Decoder::forward: the logits of every position, decoded one
// token at a time over the KV cache (and in chunks), equal those of a full
// forward of the same prefix. Also with LoRA adapters (merged by the decoder)
// and with bf16 weights (read as fp32).
#include "lib/nn/kv_decoder.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "lib/autograd/tape.h"
#include "lib/base/rng.h"

namespace fd::nn {
namespace {

GptConfig config() {
  GptConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 16;
  c.vocab_size = 40;
  c.max_seq_len = 24;
  return c;
}

// GPT-2 init, weights scaled up so that attention is far from uniform and the
// logits vary a lot between positions.
void init(Decoder& m, uint64_t seed) {
  m.init_weights(seed);
  for (const Parameter* p : m.parameters())
    if (p->decay) {
      std::vector<float> v = p->value.to_vector();
      for (float& x : v) x *= 8.0f;
      p->value.copy_from(Tensor::from_vector(v, p->value.shape()));  // rounds to its dtype
    }
}

std::vector<int32_t> tokens(int n, uint64_t seed, int vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i)
    t[size_t(i)] = int32_t(hash_words(seed, uint64_t(i)) % uint64_t(vocab));
  return t;
}

// Logits (T x V) of the full forward of `seq`.
std::vector<float> full_logits(const Decoder& m, const std::vector<int32_t>& seq) {
  autograd::NoGradGuard no_grad;
  Tensor t = Tensor::empty(Shape{1, int64_t(seq.size())}, DType::kI32);
  std::copy(seq.begin(), seq.end(), t.i32());
  return m.forward(t).value().to_vector();
}

// Largest over positions of ||a_t - b_t|| / ||b_t||.
double max_rel(const std::vector<float>& a, const std::vector<float>& b, int V) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t r = 0; r * V < b.size(); ++r) {
    double d = 0, n = 0;
    for (int v = 0; v < V; ++v) {
      const double x = a[r * V + size_t(v)], y = b[r * V + size_t(v)];
      d += (x - y) * (x - y);
      n += y * y;
    }
    worst = std::max(worst, std::sqrt(d / n));
  }
  return worst;
}

// Decodes `seq` one token at a time; every position's logits, concatenated.
std::vector<float> decode_one_by_one(KvDecoder& d, const std::vector<int32_t>& seq) {
  std::vector<float> out;
  for (int32_t t : seq) {
    std::span<const float> l = d.append(std::span<const int32_t>(&t, 1));
    out.insert(out.end(), l.begin(), l.end());
  }
  return out;
}

TEST(KvDecoder, IncrementalLogitsEqualFullForwardAtEveryPosition) {
  Decoder m(config());
  init(m, 5);
  const int V = config().vocab_size;
  const std::vector<int32_t> seq = tokens(config().max_seq_len, 11, V);  // fills the cache
  KvDecoder d(m);
  std::vector<float> inc = decode_one_by_one(d, seq);
  EXPECT_EQ(d.length(), config().max_seq_len);
  std::vector<float> full = full_logits(m, seq);
  const double rel = max_rel(inc, full, V);
  std::printf("  incremental vs full forward, %zu positions: max rel %.2e\n", seq.size(), rel);
  EXPECT_LT(rel, 1e-5);
  // The check has teeth: a cache that forgot the first token is far off.
  std::vector<int32_t> other = seq;
  other[0] = (other[0] + 1) % V;
  EXPECT_GT(max_rel(inc, full_logits(m, other), V), 1e-3);

  // reset() starts over at position 0.
  d.reset();
  std::vector<float> again = decode_one_by_one(d, seq);
  EXPECT_EQ(again, inc);
}

TEST(KvDecoder, ChunksEqualOneByOne) {
  Decoder m(config());
  init(m, 6);
  const int V = config().vocab_size;
  const std::vector<int32_t> seq = tokens(20, 12, V);
  KvDecoder d(m);
  std::span<const int32_t> s(seq);
  std::span<const float> a = d.append(s.subspan(0, 7), /*all_logits=*/true);
  std::vector<float> chunked(a.begin(), a.end());
  std::span<const float> b = d.append(s.subspan(7, 5), true);
  chunked.insert(chunked.end(), b.begin(), b.end());
  std::vector<float> rest = decode_one_by_one(d, std::vector<int32_t>(seq.begin() + 12, seq.end()));
  chunked.insert(chunked.end(), rest.begin(), rest.end());
  EXPECT_LT(max_rel(chunked, full_logits(m, seq), V), 1e-5);
  // Without all_logits a chunk returns its last position's logits.
  d.reset();
  std::span<const float> last = d.append(s.subspan(0, 7));
  ASSERT_EQ(last.size(), size_t(V));
  EXPECT_LT(max_rel(std::vector<float>(last.begin(), last.end()),
                    std::vector<float>(chunked.begin() + 6 * V, chunked.begin() + 7 * V), V),
            1e-6);
}

// LoRA: the decoder merges W + alpha/r A^T B^T; the model's forward runs the
// adapters separately. B is made non-zero so that the adapters matter.
TEST(KvDecoder, MergesLoraAdapters) {
  LoraConfig lora;
  lora.r = 2;
  lora.alpha = 4.0f;
  lora.modules = {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"};
  lora.layers = {1};
  Decoder m(config(), DType::kF32, {}, lora);
  init(m, 7);
  for (const Parameter* p : m.parameters()) {
    std::vector<float> v = p->value.to_vector();
    for (size_t i = 0; i < v.size(); ++i) v[i] = 0.3f * (2.0f * uniform01(hash_words(3, i)) - 1.0f);
    p->value.copy_from(Tensor::from_vector(v, p->value.shape()));
  }
  const int V = config().vocab_size;
  const std::vector<int32_t> seq = tokens(18, 13, V);
  KvDecoder d(m);
  std::vector<float> full = full_logits(m, seq);
  const double rel = max_rel(decode_one_by_one(d, seq), full, V);
  std::printf("  LoRA: max rel %.2e\n", rel);
  EXPECT_LT(rel, 1e-5);
  // The adapters change the logits (so the merge was needed).
  Decoder base(config());
  for (const Parameter* p : base.parameters()) {
    for (const Parameter* q : m.frozen_parameters())
      if (q->name == p->name) p->value.copy_from(q->value);
  }
  EXPECT_GT(max_rel(full_logits(base, seq), full, V), 1e-2);
}

// bf16 weights are read as fp32: the decoder of a bf16 model matches the fp32
// forward of the same (rounded) weights.
TEST(KvDecoder, ReadsBf16WeightsAsFp32) {
  Decoder m16(config(), DType::kBF16);
  init(m16, 8);
  Decoder m32(config());
  for (size_t i = 0; i < m32.parameters().size(); ++i)
    m32.parameters()[i]->value.copy_from(m16.parameters()[i]->value);
  const int V = config().vocab_size;
  const std::vector<int32_t> seq = tokens(16, 14, V);
  KvDecoder d(m16);
  EXPECT_LT(max_rel(decode_one_by_one(d, seq), full_logits(m32, seq), V), 1e-5);
}

// The Llama family: RMSNorm, RoPE (with llama3 scaling), GQA/MQA, q/k norm,
// q/k/v biases, SwiGLU, tied and untied heads.
DecoderConfig family_config(ModelFamily f) {
  DecoderConfig c;
  c.family = f;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = f == ModelFamily::kMistral ? 1 : 2;
  c.head_dim = f == ModelFamily::kQwen3 ? 16 : 8;
  c.vocab_size = 40;
  c.max_position_embeddings = 64;
  c.norm_eps = 1e-6;
  c.rope_theta = f == ModelFamily::kLlama ? 500000.0 : 10000.0;
  if (f == ModelFamily::kLlama) {
    c.rope_scaling.kind = RopeScalingKind::kLlama3;
    c.rope_scaling.factor = 8.0;
    c.rope_scaling.original_max_position_embeddings = 8;
  }
  c.attention_bias = f == ModelFamily::kQwen2;
  c.qk_norm = f == ModelFamily::kQwen3;
  c.tie_word_embeddings = f == ModelFamily::kQwen2 || f == ModelFamily::kQwen3;
  return c;
}

TEST(KvDecoder, LlamaFamilyIncrementalEqualsFullForward) {
  for (ModelFamily f :
       {ModelFamily::kLlama, ModelFamily::kQwen2, ModelFamily::kQwen3, ModelFamily::kMistral}) {
    const DecoderConfig c = family_config(f);
    Decoder m(c);
    init(m, 21);
    // Norm weights and biases away from 1 and 0 so that they matter.
    for (const Parameter* p : m.parameters())
      if (!p->decay) {
        std::vector<float> v = p->value.to_vector();
        for (size_t i = 0; i < v.size(); ++i) v[i] += 0.3f * (uniform01(hash_words(9, i)) - 0.5f);
        p->value.copy_from(Tensor::from_vector(v, p->value.shape()));
      }
    const int V = int(c.vocab_size);
    const std::vector<int32_t> seq = tokens(30, 15, V);
    KvDecoder d(m, 40);
    EXPECT_EQ(d.capacity(), 40);
    std::vector<float> full = full_logits(m, seq);
    const double rel = max_rel(decode_one_by_one(d, seq), full, V);
    std::printf("  %s: max rel %.2e\n", family_name(f), rel);
    EXPECT_LT(rel, 1e-5) << family_name(f);
    d.reset();
    std::span<const float> a = d.append(std::span<const int32_t>(seq), /*all_logits=*/true);
    EXPECT_LT(max_rel(std::vector<float>(a.begin(), a.end()), full, V), 1e-5) << family_name(f);
  }
}

TEST(KvDecoder, LlamaFamilyMergesLoraOnEveryLinear) {
  const DecoderConfig c = family_config(ModelFamily::kLlama);
  LoraConfig lora;
  lora.r = 2;
  lora.alpha = 4.0f;
  lora.modules = lora_modules_for_targets(c, {"all-linear"});
  ASSERT_EQ(lora.modules.size(), 7u);
  Decoder m(c, DType::kF32, {}, lora);
  init(m, 22);
  for (const Parameter* p : m.parameters()) {
    std::vector<float> v = p->value.to_vector();
    for (size_t i = 0; i < v.size(); ++i) v[i] = 0.3f * (2.0f * uniform01(hash_words(4, i)) - 1.0f);
    p->value.copy_from(Tensor::from_vector(v, p->value.shape()));
  }
  const int V = int(c.vocab_size);
  const std::vector<int32_t> seq = tokens(20, 16, V);
  KvDecoder d(m);
  EXPECT_LT(max_rel(decode_one_by_one(d, seq), full_logits(m, seq), V), 1e-5);
}

// host_bytes() (what `fdtrain estimate` adds for the end-of-run sample) is what a decoder
// holds after appends of up to `rows` tokens: fp32 and bf16 weights, LoRA-merged linears, tied
// and untied heads, RoPE, GQA, q/k norm; and the same for the model on the counting device.
TEST(KvDecoder, HostBytesAreWhatTheDecoderHolds) {
  struct Case {
    const char* name;
    DecoderConfig c;
    DType dtype;
    bool lora;
  };
  DecoderConfig gpt = gpt2_config(config());
  std::vector<Case> cases = {{"gpt2 fp32", gpt, DType::kF32, false},
                             {"gpt2 bf16", gpt, DType::kBF16, false},
                             {"gpt2 fp32 lora", gpt, DType::kF32, true}};
  for (ModelFamily f :
       {ModelFamily::kLlama, ModelFamily::kMistral, ModelFamily::kQwen2, ModelFamily::kQwen3})
    cases.push_back({"llama family", family_config(f), DType::kBF16, f == ModelFamily::kQwen2});
  for (const Case& k : cases) {
    LoraConfig lora;
    if (k.lora) {
      lora.r = 2;
      lora.alpha = 4.0f;
      lora.modules = {block_linears(k.c)[0].module, block_linears(k.c).back().module};
    }
    Decoder m(k.c, k.dtype, {}, lora);
    m.init_weights(3);
    for (int cap : {0, 12}) {
      KvDecoder d(m, cap);
      const std::vector<int32_t> seq = tokens(7, 5, k.c.vocab_size);
      d.append(seq);
      d.append(std::span<const int32_t>(seq.data(), 1));
      EXPECT_EQ(d.bytes(), KvDecoder::host_bytes(m, cap, 7)) << k.name << " capacity " << cap;
    }
    DeviceScope on_meta(Device::meta());
    Decoder meta(k.c, k.dtype, {}, lora);
    EXPECT_EQ(KvDecoder::host_bytes(meta, 12, 7), KvDecoder::host_bytes(m, 12, 7)) << k.name;
  }
}

}  // namespace
}  // namespace fd::nn
