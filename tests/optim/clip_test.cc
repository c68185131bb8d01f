// Global gradient norm over several flat groups and clipping as
// torch.nn.utils.clip_grad_norm_ does it.
#include "lib/optim/clip.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace fd::optim {
namespace {

using nn::FlatParamGroup;

// Two groups with padding: a has 3 + 5 elements, b has 1.
struct Groups {
  FlatParamGroup a{"a", {{"a.w", Shape{3}, true}, {"a.b", Shape{5}, false}}, DType::kF32};
  FlatParamGroup b{"b", {{"b.w", Shape{1}, true}}, DType::kF32};
  std::vector<const FlatParamGroup*> list() const { return {&a, &b}; }
};

void set(const nn::Parameter& p, const std::vector<float>& g) {
  p.grad.copy_from(Tensor::from_vector(g, p.grad.shape()));
}

TEST(Clip, NormAcrossGroupsIsExactForPythagoreanValues) {
  Groups g;
  set(g.a.param("a.w"), {3, 0, 0});
  set(g.a.param("a.b"), {0, 0, 4, 0, 0});
  set(g.b.param("b.w"), {12});
  EXPECT_DOUBLE_EQ(global_grad_norm(g.list()), 13.0);  // sqrt(9 + 16 + 144)
  EXPECT_DOUBLE_EQ(global_grad_norm({&g.a}), 5.0);
  EXPECT_DOUBLE_EQ(global_grad_norm({}), 0.0);
}

TEST(Clip, NormMatchesDoubleReference) {
  Groups g;
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0.0f, 1e-3f);
  double ref = 0;
  for (const FlatParamGroup* grp : g.list()) {
    for (const nn::Parameter& p : grp->params()) {
      std::vector<float> v(size_t(p.grad.numel()));
      for (float& x : v) {
        x = n(rng);
        ref += double(x) * double(x);
      }
      set(p, v);
    }
  }
  ref = std::sqrt(ref);
  const double got = global_grad_norm(g.list());
  std::printf("  norm %.12e  ref %.12e  rel %.2e\n", got, ref, std::fabs(got - ref) / ref);
  EXPECT_NEAR(got, ref, 1e-12 * ref);
}

TEST(Clip, ScalesEveryGroupByMaxNormOverNorm) {
  Groups g;
  set(g.a.param("a.w"), {3, 0, 0});
  set(g.a.param("a.b"), {0, 0, 4, 0, 0});
  set(g.b.param("b.w"), {12});
  const double norm = global_grad_norm(g.list());
  const float coef = clip_grad_norm(g.list(), norm, 6.5f);
  const double want = 6.5 / (13.0 + 1e-6);
  EXPECT_FLOAT_EQ(coef, float(want));
  EXPECT_FLOAT_EQ(g.a.param("a.w").grad.to_vector()[0], float(3 * want));
  EXPECT_FLOAT_EQ(g.a.param("a.b").grad.to_vector()[2], float(4 * want));
  EXPECT_FLOAT_EQ(g.b.param("b.w").grad.to_vector()[0], float(12 * want));
  EXPECT_NEAR(global_grad_norm(g.list()), 6.5, 1e-5);
  // Padding stays zero.
  std::vector<float> flat = g.a.flat_grads().to_vector();
  for (int64_t j = 3; j < 16; ++j) EXPECT_EQ(flat[size_t(j)], 0.0f) << j;
}

TEST(Clip, NoScalingBelowMaxNorm) {
  Groups g;
  set(g.a.param("a.w"), {3, 0, 0});
  set(g.b.param("b.w"), {4});
  std::vector<float> before_a = g.a.flat_grads().to_vector();
  EXPECT_EQ(clip_grad_norm(g.list(), global_grad_norm(g.list()), 5.5f), 1.0f);
  EXPECT_EQ(g.a.flat_grads().to_vector(), before_a);
  EXPECT_EQ(g.b.param("b.w").grad.to_vector()[0], 4.0f);
}

TEST(Clip, DisabledWhenMaxNormIsNotPositive) {
  Groups g;
  set(g.a.param("a.w"), {300, 0, 0});
  set(g.b.param("b.w"), {400});
  for (float max_norm : {0.0f, -1.0f}) {
    EXPECT_EQ(clip_grad_norm(g.list(), global_grad_norm(g.list()), max_norm), 1.0f);
    EXPECT_EQ(g.a.param("a.w").grad.to_vector()[0], 300.0f);
    EXPECT_EQ(g.b.param("b.w").grad.to_vector()[0], 400.0f);
  }
}

// The caller's norm is used as given (it may come from a reduction across ranks).
TEST(Clip, UsesTheNormPassedIn) {
  Groups g;
  set(g.b.param("b.w"), {1});
  const float coef = clip_grad_norm(g.list(), 4.0, 1.0f);
  EXPECT_FLOAT_EQ(coef, float(1.0 / (4.0 + 1e-6)));
  EXPECT_FLOAT_EQ(g.b.param("b.w").grad.to_vector()[0], 0.25f);
}

// torch adds 1e-6 to the norm; it shows at small norms: 1e-6 / (1e-5 + 1e-6) = 1/11.
TEST(Clip, EpsilonInTheDenominatorAsTorch) {
  Groups g;
  set(g.b.param("b.w"), {1e-5f});
  const double norm = global_grad_norm(g.list());
  EXPECT_NEAR(norm, 1e-5, 1e-12);
  const float coef = clip_grad_norm(g.list(), norm, 1e-6f);
  EXPECT_NEAR(coef, 1.0 / 11.0, 1e-6);
  EXPECT_NEAR(g.b.param("b.w").grad.to_vector()[0], 1e-5 / 11.0, 1e-11);
}

}  // namespace
}  // namespace fd::optim
