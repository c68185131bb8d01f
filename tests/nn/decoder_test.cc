// Decoder: parameter names, shapes and order (Hugging Face GPT-2 state_dict),
// parameter counts, GPT-2 initialisation (statistics and determinism), the
// forward's shape and causality, the loss at a known point, and the gradient
// of the whole model against central finite differences of the loss.
#include "lib/nn/decoder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "lib/autograd/tape.h"

namespace fd::nn {
namespace {

GptConfig tiny_config() {
  GptConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 16;
  c.vocab_size = 32;
  c.max_seq_len = 8;
  return c;
}

// (B, T) i32 tokens from a fixed generator.
Tensor random_tokens(int64_t B, int64_t T, int V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(0, V - 1);
  Tensor t = Tensor::empty(Shape{B, T}, DType::kI32);
  for (int64_t i = 0; i < B * T; ++i) t.i32()[i] = dist(rng);
  return t;
}

float loss_no_grad(const Decoder& m, const Tensor& tokens, const Tensor& targets) {
  autograd::NoGradGuard no_grad;
  return m.loss(tokens, targets).value().to_vector()[0];
}

// The names and shapes of GPT2LMHeadModel.transformer.state_dict() (Conv1D
// weights are (in, out)), written out independently of gpt.cc.
std::vector<std::pair<std::string, Shape>> hf_state_dict(const GptConfig& c) {
  const int64_t C = c.d_model, V = c.vocab_size, T = c.max_seq_len;
  std::vector<std::pair<std::string, Shape>> out = {{"wte.weight", Shape{V, C}},
                                                    {"wpe.weight", Shape{T, C}}};
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    out.insert(out.end(), {{h + "ln_1.weight", Shape{C}},
                           {h + "ln_1.bias", Shape{C}},
                           {h + "attn.c_attn.weight", Shape{C, 3 * C}},
                           {h + "attn.c_attn.bias", Shape{3 * C}},
                           {h + "attn.c_proj.weight", Shape{C, C}},
                           {h + "attn.c_proj.bias", Shape{C}},
                           {h + "ln_2.weight", Shape{C}},
                           {h + "ln_2.bias", Shape{C}},
                           {h + "mlp.c_fc.weight", Shape{C, 4 * C}},
                           {h + "mlp.c_fc.bias", Shape{4 * C}},
                           {h + "mlp.c_proj.weight", Shape{4 * C, C}},
                           {h + "mlp.c_proj.bias", Shape{C}}});
  }
  out.insert(out.end(), {{"ln_f.weight", Shape{C}}, {"ln_f.bias", Shape{C}}});
  return out;
}

TEST(Decoder, ParametersFollowHuggingFaceStateDict) {
  GptConfig c = tiny_config();
  c.n_layer = 3;
  c.max_seq_len = 12;  // distinct from every other dimension
  Decoder m(c);
  const auto want = hf_state_dict(c);
  const auto got = m.parameters();
  ASSERT_EQ(got.size(), want.size());
  ASSERT_EQ(got.size(), size_t(2 + 12 * 3 + 2));
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i]->name, want[i].first) << "position " << i;
    EXPECT_EQ(got[i]->value.shape(), want[i].second) << want[i].first;
    EXPECT_EQ(m.find(want[i].first), got[i]) << want[i].first;
    // AdamW decays 2-D weights only.
    EXPECT_EQ(got[i]->decay, want[i].second.ndim() == 2) << want[i].first;
  }
  EXPECT_EQ(m.find("lm_head.weight"), nullptr);  // tied to wte, not a parameter
  EXPECT_EQ(m.find("h.3.ln_1.weight"), nullptr);
}

TEST(Decoder, SegmentsAreEmbedBlocksFinal) {
  GptConfig c = tiny_config();
  Decoder m(c);
  ASSERT_EQ(m.segments().size(), size_t(c.n_layer + 2));
  EXPECT_EQ(m.segments()[0]->name(), "embed");
  EXPECT_EQ(m.segments()[1]->name(), "h.0");
  EXPECT_EQ(m.segments()[2]->name(), "h.1");
  EXPECT_EQ(m.segments()[3]->name(), "final");
  EXPECT_EQ(m.segments()[0]->params().size(), 2u);
  EXPECT_EQ(m.segments()[3]->params().size(), 2u);
  for (int l = 0; l < c.n_layer; ++l) {
    for (const Parameter& p : m.segments()[size_t(l) + 1]->params())
      EXPECT_EQ(p.name.rfind("h." + std::to_string(l) + ".", 0), 0u) << p.name;
  }
}

