// QLoRA's 4-bit base on the GPU against lib/quant on the CPU (issue 37).
//
// The decoded block absmax and dequantized ranges must be the CPU's bits (kernels/quant_4bit.cu
// repeats lib/quant's float operations and its flush of subnormals): NF4 and FP4, with and without
// double quantization, an odd element count, more than 256 blocks (two nested absmax values),
// ranges that start and end mid-byte and mid-block, a block with subnormal products, an all-zero
// block; fp32 and bf16 outputs. linear_4bit's forward, input gradient and bias gradient on the GPU
// are compared with the CPU's as the op parity tests compare (||gpu - cpu|| / ||cpu||, fp32 1e-5,
// bf16 1e-2; one PARITY line each, which device_check.sh collects, as for the whole dequantized
// weight and its absmax, where 0 means the same bits), and its scratch with the CPU's and meta's
// (the memory estimate runs on meta). Without a usable GPU every test skips.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/kernels.h"
#include "lib/autograd/tape.h"
#include "lib/quant/linear_4bit.h"
#include "lib/quant/quantize.h"
#include "lib/quant/quantized_weight.h"
#include "lib/tensor/device.h"
#include "lib/tensor/memory.h"
#include "lib/tensor/tensor.h"
#include "tests/gpu/require_gpu.h"

