// linear_4bit on the CPU (and meta: allocations only), one GEMM per dequantized panel of W.
// F32In/F32Out come from lib/ops so that the scratch copies of bf16/f16 operands are the ones
// ops::matmul makes.
#include "lib/quant/linear_4bit.h"

#include <algorithm>

#include "lib/autograd/tape.h"
#include "lib/base/check.h"
#include "lib/ops/f32_buffer.h"
#include "lib/ops/gemm.h"
#include "lib/ops/shape_util.h"
#include "lib/quant/backend.h"

namespace fd::quant {

using autograd::Variable;

namespace {

// The decoded absmax and one panel of W, fp32 scratch of the 4-bit base's category (on meta as
// on the CPU).
struct Panels {
  Panels(const QuantizedWeight& w, int64_t panel_rows)
      : absmax(Tensor::empty(Shape{w.num_blocks()}, DType::kF32, MemCategory::kQuantized,
                             w.packed().device())),
        panel(Tensor::empty(Shape{panel_rows, w.shape()[1]}, DType::kF32, MemCategory::kQuantized,
                            w.packed().device())),
        rows(panel_rows) {
    if (!w.is_meta()) w.block_absmax(absmax.data<float>());
  }
  // Rows [r0, r0 + n) of W into the panel.
  const float* load(const QuantizedWeight& w, int64_t r0, int64_t n) const {
    const int64_t k = w.shape()[1];
    dequantize_range(w.type(), w.block_size(), w.packed().data<uint8_t>(), w.numel(),
                     std::span<const float>(absmax.data<float>(), size_t(absmax.numel())), r0 * k,
                     n * k, panel.data<float>());
    return panel.data<float>();
  }
  Tensor absmax, panel;
  int64_t rows;
};

void forward(const Tensor& x, const QuantizedWeight& w, const Tensor& bias, int64_t m,
             int64_t panel_rows, const Tensor& out) {
  const int64_t n = w.shape()[0], k = w.shape()[1];
  const bool meta = out.is_meta();
  ops::F32In X(x);
  ops::F32Out Y = ops::F32Out::overwrite(out);
  Panels p(w, panel_rows);
  float beta = 0.0f;
  if (bias.defined()) {
    ops::F32In bv(bias);
    if (!meta) {
      float* __restrict y = Y.get();
      const float* __restrict c = bv.get();
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) y[i * n + j] = c[j];
    }
    beta = 1.0f;
  }
  if (meta) return;
  for (int64_t r0 = 0; r0 < n; r0 += p.rows) {
    const int64_t rows = std::min(p.rows, n - r0);
    const float* panel = p.load(w, r0, rows);
    // y[:, r0:r0+rows] (+)= x (m x k) @ panel^T (k x rows)
    ops::gemm(false, true, m, rows, k, 1.0f, X.get(), k, panel, k, beta, Y.get() + r0, n);
  }
  Y.store();
}

// `w` is defined when x requires a gradient.
void backward(const QuantizedWeight& w, const Tensor& dy, int64_t m, int64_t n, int64_t k,
              int64_t panel_rows, autograd::GradSlot* xs, autograd::GradSlot* biass) {
  const bool meta = dy.is_meta();
  ops::F32In dY(dy);
  if (xs != nullptr && xs->requires_grad) {
    ops::F32Out dX = ops::F32Out::update(xs->grad_update());
    Panels p(w, panel_rows);
    if (!meta) {
      for (int64_t r0 = 0; r0 < n; r0 += p.rows) {
        const int64_t rows = std::min(p.rows, n - r0);
        const float* panel = p.load(w, r0, rows);
        // dx (m x k) += dy[:, r0:r0+rows] (m x rows) @ panel (rows x k)
        ops::gemm(false, false, m, k, rows, 1.0f, dY.get() + r0, n, panel, k, 1.0f, dX.get(), k);
      }
      dX.store();
    }
  }
  if (biass != nullptr && biass->requires_grad) {
    ops::F32Out db = ops::F32Out::update(biass->grad_update());
    if (!meta) {
      float* __restrict g = db.get();
      const float* __restrict y = dY.get();
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) g[j] += y[i * n + j];
      db.store();
    }
  }
}

}  // namespace

Variable linear_4bit(const Variable& x, const QuantizedWeight& w, const Variable& bias,
                     Matmul4bitOptions options) {
  FD_CHECK(w.defined() && w.shape().size() == 2,
           "linear_4bit: the weight must be a 2-D 4-bit "
           "weight");
  const int64_t n = w.shape()[0], k = w.shape()[1];
  const Shape& xs = x.shape();
  FD_CHECK(x.defined() && xs.ndim() >= 1 && xs.cols() == k,
           "linear_4bit: x {} against a weight of {} inputs", x.defined() ? xs.str() : "", k);
  FD_CHECK(!bias.defined() || (bias.shape().ndim() == 1 && bias.shape()[0] == n),
           "linear_4bit: bias {} for {} outputs", bias.defined() ? bias.shape().str() : "", n);
  const Device wd = w.packed().device();
  auto same_place = [&](const Tensor& t) {
    return t.is_meta() == wd.is_meta() && t.is_cuda() == wd.is_cuda();
  };
  FD_CHECK(same_place(x.value()) && (!bias.defined() || same_place(bias.value())),
           "linear_4bit: x on {}, the bias on {}, the weight on {}: all on the CPU, all on the "
           "GPU or all on meta",
           x.value().device().str(), bias.defined() ? bias.value().device().str() : "-", wd.str());
  const int64_t m = xs.rows();
  const int64_t panel_rows = panel_rows_for(n, k, options.panel_elements);

  Tensor out = Tensor::empty(ops::with_last_dim(xs, n), x.dtype());
  const Tensor bias_t = bias.defined() ? bias.value() : Tensor();
  if (w.is_cuda()) {
    cuda::linear_4bit_forward(x.value(), w, bias_t, m, panel_rows, out);
  } else {
    forward(x.value(), w, bias_t, m, panel_rows, out);
  }

  const bool rec = autograd::should_record({&x, &bias});
  Variable y = Variable::op_output(out, rec);
  if (rec) {
    auto ys = y.slot();
    auto xslot = x.slot();
    auto biasslot = bias.defined() ? bias.slot() : nullptr;
    // dx needs W (a handle on its tensors); the bias gradient needs only dy.
    QuantizedWeight w_saved = x.requires_grad() ? w : QuantizedWeight();
    autograd::current_tape().record(
        {"linear_4bit", {ys}, [ys, xslot, biasslot, w_saved, m, n, k, panel_rows] {
           if (ys->grad.is_cuda()) {
             cuda::linear_4bit_backward(w_saved, ys->grad, m, n, k, panel_rows, xslot.get(),
                                        biasslot.get());
           } else {
             backward(w_saved, ys->grad, m, n, k, panel_rows, xslot.get(), biasslot.get());
           }
         }});
  }
  return y;
}

}  // namespace fd::quant
