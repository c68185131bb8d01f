// QuantizedWeight (a Quantized4bit in accounted tensors, U8 codes) and the linear_4bit autograd
// op: exact conversions, storage bytes against the accountant, forward and dx against a float64
// reference over the dequantized weight (prints the largest relative difference), a central
// finite-difference check of dx, the bias gradient, no gradient to W, and the meta device
// allocating exactly what the CPU run allocates.
#include "lib/quant/linear_4bit.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "lib/autograd/tape.h"
#include "lib/tensor/memory.h"

namespace fd::quant {
namespace {

using autograd::Variable;

std::vector<float> randn(size_t n, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = scale * nd(rng);
  return v;
}

Tensor tensor_of(const std::vector<float>& v, const Shape& shape, DType dtype) {
  Tensor f = Tensor::from_vector(v, shape);
  return dtype == DType::kF32 ? f : f.to(dtype);
}

Quantized4bit make_weight(int64_t n, int64_t k, QuantOptions opts, uint32_t seed) {
  return quantize(randn(size_t(n * k), 0.02f, seed), {n, k}, opts, "w");
}

void expect_same(const Quantized4bit& a, const Quantized4bit& b) {
  EXPECT_EQ(a.type, b.type);
  EXPECT_EQ(a.block_size, b.block_size);
  EXPECT_EQ(a.shape, b.shape);
  EXPECT_EQ(a.packed, b.packed);
  EXPECT_EQ(a.absmax.size(), b.absmax.size());
  EXPECT_EQ(0, a.absmax.empty() ? 0
                                : std::memcmp(a.absmax.data(), b.absmax.data(),
                                              a.absmax.size() * sizeof(float)));
  ASSERT_EQ(a.nested.has_value(), b.nested.has_value());
  if (a.nested) {
    EXPECT_EQ(a.nested->codes, b.nested->codes);
    ASSERT_EQ(a.nested->absmax.size(), b.nested->absmax.size());
    EXPECT_EQ(0, std::memcmp(a.nested->absmax.data(), b.nested->absmax.data(),
                             a.nested->absmax.size() * sizeof(float)));
    EXPECT_EQ(f32_bits(a.nested->offset), f32_bits(b.nested->offset));
    EXPECT_EQ(0, std::memcmp(a.nested->map.data(), b.nested->map.data(), 256 * sizeof(float)));
  }
}

TEST(U8, Basics) {
  EXPECT_EQ(dtype_size(DType::kU8), 1u);
  EXPECT_EQ(dtype_name(DType::kU8), "u8");
  // The existing dtypes keep their numbers (files and the C API store them).
  EXPECT_EQ(int(DType::kF32), 0);
  EXPECT_EQ(int(DType::kI32), 3);
  EXPECT_EQ(int(DType::kU8), 4);
  MemoryAccountant& acct = MemoryAccountant::global();
  const int64_t before = acct.current(MemCategory::kFrozen);
  {
    Tensor t = Tensor::zeros(Shape{7}, DType::kU8, MemCategory::kFrozen);
    EXPECT_EQ(t.nbytes(), 7u);
    EXPECT_EQ(acct.current(MemCategory::kFrozen) - before, 7);
    t.fill_(200.0f);
    for (int i = 0; i < 7; ++i) EXPECT_EQ(t.data<uint8_t>()[i], 200);
    EXPECT_EQ(t.flat_slice(2, 3).data<uint8_t>(), t.data<uint8_t>() + 2);
    // No float conversion of raw bytes.
    EXPECT_DEATH(t.to(DType::kF32), "convert_to_f32: unsupported dtype u8");
    EXPECT_DEATH(Tensor::zeros(Shape{2}).to(DType::kU8), "convert_f32_to: unsupported dtype u8");
  }
  EXPECT_EQ(acct.current(MemCategory::kFrozen), before);
}

TEST(QuantizedWeight, RoundTripExactAndAccounted) {
  MemoryAccountant& acct = MemoryAccountant::global();
  for (bool dq : {false, true}) {
    for (int64_t bs : {64, 256}) {
      // 301 x 17: odd element count (a padding nibble), several nested groups with dq.
      const int64_t n = dq ? 301 : 5, k = 17;
      const Quantized4bit q = make_weight(n, k, {QuantType::kNF4, bs, dq}, 7);
      const int64_t before = acct.current(MemCategory::kFrozen);
      QuantizedWeight w = QuantizedWeight::from(q, Device::cpu());
      EXPECT_EQ(w.storage_bytes(), q.storage_bytes());
      // One buffer in the encoded layout: the storage plus at most 3 + 3 alignment bytes.
      const int64_t encoded = encoded_layout(q.numel(), {QuantType::kNF4, bs, dq}).bytes;
      EXPECT_EQ(acct.current(MemCategory::kFrozen) - before, encoded);
      EXPECT_LE(encoded - q.storage_bytes(), 6);
      EXPECT_EQ(w.packed().dtype(), DType::kU8);
      EXPECT_EQ(w.double_quant(), dq);
      expect_same(w.to_quantized4bit(), q);
      std::vector<float> am(size_t(w.num_blocks()));
      w.block_absmax(am.data());
      EXPECT_EQ(am, block_absmax(q));
    }
  }
}

// The tensor forms the GPU path shares with the CPU (block_absmax into a tensor, dequantize_range
// over a QuantizedWeight) give the Quantized4bit's values: fp32 exactly, bf16 rounded to nearest
// even; ranges starting on a low nibble and crossing blocks. tests/gpu/quant_parity_test.cc holds
// the GPU to these bits.
TEST(QuantizedWeight, TensorFormsAreTheQuantized4bitValues) {
  for (auto [type, dq] : {std::pair{QuantType::kNF4, true}, std::pair{QuantType::kFP4, false}}) {
    const Quantized4bit q = make_weight(301, 17, {type, 64, dq}, 5);
    const QuantizedWeight w = QuantizedWeight::from(q, Device::cpu());
    const std::vector<float> ref_absmax = block_absmax(q);
    Tensor absmax =
        Tensor::empty(Shape{w.num_blocks()}, DType::kF32, MemCategory::kOther, Device::cpu());
    w.block_absmax(absmax);
    EXPECT_EQ(absmax.to_vector(), ref_absmax);
    const std::vector<float> all = dequantize(q);
    const std::vector<std::pair<int64_t, int64_t>> ranges = {
        {0, 301 * 17}, {1, 130}, {63, 2}, {301 * 17 - 1, 1}, {5, 0}};
    for (auto [begin, count] : ranges) {
      SCOPED_TRACE(std::to_string(begin) + " +" + std::to_string(count));
      Tensor f = Tensor::empty(Shape{count}, DType::kF32, MemCategory::kOther, Device::cpu());
      Tensor h = Tensor::empty(Shape{count}, DType::kBF16, MemCategory::kOther, Device::cpu());
      dequantize_range(w, absmax, begin, count, f);
      dequantize_range(w, absmax, begin, count, h);
      const std::vector<float> want(all.begin() + begin, all.begin() + begin + count);
      EXPECT_EQ(f.to_vector(), want);
      Tensor want_h = Tensor::from_vector(want, Shape{count}).to(DType::kBF16);
      EXPECT_EQ(h.to_vector(), want_h.to_vector());
    }
    // A meta weight has no values to decode.
    const QuantizedWeight m = QuantizedWeight::empty({301, 17}, {type, 64, dq});
    EXPECT_DEATH(m.block_absmax(absmax), "block_absmax on meta");
  }
}

TEST(QuantizedWeight, MetaHasTheSizesNotTheValues) {
  MemoryAccountant& acct = MemoryAccountant::global();
  for (bool dq : {false, true}) {
    const QuantOptions opts{QuantType::kFP4, 64, dq};
    const Quantized4bit q = make_weight(300, 65, opts, 3);
    const int64_t before = acct.current(MemCategory::kFrozen);
    QuantizedWeight m = QuantizedWeight::empty({300, 65}, opts);
    EXPECT_TRUE(m.is_meta());
    EXPECT_EQ(m.storage_bytes(), q.storage_bytes());
    EXPECT_EQ(acct.current(MemCategory::kFrozen) - before, encoded_layout(300 * 65, opts).bytes);
    EXPECT_DEATH(m.to_quantized4bit(), "not on the CPU");
    // The same on meta from values.
    EXPECT_EQ(QuantizedWeight::from(q, Device::meta()).storage_bytes(), q.storage_bytes());
  }
}

// A weight encoded into part of a larger buffer and viewed there is the weight: the layout's
// fields in order, 4-byte aligned, the gaps zero; the views read back exactly what was encoded.
TEST(QuantizedWeight, EncodedIntoABufferAndViewed) {
  for (bool dq : {false, true}) {
    for (int64_t n : {1, 5, 301}) {
      const QuantOptions opts{QuantType::kNF4, 64, dq};
      const Quantized4bit q = make_weight(n, 17, opts, 11);
      const EncodedLayout l = encoded_layout(q.numel(), opts);
      EXPECT_EQ(l.packed, 0);
      EXPECT_EQ(l.bytes % 4, 0);
      if (dq) {
        EXPECT_EQ(l.absmax, -1);
        EXPECT_EQ(l.nested_codes % 4, 0);
        EXPECT_GE(l.nested_codes, (q.numel() + 1) / 2);
        EXPECT_GE(l.nested_absmax, l.nested_codes + q.num_blocks());
        EXPECT_EQ(l.nested_offset, l.nested_absmax + 4 * int64_t(q.nested->absmax.size()));
      } else {
        EXPECT_EQ(l.absmax % 4, 0);
        EXPECT_EQ(l.bytes, l.absmax + 4 * q.num_blocks());
      }
      // At byte 32 of a buffer with room either side.
      Tensor buf = Tensor::zeros(Shape{l.bytes + 64}, DType::kU8, MemCategory::kOther);
      buf.fill_(255.0f);
      encode(q, std::span<uint8_t>(buf.data<uint8_t>() + 32, size_t(l.bytes)));
      EXPECT_EQ(buf.data<uint8_t>()[31], 255);
      EXPECT_EQ(buf.data<uint8_t>()[32 + l.bytes], 255);
      const QuantizedWeight w = QuantizedWeight::view(buf.storage(), 32, q.shape, opts);
      expect_same(w.to_quantized4bit(), q);
      EXPECT_EQ(w.storage_bytes(), q.storage_bytes());
    }
  }
  // A view must start on a 4-byte boundary.
  Tensor buf = Tensor::zeros(Shape{256}, DType::kU8, MemCategory::kOther);
  EXPECT_DEATH(QuantizedWeight::view(buf.storage(), 2, {4, 4}, {}), "multiple of 4");
}

// float64 reference y = x W^T + b over the dequantized weight, and dx = dy W.
struct Ref {
  std::vector<double> y, dx;
};
Ref reference(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& b,
              const std::vector<float>& dy, int64_t m, int64_t n, int64_t k) {
  Ref r{std::vector<double>(size_t(m * n)), std::vector<double>(size_t(m * k))};
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = b.empty() ? 0.0 : b[size_t(j)];
      for (int64_t l = 0; l < k; ++l) s += double(x[size_t(i * k + l)]) * w[size_t(j * k + l)];
      r.y[size_t(i * n + j)] = s;
    }
  for (int64_t i = 0; i < m; ++i)
    for (int64_t l = 0; l < k; ++l) {
      double s = 0.0;
      for (int64_t j = 0; j < n; ++j) s += double(dy[size_t(i * n + j)]) * w[size_t(j * k + l)];
      r.dx[size_t(i * k + l)] = s;
    }
  return r;
}

double max_rel(const std::vector<float>& got, const std::vector<double>& want) {
  double scale = 0.0, err = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, std::abs(want[i]));
    err = std::max(err, std::abs(double(got[i]) - want[i]));
  }
  return err / std::max(scale, 1e-30);
}

