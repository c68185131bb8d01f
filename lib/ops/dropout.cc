#include "lib/ops/dropout.h"

#include "lib/autograd/tape.h"
#include "lib/base/check.h"
#include "lib/base/rng.h"
#include "lib/ops/f32_buffer.h"
#include "lib/ops/gpu.h"

namespace fd::ops {
namespace {

// hash_words(seed, stream, i) with the per-call prefix hoisted out of the loop:
// hash_words(a, b, c, 0) = mix64(mix64(mix64(mix64(a) ^ b) ^ c) ^ 0).
struct MaskGen {
  uint64_t prefix;
  float p, keep_scale;
  MaskGen(float p_, uint64_t seed, uint64_t stream)
      : prefix(mix64(mix64(seed) ^ stream)), p(p_), keep_scale(1.0f / (1.0f - p_)) {}
  float operator()(int64_t i) const {
    const uint64_t h = mix64(mix64(prefix ^ static_cast<uint64_t>(i)));
    return uniform01(h) >= p ? keep_scale : 0.0f;
  }
};

// y = x * mask (forward), or y += x * mask (backward, accumulate = true).
void apply(const MaskGen& m, const float* __restrict x, float* __restrict y, int64_t n,
           bool accumulate) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i] * m(i);
    y[i] = accumulate ? y[i] + v : v;
  }
}

}  // namespace

std::vector<float> dropout_mask(int64_t n, float p, uint64_t seed, uint64_t stream) {
  FD_CHECK(p >= 0.0f && p < 1.0f, "dropout: p must be in [0, 1), got {}", p);
  MaskGen m(p, seed, stream);
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = p == 0.0f ? 1.0f : m(i);
  return out;
}

Variable dropout(const Variable& x, float p, uint64_t seed, uint64_t stream) {
  FD_CHECK(p >= 0.0f && p < 1.0f, "dropout: p must be in [0, 1), got {}", p);
  if (p == 0.0f) return x;
  const MaskGen mask(p, seed, stream);
  Tensor out = Tensor::empty(x.shape(), x.dtype());
#if FDTRAIN_HAVE_CUDA
  if (x.value().is_cuda()) {
    kernels::dropout_forward(x.value().raw(), out.raw(), gpu::dt(x.dtype()), out.numel(), p, seed,
                             stream);
  } else
#endif
  {
    F32In X(x.value());
    F32Out Y = F32Out::overwrite(out);
    apply(mask, X.get(), Y.get(), out.numel(), false);
    Y.store();
  }
  bool rec = autograd::should_record({&x});
  Variable y = Variable::op_output(out, rec);
  if (rec) {
    auto ys = y.slot();
    auto xs = x.slot();
    autograd::current_tape().record({"dropout", {ys}, [ys, xs, mask, p, seed, stream] {
                                       if (!xs->requires_grad) return;
#if FDTRAIN_HAVE_CUDA
                                       if (ys->grad.is_cuda()) {
                                         const Tensor& dy = ys->grad;
                                         const Tensor& dx = xs->ensure_grad();
                                         return kernels::dropout_backward(
                                             dy.raw(), gpu::dt(dy.dtype()), dx.raw(),
                                             gpu::dt(dx.dtype()), dy.numel(), p, seed, stream);
                                       }
#else
                                       (void)p, (void)seed, (void)stream;
#endif
                                       F32In dY(ys->grad);
                                       F32Out dX = F32Out::accumulate(xs->ensure_grad());
                                       apply(mask, dY.get(), dX.get(), ys->grad.numel(), true);
                                       dX.store();
                                     }});
  }
  return y;
}

}  // namespace fd::ops
