// generate(): the KV-cached decoding gives the tokens of the full re-run it
// replaced (the previous implementation, kept below as the reference);
// determinism in the seed, greedy and top-k decoding checked against the
// model's own logits, the context window rule, and the sampling distribution
// against softmax(logits / temperature) on a model whose logits do not depend
// on the context.
#include "lib/engine/generate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <vector>

#include "lib/autograd/tape.h"
#include "lib/base/rng.h"

namespace fd::engine {
namespace {

nn::GptConfig tiny() {
  nn::GptConfig c;
  c.n_layer = 1;
  c.n_head = 2;
  c.d_model = 16;
  c.vocab_size = 32;
  c.max_seq_len = 16;
  return c;
}

// Logits of the last position of a full forward of the last `ctx` tokens of `seq`.
std::vector<float> last_logits(const nn::Decoder& m, const std::vector<int32_t>& seq, int64_t ctx) {
  autograd::NoGradGuard no_grad;
  const int64_t V = m.config().vocab_size;
  const int64_t start = std::max<int64_t>(0, int64_t(seq.size()) - ctx);
  const int64_t T = int64_t(seq.size()) - start;
  Tensor tokens = Tensor::empty(Shape{1, T}, DType::kI32);
  std::copy(seq.begin() + start, seq.end(), tokens.i32());
  std::vector<float> all = m.forward(tokens).value().to_vector();
  return std::vector<float>(all.end() - V, all.end());
}
std::vector<float> last_logits(const nn::Decoder& m, const std::vector<int32_t>& seq) {
  return last_logits(m, seq, m.config().max_position_embeddings);
}

// The context generate() reads for each new token (generate.h): the whole
// sequence while it fits the window; once a window is full, its newest
// ceil(window / 2) tokens, growing again from there.
class ContextRule {
 public:
  ContextRule(int window, size_t prompt)
      : window_(window), len_(std::min<size_t>(window, prompt)) {}
  size_t length() const { return len_; }
  void advance() { len_ = int(len_) < window_ ? len_ + 1 : size_t(window_ + 1) / 2; }

 private:
  int window_;
  size_t len_;
};

// The previous generate(): a full forward of the last `window` tokens for
// every new token, no cache (verbatim but for the context rule, which
// `halve` switches to generate.h's; the two agree while the sequence fits).
std::vector<int32_t> full_rerun_generate(const nn::Decoder& model, const std::vector<int32_t>& prompt,
                                         const SampleOptions& options, bool halve) {
  autograd::NoGradGuard no_grad;
  const int V = int(model.config().vocab_size);
  const int ctx = options.max_context > 0
                      ? std::min(options.max_context, int(model.config().max_position_embeddings))
                      : int(model.config().max_position_embeddings);
  std::vector<int32_t> seq = prompt.empty() ? std::vector<int32_t>{options.start_token} : prompt;
  ContextRule rule(ctx, seq.size());
  std::vector<int32_t> out;
  std::vector<float> probs(static_cast<size_t>(V));
  std::vector<int> order(static_cast<size_t>(V));
  for (int i = 0; i < options.max_new_tokens; ++i) {
    int64_t start =
        std::max<int64_t>(0, int64_t(seq.size()) - (halve ? int64_t(rule.length()) : ctx));
    int64_t T = int64_t(seq.size()) - start;
    Tensor tokens = Tensor::empty(Shape{1, T}, DType::kI32);
    std::copy(seq.begin() + start, seq.end(), tokens.i32());
    std::vector<float> logits = model.forward(tokens).value().to_vector();
    const float* last = logits.data() + (T - 1) * V;
    float mx = *std::max_element(last, last + V);
    for (int v = 0; v < V; ++v) probs[v] = std::exp((last[v] - mx) / options.temperature);
    if (options.top_k > 0 && options.top_k < V) {
      std::iota(order.begin(), order.end(), 0);
      std::nth_element(order.begin(), order.begin() + options.top_k, order.end(),
                       [&](int a, int b) { return probs[a] > probs[b]; });
      for (int r = options.top_k; r < V; ++r) probs[order[r]] = 0.0f;
    }
    double total = std::accumulate(probs.begin(), probs.end(), 0.0);
    double u = uniform01(hash_words(options.seed, 0x5a3b1e, uint64_t(i))) * total;
    int pick = -1;
    for (int v = 0; v < V; ++v) {
      if (probs[v] <= 0.0f) continue;
      pick = v;
      u -= probs[v];
      if (u < 0) break;
    }
    seq.push_back(pick);
    out.push_back(pick);
    rule.advance();
  }
  return out;
}

class Generate : public ::testing::Test {
 protected:
  void SetUp() override {
    model_.init_weights(3);
    // Larger weights than GPT-2 init so that logits are well separated.
    for (const nn::Parameter* p : model_.parameters())
      if (p->decay)
        for (int64_t i = 0; i < p->value.numel(); ++i) p->value.f32()[i] *= 20.0f;
  }
  nn::Decoder model_{tiny()};