TEST(Linear4bit, ForwardAndInputGradAgainstFloat64) {
  const int64_t m = 6, n = 37, k = 96;  // panels of 8 rows: 37 is not a multiple
  const Quantized4bit q = make_weight(n, k, {QuantType::kNF4, 64, true}, 11);
  const QuantizedWeight w = QuantizedWeight::from(q);
  const std::vector<float> wf = dequantize(q);
  const std::vector<float> xv = randn(size_t(m * k), 1.0f, 1);
  const std::vector<float> bv = randn(size_t(n), 0.5f, 2);
  const std::vector<float> dyv = randn(size_t(m * n), 1.0f, 3);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    // The reference sees the operands as the op does (rounded to dt).
    const std::vector<float> xr = tensor_of(xv, Shape{2, 3, k}, dt).to_vector();
    const std::vector<float> br = tensor_of(bv, Shape{n}, dt).to_vector();
    const std::vector<float> dyr = tensor_of(dyv, Shape{2, 3, n}, dt).to_vector();
    const Ref ref = reference(xr, wf, br, dyr, m, n, k);
    autograd::Tape tape;
    autograd::TapeScope scope(tape);
    Variable x(tensor_of(xv, Shape{2, 3, k}, dt), true);
    Variable b(tensor_of(bv, Shape{n}, dt), false);
    Variable y = linear_4bit(x, w, b, {.panel_elements = 8 * k});
    EXPECT_EQ(y.dtype(), dt);
    EXPECT_EQ(y.shape(), (Shape{2, 3, n}));
    y.slot()->ensure_grad().copy_from(tensor_of(dyv, Shape{2, 3, n}, dt));
    tape.run_backward();
    const double ey = max_rel(y.value().to_vector(), ref.y);
    const double edx = max_rel(x.grad().to_vector(), ref.dx);
    std::printf("linear_4bit %s: forward max rel diff %.3g, dx %.3g\n",
                std::string(dtype_name(dt)).c_str(), ey, edx);
    // fp32 compute; the output rounded to dt (2^-8 for bf16, 2^-11 for f16).
    const double tol = dt == DType::kF32 ? 1e-5 : dt == DType::kBF16 ? 8e-3 : 1e-3;
    EXPECT_LT(ey, tol);
    EXPECT_LT(edx, tol);
    EXPECT_FALSE(b.requires_grad());
  }
}