namespace fd::quant {
namespace {

using autograd::Variable;

std::vector<float> randn(size_t n, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// A weight of n values (odd) in blocks of `block`: 0.02 N(0, 1), one all-zero block, one block of
// tiny values (products code * absmax below FLT_MIN: flushed), subnormal inputs among normals.
std::vector<float> awkward_values(int64_t n, int64_t block, uint32_t seed) {
  std::vector<float> v = randn(size_t(n), 0.02f, seed);
  for (int64_t i = 2 * block; i < 3 * block; ++i) v[size_t(i)] = 0.0f;
  for (int64_t i = 5 * block; i < 6 * block; ++i) v[size_t(i)] *= 1e-36f;
  v[size_t(7 * block + 3)] = 1e-40f;  // subnormal: counts as 0
  v[size_t(7 * block + 4)] = -3e-39f;
  return v;
}

std::vector<uint32_t> bits(const Tensor& t) {
  const Tensor host = t.is_cuda() ? t.to_device(Device::cpu(), MemCategory::kOther) : t;
  std::vector<uint32_t> b(size_t(host.numel()));
  if (host.dtype() == DType::kF32) {
    std::memcpy(b.data(), host.raw(), host.nbytes());
  } else {
    const auto* h = host.data<uint16_t>();
    for (size_t i = 0; i < b.size(); ++i) b[i] = h[i];
  }
  return b;
}

// The index and both values of the first difference, or "" when equal.
std::string first_difference(const std::vector<uint32_t>& gpu, const std::vector<uint32_t>& cpu) {
  if (gpu.size() != cpu.size())
    return "sizes " + std::to_string(gpu.size()) + " vs " + std::to_string(cpu.size());
  for (size_t i = 0; i < gpu.size(); ++i) {
    if (gpu[i] != cpu[i]) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "element %zu: gpu 0x%08x cpu 0x%08x", i, gpu[i], cpu[i]);
      return buf;
    }
  }
  return "";
}

double rel_diff(const Tensor& gpu, const Tensor& cpu) {
  std::vector<float> g = gpu.to_vector(), c = cpu.to_vector();
  EXPECT_EQ(g.size(), c.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    num += (double(g[i]) - c[i]) * (double(g[i]) - c[i]);
    den += double(c[i]) * c[i];
  }
  EXPECT_GT(den, 0.0) << "reference is all zero: the comparison would prove nothing";
  return std::sqrt(num / den);
}

struct Case {
  QuantType type;
  int64_t block_size;
  bool double_quant;
};

// gtest prints a parameter in test listings (and ctest's names): the case, not its bytes.
void PrintTo(const Case& c, std::ostream* os) {
  *os << quant_type_name(c.type) << " block " << c.block_size
      << (c.double_quant ? " double quant" : " plain");
}

class GpuQuant : public ::testing::TestWithParam<Case> {};

TEST_P(GpuQuant, AbsmaxAndRangesAreTheCpusBits) {
  REQUIRE_GPU();
  const Case c = GetParam();
  const QuantOptions opts{c.type, c.block_size, c.double_quant};
  // 300 blocks and a partial one (two nested groups with double quantization), an odd count.
  const int64_t n = 300 * c.block_size + 37;
  const Quantized4bit q = quantize(awkward_values(n, c.block_size, 11), {n}, opts, "w");
  const QuantizedWeight cpu = QuantizedWeight::from(q, Device::cpu());
  const QuantizedWeight gpu = QuantizedWeight::from(q, Device::cuda(0));
  ASSERT_TRUE(gpu.is_cuda());
  EXPECT_EQ(gpu.storage_bytes(), q.storage_bytes());

  // The upload is exact: the GPU's bytes read back are the weight.
  const Quantized4bit back = gpu.to_quantized4bit();
  EXPECT_EQ(back.packed, q.packed);
  EXPECT_EQ(back.absmax, q.absmax);
  ASSERT_EQ(back.nested.has_value(), q.nested.has_value());
  if (q.nested) {
    EXPECT_EQ(back.nested->codes, q.nested->codes);
    EXPECT_EQ(back.nested->absmax, q.nested->absmax);
    EXPECT_EQ(std::memcmp(&back.nested->offset, &q.nested->offset, 4), 0);
  }

  const int64_t blocks = q.num_blocks();
  Tensor a_cpu = Tensor::empty(Shape{blocks}, DType::kF32, MemCategory::kOther, Device::cpu());
  Tensor a_gpu = Tensor::empty(Shape{blocks}, DType::kF32, MemCategory::kOther, Device::cuda(0));
  cpu.block_absmax(a_cpu);
  gpu.block_absmax(a_gpu);
  EXPECT_EQ(first_difference(bits(a_gpu), bits(a_cpu)), "") << "decoded absmax";
  // ... which is quant::block_absmax of the Quantized4bit.
  const std::vector<float> ref = block_absmax(q);
  EXPECT_EQ(std::memcmp(ref.data(), a_cpu.data<float>(), ref.size() * 4), 0);

  const int64_t bs = c.block_size;
  const std::vector<std::pair<int64_t, int64_t>> ranges = {
      {0, n},                      // the whole weight, the padding nibble excluded
      {1, 2 * bs + 1},             // starts on a low nibble, ends on a high one
      {bs - 1, 3},                 // across a block boundary
      {5 * bs + 7, bs},            // inside the block of flushed products
      {n - 1, 1},                  // the last element (high nibble of the last byte)
      {256 * bs - 3, 2 * bs + 5},  // across the nested groups' boundary
      {7, 0}};                     // empty
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (auto [begin, count] : ranges) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " [" + std::to_string(begin) + ", +" +
                   std::to_string(count) + ")");
      Tensor o_cpu = Tensor::empty(Shape{count}, dt, MemCategory::kOther, Device::cpu());
      Tensor o_gpu = Tensor::empty(Shape{count}, dt, MemCategory::kOther, Device::cuda(0));
      dequantize_range(cpu, a_cpu, begin, count, o_cpu);
      dequantize_range(gpu, a_gpu, begin, count, o_gpu);
      EXPECT_EQ(first_difference(bits(o_gpu), bits(o_cpu)), "");
      if (begin == 0 && count == n) {  // the device check's report: 0 when bit for bit
        const std::string name = std::string(quant_type_name(c.type)) + "_b" +
                                 std::to_string(c.block_size) + (c.double_quant ? "_dq" : "_plain");
        std::printf(
            "PARITY op=dequantize_4bit_%s dtype=%s out=%.2e grad0=%.2e (grad0: the "
            "absmax; bound 0)\n",
            name.c_str(), std::string(dtype_name(dt)).c_str(), rel_diff(o_gpu, o_cpu),
            rel_diff(a_gpu, a_cpu));
      }
      if (dt == DType::kF32) {  // ... which is quant::dequantize_range of the Quantized4bit
        std::vector<float> r(static_cast<size_t>(count));
        dequantize_range(q, ref, begin, count, r.data());
        EXPECT_EQ(count == 0 ? 0 : std::memcmp(r.data(), o_cpu.data<float>(), r.size() * 4), 0);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, GpuQuant,
                         ::testing::Values(Case{QuantType::kNF4, 64, true},
                                           Case{QuantType::kNF4, 64, false},
                                           Case{QuantType::kFP4, 128, true},
                                           Case{QuantType::kFP4, 32, false}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return std::string(quant_type_name(i.param.type)) + "_b" +
                                  std::to_string(i.param.block_size) +
                                  (i.param.double_quant ? "_dq" : "_plain");
                         });

// y, x.grad and bias.grad of linear_4bit on `dev` (host copies); x is (2, 19, K).
std::vector<Tensor> run_linear(Device dev, DType dt, const Quantized4bit& q,
                               int64_t panel_elements) {
  DeviceScope scope(dev);
  const int64_t n = q.shape[0], k = q.shape[1];
  autograd::Tape tape;
  autograd::TapeScope ts(tape);
  const QuantizedWeight w = QuantizedWeight::from(q, dev);
  Variable x(Tensor::from_vector(randn(size_t(2 * 19 * k), 1.0f, 3), Shape{2, 19, k}, dt), true);
  Variable b(Tensor::from_vector(randn(size_t(n), 0.5f, 4), Shape{n}, dt), true);
  Variable y = linear_4bit(x, w, b, {.panel_elements = panel_elements});
  y.slot()->grad = Tensor::from_vector(randn(size_t(y.value().numel()), 1.0f, 5), y.shape(), dt);
  tape.run_backward();
  return {y.value().to_device(Device::cpu()), x.grad().to_device(Device::cpu()),
          b.grad().to_device(Device::cpu())};
}

TEST(GpuQuantLinear, ForwardAndGradientsMatchTheCpu) {
  REQUIRE_GPU();
  const bool tf32 = kernels::tf32_allowed();
  kernels::set_tf32(false);       // exact fp32 GEMMs, as the CPU's
  const int64_t n = 53, k = 200;  // blocks of 64 straddle rows; 7 panels of 8 rows, a short last
  for (auto [type, dq] : {std::pair{QuantType::kNF4, true}, std::pair{QuantType::kFP4, false}}) {
    const Quantized4bit q = quantize(randn(size_t(n * k), 0.02f, 9), {n, k}, {type, 64, dq}, "w");
    for (DType dt : {DType::kF32, DType::kBF16}) {
      const std::vector<Tensor> cpu = run_linear(Device::cpu(), dt, q, 8 * k);
      const std::vector<Tensor> gpu = run_linear(Device::cuda(0), dt, q, 8 * k);
      const double bound = dt == DType::kF32 ? 1e-5 : 1e-2;
      std::string line = "PARITY op=linear_4bit_" + std::string(quant_type_name(type)) +
                         " dtype=" + std::string(dtype_name(dt));
      const char* names[] = {"out", "grad0", "grad1"};
      for (size_t i = 0; i < cpu.size(); ++i) {
        const double r = rel_diff(gpu[i], cpu[i]);
        char buf[48];
        std::snprintf(buf, sizeof buf, " %s=%.2e", names[i], r);
        line += buf;
        EXPECT_LE(r, bound) << line;
      }
      std::printf("%s (bound %.0e)\n", line.c_str(), bound);
    }
  }
  kernels::set_tf32(tf32);
}

// Accountant usage of forward + backward relative to before, by category (peak and after), as
// tests/quant/linear_4bit_test.cc measures it for the CPU and meta.
struct Usage {
  int64_t peak_act = 0, after_act = 0, peak_quant = 0, after_quant = 0, peak_frozen = 0;
};

Usage run_usage(Device device, DType dt, bool bias_grad, int64_t m, int64_t n, int64_t k,
                int64_t panel_elements) {
  DeviceScope scope(device);
  MemoryAccountant& acct = MemoryAccountant::global();
  const QuantOptions opts{QuantType::kNF4, 64, true};
  const QuantizedWeight w =
      device.is_meta() ? QuantizedWeight::empty({n, k}, opts)
                       : QuantizedWeight::from(
                             quantize(randn(size_t(n * k), 0.02f, 2), {n, k}, opts, "w"), device);
  Variable x(Tensor::zeros(Shape{m, k}, dt), true);
  Variable b(Tensor::zeros(Shape{n}, dt), bias_grad);
  const int64_t act0 = acct.current(MemCategory::kActivations);
  const int64_t quant0 = acct.current(MemCategory::kQuantized);
  const int64_t frozen0 = acct.current(MemCategory::kFrozen);
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

TEST(GpuQuantLinear, ScratchIsWhatTheEstimateCounts) {
  REQUIRE_GPU();
  const int64_t m = 3, n = 10, k = 128, pe = 4 * k;  // panels of 4 rows
  const int64_t blocks = n * k / 64;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (bool bias_grad : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (bias_grad ? " bias grad" : " frozen bias"));
      const Usage cpu = run_usage(Device::cpu(), dt, bias_grad, m, n, k, pe);
      const Usage meta = run_usage(Device::meta(), dt, bias_grad, m, n, k, pe);
      const Usage gpu = run_usage(Device::cuda(0), dt, bias_grad, m, n, k, pe);
      EXPECT_EQ(gpu.peak_act, meta.peak_act);
      EXPECT_EQ(gpu.after_act, meta.after_act);
      EXPECT_EQ(gpu.peak_quant, meta.peak_quant);
      EXPECT_EQ(gpu.peak_quant, cpu.peak_quant);
      EXPECT_EQ(gpu.peak_quant, 4 * (blocks + 4 * k));  // the decoded absmax and one panel
      EXPECT_EQ(gpu.after_quant, 0);
      EXPECT_EQ(gpu.peak_frozen, 0);
    }
  }
}

TEST(GpuQuantLinear, WeightOnTheGpuIsCountedAsOnTheCpu) {
  REQUIRE_GPU();
  MemoryAccountant& acct = MemoryAccountant::global();
  const QuantOptions opts{QuantType::kFP4, 128, true};
  const Quantized4bit q = quantize(randn(size_t(300 * 65), 0.02f, 8), {300, 65}, opts, "w");
  const int64_t before = acct.current(MemCategory::kFrozen);
  {
    const QuantizedWeight w = QuantizedWeight::from(q, Device::cuda(0));
    EXPECT_EQ(acct.current(MemCategory::kFrozen) - before, encoded_layout(300 * 65, opts).bytes);
  }
  EXPECT_EQ(acct.current(MemCategory::kFrozen), before);
}

}  // namespace
}  // namespace fd::quant
