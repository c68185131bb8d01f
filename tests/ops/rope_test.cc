#include "lib/ops/rope.h"

#include <numbers>

#include "tests/ops/op_test_util.h"

namespace fd::ops {
namespace {

using namespace fd::ops::testing;

constexpr int64_t kB = 2, kT = 5, kH = 3, kD = 8, kP = 7;

// Rotation of x (B, T, H*D) by tables c, s (P, D), Hugging Face's x * cos + rotate_half(x) * sin.
Vec rotate(const Vec& x, const Vec& c, const Vec& s) {
  Vec out(x.size());
  const int64_t h = kD / 2;
  for (int64_t bt = 0; bt < kB * kT; ++bt) {
    const int64_t t = bt % kT;
    for (int64_t head = 0; head < kH; ++head) {
      const int64_t o = (bt * kH + head) * kD;
      for (int64_t i = 0; i < kD; ++i) {
        const double rot = i < h ? -x[size_t(o + i + h)] : x[size_t(o + i - h)];
        out[size_t(o + i)] = x[size_t(o + i)] * c[size_t(t * kD + i)] + rot * s[size_t(t * kD + i)];
      }
    }
  }
  return out;
}

// cos/sin of p * inv_freq, duplicated over both halves, in float64.
void tables64(const Vec& inv, int64_t P, int64_t D, Vec* c, Vec* s) {
  c->assign(size_t(P * D), 0.0);
  s->assign(size_t(P * D), 0.0);
  for (int64_t p = 0; p < P; ++p)
    for (int64_t i = 0; i < D; ++i) {
      const double a = double(p) * inv[size_t(i % (D / 2))];
      (*c)[size_t(p * D + i)] = std::cos(a);
      (*s)[size_t(p * D + i)] = std::sin(a);
    }
}

// Hugging Face's default / linear / llama3 inverse frequencies, written as its torch code
// (torch.where on the whole vector), in float64.
Vec inv_freq64(const RopeOptions& o) {
  const int64_t half = o.head_dim / 2;
  Vec inv(static_cast<size_t>(half));
  for (int64_t j = 0; j < half; ++j)
    inv[size_t(j)] = 1.0 / std::pow(o.theta, double(2 * j) / double(o.head_dim));
  if (o.kind == RopeScalingKind::kLinear)
    for (double& f : inv) f /= o.factor;
  if (o.kind != RopeScalingKind::kLlama3) return inv;
  const double old_len = double(o.original_max_position_embeddings);
  const double low_wl = old_len / o.low_freq_factor, high_wl = old_len / o.high_freq_factor;
  for (double& f : inv) {
    const double wl = 2 * std::numbers::pi / f;
    const double llama = wl > low_wl ? f / o.factor : f;
    const double smooth =
        (old_len / wl - o.low_freq_factor) / (o.high_freq_factor - o.low_freq_factor);
    const double smoothed = (1 - smooth) * llama / o.factor + smooth * llama;
    const bool medium = !(wl < high_wl) && !(wl > low_wl);
    f = medium ? smoothed : llama;
  }
  return inv;
}

RopeOptions small_options() { return RopeOptions{.head_dim = kD, .theta = 100.0}; }

void check(DType dt, bool four_d) {
  std::printf("rope %s %s\n", name_of(dt), four_d ? "(B, T, H, D)" : "(B, T, C)");
  const RopeTables tab = rope_tables(small_options(), kP);
  const Vec c = values(tab.cos), s = values(tab.sin);
  std::mt19937 rng(11);
  std::vector<Vec> in = {rounded(randn(kB * kT * kH * kD, rng), dt)};
  const Vec R = rounded(randn(kB * kT * kH * kD, rng), dt);
  const Shape shape = four_d ? Shape{kB, kT, kH, kD} : Shape{kB, kT, kH * kD};
  Variable xv(make_tensor(in[0], shape, dt), true);
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  Variable y = rope(xv, tab.cos, tab.sin);
  EXPECT_EQ(y.dtype(), dt);
  EXPECT_EQ(y.shape(), shape);
  auto ref = [&](const std::vector<Vec>& v) { return rotate(v[0], c, s); };
  const double tol = tol_for(dt);
  expect_close("out", values(y.value()), ref(in), tol);
  backward_with(tape, y, R);
  expect_close("grad x", values(xv.grad()), fd_grad(ref, in, 0, R), tol);
}

TEST(Rope, GradF32) { check(DType::kF32, false); }
TEST(Rope, GradF32FourDims) { check(DType::kF32, true); }
TEST(Rope, GradBF16) { check(DType::kBF16, false); }
TEST(Rope, GradF16) { check(DType::kF16, false); }

TEST(Rope, BF16MatchesF32) {
  std::printf("rope bf16 vs f32\n");
  const RopeTables tab = rope_tables(small_options(), kP);
  std::mt19937 rng(12);
  const Vec x = rounded(randn(kB * kT * kH * kD, rng), DType::kBF16);
  auto out = [&](DType dt) {
    return values(
        rope(Variable(make_tensor(x, Shape{kB, kT, kH * kD}, dt), false), tab.cos, tab.sin)
            .value());
  };
  expect_close("out", out(DType::kBF16), out(DType::kF32), 1e-2);
}

// Position 0 is the identity; a rotation keeps each (i, i + D/2) pair's length.
TEST(Rope, PositionZeroIsIdentity) {
  const RopeTables tab = rope_tables(small_options(), kP);
  std::mt19937 rng(13);
  const Vec x = rounded(randn(kD, rng), DType::kF32);
  const Vec y =
      values(rope(Variable(make_tensor(x, Shape{1, 1, kD}, DType::kF32), false), tab.cos, tab.sin)
                 .value());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(y[i], x[i]) << i;
}

void check_tables(const std::string& what, const RopeOptions& o, int64_t P) {
  std::printf("rope tables: %s\n", what.c_str());
  const Vec inv64 = inv_freq64(o);
  const std::vector<float> inv = rope_inv_freq(o);
  expect_close("inv_freq", Vec(inv.begin(), inv.end()), inv64, 1e-7);
  Vec c64, s64;
  tables64(inv64, P, o.head_dim, &c64, &s64);
  const RopeTables tab = rope_tables(o, P);
  EXPECT_EQ(tab.cos.shape(), (Shape{P, o.head_dim}));
  EXPECT_EQ(tab.cos.dtype(), DType::kF32);
  // fp32 angles: p * inv_freq carries a relative error of about 6e-8 (the torch behaviour).
  expect_close("cos", values(tab.cos), c64, 1e-6);
  expect_close("sin", values(tab.sin), s64, 1e-6);
}

TEST(RopeTables, Default) {
  check_tables("default theta 10000 D 64", RopeOptions{.head_dim = 64, .theta = 10000.0}, 64);
}

TEST(RopeTables, Linear) {
  check_tables(
      "linear factor 4",
      RopeOptions{
          .head_dim = 32, .theta = 10000.0, .kind = RopeScalingKind::kLinear, .factor = 4.0},
      64);
}

// Llama 3.1's parameters: D = 128 spans all three regimes (kept, ramp, divided).
TEST(RopeTables, Llama3) {
  const RopeOptions o{.head_dim = 128,
                      .theta = 500000.0,
                      .kind = RopeScalingKind::kLlama3,
                      .factor = 8.0,
                      .low_freq_factor = 1.0,
                      .high_freq_factor = 4.0,
                      .original_max_position_embeddings = 8192};
  check_tables("llama3 (Llama 3.1 8B)", o, 64);
  RopeOptions plain = o;
  plain.kind = RopeScalingKind::kDefault;
  const std::vector<float> scaled = rope_inv_freq(o), base = rope_inv_freq(plain);
  int kept = 0, divided = 0, ramp = 0;
  for (size_t j = 0; j < scaled.size(); ++j) {
    if (scaled[j] == base[j]) {
      ++kept;
    } else if (std::abs(double(scaled[j]) * 8.0 / double(base[j]) - 1.0) < 1e-6) {
      ++divided;
    } else {
      ++ramp;
      EXPECT_GT(scaled[j], base[j] / 8.0f);
      EXPECT_LT(scaled[j], base[j]);
    }
  }
  std::printf("  llama3 regimes: kept %d, ramp %d, divided %d\n", kept, ramp, divided);
  EXPECT_GT(kept, 0);
  EXPECT_GT(ramp, 0);
  EXPECT_GT(divided, 0);
  EXPECT_EQ(scaled[0], 1.0f);
}

}  // namespace
}  // namespace fd::ops
