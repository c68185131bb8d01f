#include "lib/ops/rope.h"

#include <cmath>
#include <numbers>

#include "lib/autograd/tape.h"
#include "lib/ops/backend.h"

namespace fd::ops {

// Hugging Face modeling_rope_utils (_compute_default_rope_parameters, the linear variant,
// _compute_llama3_parameters) computes inv_freq with float32 tensors, and each step below is
// the fp32 operation torch performs on the CPU, rounding where it rounds: a Python float meets
// a float32 tensor as a float32 value, `x / t` is `t.reciprocal() * x`, `t / x` divides.
// Rounding once from float64 instead gives other bits for about a third of the frequencies
// (1 to 3 ulp), and since the angle is p * inv_freq that is up to 8e-3 rad at position 1e5
// (tests/golden/rope_golden_test.cc). pow is correctly rounded here; torch's vectorised powf
// (SLEEF, within 1 ulp) gives the same bits for every frequency of the golden configurations.
std::vector<float> rope_inv_freq(const RopeOptions& o) {
  FD_CHECK(o.head_dim > 0 && o.head_dim % 2 == 0, "rope: head_dim {} must be even", o.head_dim);
  const int64_t half = o.head_dim / 2;
  const float base = float(o.theta), dim = float(o.head_dim), factor = float(o.factor);
  std::vector<float> inv(static_cast<size_t>(half));
  for (int64_t j = 0; j < half; ++j) {
    // 1.0 / (base ** (arange(0, dim, 2).float() / dim))
    const float exponent = float(2 * j) / dim;
    const float power = float(std::pow(double(base), double(exponent)));
    float f = 1.0f / power;
    switch (o.kind) {
      case RopeScalingKind::kDefault:
        break;
      case RopeScalingKind::kLinear:  // inv_freq / factor
        f = f / factor;
        break;
      case RopeScalingKind::kLlama3: {
        const double old_len = double(o.original_max_position_embeddings);
        const float low_freq_wavelen = float(old_len / o.low_freq_factor);
        const float high_freq_wavelen = float(old_len / o.high_freq_factor);
        const float wavelen = (1.0f / f) * float(2.0 * std::numbers::pi);  // 2 pi / inv_freq
        const float scaled = wavelen > low_freq_wavelen ? f / factor : f;
        // smooth = (old_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        const float smooth = ((1.0f / wavelen) * float(old_len) - float(o.low_freq_factor)) /
                             float(o.high_freq_factor - o.low_freq_factor);
        // (1 - smooth) * scaled / factor + smooth * scaled
        const float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
        const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
        f = medium ? smoothed : scaled;
        break;
      }
    }
    inv[size_t(j)] = f;
  }
  return inv;
}

RopeTables rope_tables(const RopeOptions& o, int64_t max_positions) {
  const std::vector<float> inv = rope_inv_freq(o);
  const int64_t D = o.head_dim, half = D / 2;
  std::vector<float> c(size_t(max_positions * D)), s(c.size());
  for (int64_t p = 0; p < max_positions; ++p) {
    for (int64_t j = 0; j < half; ++j) {
      const float angle = float(p) * inv[size_t(j)];  // an fp32 product, as torch
      const float cv = float(std::cos(double(angle)));
      const float sv = float(std::sin(double(angle)));
      c[size_t(p * D + j)] = c[size_t(p * D + j + half)] = cv;
      s[size_t(p * D + j)] = s[size_t(p * D + j + half)] = sv;
    }
  }
  const Shape shape{max_positions, D};
  return {Tensor::from_vector(c, shape, DType::kF32, MemCategory::kParams),
          Tensor::from_vector(s, shape, DType::kF32, MemCategory::kParams)};
}

Variable rope(const Variable& x, const Tensor& cos, const Tensor& sin, const Tensor& positions_in) {
  const Shape& xs_shape = x.shape();
  const int64_t D = cos.shape().cols();
  FD_CHECK(xs_shape.ndim() >= 3 && cos.shape().ndim() == 2 && sin.shape() == cos.shape() &&
               cos.dtype() == DType::kF32 && sin.dtype() == DType::kF32 && D % 2 == 0 &&
               cos.shape()[0] >= xs_shape[1] &&
               (xs_shape.numel() / (xs_shape[0] * xs_shape[1])) % D == 0,
           "rope: x {}, cos {}, sin {}", xs_shape.str(), cos.shape().str(), sin.shape().str());
  const bool gpu = x.value().is_cuda();
  // Positions where the backend reads them: checked on the host, then copied to the GPU for a
  // GPU op; on the GPU already: used as given (the caller checked them).
  Tensor positions = positions_in;
  if (positions.defined()) {
    const Shape want{xs_shape[0], xs_shape[1]};
    FD_CHECK(positions.dtype() == DType::kI32 && positions.shape() == want &&
                 (!positions.is_cuda() || gpu),
             "rope: positions {} {} for x {} (want i32 (B, T), on the host or x's GPU)",
             dtype_name(positions.dtype()), positions.shape().str(), xs_shape.str());
    if (!positions.is_meta() && !positions.is_cuda()) {
      const int32_t* p = positions.data<int32_t>();
      for (int64_t i = 0; i < positions.numel(); ++i) {
        FD_CHECK(p[i] >= 0 && p[i] < cos.shape()[0],
                 "rope: position {} at index {} outside the tables' {} rows", p[i], i,
                 cos.shape()[0]);
      }
      if (gpu) positions = positions.to_device(x.value().device(), MemCategory::kOther);
    }
  }
  Tensor out = Tensor::empty(xs_shape, x.dtype());
  if (gpu) {
    cuda::rope_forward(x.value(), cos, sin, positions, out);
  } else {
    cpu::rope_forward(x.value(), cos, sin, positions, out);
  }
  bool rec = autograd::should_record({&x});
  Variable y = Variable::op_output(out, rec);
  if (rec) {
    auto ys = y.slot();
    auto xs = x.slot();
    autograd::current_tape().record(
        {"rope", {ys}, [ys, xs, cos, sin, positions, gpu] {
           if (!xs->requires_grad) return;
           if (gpu) {
             cuda::rope_backward(ys->grad, cos, sin, positions, xs.get());
           } else {
             cpu::rope_backward(ys->grad, cos, sin, positions, xs.get());
           }
         }});
  }
  return y;
}

}  // namespace fd::ops