  // Each token of `out`, generated after `seq`, is the argmax of the model's
  // logits over the context generate() used; marks the tokens in `picked`.
  void expect_argmax(std::vector<int32_t> seq, const std::vector<int32_t>& out, int32_t prompt,
                     std::vector<bool>& picked) {
    ContextRule rule(tiny().max_seq_len, seq.size());
    for (size_t i = 0; i < out.size(); ++i) {
      std::vector<float> l = last_logits(model_, seq, int64_t(rule.length()));
      rule.advance();
      const int32_t want = int32_t(std::max_element(l.begin(), l.end()) - l.begin());
      EXPECT_EQ(out[i], want) << "prompt " << prompt << " token " << i;
      picked[size_t(out[i])] = true;
      seq.push_back(out[i]);
    }
  }
};

TEST_F(Generate, DeterministicInSeedAndInRange) {
  SampleOptions o;
  o.max_new_tokens = 24;
  o.temperature = 1.0f;
  o.top_k = 0;
  o.seed = 77;
  const std::vector<int32_t> prompt = {4, 5, 6};
  std::vector<int32_t> a = generate(model_, prompt, o);
  std::vector<int32_t> b = generate(model_, prompt, o);
  ASSERT_EQ(a.size(), 24u);
  EXPECT_EQ(a, b);
  for (int32_t t : a) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, tiny().vocab_size);
  }
  o.seed = 78;
  EXPECT_NE(generate(model_, prompt, o), a);
  o.max_new_tokens = 0;
  EXPECT_TRUE(generate(model_, prompt, o).empty());
}

// The cached decoding samples the tokens of the full re-run it replaced, for
// several prompts, seeds, temperatures and top-k, while the sequence fits the
// window (3 + 13 = 16 tokens; a shorter max_context too).
TEST_F(Generate, SameTokensAsTheFullRerun) {
  int differing_outputs = 0;
  std::vector<int32_t> previous;
  for (int k : {0, 1, 5}) {
    for (uint64_t seed : {1u, 2u, 3u}) {
      for (int32_t first = 0; first < 4; ++first) {
        SampleOptions o;
        o.max_new_tokens = 13;
        o.top_k = k;
        o.temperature = 0.6f + 0.4f * float(seed);
        o.seed = seed;
        o.max_context = first == 3 ? 10 : 0;
        if (first == 3) o.max_new_tokens = 7;
        const std::vector<int32_t> prompt = {first, 2 * first + 1, 31 - first};
        std::vector<int32_t> got = generate(model_, prompt, o);
        EXPECT_EQ(got, full_rerun_generate(model_, prompt, o, /*halve=*/false))
            << "k " << k << " seed " << seed << " prompt " << first;
        differing_outputs += got != previous;
        previous = got;
      }
    }
  }
  EXPECT_GT(differing_outputs, 20);  // the outputs are not all the same
}

// Past the window, the documented rule (keep the newest half, re-run it):
// 3 + 40 tokens through a 16-token window, and a prompt longer than the window.
TEST_F(Generate, PastTheWindowKeepsTheNewestHalf) {
  SampleOptions o;
  o.max_new_tokens = 40;
  o.top_k = 0;
  o.temperature = 1.0f;
  for (uint64_t seed : {4u, 5u}) {
    o.seed = seed;
    const std::vector<int32_t> prompt = {1, 2, 3};
    EXPECT_EQ(generate(model_, prompt, o), full_rerun_generate(model_, prompt, o, true));
    std::vector<int32_t> long_prompt(21);
    std::iota(long_prompt.begin(), long_prompt.end(), 5);
    EXPECT_EQ(generate(model_, long_prompt, o), full_rerun_generate(model_, long_prompt, o, true));
  }
  // The rule matters: the old crop (always the last 16 tokens) samples other tokens.
  o.seed = 4;
  EXPECT_NE(full_rerun_generate(model_, {1, 2, 3}, o, true),
            full_rerun_generate(model_, {1, 2, 3}, o, false));
}