TEST(Linear4bit, InputGradMatchesFiniteDifferences) {
  const int64_t m = 2, n = 3, k = 16;
  const Quantized4bit q = make_weight(n, k, {QuantType::kFP4, 32, true}, 5);
  const QuantizedWeight w = QuantizedWeight::from(q);
  const std::vector<float> xv = randn(size_t(m * k), 1.0f, 8);
  const std::vector<float> g = randn(size_t(m * n), 1.0f, 9);
  auto f = [&](const std::vector<float>& xs) {  // sum(y * g), y = x W^T in the op
    autograd::NoGradGuard ng;
    const std::vector<float> y =
        linear_4bit(Variable(Tensor::from_vector(xs, Shape{m, k})), w).value().to_vector();
    double s = 0.0;
    for (size_t i = 0; i < y.size(); ++i) s += double(y[i]) * g[i];
    return s;
  };
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  Variable x(Tensor::from_vector(xv, Shape{m, k}), true);
  Variable y = linear_4bit(x, w);
  y.slot()->ensure_grad().copy_from(Tensor::from_vector(g, Shape{m, n}));
  tape.run_backward();
  const std::vector<float> dx = x.grad().to_vector();
  const float h = 1e-2f;  // f is linear in x: only rounding limits the step
  double worst = 0.0;
  for (size_t i = 0; i < xv.size(); ++i) {
    std::vector<float> xp = xv, xm = xv;
    xp[i] += h;
    xm[i] -= h;
    const double fd = (f(xp) - f(xm)) / (double(xp[i]) - double(xm[i]));
    worst = std::max(worst, std::abs(fd - dx[i]));
  }
  std::printf("linear_4bit finite differences: max |fd - dx| %.3g\n", worst);
  EXPECT_LT(worst, 1e-4);
}

