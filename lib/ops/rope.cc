#include "lib/ops/rope.h"

#include <cmath>
#include <numbers>

#include "lib/autograd/tape.h"
#include "lib/ops/backend.h"

namespace fd::ops {

// Hugging Face modeling_rope_utils: _compute_default_rope_parameters, the linear
// variant, and _compute_llama3_parameters.
std::vector<float> rope_inv_freq(const RopeOptions& o) {
  FD_CHECK(o.head_dim > 0 && o.head_dim % 2 == 0, "rope: head_dim {} must be even", o.head_dim);
  const int64_t half = o.head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  for (int64_t j = 0; j < half; ++j) {
    double f = 1.0 / std::pow(o.theta, double(2 * j) / double(o.head_dim));
    switch (o.kind) {
      case RopeScalingKind::kDefault:
        break;
      case RopeScalingKind::kLinear:
        f /= o.factor;
        break;
      case RopeScalingKind::kLlama3: {
        const double old_len = double(o.original_max_position_embeddings);
        const double low_freq_wavelen = old_len / o.low_freq_factor;
        const double high_freq_wavelen = old_len / o.high_freq_factor;
        const double wavelen = 2.0 * std::numbers::pi / f;
        if (wavelen > low_freq_wavelen) {
          f /= o.factor;
        } else if (!(wavelen < high_freq_wavelen)) {  // medium: interpolate
          const double smooth =
              (old_len / wavelen - o.low_freq_factor) / (o.high_freq_factor - o.low_freq_factor);
          f = (1.0 - smooth) * f / o.factor + smooth * f;
        }
        break;
      }
    }
    inv[size_t(j)] = float(f);
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

Variable rope(const Variable& x, const Tensor& cos, const Tensor& sin) {
  const Shape& xs_shape = x.shape();
  const int64_t D = cos.shape().cols();
  FD_CHECK(xs_shape.ndim() >= 3 && cos.shape().ndim() == 2 && sin.shape() == cos.shape() &&
               cos.dtype() == DType::kF32 && sin.dtype() == DType::kF32 && D % 2 == 0 &&
               cos.shape()[0] >= xs_shape[1] &&
               (xs_shape.numel() / (xs_shape[0] * xs_shape[1])) % D == 0,
           "rope: x {}, cos {}, sin {}", xs_shape.str(), cos.shape().str(), sin.shape().str());
  Tensor out = Tensor::empty(xs_shape, x.dtype());
  const bool gpu = x.value().is_cuda();
  if (gpu) {
    cuda::rope_forward(x.value(), cos, sin, out);
  } else {
    cpu::rope_forward(x.value(), cos, sin, out);
  }
  bool rec = autograd::should_record({&x});
  Variable y = Variable::op_output(out, rec);
  if (rec) {
    auto ys = y.slot();
    auto xs = x.slot();
    autograd::current_tape().record({"rope", {ys}, [ys, xs, cos, sin, gpu] {
                                       if (!xs->requires_grad) return;
                                       if (gpu) {
                                         cuda::rope_backward(ys->grad, cos, sin, xs.get());
                                       } else {
                                         cpu::rope_backward(ys->grad, cos, sin, xs.get());
                                       }
                                     }});
  }
  return y;
}

}  // namespace fd::ops