// top_k = 1 is greedy: each token is the argmax of the last position's logits
// of the context generate() reads. 16 new tokens after a 3-token prompt run
// past the 16-token context, so the window rule is checked too. Several
// prompts, so that greedy picks more than one token overall.
TEST_F(Generate, TopOneIsArgmaxOfTheModelsLogits) {
  SampleOptions o;
  o.max_new_tokens = 16;
  o.top_k = 1;
  o.temperature = 0.8f;
  std::vector<bool> picked(size_t(tiny().vocab_size), false);
  for (int32_t first = 0; first < 8; ++first) {
    std::vector<int32_t> seq = {first, 2 * first + 1, 31 - first};
    std::vector<int32_t> out = generate(model_, seq, o);
    ASSERT_EQ(out.size(), 16u);
    expect_argmax(seq, out, first, picked);
  }
  EXPECT_GE(std::count(picked.begin(), picked.end(), true), 2);  // the check has teeth
}

// temperature 0 is greedy: each token is the argmax of the model's logits,
// whatever the seed, top_k and top_p; the same tokens as top_k = 1.
TEST_F(Generate, TemperatureZeroIsArgmax) {
  SampleOptions o;
  o.max_new_tokens = 16;
  o.temperature = 0.0f;
  o.top_k = 0;
  std::vector<bool> picked(size_t(tiny().vocab_size), false);
  for (int32_t first = 0; first < 8; ++first) {
    std::vector<int32_t> seq = {first, 2 * first + 1, 31 - first};
    o.seed = uint64_t(first) + 100;
    o.top_p = first % 2 ? 0.3f : 1.0f;
    std::vector<int32_t> out = generate(model_, seq, o);
    ASSERT_EQ(out.size(), 16u);
    SampleOptions top1 = o;
    top1.temperature = 0.8f;
    top1.top_k = 1;
    top1.top_p = 1.0f;
    EXPECT_EQ(out, generate(model_, seq, top1)) << "prompt " << first;
    expect_argmax(seq, out, first, picked);
  }
  EXPECT_GE(std::count(picked.begin(), picked.end(), true), 2);  // the check has teeth
}

// top_k = 3: every token is one of the three largest logits at its step.
TEST_F(Generate, TopKSamplesOnlyFromTheKLargest) {
  SampleOptions o;
  o.max_new_tokens = 40;
  o.top_k = 3;
  o.temperature = 5.0f;  // flat enough that all three get picked
  o.seed = 9;
  std::vector<int32_t> seq = {7};
  std::vector<int32_t> out = generate(model_, seq, o);
  int not_argmax = 0;
  ContextRule rule(tiny().max_seq_len, seq.size());
  for (size_t i = 0; i < out.size(); ++i) {
    std::vector<float> l = last_logits(model_, seq, int64_t(rule.length()));
    rule.advance();
    std::vector<float> sorted = l;
    std::sort(sorted.begin(), sorted.end(), std::greater<float>());
    EXPECT_GE(l[size_t(out[i])], sorted[2]) << "token " << i << " outside the top 3";
    not_argmax += l[size_t(out[i])] < sorted[0] ? 1 : 0;
    seq.push_back(out[i]);
  }
  EXPECT_GT(not_argmax, 0);
}

TEST_F(Generate, EmptyPromptStartsFromNewline) {
  SampleOptions o;
  o.max_new_tokens = 10;
  o.top_k = 0;
  o.temperature = 1.0f;
  EXPECT_EQ(generate(model_, {}, o), generate(model_, {10}, o));
}

// A model whose logits are the same for every context: ln_f maps everything
// to e_0 (weight 0, bias e_0), so logits[v] = wte[v, 0]. Generation then draws
// i.i.d. from softmax(logits / temperature) restricted to the top k.
class Sampling : public ::testing::Test {
 protected:
  void SetUp() override {
    model_.init_weights(1);
    model_.find("ln_f.weight")->value.zero_();
    Tensor bias = model_.find("ln_f.bias")->value;
    bias.zero_();
    bias.f32()[0] = 1.0f;
    const int64_t C = model_.config().hidden_size;
    for (int v = 0; v < kV; ++v) model_.find("wte.weight")->value.f32()[v * C] = logits_[v];
  }

  // Frequencies of N generated tokens against p = softmax(logits / T) over the top k.
  void check(float temperature, int top_k, int n) {
    std::vector<double> p(kV, 0.0);
    double z = 0;
    for (int v = 0; v < kV; ++v) {
      // logits_ are increasing, so the top k are the last k.
      if (top_k > 0 && v < kV - top_k) continue;
      p[v] = std::exp(double(logits_[v]) / temperature);
      z += p[v];
    }
    SampleOptions o;
    o.max_new_tokens = n;
    o.temperature = temperature;
    o.top_k = top_k;
    o.seed = 2024;
    std::vector<int32_t> out = generate(model_, {0}, o);
    std::vector<int> count(kV, 0);
    for (int32_t t : out) ++count[size_t(t)];
    for (int v = 0; v < kV; ++v) {
      p[v] /= z;
      const double f = double(count[v]) / n;
      const double sigma = std::sqrt(p[v] * (1 - p[v]) / n);
      std::printf("  T %.1f k %d token %d: freq %.4f  p %.4f  (%.1f sigma)\n", temperature, top_k,
                  v, f, p[v], sigma > 0 ? std::fabs(f - p[v]) / sigma : 0.0);
      if (p[v] == 0)
        EXPECT_EQ(count[v], 0) << "token " << v << " is outside the top " << top_k;
      else
        EXPECT_LE(std::fabs(f - p[v]), 5 * sigma) << "token " << v;
    }
  }