TEST(Linear4bit, BiasGradAndNoGradForTheWeight) {
  const int64_t m = 4, n = 5, k = 32;
  const Quantized4bit q = make_weight(n, k, {QuantType::kNF4, 32, false}, 21);
  const QuantizedWeight w = QuantizedWeight::from(q);
  const std::vector<float> dyv = randn(size_t(m * n), 1.0f, 4);
  for (bool x_grad : {false, true}) {
    autograd::Tape tape;
    autograd::TapeScope scope(tape);
    Variable x(Tensor::from_vector(randn(size_t(m * k), 1.0f, 6), Shape{m, k}), x_grad);
    Variable b(Tensor::from_vector(randn(size_t(n), 1.0f, 7), Shape{n}), true);
    Variable y = linear_4bit(x, w, b);
    y.slot()->ensure_grad().copy_from(Tensor::from_vector(dyv, Shape{m, n}));
    tape.run_backward();
    const std::vector<float> db = b.grad().to_vector();
    for (int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (int64_t i = 0; i < m; ++i) s += dyv[size_t(i * n + j)];
      EXPECT_NEAR(db[size_t(j)], s, 1e-5) << j;
    }
    EXPECT_EQ(x.requires_grad(), x_grad);
    if (!x_grad) {
      EXPECT_FALSE(x.slot() && x.slot()->has_grad());
    }
  }
  // Nothing requires grad: nothing recorded. W itself has no gradient slot to reach.
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  Variable y = linear_4bit(Variable(Tensor::zeros(Shape{1, k})), w);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(tape.size(), 0u);
}

