// optim::AdamW over flat groups against a float64 transcription of
// torch.optim.AdamW: decay only where Parameter::decay is set, padding
// skipped, several groups, a different learning rate every step.
#include "lib/optim/adamw.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace fd::optim {
namespace {

using nn::FlatParamGroup;
using nn::Parameter;

// torch.optim.AdamW (amsgrad=False, maximize=False), one element, in double.
struct RefAdamW {
  double p, m = 0, v = 0;
  void step(double g, double lr, const AdamWOptions& o, double wd, int t) {
    p *= 1 - lr * wd;
    m = o.beta1 * m + (1 - double(o.beta1)) * g;
    v = o.beta2 * v + (1 - double(o.beta2)) * g * g;
    const double bc1 = 1 - std::pow(double(o.beta1), t);
    const double bc2 = 1 - std::pow(double(o.beta2), t);
    p -= lr / bc1 * m / (std::sqrt(v) / std::sqrt(bc2) + o.eps);
  }
};

// "w" (3, 5) decayed, "b" (5) not, "w2" (2, 8) decayed: three runs with padding between.
std::vector<nn::ParamSpec> mixed_specs() {
  return {{"w", Shape{3, 5}, true}, {"b", Shape{5}, false}, {"w2", Shape{2, 8}, true}};
}

void fill_random(const Tensor& t, std::mt19937& rng, float scale) {
  std::normal_distribution<float> n(0.0f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = n(rng);
}

TEST(OptimAdamW, ThreeStepsMatchTorchReference) {
  FlatParamGroup g1("g1", mixed_specs(), DType::kF32);
  // Two decayed parameters back to back (one run) and a bias.
  FlatParamGroup g2("g2",
                    {{"x", Shape{4, 4}, true}, {"y", Shape{2, 8}, true}, {"z", Shape{3}, false}},
                    DType::kF32);
  const std::vector<const FlatParamGroup*> groups = {&g1, &g2};
  AdamWOptions o;
  o.beta1 = 0.9f;
  o.beta2 = 0.95f;
  o.eps = 1e-8f;
  o.weight_decay = 0.1f;
  o.lr = 1.0f;  // unused by step(lr): the schedule's lr is passed in
  std::mt19937 rng(42);
  struct Elem {
    const FlatParamGroup* group;
    const Parameter* param;
    int64_t index;
    double p0;
    RefAdamW ref;
  };
  std::vector<Elem> elems;
  for (const FlatParamGroup* g : groups) {
    for (const Parameter& p : g->params()) {
      fill_random(p.value, rng, 1.0f);
      for (int64_t i = 0; i < p.value.numel(); ++i)
        elems.push_back({g, &p, i, p.value.f32()[i], RefAdamW{p.value.f32()[i]}});
    }
  }
  AdamW opt(groups, o);
  EXPECT_EQ(opt.steps_taken(), 0);
  const float lrs[3] = {1e-2f, 5e-3f, 2e-2f};
  for (int t = 1; t <= 3; ++t) {
    for (const FlatParamGroup* g : groups) {
      for (const Parameter& p : g->params()) fill_random(p.grad, rng, 0.1f);
      if (t == 2) g->params()[0].grad.f32()[1] = 0.0f;  // momentum and decay only
    }
    opt.step(lrs[t - 1]);
    EXPECT_EQ(opt.steps_taken(), t);
    for (Elem& e : elems) {
      const float g = e.param->grad.f32()[e.index];
      e.ref.step(g, lrs[t - 1], o, e.param->decay ? o.weight_decay : 0.0, t);
    }
  }
  // The change of each parameter is what the update computes: ||Δp - Δref|| / ||Δref||.
  double diff2 = 0, ref2 = 0, max_diff = 0;
  for (const Elem& e : elems) {
    const double dp = double(e.param->value.f32()[e.index]) - e.p0, dref = e.ref.p - e.p0;
    diff2 += (dp - dref) * (dp - dref);
    ref2 += dref * dref;
    max_diff = std::max(max_diff, std::fabs(dp - dref));
    // Elementwise: fp32 rounding of p (~1) is 6e-8 per operation.
    EXPECT_LE(std::fabs(dp - dref), 5e-7) << e.group->name() << "." << e.param->name << "["
                                          << e.index << "] delta " << dp << " ref " << dref;
  }
  const double rel = std::sqrt(diff2 / ref2);
  std::printf("  %zu elements: rel err of param change %.3e  max diff %.3e\n", elems.size(), rel,
              max_diff);
  EXPECT_LE(rel, 1e-5);
}

// With zero gradients Adam's update is 0/(0 + eps) = 0 and only decoupled
// decay acts: decayed parameters shrink by (1 - lr*wd) per step, the others
// and the padding are bitwise unchanged.
TEST(OptimAdamW, DecayOnlyWhereFlaggedAndPaddingUntouched) {
  FlatParamGroup g("g", mixed_specs(), DType::kF32);
  g.flat_params().fill_(2.0f);  // padding included: it must stay 2
  AdamWOptions o;
  o.weight_decay = 0.5f;
  AdamW opt({&g}, o);
  opt.step(0.1f);
  opt.step(0.2f);
  const float want_decayed = 2.0f * (1 - 0.1f * 0.5f) * (1 - 0.2f * 0.5f);
  std::vector<float> flat = g.flat_params().to_vector();
  std::vector<bool> decayed(flat.size(), false);
  for (const Parameter& p : g.params())
    for (int64_t i = 0; i < p.value.numel(); ++i) decayed[size_t(p.offset + i)] = p.decay;
  for (size_t j = 0; j < flat.size(); ++j) {
    if (decayed[j])
      EXPECT_FLOAT_EQ(flat[j], want_decayed) << j;
    else
      EXPECT_EQ(flat[j], 2.0f) << j;  // bias and padding
  }
}

// Padding gradients are not read: a (contract-breaking) nonzero gradient in
// the padding neither moves the padding nor the parameters. Two decayed and
// two non-decayed parameters in a row, each followed by padding, so that a
// run must not be merged across padding.
TEST(OptimAdamW, PaddingGradientIsIgnored) {
  const std::vector<nn::ParamSpec> specs = {{"w", Shape{3, 5}, true},   // 0..14, pad 15
                                            {"w2", Shape{2, 8}, true},  // 16..31
                                            {"b", Shape{5}, false},     // 32..36, pad 37..47
                                            {"b2", Shape{3}, false}};   // 48..50, pad 51..63
  FlatParamGroup clean("g", specs, DType::kF32);
  FlatParamGroup dirty("g", specs, DType::kF32);
  ASSERT_EQ(dirty.param("b2").offset, 48);
  for (const FlatParamGroup* g : {&clean, &dirty}) {
    std::mt19937 r(7);
    for (const Parameter& p : g->params()) {
      fill_random(p.value, r, 1.0f);
      fill_random(p.grad, r, 1.0f);
    }
  }
  const std::vector<int64_t> padding = {15, 37, 47, 51, 63};
  for (int64_t j : padding) dirty.flat_grads().f32()[j] = 1000.0f;
  AdamWOptions o;
  o.weight_decay = 0.1f;
  AdamW a({&clean}, o), b({&dirty}, o);
  a.step(1e-2f);
  b.step(1e-2f);
  std::vector<float> pc = clean.flat_params().to_vector(), pd = dirty.flat_params().to_vector();
  EXPECT_EQ(pc, pd);
  for (int64_t j : padding) EXPECT_EQ(pd[size_t(j)], 0.0f) << j;
}

TEST(OptimAdamW, FirstStepMovesByLrTimesSign) {
  FlatParamGroup g("g", {{"w", Shape{2, 2}, true}}, DType::kF32);
  for (int i = 0; i < 4; ++i) g.flat_params().f32()[i] = 1.0f;
  const float grads[4] = {0.5f, -3.0f, 1e-3f, -2e-4f};
  for (int i = 0; i < 4; ++i) g.flat_grads().f32()[i] = grads[i];
  AdamW opt({&g}, AdamWOptions{});  // weight_decay 0 by default
  opt.step(0.01f);
  // m̂ = g, v̂ = g², so the step is lr * g / (|g| + eps).
  for (int i = 0; i < 4; ++i) {
    const double want = 1.0 - 0.01 * grads[i] / (std::fabs(grads[i]) + 1e-8);
    EXPECT_NEAR(g.flat_params().f32()[i], want, 1e-6) << i;
  }
}

// A shard in the middle of a group: decay runs are clipped to the shard, the
// update equals the whole-group update on those elements, others are untouched.
TEST(OptimAdamW, ShardUpdateEqualsTheSameElementsOfAWholeGroupUpdate) {
  FlatParamGroup whole("w", mixed_specs(), DType::kF32);
  FlatParamGroup part("p", mixed_specs(), DType::kF32);
  for (int64_t i = 0; i < whole.numel(); ++i) {
    float v = 0.01f * float((i * 7) % 23) - 0.1f, g = 0.003f * float((i * 5) % 17) - 0.02f;
    whole.flat_params().f32()[i] = part.flat_params().f32()[i] = v;
    whole.flat_grads().f32()[i] = part.flat_grads().f32()[i] = g;
  }
  AdamWOptions o;
  o.lr = 1e-2f;
  o.weight_decay = 0.1f;
  AdamW full(std::vector<const FlatParamGroup*>{&whole}, o);
  const int64_t begin = 16, count = 16;  // straddles two parameters
  AdamW shard({{&part, begin, count, part.flat_params().flat_slice(begin, count),
                part.flat_grads().flat_slice(begin, count), Tensor()}},
              o);
  EXPECT_EQ(shard.state_bytes(), 2 * 4 * count);
  std::vector<float> before = part.flat_params().to_vector();
  for (int s = 0; s < 3; ++s) {
    full.step(o.lr);
    shard.step(o.lr);
  }
  std::vector<float> a = whole.flat_params().to_vector(), b = part.flat_params().to_vector();
  for (int64_t i = 0; i < whole.numel(); ++i) {
    if (i >= begin && i < begin + count) {
      EXPECT_EQ(a[i], b[i]) << i;
    } else {
      EXPECT_EQ(b[i], before[i]) << i;
    }
  }
}

TEST(OptimAdamW, StateBytesAreTwoFp32BuffersPerGroup) {
  FlatParamGroup g1("g1", mixed_specs(), DType::kF32);             // 48 elements with padding
  FlatParamGroup g2("g2", {{"x", Shape{1}, false}}, DType::kF32);  // 16
  ASSERT_EQ(g1.numel(), 48);
  ASSERT_EQ(g2.numel(), 16);
  using Groups = std::vector<const FlatParamGroup*>;
  EXPECT_EQ(AdamW(Groups{&g1, &g2}, AdamWOptions{}).state_bytes(), 2 * 4 * (48 + 16));
  EXPECT_EQ(AdamW(Groups{}, AdamWOptions{}).state_bytes(), 0);
}

}  // namespace
}  // namespace fd::optim
