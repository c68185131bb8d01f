// Linear4bit against a float64 reference matmul over the dequantized weight: the forward
// y = x W^T and the input gradient dx = dy W, fp32 and bf16 activations, with panels that do
// and do not divide the rows and blocks that straddle rows. Prints the largest relative
// difference.
#include "lib/quant/matmul_4bit.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace fd::quant {
namespace {

struct Problem {
  int64_t m, n, k;
  std::vector<float> w, x, dy;
};

Problem make(int64_t m, int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Problem p{m, n, k, {}, {}, {}};
  p.w.resize(size_t(n * k));
  p.x.resize(size_t(m * k));
  p.dy.resize(size_t(m * n));
  for (float& v : p.w) v = 0.02f * nd(rng);
  for (float& v : p.x) v = nd(rng);
  for (float& v : p.dy) v = nd(rng);
  return p;
}

// max over outputs of |got - ref| / sum_i |a_i b_i| (the scale of the dot product's rounding).
struct Diff {
  double max_rel = 0.0;
};

// ref y (m x n) = x (m x k) W^T in float64, plus the scale sum |x||w| per output.
void ref_forward(const std::vector<double>& x, const std::vector<double>& w, int64_t m, int64_t n,
                 int64_t k, std::vector<double>& y, std::vector<double>& scale) {
  y.assign(size_t(m * n), 0.0);
  scale.assign(size_t(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t l = 0; l < k; ++l) {
        y[i * n + j] += x[i * k + l] * w[j * k + l];
        scale[i * n + j] += std::fabs(x[i * k + l] * w[j * k + l]);
      }
}

void ref_backward(const std::vector<double>& dy, const std::vector<double>& w, int64_t m, int64_t n,
                  int64_t k, std::vector<double>& dx, std::vector<double>& scale) {
  dx.assign(size_t(m * k), 0.0);
  scale.assign(size_t(m * k), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t l = 0; l < k; ++l)
      for (int64_t j = 0; j < n; ++j) {
        dx[i * k + l] += dy[i * n + j] * w[j * k + l];
        scale[i * k + l] += std::fabs(dy[i * n + j] * w[j * k + l]);
      }
}

double max_rel(const std::vector<float>& got, const std::vector<double>& ref,
               const std::vector<double>& scale) {
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::fabs(double(got[i]) - ref[i]) / std::max(scale[i], 1e-30));
  }
  return worst;
}

std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

TEST(Matmul4bit, Fp32MatchesFloat64ReferenceOverDequantizedWeight) {
  // K = 200: blocks of 64 straddle rows; N = 300 rows.
  const Problem p = make(17, 300, 200, 1);
  for (QuantType type : {QuantType::kNF4, QuantType::kFP4}) {
    QuantOptions o;
    o.type = type;
    const Quantized4bit q = quantize(p.w, {p.n, p.k}, o, "w");
    const std::vector<double> wd = widen(dequantize(q));
    std::vector<double> y_ref, y_scale, dx_ref, dx_scale;
    ref_forward(widen(p.x), wd, p.m, p.n, p.k, y_ref, y_scale);
    ref_backward(widen(p.dy), wd, p.m, p.n, p.k, dx_ref, dx_scale);
    // Panels of 7 rows (300 = 42 * 7 + 6), of 1 row, and of half the rows (the cap).
    for (int64_t panel : {int64_t(1400), int64_t(1), int64_t(1) << 20}) {
      Matmul4bitOptions mo;
      mo.panel_elements = panel;
      const Linear4bit lin(q, mo);
      EXPECT_EQ(lin.panel_rows(), std::clamp<int64_t>(panel / p.k, 1, (p.n + 1) / 2));
      std::vector<float> y(size_t(p.m * p.n)), dx(size_t(p.m * p.k));
      lin.forward(p.x.data(), p.m, y.data());
      lin.backward_input(p.dy.data(), p.m, dx.data(), false);
      const double ry = max_rel(y, y_ref, y_scale), rdx = max_rel(dx, dx_ref, dx_scale);
      std::printf("%s panel_rows=%ld: forward max rel diff %.3g, input grad %.3g\n",
                  std::string(quant_type_name(type)).c_str(), long(lin.panel_rows()), ry, rdx);
      EXPECT_LT(ry, 2e-6);
      EXPECT_LT(rdx, 2e-6);
      // Accumulating adds onto what is there.
      std::vector<float> acc(dx.size(), 1.0f);
      lin.backward_input(p.dy.data(), p.m, acc.data(), true);
      for (size_t i = 0; i < acc.size(); ++i) ASSERT_NEAR(acc[i], dx[i] + 1.0f, 1e-4);
    }
  }
}

TEST(Matmul4bit, Bf16ActivationsMatchReferenceWithinOneRounding) {
  const Problem p = make(9, 130, 96, 2);
  QuantOptions o;
  o.block_size = 128;
  const Quantized4bit q = quantize(p.w, {p.n, p.k}, o, "w");
  const std::vector<double> wd = widen(dequantize(q));
  const Linear4bit lin(q);
  const Tensor x = Tensor::from_vector(p.x, {3, 3, p.k}, DType::kBF16);
  const Tensor dy = Tensor::from_vector(p.dy, {3, 3, p.n}, DType::kBF16);
  const Tensor y = lin.forward(x);
  const Tensor dx = lin.backward_input(dy);
  ASSERT_EQ(y.dtype(), DType::kBF16);
  ASSERT_EQ(y.shape(), Shape({3, 3, p.n}));
  ASSERT_EQ(dx.shape(), Shape({3, 3, p.k}));
  // The reference starts from the bf16 activations, as the matmul does.
  std::vector<double> xd(size_t(p.m * p.k)), dyd(size_t(p.m * p.n));
  for (size_t i = 0; i < xd.size(); ++i) xd[i] = bf16_to_f32(x.data<uint16_t>()[i]);
  for (size_t i = 0; i < dyd.size(); ++i) dyd[i] = bf16_to_f32(dy.data<uint16_t>()[i]);
  std::vector<double> y_ref, y_scale, dx_ref, dx_scale;
  ref_forward(xd, wd, p.m, p.n, p.k, y_ref, y_scale);
  ref_backward(dyd, wd, p.m, p.n, p.k, dx_ref, dx_scale);
  double ry = 0.0, rdx = 0.0;
  for (size_t i = 0; i < y_ref.size(); ++i) {
    const double got = bf16_to_f32(y.data<uint16_t>()[i]);
    // One bf16 rounding of the result (unit roundoff 2^-8) on top of the fp32 GEMM's error.
    EXPECT_LE(std::fabs(got - y_ref[i]), 0x1p-8 * std::fabs(y_ref[i]) + 2e-6 * y_scale[i]) << i;
    ry = std::max(ry, std::fabs(got - y_ref[i]) / y_scale[i]);
  }
  for (size_t i = 0; i < dx_ref.size(); ++i) {
    const double got = bf16_to_f32(dx.data<uint16_t>()[i]);
    EXPECT_LE(std::fabs(got - dx_ref[i]), 0x1p-8 * std::fabs(dx_ref[i]) + 2e-6 * dx_scale[i]) << i;
    rdx = std::max(rdx, std::fabs(got - dx_ref[i]) / dx_scale[i]);
  }
  std::printf("bf16: forward max rel diff %.3g, input grad %.3g (bf16 output rounding)\n", ry, rdx);
}

}  // namespace
}  // namespace fd::quant