  // Draws n tokens at temperature 1 with top_k and top_p: exactly the tokens
  // of `nucleus` must come out, each as often as its softmax probability
  // renormalised over the nucleus (within 5 sigma).
  void check_nucleus(int top_k, float top_p, const std::vector<int>& nucleus, int n = 4000) {
    std::vector<double> p(kV, 0.0);
    double z = 0;
    for (int v : nucleus) {
      p[size_t(v)] = std::exp(double(logits_[v]));
      z += p[size_t(v)];
    }
    SampleOptions o;
    o.max_new_tokens = n;
    o.temperature = 1.0f;
    o.top_k = top_k;
    o.top_p = top_p;
    o.seed = 7;
    std::vector<int> count(kV, 0);
    for (int32_t t : generate(model_, {0}, o)) ++count[size_t(t)];
    std::vector<int> drawn;
    for (int v = 0; v < kV; ++v) {
      if (count[v] > 0) drawn.push_back(v);
      p[v] /= z;
      const double f = double(count[v]) / n;
      const double sigma = std::sqrt(p[v] * (1 - p[v]) / n);
      std::printf("  k %d p %.2f token %d: freq %.4f  p %.4f\n", top_k, top_p, v, f, p[v]);
      if (p[v] > 0) {
        EXPECT_LE(std::fabs(f - p[v]), 5 * sigma) << "token " << v;
      }
    }
    EXPECT_EQ(drawn, nucleus) << "top_k " << top_k << " top_p " << top_p;
  }

  static constexpr int kV = 8;
  const float logits_[kV] = {-1.0f, -0.5f, 0.0f, 0.25f, 0.5f, 1.0f, 1.5f, 2.0f};
  nn::Decoder model_{nn::GptConfig{1, 1, 8, kV, 4}};
};

TEST_F(Sampling, LogitsDoNotDependOnContext) {
  for (const std::vector<int32_t>& seq : {std::vector<int32_t>{0}, {3, 1, 7}, {6, 6, 6, 6, 2}}) {
    std::vector<float> l = last_logits(model_, seq);
    for (int v = 0; v < kV; ++v) ASSERT_NEAR(l[size_t(v)], logits_[v], 1e-6f);
  }
}

TEST_F(Sampling, FullSoftmaxAtTemperatureTwo) { check(2.0f, 0, 4000); }

TEST_F(Sampling, TopThreeAtTemperatureOne) { check(1.0f, 3, 4000); }

// Top-p on a hand-computed distribution. softmax(logits_) is, for tokens 0..7,
//   0.0189 0.0311 0.0513 0.0659 0.0846 0.1394 0.2299 0.3790,
// so from the likeliest down the cumulative sums are 0.3790 (7), 0.6089 (6),
// 0.7483 (5), 0.8329 (4), 0.8987 (3), 0.9500 (2), 0.9811 (1), 1 (0).
TEST_F(Sampling, TopPKeepsTheSmallestPrefixReachingP) {
  check_nucleus(0, 0.30f, {7});              // 0.3790 >= 0.30: the likeliest alone
  check_nucleus(0, 0.50f, {6, 7});           // 0.6089 >= 0.50 > 0.3790
  check_nucleus(0, 0.70f, {5, 6, 7});        // 0.7483 >= 0.70 > 0.6089
  check_nucleus(0, 0.85f, {3, 4, 5, 6, 7});  // 0.8987 >= 0.85 > 0.8329
  check_nucleus(0, 1.00f, {0, 1, 2, 3, 4, 5, 6, 7});
  check_nucleus(0, 1e-6f, {7});  // never empty
}

// Top-p applies to the distribution left by top-k, renormalised (as Hugging
// Face's warpers do): over tokens 5..7 the cumulative sums are 0.5065 (7),
// 0.8137 (6), 1, so p = 0.7 keeps {6, 7}; applied to the full distribution it
// would keep {5, 6, 7} (0.7483).
TEST_F(Sampling, TopPAppliesAfterTopK) { check_nucleus(3, 0.70f, {6, 7}); }

}  // namespace
}  // namespace fd::engine
