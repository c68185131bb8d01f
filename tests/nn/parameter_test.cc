// FlatParamGroup: the layout of parameters in one flat buffer (offsets,
// alignment, padding) and that every Parameter's value and grad are views
// that alias the group's flat buffers.
#include "lib/nn/parameter.h"

#include <gtest/gtest.h>

#include <vector>

namespace fd::nn {
namespace {

// 15, 5, 32 and 1 elements: one that needs padding, one shorter than the
// alignment, one that is an exact multiple of it, and a scalar-like tail.
std::vector<ParamSpec> specs() {
  return {{"a.weight", Shape{3, 5}, true},
          {"a.bias", Shape{5}, false},
          {"b.weight", Shape{2, 16}, true},
          {"b.bias", Shape{1}, false}};
}

TEST(FlatParamGroup, LayoutIsAlignedAndInOrder) {
  FlatParamGroup g("seg", specs(), DType::kF32);
  static_assert(FlatParamGroup::kAlignElems == 16);
  EXPECT_EQ(g.name(), "seg");
  EXPECT_EQ(g.dtype(), DType::kF32);
  ASSERT_EQ(g.params().size(), 4u);

  // Each start rounded up to a multiple of 16 elements after the previous parameter.
  const std::vector<int64_t> want_offsets = {0, 16, 32, 64};
  const std::vector<ParamSpec> s = specs();
  for (size_t i = 0; i < s.size(); ++i) {
    const Parameter& p = g.params()[i];
    EXPECT_EQ(p.name, s[i].name);
    EXPECT_EQ(p.value.shape(), s[i].shape) << p.name;
    EXPECT_EQ(p.grad.shape(), s[i].shape) << p.name;
    EXPECT_EQ(p.decay, s[i].decay) << p.name;
    EXPECT_EQ(p.offset, want_offsets[i]) << p.name;
    EXPECT_EQ(p.offset % FlatParamGroup::kAlignElems, 0) << p.name;
  }
  EXPECT_EQ(g.numel(), 80);  // 64 + 1 rounded up to 16
  EXPECT_EQ(g.param_numel(), 15 + 5 + 32 + 1);
  EXPECT_EQ(g.flat_params().shape(), Shape{80});
  EXPECT_EQ(g.flat_grads().shape(), Shape{80});
  EXPECT_EQ(&g.param("b.weight"), &g.params()[2]);
}

TEST(FlatParamGroup, ViewsAliasTheFlatBuffers) {
  FlatParamGroup g("seg", specs(), DType::kF32);
  for (const Parameter& p : g.params()) {
    EXPECT_EQ(p.value.storage(), g.flat_params().storage()) << p.name;
    EXPECT_EQ(p.grad.storage(), g.flat_grads().storage()) << p.name;
  }
  // Write a distinct value through every parameter view; it must appear in the
  // flat buffer at offset + index, and nowhere else.
  for (size_t k = 0; k < g.params().size(); ++k) {
    const Parameter& p = g.params()[k];
    for (int64_t i = 0; i < p.value.numel(); ++i) {
      p.value.f32()[i] = float(1000 * (k + 1) + i);
      p.grad.f32()[i] = -float(1000 * (k + 1) + i);
    }
  }
  std::vector<float> flat = g.flat_params().to_vector();
  std::vector<float> grads = g.flat_grads().to_vector();
  std::vector<bool> owned(flat.size(), false);
  for (size_t k = 0; k < g.params().size(); ++k) {
    const Parameter& p = g.params()[k];
    for (int64_t i = 0; i < p.value.numel(); ++i) {
      const size_t j = size_t(p.offset + i);
      EXPECT_EQ(flat[j], float(1000 * (k + 1) + i)) << p.name << "[" << i << "]";
      EXPECT_EQ(grads[j], -float(1000 * (k + 1) + i)) << p.name << "[" << i << "]";
      EXPECT_FALSE(owned[j]) << "element " << j << " belongs to two parameters";
      owned[j] = true;
    }
  }
  int padding = 0;
  for (size_t j = 0; j < flat.size(); ++j) {
    if (owned[j]) continue;
    ++padding;
    EXPECT_EQ(flat[j], 0.0f) << "padding element " << j;
    EXPECT_EQ(grads[j], 0.0f) << "padding element " << j;
  }
  EXPECT_EQ(padding, 80 - 53);

  // And the other way: a write into the flat buffer shows through the view.
  g.flat_params().f32()[16 + 3] = 7.5f;
  EXPECT_EQ(g.param("a.bias").value.to_vector()[3], 7.5f);
  g.flat_grads().f32()[64] = -2.5f;
  EXPECT_EQ(g.param("b.bias").grad.to_vector()[0], -2.5f);
}

TEST(FlatParamGroup, BuffersStartZeroAndZeroGradsClearsOnlyGrads) {
  FlatParamGroup g("seg", specs(), DType::kF32);
  for (float x : g.flat_params().to_vector()) ASSERT_EQ(x, 0.0f);
  for (float x : g.flat_grads().to_vector()) ASSERT_EQ(x, 0.0f);
  g.flat_params().fill_(3.0f);
  g.flat_grads().fill_(4.0f);
  g.zero_grads();
  for (float x : g.flat_grads().to_vector()) EXPECT_EQ(x, 0.0f);
  for (float x : g.flat_params().to_vector()) EXPECT_EQ(x, 3.0f);
}

TEST(FlatParamGroup, VarAccumulatesIntoTheGradView) {
  FlatParamGroup g("seg", specs(), DType::kF32);
  const Parameter& p = g.param("a.bias");
  autograd::Variable v = p.var();
  EXPECT_TRUE(v.requires_grad());
  EXPECT_EQ(v.value().storage(), g.flat_params().storage());
  // The leaf's gradient buffer is the group's gradient view.
  EXPECT_EQ(v.slot()->grad.storage(), g.flat_grads().storage());
  EXPECT_EQ(v.slot()->grad.offset(), p.grad.offset());
}

// pad_for resizes both flat buffers for a partition and back, any number of
// times: offsets, values and every view (and a Variable bound to one) stay as
// they were, the padding is zero, and a released buffer stays released with
// nothing accounted.
TEST(FlatParamGroup, PadForResizesUnderTheViews) {
  FlatParamGroup g("seg", specs(), DType::kF32);  // 80 elements: alignment only
  const Parameter& bias = g.param("a.bias");
  autograd::Variable v = bias.var();
  for (size_t k = 0; k < g.params().size(); ++k) {
    const Parameter& p = g.params()[k];
    for (int64_t i = 0; i < p.value.numel(); ++i) {
      p.value.f32()[i] = float(100 * (k + 1) + i);
      p.grad.f32()[i] = -float(100 * (k + 1) + i);
    }
  }
  const std::vector<float> params0 = g.flat_params().to_vector();
  const std::vector<float> grads0 = g.flat_grads().to_vector();
  MemoryAccountant& acct = MemoryAccountant::global();
  const int64_t held0 = acct.current(MemCategory::kParams);
  // 80 is a multiple of 16 x 1 and 16 x 5; 16 x 3 and 16 x 4 need more, 16 x 2 less than 16 x 4.
  for (int64_t shards : {3, 4, 2, 5, 1}) {
    SCOPED_TRACE(shards);
    g.pad_for(shards);
    const int64_t want = (80 + 16 * shards - 1) / (16 * shards) * (16 * shards);
    EXPECT_EQ(g.numel(), want);
    EXPECT_EQ(g.numel(), FlatParamGroup::padded_numel(specs(), shards));
    EXPECT_EQ(g.flat_grads().numel(), want);
    EXPECT_EQ(acct.current(MemCategory::kParams) - held0, (want - 80) * 4) << "the old bytes freed";
    const std::vector<float> flat = g.flat_params().to_vector();
    const std::vector<float> grads = g.flat_grads().to_vector();
    for (size_t j = 0; j < flat.size(); ++j) {
      EXPECT_EQ(flat[j], j < 80 ? params0[j] : 0.0f) << j;
      EXPECT_EQ(grads[j], j < 80 ? grads0[j] : 0.0f) << j;
    }
    for (const Parameter& p : g.params()) {
      EXPECT_EQ(p.value.storage(), g.flat_params().storage()) << p.name;
      EXPECT_EQ(p.grad.storage(), g.flat_grads().storage()) << p.name;
    }
    EXPECT_EQ(v.value().to_vector(), bias.value.to_vector());
    EXPECT_EQ(v.value().to_vector()[2], 202.0f);
  }

  GroupLayout released;
  released.params_resident = released.grads_resident = false;
  FlatParamGroup r("seg", specs(), DType::kF32, released);
  const int64_t before = acct.current(MemCategory::kParams) + acct.current(MemCategory::kGrads);
  r.pad_for(3);
  EXPECT_EQ(r.numel(), 96);
  EXPECT_FALSE(r.flat_params().storage()->resident());
  EXPECT_FALSE(r.flat_grads().storage()->resident());
  EXPECT_EQ(acct.current(MemCategory::kParams) + acct.current(MemCategory::kGrads), before);
  r.flat_params().storage()->acquire();
  EXPECT_EQ(acct.current(MemCategory::kParams) + acct.current(MemCategory::kGrads),
            before + 96 * 4);
}

TEST(FlatParamGroup, Bf16GroupUsesTheSameElementLayout) {
  FlatParamGroup g("seg", specs(), DType::kBF16);
  EXPECT_EQ(g.numel(), 80);
  EXPECT_EQ(g.flat_params().dtype(), DType::kBF16);
  EXPECT_EQ(g.params()[3].offset, 64);
  EXPECT_EQ(g.params()[3].value.dtype(), DType::kBF16);
}

}  // namespace
}  // namespace fd::nn