TEST(Decoder, NumParamsIsTheSumOfParameterSizes) {
  for (GptConfig c : {tiny_config(), GptConfig{}, GptConfig{1, 1, 8, 3, 5}}) {
    Decoder m(c);
    int64_t sum = 0, group_sum = 0;
    for (const Parameter* p : m.parameters()) sum += p->value.numel();
    for (const auto& s : m.segments()) group_sum += s->param_numel();
    EXPECT_EQ(gpt2_config(c).num_params(), sum) << "L" << c.n_layer << " C" << c.d_model;
    EXPECT_EQ(group_sum, sum);
  }
}

TEST(Decoder, NumParamsOfGpt2Small) {
  // GPT2LMHeadModel.from_pretrained("gpt2"): 124,439,808 parameters (lm head tied).
  GptConfig c{12, 12, 768, 50257, 1024};
  EXPECT_EQ(gpt2_config(c).num_params(), 124439808);
  // 6N + 12·L·T·C at T = 1024.
  EXPECT_DOUBLE_EQ(gpt2_config(c).flops_per_token(1024), 6.0 * 124439808 + 12.0 * 12 * 1024 * 768);
}

struct Stats {
  double mean, std, frac_within_1std;
};

Stats stats(const std::vector<float>& v) {
  double s = 0, s2 = 0;
  for (float x : v) s += x;
  const double mean = s / double(v.size());
  for (float x : v) s2 += (x - mean) * (x - mean);
  const double std = std::sqrt(s2 / double(v.size()));
  int64_t within = 0;
  for (float x : v) within += std::fabs(x - mean) <= std ? 1 : 0;
  return {mean, std, double(within) / double(v.size())};
}

TEST(Decoder, InitGpt2Statistics) {
  // L = 2: residual std 0.02 / sqrt(4) = 0.01. C = 72 leaves padding after 1-D parameters.
  GptConfig c{2, 2, 72, 256, 64};
  Decoder m(c);
  // Start from garbage so that "init sets every element" is checked too.
  for (const Parameter* p : m.parameters()) p->value.fill_(5.0f);
  m.init_weights(1234);
  for (const Parameter* p : m.parameters()) {
    std::vector<float> v = p->value.to_vector();
    const bool is_ln = p->name.find("ln_") != std::string::npos;
    const bool is_weight = p->name.ends_with(".weight");
    if (is_ln && is_weight) {
      for (float x : v) ASSERT_EQ(x, 1.0f) << p->name;
    } else if (!is_weight) {
      for (float x : v) ASSERT_EQ(x, 0.0f) << p->name;
    } else {
      const bool resid = p->name.ends_with("c_proj.weight");
      const double want_std = resid ? 0.02 / std::sqrt(2.0 * c.n_layer) : 0.02;
      Stats st = stats(v);
      std::printf("  %-22s n %6zu  mean %+.2e  std %.5f (want %.5f)  |x|<=std %.3f\n",
                  p->name.c_str(), v.size(), st.mean, st.std, want_std, st.frac_within_1std);
      // n >= 4096: the sample std is within ~1.1% (1 sigma) of the true one.
      EXPECT_NEAR(st.std / want_std, 1.0, 0.05) << p->name;
      EXPECT_LE(std::fabs(st.mean), 5 * want_std / std::sqrt(double(v.size()))) << p->name;
      // Normal: 68.3% within one std (uniform would give 57.7%).
      EXPECT_NEAR(st.frac_within_1std, 0.6827, 0.03) << p->name;
    }
  }
  // Padding is zero and stays zero.
  int64_t padding = 0;
  for (const auto& s : m.segments()) {
    std::vector<float> flat = s->flat_params().to_vector();
    std::vector<bool> owned(flat.size(), false);
    for (const Parameter& p : s->params())
      for (int64_t i = 0; i < p.value.numel(); ++i) owned[size_t(p.offset + i)] = true;
    for (size_t j = 0; j < flat.size(); ++j)
      if (!owned[j]) {
        ++padding;
        EXPECT_EQ(flat[j], 0.0f) << s->name() << " padding " << j;
      }
  }
  EXPECT_GT(padding, 0);
}

