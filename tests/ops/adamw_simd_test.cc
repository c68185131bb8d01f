// The CPU AdamW kernels (lib/ops/cpu/adamw_*.cc) against the scalar
// reference ops::adamw_update(float*...), bit for bit (memcmp): every
// instruction set this CPU runs, every gradient dtype, with and without the
// compute copy, zeros, denormals, huge values, NaN and Inf gradients, odd
// lengths and offsets, arrays misaligned relative to each other, 1-3 threads.
//
// The reference runs one element at a time (n = 1), on the gradient as
// convert_to_f32 gives it, times the scale when that is not 1; the expected
// copy is convert_f32_to of the expected parameters. The state p, m, v is
// finite, so every NaN has a single source and its bits are well defined.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "lib/ops/adamw.h"
#include "lib/ops/cpu/adamw_isa.h"
#include "lib/tensor/tensor.h"

namespace fd::ops {
namespace cpu {
// For gtest's messages and ctest's test list: the kernel's name, not its bytes.
void PrintTo(AdamWIsa isa, std::ostream* os) { *os << adamw_isa_name(isa); }
}  // namespace cpu

namespace {

using cpu::AdamWIsa;

struct GradCase {
  DType dtype;
  float scale;
};
constexpr GradCase kGradCases[] = {{DType::kF32, 1.0f},  {DType::kF32, 0.37f},
                                   {DType::kBF16, 1.0f}, {DType::kBF16, 0.37f},
                                   {DType::kF16, 1.0f},  {DType::kF16, 1.0f / 3.0f}};
// The compute copy: none (kI32 stands for it here), or rewritten in this dtype.
constexpr DType kNoCopy = DType::kI32;
constexpr DType kCopies[] = {kNoCopy, DType::kBF16, DType::kF16, DType::kF32};
constexpr int64_t kLengths[] = {0, 1, 7, 15, 16, 17, 63, 64, 65, 1000, 4097, 100003};
constexpr AdamWStep kStep{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3};

// Restores the kernel, the thread count and the split size whatever a test did.
struct Restore {
  ~Restore() {
    cpu::set_adamw_isa(cpu::adamw_best_isa());
    set_adamw_threads(1);
    cpu::set_adamw_min_part(cpu::kAdamWMinPart);
  }
};

std::string copy_name(DType c) { return c == kNoCopy ? "none" : std::string(dtype_name(c)); }

// A flat tensor of n elements starting `skew` elements into its storage, so that the arrays of
// one call are misaligned with respect to each other.
Tensor skewed(int64_t n, DType dtype, size_t skew) {
  Tensor whole = Tensor::empty(Shape{n + int64_t(skew)}, dtype);
  return Tensor::view_of(whole.storage(), skew, Shape{n}, dtype);
}

// Awkward fp32 values: mostly N(0, scale), with zeros of both signs, denormals and huge values.
float awkward(std::mt19937& rng, float scale, float huge) {
  std::normal_distribution<float> normal(0.0f, scale);
  switch (rng() % 16) {
    case 0:
      return rng() % 2 ? 0.0f : -0.0f;
    case 1:
      return bits_f32((rng() & 0x807fffffu) | 1u);  // a denormal
    case 2:
      return rng() % 2 ? huge : -huge;
    case 3:
      return normal(rng) * 1e-30f;
    default:
      return normal(rng);
  }
}

// The inputs of one call: finite state, gradients with a NaN and infinities among awkward values.
struct Inputs {
  std::vector<float> p, m, v;
  std::vector<uint8_t> grad;  // numel values of the gradient dtype
  std::vector<uint8_t> copy;  // numel values of the copy dtype (garbage outside the range)
};

Inputs make_inputs(int64_t numel, int64_t offset, int64_t n, DType gt, DType ct, uint32_t seed) {
  std::mt19937 rng(seed);
  Inputs in;
  for (int64_t i = 0; i < numel; ++i) {
    in.p.push_back(awkward(rng, 1.0f, 1e30f));
    in.m.push_back(awkward(rng, 0.1f, 1e20f));
    const float s = awkward(rng, 0.1f, 1e18f);
    in.v.push_back(s * s);
  }
  std::vector<float> g(static_cast<size_t>(numel));
  for (float& x : g) x = awkward(rng, std::pow(10.0f, float(rng() % 10) - 8.0f), 1e30f);
  if (n >= 3) {
    g[size_t(offset + n / 2)] = std::nanf("");
    g[size_t(offset + n / 3)] = INFINITY;
    g[size_t(offset)] = -INFINITY;
  }
  in.grad.resize(size_t(numel) * dtype_size(gt));
  convert_f32_to(gt, g.data(), in.grad.data(), g.size());
  if (gt != DType::kF32) {  // and every few elements a random 16-bit pattern: NaNs, subnormals
    uint16_t* h = reinterpret_cast<uint16_t*>(in.grad.data());
    for (int64_t i = 0; i < numel; i += 1 + int64_t(rng() % 8)) h[i] = uint16_t(rng());
  }
  const size_t cs = ct == kNoCopy ? 0 : dtype_size(ct);
  for (size_t i = 0; i < size_t(numel) * cs; ++i) in.copy.push_back(uint8_t(rng()));
  return in;
}

// The reference, element by element, over [offset, offset + n).
Inputs expected(Inputs in, int64_t offset, int64_t n, DType gt, float scale, DType ct,
                const AdamWStep& s) {
  std::vector<float> g(in.p.size());
  convert_to_f32(gt, in.grad.data(), g.data(), g.size());
  for (int64_t i = offset; i < offset + n; ++i) {
    float gi = g[size_t(i)];
    if (scale != 1.0f) gi *= scale;
    adamw_update(&in.p[size_t(i)], &gi, &in.m[size_t(i)], &in.v[size_t(i)], 1, s);
  }
  if (ct != kNoCopy)
    convert_f32_to(ct, in.p.data() + offset, in.copy.data() + size_t(offset) * dtype_size(ct),
                   size_t(n));
  return in;
}

// What the backend leaves in the arrays (skewed tensors, as lib/optim's could be).
Inputs run_backend(const Inputs& in, int64_t offset, int64_t n, DType gt, float scale, DType ct,
                   const AdamWStep& s) {
  const int64_t numel = int64_t(in.p.size());
  Tensor p = skewed(numel, DType::kF32, 0), m = skewed(numel, DType::kF32, 1),
         v = skewed(numel, DType::kF32, 2), g = skewed(numel, gt, 1), c;
  std::memcpy(p.raw(), in.p.data(), p.nbytes());
  std::memcpy(m.raw(), in.m.data(), m.nbytes());
  std::memcpy(v.raw(), in.v.data(), v.nbytes());
  std::memcpy(g.raw(), in.grad.data(), g.nbytes());
  if (ct != kNoCopy) {
    c = skewed(numel, ct, 3);
    std::memcpy(c.raw(), in.copy.data(), c.nbytes());
  }
  adamw_update(p, g, scale, m, v, c, offset, n, s);
  Inputs out = in;
  std::memcpy(out.p.data(), p.raw(), p.nbytes());
  std::memcpy(out.m.data(), m.raw(), m.nbytes());
  std::memcpy(out.v.data(), v.raw(), v.nbytes());
  if (ct != kNoCopy) std::memcpy(out.copy.data(), c.raw(), c.nbytes());
  return out;
}

// Bitwise equality of one array, naming the first differing element.
template <typename T>
::testing::AssertionResult same_bits(const char* name, const std::vector<T>& got,
                                     const std::vector<T>& want, size_t elem = sizeof(T)) {
  if (got.size() == want.size() &&
      std::memcmp(got.data(), want.data(), got.size() * sizeof(T)) == 0)
    return ::testing::AssertionSuccess();
  const auto* a = reinterpret_cast<const uint8_t*>(got.data());
  const auto* b = reinterpret_cast<const uint8_t*>(want.data());
  size_t i = 0;
  while (std::memcmp(a + i * elem, b + i * elem, elem) == 0) ++i;
  uint32_t x = 0, y = 0;
  std::memcpy(&x, a + i * elem, elem);
  std::memcpy(&y, b + i * elem, elem);
  char msg[96];
  std::snprintf(msg, sizeof msg, "%s[%zu]: bits 0x%x, reference 0x%x", name, i, x, y);
  return ::testing::AssertionFailure() << msg;
}

bool all_same(const Inputs& a, const Inputs& b) {
  return same_bits("p", a.p, b.p) && same_bits("m", a.m, b.m) && same_bits("v", a.v, b.v) &&
         a.copy == b.copy;
}

class AdamWSimd : public ::testing::TestWithParam<AdamWIsa> {
 protected:
  void SetUp() override {
    if (!cpu::adamw_isa_supported(GetParam()))
      GTEST_SKIP() << "this CPU cannot run " << cpu::adamw_isa_name(GetParam());
    cpu::set_adamw_isa(GetParam());
    cpu::set_adamw_min_part(64);  // split even short ranges between the threads
  }
  Restore restore_;
};

TEST_P(AdamWSimd, MatchesScalarReferenceBitForBit) {
  int cases = 0;
  for (const GradCase& gc : kGradCases) {
    for (DType ct : kCopies) {
      for (int64_t n : kLengths) {
        const int64_t offset = n % 2 ? 3 : 37;  // never a multiple of a vector
        const int64_t numel = offset + n + 11;
        const Inputs in = make_inputs(numel, offset, n, gc.dtype, ct, uint32_t(n + 7 * cases));
        const Inputs want = expected(in, offset, n, gc.dtype, gc.scale, ct, kStep);
        for (int threads : {1, 2, 3}) {
          SCOPED_TRACE(::testing::Message() << "grad " << dtype_name(gc.dtype) << " x " << gc.scale
                                            << ", copy " << copy_name(ct) << ", n " << n
                                            << ", offset " << offset << ", threads " << threads);
          set_adamw_threads(threads);
          const Inputs got = run_backend(in, offset, n, gc.dtype, gc.scale, ct, kStep);
          EXPECT_TRUE(same_bits("p", got.p, want.p));
          EXPECT_TRUE(same_bits("m", got.m, want.m));
          EXPECT_TRUE(same_bits("v", got.v, want.v));
          EXPECT_TRUE(same_bits("copy", got.copy, want.copy, ct == kNoCopy ? 1 : dtype_size(ct)));
          ++cases;
        }
      }
    }
  }
  std::printf("adamw %s: %d cases bitwise equal to the scalar reference\n",
              std::string(cpu::adamw_isa_name(GetParam())).c_str(), cases);
}

// The comparison sees the smallest changes: eps one ulp away, or one product and sum fused into
// an FMA (what -ffp-contract=fast would do), change bits that the test above compares.
TEST_P(AdamWSimd, ComparisonSeesOneUlpAndOneFma) {
  const int64_t n = 4097, offset = 5, numel = n + 16;
  const Inputs in = make_inputs(numel, offset, n, DType::kF32, kNoCopy, 11);
  AdamWStep other = kStep;
  other.eps = std::nextafter(kStep.eps, 1.0f);
  const Inputs want = expected(in, offset, n, DType::kF32, 1.0f, kNoCopy, kStep);
  EXPECT_TRUE(all_same(run_backend(in, offset, n, DType::kF32, 1.0f, kNoCopy, kStep), want));
  EXPECT_FALSE(all_same(run_backend(in, offset, n, DType::kF32, 1.0f, kNoCopy, other), want));

  // v = b2 * v + ((1 - b2) * g) * g with the last product fused: some v differ.
  const cpu::AdamWScalars k = cpu::adamw_scalars(kStep);
  std::vector<float> g(static_cast<size_t>(numel));
  std::memcpy(g.data(), in.grad.data(), g.size() * 4);
  int fused_differs = 0;
  for (int64_t i = offset; i < offset + n; ++i) {
    const float gi = g[size_t(i)], vi = in.v[size_t(i)];
    const float fused = std::fma(k.one_minus_beta2 * gi, gi, k.beta2 * vi);
    fused_differs += f32_bits(fused) != f32_bits(want.v[size_t(i)]) && !std::isnan(fused);
  }
  std::printf("adamw %s: an FMA in v's update would change %d of %lld elements\n",
              std::string(cpu::adamw_isa_name(GetParam())).c_str(), fused_differs,
              static_cast<long long>(n));
  EXPECT_GT(fused_differs, 0);
}

// Every bf16 and f16 bit pattern as a gradient (NaNs, infinities, subnormals included), read
// as convert_to_f32 reads it.
TEST_P(AdamWSimd, EverySixteenBitGradientPattern) {
  const int64_t n = 65536, offset = 1, numel = n + 2;
  for (DType gt : {DType::kBF16, DType::kF16}) {
    for (DType ct : {DType::kBF16, DType::kF16}) {
      SCOPED_TRACE(::testing::Message()
                   << "grad " << dtype_name(gt) << ", copy " << dtype_name(ct));
      Inputs in = make_inputs(numel, offset, n, gt, ct, 5);
      uint16_t* h = reinterpret_cast<uint16_t*>(in.grad.data());
      for (int64_t i = 0; i < n; ++i) h[offset + i] = uint16_t(i);
      set_adamw_threads(2);
      const Inputs want = expected(in, offset, n, gt, 1.0f, ct, kStep);
      const Inputs got = run_backend(in, offset, n, gt, 1.0f, ct, kStep);
      EXPECT_TRUE(same_bits("p", got.p, want.p));
      EXPECT_TRUE(same_bits("m", got.m, want.m));
      EXPECT_TRUE(same_bits("v", got.v, want.v));
      EXPECT_TRUE(same_bits("copy", got.copy, want.copy, 2));
    }
  }
}

// With lr = 0 the parameters stay as they are (NaNs quieted), so the copy is their conversion:
// every f16 value, the midpoints between neighbours and one ulp either side (ties to even,
// subnormals, overflow to inf), bf16 ties, NaNs: what convert_f32_to and f32_to_f16 /
// f32_to_bf16 give.
TEST_P(AdamWSimd, CopyRoundsAsConvertF32To) {
  std::vector<float> values;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;  // inf and NaN: below
    const float a = f16_to_f32(uint16_t(h));
    const float b = (h & 0x7fff) == 0x7bff ? std::copysign(65536.0f, a)  // 65520: the tie to inf
                                           : f16_to_f32(uint16_t(h + 1));
    const float mid = float((double(a) + double(b)) / 2);
    values.insert(values.end(), {a, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 2 * mid)});
  }
  std::mt19937 rng(3);
  for (int i = 0; i < 20000; ++i) {
    const uint32_t u = rng();
    values.push_back(bits_f32(u));                            // anything, NaNs too
    values.push_back(bits_f32((u & 0xffff0000u) | 0x8000u));  // a bf16 tie
    values.push_back(bits_f32((u & 0xffff0000u) | 0x7fffu));
  }
  for (uint32_t u : {0x7f800000u, 0xff800000u, 0x7f800001u, 0x7fbfffffu, 0x7fc00000u, 0xffc00001u,
                     0x7f7fffffu, 0x477fefffu, 0x477ff000u, 0x33000000u, 0x33000001u})
    values.push_back(bits_f32(u));
  const int64_t n = int64_t(values.size()), offset = 7, numel = n + 8;
  AdamWStep s = kStep;
  s.lr = 0.0f;
  for (DType ct : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(::testing::Message() << "copy " << dtype_name(ct));
    Inputs in = make_inputs(numel, offset, n, DType::kF32, ct, 9);
    std::fill(in.m.begin(), in.m.end(), 0.0f);
    std::fill(in.v.begin(), in.v.end(), 0.0f);
    std::fill(in.grad.begin(), in.grad.end(), 0);
    std::copy(values.begin(), values.end(), in.p.begin() + offset);
    set_adamw_threads(3);
    const Inputs want = expected(in, offset, n, DType::kF32, 1.0f, ct, s);
    const Inputs got = run_backend(in, offset, n, DType::kF32, 1.0f, ct, s);
    EXPECT_TRUE(same_bits("p", got.p, want.p));
    EXPECT_TRUE(same_bits("copy", got.copy, want.copy, 2));
    // The bulk conversion (F16C where the CPU has it) is also the scalar one, element by element.
    const uint16_t* c = reinterpret_cast<const uint16_t*>(got.copy.data());
    int64_t bad = 0;
    for (int64_t i = offset; i < offset + n; ++i) {
      const float x = want.p[size_t(i)];
      bad += c[i] != (ct == DType::kF16 ? f32_to_f16(x) : f32_to_bf16(x));
    }
    EXPECT_EQ(bad, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, AdamWSimd, ::testing::ValuesIn(cpu::kAdamWIsas),
                         [](const auto& info) {
                           return std::string(cpu::adamw_isa_name(info.param));
                         });

// Parts: contiguous, boundaries on multiples of 64, covering [begin, end) exactly.
TEST(AdamWThreads, PartsAreAlignedAndCoverTheRange) {
  for (int64_t begin : {0, 1, 63, 64, 100}) {
    for (int64_t n : {0, 1, 64, 127, 1000, 100003}) {
      for (int parts : {1, 2, 3, 7}) {
        int64_t prev = begin;
        EXPECT_EQ(cpu::adamw_part_bound(begin, begin + n, parts, 0), begin);
        for (int k = 1; k <= parts; ++k) {
          const int64_t b = cpu::adamw_part_bound(begin, begin + n, parts, k);
          EXPECT_GE(b, prev);
          if (k < parts && b != begin && b != begin + n) {
            EXPECT_EQ(b % 64, 0);
          }
          prev = b;
        }
        EXPECT_EQ(prev, begin + n);
      }
    }
  }
  // An even split: three parts of 3 x 64 k elements are 64 k each.
  EXPECT_EQ(cpu::adamw_part_bound(0, 3 * 65536, 3, 1), 65536);
  EXPECT_EQ(cpu::adamw_part_bound(0, 3 * 65536, 3, 2), 2 * 65536);
}

// The default split size and the best kernel, several threads, callers on two threads at once
// (they take turns on the pool): the same bits as one thread.
TEST(AdamWThreads, DefaultsAndConcurrentCallersMatchOneThread) {
  Restore restore;
  const int64_t n = 300001, offset = 3, numel = n + 5;
  const Inputs in = make_inputs(numel, offset, n, DType::kBF16, DType::kBF16, 21);
  const Inputs want = expected(in, offset, n, DType::kBF16, 0.5f, DType::kBF16, kStep);
  set_adamw_threads(3);
  Inputs got[2];
  std::thread other(
      [&] { got[1] = run_backend(in, offset, n, DType::kBF16, 0.5f, DType::kBF16, kStep); });
  got[0] = run_backend(in, offset, n, DType::kBF16, 0.5f, DType::kBF16, kStep);
  other.join();
  for (const Inputs& g : got) {
    EXPECT_TRUE(same_bits("p", g.p, want.p));
    EXPECT_TRUE(same_bits("m", g.m, want.m));
    EXPECT_TRUE(same_bits("v", g.v, want.v));
    EXPECT_TRUE(same_bits("copy", g.copy, want.copy, 2));
  }
}

}  // namespace
}  // namespace fd::ops
