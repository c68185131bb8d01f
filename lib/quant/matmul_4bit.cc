// matmul_4bit on the CPU: a panel of W's rows dequantized into scratch, one GEMM per panel.
#include "lib/quant/matmul_4bit.h"

#include <algorithm>
#include <vector>

#include "lib/base/check.h"
#include "lib/ops/gemm.h"

namespace fd::quant {

Linear4bit::Linear4bit(const Quantized4bit& weight, Matmul4bitOptions options)
    : weight_(weight), absmax_(block_absmax(weight)) {
  FD_CHECK(weight.shape.size() == 2, "a 4-bit linear weight is 2-D, not {}-D", weight.shape.size());
  panel_rows_ = panel_rows_for(out_features(), in_features(), options.panel_elements);
}

int64_t panel_rows_for(int64_t out_features, int64_t in_features, int64_t panel_elements) {
  FD_CHECK(panel_elements > 0, "panel_elements must be positive");
  // At most half the rows (at least 2 panels when there are 2 rows), so the whole weight is
  // never expanded at once.
  const int64_t max_rows = std::max<int64_t>(1, (out_features + 1) / 2);
  return std::clamp<int64_t>(panel_elements / std::max<int64_t>(1, in_features), 1, max_rows);
}

void Linear4bit::forward(const float* x, int64_t m, float* y) const {
  const int64_t n = out_features(), k = in_features();
  std::vector<float> panel(size_t(panel_rows_ * k));
  for (int64_t r0 = 0; r0 < n; r0 += panel_rows_) {
    const int64_t rows = std::min(panel_rows_, n - r0);
    dequantize_range(weight_, absmax_, r0 * k, rows * k, panel.data());
    // y[:, r0:r0+rows] = x (m x k) @ panel^T (k x rows)
    ops::gemm(false, true, m, rows, k, 1.0f, x, k, panel.data(), k, 0.0f, y + r0, n);
  }
}

void Linear4bit::backward_input(const float* dy, int64_t m, float* dx, bool accumulate) const {
  const int64_t n = out_features(), k = in_features();
  std::vector<float> panel(size_t(panel_rows_ * k));
  for (int64_t r0 = 0; r0 < n; r0 += panel_rows_) {
    const int64_t rows = std::min(panel_rows_, n - r0);
    dequantize_range(weight_, absmax_, r0 * k, rows * k, panel.data());
    // dx (m x k) (+)= dy[:, r0:r0+rows] (m x rows) @ panel (rows x k)
    const float beta = (accumulate || r0 > 0) ? 1.0f : 0.0f;
    ops::gemm(false, false, m, k, rows, 1.0f, dy + r0, n, panel.data(), k, beta, dx, k);
  }
}

namespace {

std::vector<float> to_f32(const Tensor& t) {
  const int64_t n = t.numel();
  std::vector<float> v(static_cast<size_t>(n));
  switch (t.dtype()) {
    case DType::kF32:
      std::copy(t.data<float>(), t.data<float>() + n, v.begin());
      break;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) v[i] = bf16_to_f32(t.data<uint16_t>()[i]);
      break;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) v[i] = f16_to_f32(t.data<uint16_t>()[i]);
      break;
    default:
      FD_CHECK(false, "4-bit matmul: a float tensor is needed, not {}", dtype_name(t.dtype()));
  }
  return v;
}

// A tensor of `dtype` with `like`'s leading dims and last dim `last`, from fp32 values.
Tensor from_f32(const std::vector<float>& v, const Shape& like, int64_t last, DType dtype) {
  std::vector<int64_t> dims;
  for (int i = 0; i + 1 < like.ndim(); ++i) dims.push_back(like[i]);
  dims.push_back(last);
  return Tensor::from_vector(v, Shape(std::span<const int64_t>(dims)), dtype);
}

}  // namespace

Tensor Linear4bit::forward(const Tensor& x) const {
  FD_CHECK(x.shape().ndim() >= 1 && x.shape().cols() == in_features(),
           "4-bit matmul: x {} against a weight of {} inputs", x.shape().str(), in_features());
  const std::vector<float> xf = to_f32(x);
  const int64_t m = x.shape().rows();
  std::vector<float> y(size_t(m * out_features()));
  forward(xf.data(), m, y.data());
  return from_f32(y, x.shape(), out_features(), x.dtype());
}

Tensor Linear4bit::backward_input(const Tensor& dy) const {
  FD_CHECK(dy.shape().ndim() >= 1 && dy.shape().cols() == out_features(),
           "4-bit matmul: dy {} against a weight of {} outputs", dy.shape().str(), out_features());
  const std::vector<float> dyf = to_f32(dy);
  const int64_t m = dy.shape().rows();
  std::vector<float> dx(size_t(m * in_features()));
  backward_input(dyf.data(), m, dx.data(), false);
  return from_f32(dx, dy.shape(), in_features(), dy.dtype());
}

}  // namespace fd::quant