TEST(Decoder, InitGpt2IsAFunctionOfSeedNameAndIndex) {
  GptConfig c = tiny_config();
  Decoder a(c), b(c), other_seed(c);
  a.init_weights(7);
  b.init_weights(7);
  other_seed.init_weights(8);
  for (const Parameter* p : a.parameters()) {
    std::vector<float> va = p->value.to_vector();
    EXPECT_EQ(va, b.find(p->name)->value.to_vector()) << p->name;
    if (p->decay) {
      std::vector<float> vo = other_seed.find(p->name)->value.to_vector();
      int64_t same = 0;
      for (size_t i = 0; i < va.size(); ++i) same += va[i] == vo[i] ? 1 : 0;
      EXPECT_EQ(same, 0) << p->name << ": seeds 7 and 8 agree on " << same << " elements";
    }
  }
  // Two parameters of equal shape get different values (the name enters the hash).
  EXPECT_NE(a.find("h.0.attn.c_attn.weight")->value.to_vector(),
            a.find("h.1.attn.c_attn.weight")->value.to_vector());

  // A deeper, wider-vocabulary model: the shared parameters are bitwise equal,
  // except the residual projections, whose std scales with 1/sqrt(2L).
  GptConfig c3 = c;
  c3.n_layer = 3;
  c3.vocab_size = 40;
  Decoder deep(c3);
  deep.init_weights(7);
  EXPECT_EQ(a.find("h.0.attn.c_attn.weight")->value.to_vector(),
            deep.find("h.0.attn.c_attn.weight")->value.to_vector());
  EXPECT_EQ(a.find("h.1.mlp.c_fc.weight")->value.to_vector(),
            deep.find("h.1.mlp.c_fc.weight")->value.to_vector());
  EXPECT_EQ(a.find("wpe.weight")->value.to_vector(), deep.find("wpe.weight")->value.to_vector());
  // wte (V, C) row-major: the first 32 rows are the same elements.
  std::vector<float> wte2 = a.find("wte.weight")->value.to_vector();
  std::vector<float> wte3 = deep.find("wte.weight")->value.to_vector();
  EXPECT_TRUE(std::equal(wte2.begin(), wte2.end(), wte3.begin()));
  std::vector<float> p2 = a.find("h.0.attn.c_proj.weight")->value.to_vector();
  std::vector<float> p3 = deep.find("h.0.attn.c_proj.weight")->value.to_vector();
  const double ratio = std::sqrt(2.0 * 3) / std::sqrt(2.0 * 2);  // std_L2 / std_L3
  for (size_t i = 0; i < p2.size(); ++i)
    ASSERT_NEAR(double(p3[i]) * ratio, double(p2[i]), 1e-6 * std::fabs(p2[i]) + 1e-12) << i;
}

TEST(Decoder, ForwardShapeAndCausality) {
  GptConfig c = tiny_config();
  Decoder m(c);
  m.init_weights(3);
  const int64_t B = 2, T = 6;
  Tensor tokens = random_tokens(B, T, c.vocab_size, 11);
  autograd::NoGradGuard no_grad;
  std::vector<float> base = m.forward(tokens).value().to_vector();
  ASSERT_EQ(m.forward(tokens).shape(), (Shape{B, T, c.vocab_size}));
  ASSERT_EQ(base.size(), size_t(B * T * c.vocab_size));
  for (float x : base) ASSERT_TRUE(std::isfinite(x));

  // Change the token at position 3 of row 1: logits of row 1 at positions < 3
  // and all of row 0 must be bitwise unchanged, position 3 must change.
  Tensor changed = random_tokens(B, T, c.vocab_size, 11);
  changed.i32()[1 * T + 3] = (changed.i32()[1 * T + 3] + 1) % c.vocab_size;
  std::vector<float> after = m.forward(changed).value().to_vector();
  const int64_t V = c.vocab_size;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const bool must_equal = b == 0 || t < 3;
      bool equal = std::equal(base.begin() + (b * T + t) * V, base.begin() + (b * T + t + 1) * V,
                              after.begin() + (b * T + t) * V);
      if (must_equal) {
        EXPECT_TRUE(equal) << "b " << b << " t " << t;
      }
      if (b == 1 && t == 3) {
        EXPECT_FALSE(equal);
      }
    }
  }
  // A shorter sequence gives the same logits for the positions it has (positions
  // cache is per shape).
  Tensor prefix = Tensor::empty(Shape{1, 4}, DType::kI32);
  std::copy(tokens.i32(), tokens.i32() + 4, prefix.i32());
  std::vector<float> short_logits = m.forward(prefix).value().to_vector();
  for (size_t i = 0; i < short_logits.size(); ++i)
    EXPECT_NEAR(short_logits[i], base[i], 1e-5f) << i;
}

