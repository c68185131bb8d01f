// GpuOpBench: the GPU kernels that dominate a GPT-2 124M bf16 step, timed
// with CUDA events (DeviceTimer) on the compute stream; stage 3 of the device
// check (tests/gpu/device_check.sh) runs it:
//   gpu_tests --gtest_also_run_disabled_tests --gtest_filter='GpuOpBench.*'
// (disabled otherwise: a measurement, not a test, and it needs a GPU; it is
// in gpu_tests so that the bundle carries no second copy of the libraries).
// Prints one OPTIME line per (op, shape): milliseconds per call (median of
// 10 after 3 warm-up calls) and the TFLOP/s that makes.
//
//   attention  causal attention forward and backward (ops::causal_attention),
//              FLOPs counted as FlashAttention counts them for a causal mask:
//              forward 2 GEMMs of B*H*T*T*hs multiply-adds, halved, = 2 B H T^2 hs;
//              backward 2.5x the forward (5 GEMMs, recomputing the scores);
//              timed for both implementations: the tensor-core kernels and the
//              SIMT fp32 ones ("simt", kernels::set_attention_kernels);
//   head       the classifier and cross-entropy (ops::linear_cross_entropy,
//              the GPT-2 head): forward 2 R C V, backward 4 R C V (R = B T rows).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "lib/autograd/tape.h"
#include "lib/base/error.h"
#include "kernels/kernels.h"
#include "lib/ops/attention.h"
#include "lib/ops/linear_cross_entropy.h"
#include "lib/tensor/device.h"
#include "lib/tensor/tensor.h"

namespace fd {
namespace {

using autograd::Variable;

Tensor randn(int64_t n, Shape shape, DType dtype, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return Tensor::from_vector(v, shape, dtype);
}

// Median milliseconds of `iters` timed calls of fn after 3 untimed ones.
double time_ms(int iters, const std::function<void()>& fn) {
  for (int i = 0; i < 3; ++i) fn();
  std::vector<double> ms;
  DeviceTimer timer;
  for (int i = 0; i < iters; ++i) {
    timer.start();
    fn();
    timer.stop();
    ms.push_back(timer.seconds() * 1e3);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

void report(const std::string& what, double ms, double flops) {
  std::printf("OPTIME %s: %.3f ms, %.1f TFLOP/s\n", what.c_str(), ms, flops / (ms * 1e-3) / 1e12);
  std::fflush(stdout);
}

// Forward, and forward + backward, of `op` on fresh leaves; the backward time
// is the difference of the medians.
void time_op(const std::string& name, int iters, double fwd_flops, double bwd_flops,
             const std::vector<Tensor>& inputs,
             const std::function<Variable(const std::vector<Variable>&)>& op) {
  auto run = [&](bool backward) {
    autograd::Tape tape;
    autograd::TapeScope scope(tape);
    std::vector<Variable> vars;
    for (const Tensor& t : inputs) vars.emplace_back(t, true);
    Variable y = op(vars);
    if (!backward) return;
    Tensor seed = Tensor::empty(y.shape(), y.dtype());
    seed.fill_(1.0f);
    y.slot()->grad = seed;
    tape.run_backward();
  };
  const double fwd = time_ms(iters, [&] { run(false); });
  const double both = time_ms(iters, [&] { run(true); });
  report(name + " forward", fwd, fwd_flops);
  report(name + " backward", std::max(both - fwd, 1e-6), bwd_flops);
}

TEST(GpuOpBench, DISABLED_AttentionAndHead) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no usable GPU: " << cuda_unavailable_reason();
  const int iters = 10;
  init_cuda_device(0);
  DeviceScope on_gpu(Device::cuda(0));
  std::printf("gpu_op_bench: %s, bf16\n", cuda_device_name().c_str());
  const DType bf16 = DType::kBF16;
  for (auto which : {kernels::AttentionKernels::kTensorCores, kernels::AttentionKernels::kSimt}) {
    kernels::set_attention_kernels(which);
    const std::string impl =
        which == kernels::AttentionKernels::kSimt ? " (simt)" : " (tensor cores)";
    // GPT-2 124M at micro batch 16, T = 1024: 12 heads of 64.
    {
      const int64_t B = 16, T = 1024, H = 12, hs = 64, C = H * hs;
      const double fwd = 2.0 * B * H * double(T) * T * hs;
      time_op("attention B16 T1024 H12 hs64" + impl, iters, fwd, 2.5 * fwd,
              {randn(B * T * 3 * C, Shape{B, T, 3 * C}, bf16, 1)},
              [H](const std::vector<Variable>& v) { return ops::causal_attention(v[0], int(H)); });
    }
    // A Llama-3-8B-shaped layer: 32 query heads of 128 over 8 key/value heads (GQA).
    {
      const int64_t B = 2, T = 1024, H = 32, KV = 8, hs = 128;
      const double fwd = 2.0 * B * H * double(T) * T * hs;
      time_op("attention B2 T1024 H32 KV8 hs128" + impl, iters, fwd, 2.5 * fwd,
              {randn(B * T * H * hs, Shape{B, T, H * hs}, bf16, 2),
               randn(B * T * KV * hs, Shape{B, T, KV * hs}, bf16, 3),
               randn(B * T * KV * hs, Shape{B, T, KV * hs}, bf16, 4)},
              [H, KV](const std::vector<Variable>& v) {
                return ops::causal_attention(v[0], v[1], v[2], int(H), int(KV));
              });
    }
  }
  kernels::set_attention_kernels(kernels::AttentionKernels::kTensorCores);
  // The GPT-2 head: 16 x 1024 rows, C = 768, V = 50257.
  {
    const int64_t R = 16 * 1024, C = 768, V = 50257;
    Tensor targets = Tensor::empty(Shape{R}, DType::kI32, MemCategory::kOther, Device::cpu());
    for (int64_t i = 0; i < R; ++i) targets.i32()[i] = int32_t((i * 7919) % V);
    const double fwd = 2.0 * double(R) * C * V;
    time_op("head R16384 C768 V50257", iters, fwd, 2.0 * fwd,
            {randn(R * C, Shape{R, C}, bf16, 5), randn(V * C, Shape{V, C}, bf16, 6, 0.02f)},
            [&targets](const std::vector<Variable>& v) {
              return ops::linear_cross_entropy(v[0], v[1], targets);
            });
  }
}

}  // namespace
}  // namespace fd
