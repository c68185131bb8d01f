// lib/quant on the GPU: the decoded absmax, dequantized ranges and linear_4bit, through
// kernels/quant_4bit.cu and the cuBLASLt GEMM (kernels::gemm).
//
// linear_4bit goes panel by panel as on the CPU (lib/quant/linear_4bit.cc), allocating the same
// scratch in the same order: fp32 copies of non-f32 operands (what ops::F32In / F32Out make on
// the CPU, MemCategory::kActivations), the decoded absmax and one fp32 panel (kQuantized). Each
// panel is one fp32 GEMM (TF32 tensor cores when kernels::set_tf32(true), as every fp32 GEMM).
#include <algorithm>
#include <optional>

#include "kernels/kernels.h"
#include "lib/base/check.h"
#include "lib/quant/backend.h"

namespace fd::quant::cuda {
namespace {

using kernels::DT;

DT dt(DType t) {
  FD_CHECK(t == DType::kF32 || t == DType::kBF16 || t == DType::kF16,
           "linear_4bit on the GPU: {} is not a float dtype", dtype_name(t));
  return static_cast<DT>(t);
}

void expect_cuda(const Tensor& t, const char* what) {
  FD_CHECK(!t.defined() || t.is_cuda(), "linear_4bit: the weight is on the GPU but {} is on {}",
           what, t.device().str());
}

// fp32 access to a GPU tensor of any float dtype, as ops::F32In / F32Out give on the CPU: the
// tensor's own memory for f32, else an fp32 copy (kActivations) converted back by store().
class F32Gpu {
 public:
  // `load`: the copy starts as t's values (an input, or a gradient to add into).
  F32Gpu(const Tensor& t, bool load) : dst_(t) {
    if (t.dtype() == DType::kF32) {
      p_ = t.data<float>();
      return;
    }
    copy_ = Tensor::empty(t.shape(), DType::kF32, MemCategory::kActivations, t.device());
    p_ = copy_.data<float>();
    if (load) kernels::cast(t.raw(), dt(t.dtype()), p_, DT::kF32, t.numel());
  }
  float* get() const { return p_; }
  // Writes the fp32 values into the tensor (nothing to do for f32).
  void store() const {
    if (copy_.defined()) kernels::cast(p_, DT::kF32, dst_.raw(), dt(dst_.dtype()), dst_.numel());
  }