TEST(Decoder, LossIsLogVocabWhenLogitsAreZero) {
  GptConfig c = tiny_config();
  Decoder m(c);
  m.init_weights(5);
  Tensor tokens = random_tokens(2, 8, c.vocab_size, 1);
  Tensor targets = random_tokens(2, 8, c.vocab_size, 2);
  const double ln_v = std::log(double(c.vocab_size));
  // GPT-2 init: logits have std ~ 0.02 * sqrt(C) = 0.08, so the loss is within a few % of ln V.
  const float init_loss = loss_no_grad(m, tokens, targets);
  std::printf("  loss at init %.5f, ln V %.5f\n", init_loss, ln_v);
  EXPECT_NEAR(init_loss, ln_v, 0.05);
  // ln_f.weight = ln_f.bias = 0 makes every logit exactly 0: loss = ln V to fp32 rounding.
  m.find("ln_f.weight")->value.zero_();
  EXPECT_NEAR(loss_no_grad(m, tokens, targets), ln_v, 1e-5);
  // Ignored targets do not count: half of them -1 gives the same mean.
  for (int i = 0; i < 16; i += 2) targets.i32()[i] = -1;
  EXPECT_NEAR(loss_no_grad(m, tokens, targets), ln_v, 1e-5);
}

// Every parameter away from the GPT-2 init (random biases and norm parameters
// too), so that no gradient is trivially zero or structurally special.
void randomise(Decoder& m, uint32_t seed) {
  m.init_weights(seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.0f, 0.1f);
  for (const Parameter* p : m.parameters())
    for (int64_t i = 0; i < p->value.numel(); ++i) p->value.f32()[i] += noise(rng);
}

class GptGradient : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = std::make_unique<Decoder>(tiny_config());
    randomise(*model_, 99);
    tokens_ = random_tokens(2, 6, tiny_config().vocab_size, 21);
    targets_ = random_tokens(2, 6, tiny_config().vocab_size, 22);
    targets_.i32()[4] = -1;  // an ignored position
    model_->zero_grads();
    autograd::Tape tape;
    autograd::TapeScope scope(tape);
    autograd::Variable loss = model_->loss(tokens_, targets_);
    tape.backward(loss);
  }

  // (L(x + h) - L(x - h)) / (x+ - x-) for element i of p, with the stored fp32
  // values of x±h as the actual step. Leaves the element as it was.
  double central_difference(const Parameter& p, int64_t i, double h) const {
    float* x = p.value.f32() + i;
    const float x0 = *x;
    *x = float(x0 + h);
    const double xp = *x, lp = loss_no_grad(*model_, tokens_, targets_);
    *x = float(x0 - h);
    const double xm = *x, lm = loss_no_grad(*model_, tokens_, targets_);
    *x = x0;
    return (lp - lm) / (xp - xm);
  }

  std::unique_ptr<Decoder> model_;
  Tensor tokens_, targets_;
};