TEST(Linear4bit, RefusesBadShapesAndGpu) {
  const QuantizedWeight w = QuantizedWeight::from(make_weight(4, 32, {}, 1));
  EXPECT_DEATH(linear_4bit(Variable(Tensor::zeros(Shape{2, 31})), w), "weight of 32 inputs");
  EXPECT_DEATH(
      linear_4bit(Variable(Tensor::zeros(Shape{2, 32})), w, Variable(Tensor::zeros(Shape{5}))),
      "for 4 outputs");
  EXPECT_DEATH(linear_4bit(Variable(Tensor::zeros(Shape{2, 32})), QuantizedWeight()), "2-D");
  // CPU x with a meta weight is refused.
  EXPECT_DEATH(
      linear_4bit(Variable(Tensor::zeros(Shape{2, 32})), QuantizedWeight::empty({4, 32}, {})),
      "all on the CPU, all on the GPU or all on meta");
}

// Accountant usage of forward + backward relative to before, by category: peak and after.
struct Usage {
  int64_t peak_act = 0, after_act = 0, peak_frozen = 0, peak_quant = 0, after_quant = 0;
};

Usage run(Device device, DType dt, bool bias_grad, int64_t m, int64_t n, int64_t k,
          int64_t panel_elements) {
  DeviceScope scope(device);
  MemoryAccountant& acct = MemoryAccountant::global();
  const QuantOptions opts{QuantType::kNF4, 64, true};
  const QuantizedWeight w = device.is_meta() ? QuantizedWeight::empty({n, k}, opts)
                                             : QuantizedWeight::from(make_weight(n, k, opts, 2));
  Variable x(Tensor::zeros(Shape{m, k}, dt), true);
  Variable b(Tensor::zeros(Shape{n}, dt), bias_grad);
  const int64_t act0 = acct.current(MemCategory::kActivations);
  const int64_t frozen0 = acct.current(MemCategory::kFrozen);
  const int64_t quant0 = acct.current(MemCategory::kQuantized);
  acct.reset_peaks();
  Usage u;
  {
    autograd::Tape tape;
    autograd::TapeScope ts(tape);
    Variable y = linear_4bit(x, w, b, {.panel_elements = panel_elements});
    y.slot()->ensure_grad().zero_();
    tape.run_backward();
    u.after_act = acct.current(MemCategory::kActivations) - act0;
    u.after_quant = acct.current(MemCategory::kQuantized) - quant0;
  }
  u.peak_act = acct.peak(MemCategory::kActivations) - act0;
  u.peak_quant = acct.peak(MemCategory::kQuantized) - quant0;
  u.peak_frozen = acct.peak(MemCategory::kFrozen) - frozen0;
  return u;
}

TEST(Linear4bit, MetaAllocatesExactlyWhatTheCpuDoes) {
  const int64_t m = 3, n = 10, k = 128, pe = 4 * k;  // panels of 4 rows
  const int64_t blocks = n * k / 64;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (bool bias_grad : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (bias_grad ? " bias grad" : " frozen bias"));
      const Usage cpu = run(Device::cpu(), dt, bias_grad, m, n, k, pe);
      const Usage meta = run(Device::meta(), dt, bias_grad, m, n, k, pe);
      EXPECT_EQ(meta.peak_act, cpu.peak_act);
      EXPECT_EQ(meta.after_act, cpu.after_act);
      EXPECT_EQ(meta.peak_quant, cpu.peak_quant);
      // The scratch of the 4-bit base's category: the decoded absmax and one panel of 4 rows,
      // fp32, freed after each direction.
      EXPECT_EQ(cpu.peak_quant, 4 * (blocks + 4 * k));
      EXPECT_EQ(cpu.after_quant, 0);
      EXPECT_EQ(meta.peak_frozen, 0);
      EXPECT_EQ(cpu.peak_frozen, 0);
      if (dt == DType::kF32) {
        // Forward: y (m n), fp32. Backward with y alive: dy (m n), dx (m k), db (n).
        const int64_t fwd = 4 * (m * n);
        const int64_t bwd = 4 * (2 * m * n + m * k + (bias_grad ? n : 0));
        EXPECT_EQ(meta.peak_act, std::max(fwd, bwd));
        // y, x.grad and b.grad remain.
        EXPECT_EQ(meta.after_act, 4 * (m * n + m * k + (bias_grad ? n : 0)));
      }
    }
  }
}

}  // namespace
}  // namespace fd::quant