 private:
  Tensor dst_, copy_;
  float* p_ = nullptr;
};

// The decoded absmax and one panel of W on the GPU (Panels in linear_4bit.cc).
struct Panels {
  Panels(const QuantizedWeight& w, int64_t panel_rows)
      : absmax(Tensor::empty(Shape{w.num_blocks()}, DType::kF32, MemCategory::kQuantized,
                             w.packed().device())),
        panel(Tensor::empty(Shape{panel_rows, w.shape()[1]}, DType::kF32, MemCategory::kQuantized,
                            w.packed().device())),
        rows(panel_rows) {
    cuda::block_absmax(w, absmax);
  }
  // Rows [r0, r0 + n) of W into the panel.
  const float* load(const QuantizedWeight& w, int64_t r0, int64_t n) const {
    const int64_t k = w.shape()[1];
    cuda::dequantize_range(w, absmax, r0 * k, n * k, panel);
    return panel.data<float>();
  }
  Tensor absmax, panel;
  int64_t rows;
};

}  // namespace

void block_absmax(const QuantizedWeight& w, const Tensor& out) {
  FD_CHECK(
      w.is_cuda() && out.is_cuda() && out.dtype() == DType::kF32 && out.numel() == w.num_blocks(),
      "block_absmax on the GPU: {} {} on {} for {} blocks on {}", out.shape().str(),
      dtype_name(out.dtype()), out.device().str(), w.num_blocks(), w.packed().device().str());
  if (!w.double_quant()) {
    if (out.nbytes() > 0) kernels::copy_device(out.raw(), w.absmax().raw(), out.nbytes());
    return;
  }
  kernels::decode_nested_absmax(w.nested_codes().data<uint8_t>(), w.num_blocks(),
                                w.nested_absmax().data<float>(), w.nested_offset().data<float>(),
                                w.nested_map().data(), out.data<float>());
}

void dequantize_range(const QuantizedWeight& w, const Tensor& absmax, int64_t begin, int64_t count,
                      const Tensor& out) {
  FD_CHECK(begin >= 0 && count >= 0 && begin + count <= w.numel(),
           "dequantize_range [{}, {}) of {}", begin, begin + count, w.numel());
  FD_CHECK(w.is_cuda() && absmax.is_cuda() && out.is_cuda(),
           "dequantize_range on the GPU: the weight, absmax and out must all be there");
  FD_CHECK(absmax.dtype() == DType::kF32 && absmax.numel() == w.num_blocks(),
           "dequantize_range: {} absmax of {} for {} blocks", absmax.numel(),
           dtype_name(absmax.dtype()), w.num_blocks());
  FD_CHECK(out.numel() >= count, "dequantize_range: {} values into {}", count, out.numel());
  kernels::dequantize_4bit(w.packed().data<uint8_t>(), absmax.data<float>(), w.block_size(),
                           code_values(w.type()).data(), begin, count, out.raw(), dt(out.dtype()));
}

void linear_4bit_forward(const Tensor& x, const QuantizedWeight& w, const Tensor& bias, int64_t m,
                         int64_t panel_rows, const Tensor& out) {
  expect_cuda(x, "x");
  expect_cuda(bias, "the bias");
  const int64_t n = w.shape()[0], k = w.shape()[1];
  F32Gpu X(x, true);
  F32Gpu Y(out, false);
  Panels p(w, panel_rows);
  // The CPU writes the bias into y and adds each panel's product (beta = 1); here the bias goes
  // into each panel's GEMM (its epilogue), beta = 0. The same sum of two fp32 terms.
  std::optional<F32Gpu> bv;
  if (bias.defined()) bv.emplace(bias, true);
  for (int64_t r0 = 0; r0 < n; r0 += p.rows) {
    const int64_t rows = std::min(p.rows, n - r0);
    const float* panel = p.load(w, r0, rows);
    // y[:, r0:r0+rows] = x (m x k) @ panel^T (k x rows) (+ bias[r0:r0+rows])
    kernels::gemm(false, true, m, rows, k, 1.0f, X.get(), k, panel, k, DT::kF32, 0.0f, Y.get() + r0,
                  n, DT::kF32, bv ? bv->get() + r0 : nullptr);
  }
  Y.store();
}

void linear_4bit_backward(const QuantizedWeight& w, const Tensor& dy, int64_t m, int64_t n,
                          int64_t k, int64_t panel_rows, autograd::GradSlot* xs,
                          autograd::GradSlot* biass) {
  expect_cuda(dy, "the output gradient");
  F32Gpu dY(dy, true);
  if (xs != nullptr && xs->requires_grad) {
    F32Gpu dX(xs->ensure_grad(), true);
    Panels p(w, panel_rows);
    for (int64_t r0 = 0; r0 < n; r0 += p.rows) {
      const int64_t rows = std::min(p.rows, n - r0);
      const float* panel = p.load(w, r0, rows);
      // dx (m x k) += dy[:, r0:r0+rows] (m x rows) @ panel (rows x k)
      kernels::gemm(false, false, m, k, rows, 1.0f, dY.get() + r0, n, panel, k, DT::kF32, 1.0f,
                    dX.get(), k, DT::kF32);
    }
    dX.store();
  }
  if (biass != nullptr && biass->requires_grad) {
    F32Gpu db(biass->ensure_grad(), true);
    kernels::bias_grad(dY.get(), DT::kF32, m, n, db.get(), DT::kF32);
    db.store();
  }
}

}  // namespace fd::quant::cuda