// For every parameter tensor, the element with the largest |gradient| and two
// random elements: backprop against central differences of the fp32 loss.
// With h = 1e-2 the truncation error is ~1e-5 relative here; fp32 rounding of
// the loss (one ulp is 2.4e-7 at ~3.5) adds ~1.2e-5 absolute per ulp.
TEST_F(GptGradient, ElementsMatchFiniteDifferences) {
  const double h = 1e-2, kNoiseFloor = 4 * 2.4e-7 / (2 * h);
  std::mt19937 rng(5);
  double worst = 0;
  int checked = 0;
  for (const Parameter* p : model_->parameters()) {
    std::vector<float> g = p->grad.to_vector();
    const int64_t n = int64_t(g.size());
    double gmax = 0;
    int64_t imax = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (std::fabs(g[size_t(i)]) > gmax) {
        gmax = std::fabs(g[size_t(i)]);
        imax = i;
      }
    }
    ASSERT_GT(gmax, 0.0) << p->name << " has an all-zero gradient";
    std::uniform_int_distribution<int64_t> pick(0, n - 1);
    for (int64_t i : {imax, pick(rng), pick(rng)}) {
      const double fd = central_difference(*p, i, h);
      const double bp = g[size_t(i)];
      // 2% of the element plus the noise floor: the loss (~3.5) is rounded to
      // 2.4e-7, so each difference quotient carries ~1e-5 of pure rounding.
      const double tol = 2e-2 * std::fabs(bp) + kNoiseFloor;
      worst = std::max(worst, std::fabs(fd - bp) / tol);
      ++checked;
      EXPECT_LE(std::fabs(fd - bp), tol)
          << p->name << "[" << i << "] backprop " << bp << " fd " << fd;
    }
  }
  std::printf("  %d elements, largest |fd - backprop| / tolerance %.3f\n", checked, worst);
}

// The whole gradient at once: the directional derivative along a random
// direction d over all parameters, (L(x + hd) - L(x - hd)) / 2h, against <grad, d>.
TEST_F(GptGradient, DirectionalDerivativeOfAllParameters) {
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const double h = 1e-3;
  double dot = 0, grad_norm2 = 0;
  std::vector<std::vector<float>> saved, plus, minus;
  for (const Parameter* p : model_->parameters()) saved.push_back(p->value.to_vector());
  // Build x + hd and x - hd in fp32 and use their actual difference in <grad, d>.
  for (size_t k = 0; k < saved.size(); ++k) {
    const Parameter* p = model_->parameters()[k];
    std::vector<float> g = p->grad.to_vector(), xp(saved[k]), xm(saved[k]);
    for (size_t i = 0; i < xp.size(); ++i) {
      const float d = normal(rng);
      xp[i] = float(saved[k][i] + h * d);
      xm[i] = float(saved[k][i] - h * d);
      dot += double(g[i]) * (double(xp[i]) - double(xm[i]));
      grad_norm2 += double(g[i]) * double(g[i]);
    }
    plus.push_back(xp);
    minus.push_back(xm);
  }
  auto set = [&](const std::vector<std::vector<float>>& vals) {
    for (size_t k = 0; k < vals.size(); ++k)
      model_->parameters()[k]->value.copy_from(
          Tensor::from_vector(vals[k], model_->parameters()[k]->value.shape()));
  };
  set(plus);
  const double lp = loss_no_grad(*model_, tokens_, targets_);
  set(minus);
  const double lm = loss_no_grad(*model_, tokens_, targets_);
  set(saved);
  const double fd = lp - lm, bp = dot;  // both are the change over the step 2hd
  // Scale: |<grad, 2hd>| is ~ 2h |grad| for a random d.
  const double rel = std::fabs(fd - bp) / (2 * h * std::sqrt(grad_norm2));
  std::printf("  dL over 2hd: fd %.6e  backprop %.6e  |grad| %.4f  rel %.3e\n", fd, bp,
              std::sqrt(grad_norm2), rel);
  EXPECT_LE(rel, 2e-3);
}

// Backward accumulates (+=) into the groups' flat gradient buffers; zero_grads clears them.
TEST_F(GptGradient, GradientsAccumulateUntilZeroed) {
  std::vector<float> once = model_->segments()[1]->flat_grads().to_vector();
  {
    autograd::Tape tape;
    autograd::TapeScope scope(tape);
    tape.backward(model_->loss(tokens_, targets_));
  }
  std::vector<float> twice = model_->segments()[1]->flat_grads().to_vector();
  for (size_t i = 0; i < once.size(); ++i)
    ASSERT_NEAR(twice[i], 2 * once[i], 1e-6f + 1e-5f * std::fabs(once[i])) << i;
  model_->zero_grads();
  for (const auto& s : model_->segments())
    for (float x : s->flat_grads().to_vector()) ASSERT_EQ(x, 0.0f);
}

}  // namespace
}  // namespace fd::nn
