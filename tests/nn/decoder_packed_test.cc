// Packed rows (Decoder::loss with doc_starts): the loss and every gradient of a row holding
// several examples equal those of the examples run one by one, weighted by their targets
// (what the trainer's per-step normalisation does), for GPT-2 (learned positions) and the
// Llama family (RoPE, GQA); and no attention crosses examples (a probe that would change
// the loss if it did).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "lib/autograd/tape.h"
#include "lib/nn/decoder.h"

namespace fd::nn {
namespace {

DecoderConfig tiny_gpt2() {
  GptConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 16;
  c.vocab_size = 32;
  c.max_seq_len = 32;
  return gpt2_config(c);
}

DecoderConfig tiny_llama() {
  DecoderConfig c;
  c.family = ModelFamily::kLlama;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.vocab_size = 32;
  c.max_position_embeddings = 64;
  return c;
}

void randomise(Decoder& m, uint32_t seed) {
  m.init_weights(seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.0f, 0.1f);
  for (const Parameter* p : m.parameters())
    for (int64_t i = 0; i < p->value.numel(); ++i) p->value.f32()[i] += noise(rng);
}

struct Example {
  std::vector<int32_t> tokens, targets;  // inputs and their targets (-1: no loss)
};

Tensor i32(const std::vector<int32_t>& v, int64_t B, int64_t T) {
  Tensor t = Tensor::empty(Shape{B, T}, DType::kI32);
  std::copy(v.begin(), v.end(), t.i32());
  return t;
}

std::vector<Example> examples(int V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> tok(0, V - 1);
  std::vector<Example> out;
  for (int len : {5, 1, 9, 6}) {
    Example e;
    for (int i = 0; i < len; ++i) {
      e.tokens.push_back(tok(rng));
      // Targets on roughly two thirds of the positions, always on the last.
      e.targets.push_back(i == len - 1 || rng() % 3 != 0 ? tok(rng) : -1);
    }
    out.push_back(e);
  }
  return out;
}

int64_t targets_of(const Example& e) {
  return std::count_if(e.targets.begin(), e.targets.end(), [](int32_t t) { return t >= 0; });
}

// Every flat gradient of the model, concatenated.
std::vector<float> all_grads(const Decoder& m) {
  std::vector<float> g;
  for (const FlatParamGroup* s : m.groups()) {
    std::vector<float> v = s->flat_grads().to_vector();
    g.insert(g.end(), v.begin(), v.end());
  }
  return g;
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return diff / scale;
}

void check_packed_equals_one_by_one(const DecoderConfig& config, const char* name) {
  Decoder m(config);
  randomise(m, 3);
  const std::vector<Example> ex = examples(int(config.vocab_size), 8);
  // One row of T = 24 positions: the examples (21 positions), then 3 of padding.
  const int64_t T = 24;
  std::vector<int32_t> tokens, targets, starts;
  int64_t n_targets = 0;
  for (const Example& e : ex) {
    const int32_t start = int32_t(tokens.size());
    for (size_t i = 0; i < e.tokens.size(); ++i) {
      tokens.push_back(e.tokens[i]);
      targets.push_back(e.targets[i]);
      starts.push_back(start);
    }
    n_targets += targets_of(e);
  }
  while (int64_t(tokens.size()) < T) {
    starts.push_back(int32_t(tokens.size()));
    tokens.push_back(0);
    targets.push_back(-1);
  }

  m.zero_grads();
  double packed_loss = 0;
  {
    autograd::Tape tape;
    autograd::TapeScope scope(tape);
    autograd::Variable loss =
        m.loss(i32(tokens, 1, T), i32(targets, 1, T), nullptr, i32(starts, 1, T));
    packed_loss = loss.value().to_vector()[0];
    tape.backward(loss);
  }
  const std::vector<float> packed = all_grads(m);

  m.zero_grads();
  double alone_loss = 0;
  for (const Example& e : ex) {
    const int64_t n = int64_t(e.tokens.size());
    autograd::Tape tape;
    autograd::TapeScope scope(tape);
    autograd::Variable loss = m.loss(i32(e.tokens, 1, n), i32(e.targets, 1, n));
    const double w = double(targets_of(e)) / double(n_targets);
    alone_loss += loss.value().to_vector()[0] * w;
    tape.backward(loss, float(w));
  }
  const std::vector<float> alone = all_grads(m);
  const double rel = max_rel_diff(packed, alone);
  std::printf("%s: packed loss %.9f, one by one %.9f; gradients max rel diff %.3g\n", name,
              packed_loss, alone_loss, rel);
  EXPECT_NEAR(packed_loss, alone_loss, 1e-6 * std::abs(alone_loss));
  EXPECT_LE(rel, 1e-6);
}

TEST(DecoderPacked, Gpt2PackedEqualsOneByOne) {
  check_packed_equals_one_by_one(tiny_gpt2(), "gpt2");
}
TEST(DecoderPacked, LlamaPackedEqualsOneByOne) {
  check_packed_equals_one_by_one(tiny_llama(), "llama");
}

// The probe: targets only on the second example; changing every token of the first must
// leave the loss bit for bit unchanged, and would change it without doc_starts.
void check_probe(const DecoderConfig& config) {
  Decoder m(config);
  randomise(m, 4);
  const int64_t T = 12;
  std::vector<int32_t> a = {3, 7, 1, 9, 4}, b = {5, 2, 8, 6, 1, 2, 3};
  std::vector<int32_t> targets(5, -1), starts(5, 0);
  for (size_t i = 0; i < b.size(); ++i) {
    targets.push_back(int32_t((b[i] * 7 + 3) % config.vocab_size));
    starts.push_back(5);
  }
  auto loss_with = [&](const std::vector<int32_t>& first, bool packed) {
    std::vector<int32_t> tokens = first;
    tokens.insert(tokens.end(), b.begin(), b.end());
    autograd::NoGradGuard no_grad;
    return m
        .loss(i32(tokens, 1, T), i32(targets, 1, T), nullptr, packed ? i32(starts, 1, T) : Tensor())
        .value()
        .to_vector()[0];
  };
  const std::vector<int32_t> other = {11, 12, 13, 14, 15};
  EXPECT_EQ(loss_with(a, true), loss_with(other, true));
  EXPECT_NE(loss_with(a, false), loss_with(other, false));
}

TEST(DecoderPacked, Gpt2NoAttentionCrossesExamples) { check_probe(tiny_gpt2()); }
TEST(DecoderPacked, LlamaNoAttentionCrossesExamples) { check_probe(tiny_llama()); }

}  // namespace
}  // namespace fd::nn
