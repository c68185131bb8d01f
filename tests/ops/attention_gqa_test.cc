// causal_attention over separate q, k, v with n_kv_head key/value heads (MHA, GQA, MQA):
// against a float64 reference (plain softmax attention with repeat_kv) and finite
// differences, and bit for bit against the packed overload when n_kv_head == n_head.
#include <cstring>

#include "lib/ops/attention.h"
#include "tests/ops/op_test_util.h"

namespace fd::ops {
namespace {

using namespace fd::ops::testing;

struct Geometry {
  int64_t B, T;
  int n_head, n_kv_head;
  int64_t D;

  int64_t q_width() const { return n_head * D; }
  int64_t kv_width() const { return n_kv_head * D; }
  std::string str() const {
    return fmt::format("B={} T={} n_head={} n_kv_head={} D={}", B, T, n_head, n_kv_head, D);
  }
};

// Inputs {q, k, v}; for each query head h, key/value head h / (n_head / n_kv_head) repeated
// (Hugging Face's repeat_kv), then the naive T x T softmax(q k^T / sqrt(D) + mask) v.
RefFn reference(const Geometry& g) {
  return [=](const std::vector<Vec>& in) {
    const Vec &q = in[0], &k = in[1], &v = in[2];
    const int64_t B = g.B, T = g.T, D = g.D, Cq = g.q_width(), Ckv = g.kv_width();
    const int group = g.n_head / g.n_kv_head;
    Vec out(B * T * Cq);
    Vec p(T);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < g.n_head; ++h) {
        const int64_t kvh = h / group;
        for (int64_t i = 0; i < T; ++i) {
          const double* qi = &q[(b * T + i) * Cq + h * D];
          double m = -INFINITY;
          for (int64_t j = 0; j <= i; ++j) {
            const double* kj = &k[(b * T + j) * Ckv + kvh * D];
            double s = 0;
            for (int64_t d = 0; d < D; ++d) s += qi[d] * kj[d];
            p[j] = s / std::sqrt(double(D));
            m = std::max(m, p[j]);
          }
          double z = 0;
          for (int64_t j = 0; j <= i; ++j) z += (p[j] = std::exp(p[j] - m));
          for (int64_t d = 0; d < D; ++d) {
            double o = 0;
            for (int64_t j = 0; j <= i; ++j) o += p[j] / z * v[(b * T + j) * Ckv + kvh * D + d];
            out[(b * T + i) * Cq + h * D + d] = o;
          }
        }
      }
    return out;
  };
}

// Random q, k, v (rounded to dt) and an output gradient R.
struct Case {
  std::vector<Vec> in;
  Vec R;
};
Case random_case(const Geometry& g, DType dt, uint32_t seed) {
  std::mt19937 rng(seed);
  Case c;
  c.in.push_back(rounded(randn(g.B * g.T * g.q_width(), rng, 1.5), dt));
  c.in.push_back(rounded(randn(g.B * g.T * g.kv_width(), rng, 1.5), dt));
  c.in.push_back(rounded(randn(g.B * g.T * g.kv_width(), rng, 1.5), dt));
  c.R = rounded(randn(g.B * g.T * g.q_width(), rng), dt);
  return c;
}

// The op's output and gradients dq, dk, dv.
struct Result {
  Tensor out, dq, dk, dv;
};
Result run(const Geometry& g, const Case& c, DType dt) {
  Variable q(make_tensor(c.in[0], Shape{g.B, g.T, g.q_width()}, dt), true);
  Variable k(make_tensor(c.in[1], Shape{g.B, g.T, g.kv_width()}, dt), true);
  Variable v(make_tensor(c.in[2], Shape{g.B, g.T, g.kv_width()}, dt), true);
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  Variable y = causal_attention(q, k, v, g.n_head, g.n_kv_head);
  EXPECT_EQ(y.shape(), (Shape{g.B, g.T, g.q_width()}));
  EXPECT_EQ(y.dtype(), dt);
  backward_with(tape, y, c.R);
  return {y.value(), q.grad(), k.grad(), v.grad()};
}

// Output and full finite-difference gradients against the float64 reference.
void check(const Geometry& g, DType dt) {
  std::printf("causal_attention(q, k, v) %s %s\n", g.str().c_str(), name_of(dt));
  const Case c = random_case(g, dt, 13);
  const Result r = run(g, c, dt);
  const RefFn ref = reference(g);
  const double tol = tol_for(dt);
  expect_close("out", values(r.out), ref(c.in), tol);
  expect_close("grad q", values(r.dq), fd_grad(ref, c.in, 0, c.R), tol);
  expect_close("grad k", values(r.dk), fd_grad(ref, c.in, 1, c.R), tol);
  expect_close("grad v", values(r.dv), fd_grad(ref, c.in, 2, c.R), tol);
}

TEST(CausalAttentionGqa, MhaF32) { check({2, 6, 2, 2, 8}, DType::kF32); }
TEST(CausalAttentionGqa, GqaF32) { check({2, 6, 4, 2, 8}, DType::kF32); }
TEST(CausalAttentionGqa, MqaF32) { check({2, 6, 4, 1, 8}, DType::kF32); }
TEST(CausalAttentionGqa, GqaHead16F32) { check({1, 5, 4, 2, 16}, DType::kF32); }
TEST(CausalAttentionGqa, MqaHead16F32) { check({1, 5, 4, 1, 16}, DType::kF32); }
TEST(CausalAttentionGqa, SingleTokenF32) { check({3, 1, 4, 2, 8}, DType::kF32); }
TEST(CausalAttentionGqa, GqaBF16) { check({2, 6, 4, 2, 8}, DType::kBF16); }
TEST(CausalAttentionGqa, MqaF16) { check({2, 6, 4, 1, 16}, DType::kF16); }

// T = 130 spans two 128-row query blocks of the CPU implementation (the second partial).
// A full finite-difference gradient is too slow here, so each gradient is checked along
// random directions U: <grad, U> against (L(x + hU) - L(x - hU)) / 2h.
void check_multi_block(const Geometry& g) {
  std::printf("causal_attention(q, k, v) %s f32 (directional)\n", g.str().c_str());
  const Case c = random_case(g, DType::kF32, 17);
  const Result r = run(g, c, DType::kF32);
  const RefFn ref = reference(g);
  expect_close("out", values(r.out), ref(c.in), 1e-5);
  std::mt19937 rng(23);
  const Vec grads[3] = {values(r.dq), values(r.dk), values(r.dv)};
  for (size_t which = 0; which < 3; ++which) {
    Vec got, want;
    for (int dir = 0; dir < 3; ++dir) {
      const Vec u = randn(int64_t(c.in[which].size()), rng);
      auto loss = [&](double h) {
        std::vector<Vec> x = c.in;
        for (size_t i = 0; i < u.size(); ++i) x[which][i] += h * u[i];
        const Vec out = ref(x);
        double s = 0;
        for (size_t i = 0; i < out.size(); ++i) s += c.R[i] * out[i];
        return s;
      };
      const double h = 1e-6;
      want.push_back((loss(h) - loss(-h)) / (2 * h));
      double dot = 0;
      for (size_t i = 0; i < u.size(); ++i) dot += grads[which][i] * u[i];
      got.push_back(dot);
    }
    expect_close(fmt::format("<grad {}, U> (3 directions)", "qkv"[which]), got, want, 1e-4);
  }
}

TEST(CausalAttentionGqa, MultiBlockMhaF32) { check_multi_block({1, 130, 2, 2, 8}); }
TEST(CausalAttentionGqa, MultiBlockGqaF32) { check_multi_block({1, 130, 4, 2, 8}); }
TEST(CausalAttentionGqa, MultiBlockMqaF32) { check_multi_block({1, 130, 4, 1, 16}); }

bool same_bits(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_vector(), y = b.to_vector();
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

// Every value of t rounded to dt (round to nearest even), back as a tensor of dt.
Tensor rounded_to(const Tensor& t, DType dt) { return make_tensor(values(t), t.shape(), dt); }

// bf16 inputs go through fp32 copies: the results are the f32 op's on the same (rounded)
// values, rounded once to bf16.
TEST(CausalAttentionGqa, BF16IsF32Rounded) {
  for (const Geometry& g : {Geometry{2, 7, 4, 2, 8}, Geometry{1, 130, 4, 1, 16}}) {
    std::printf("causal_attention(q, k, v) %s: bf16 against f32\n", g.str().c_str());
    const Case c = random_case(g, DType::kBF16, 29);
    const Result lo = run(g, c, DType::kBF16), hi = run(g, c, DType::kF32);
    EXPECT_TRUE(same_bits(lo.out, rounded_to(hi.out, DType::kBF16))) << "out";
    EXPECT_TRUE(same_bits(lo.dq, rounded_to(hi.dq, DType::kBF16))) << "dq";
    EXPECT_TRUE(same_bits(lo.dk, rounded_to(hi.dk, DType::kBF16))) << "dk";
    EXPECT_TRUE(same_bits(lo.dv, rounded_to(hi.dv, DType::kBF16))) << "dv";
    expect_close("out bf16 vs f32", values(lo.out), values(hi.out), 1e-2);
  }
}

// With n_kv_head == n_head and q, k, v copied out of a packed qkv, the results are the
// packed overload's bit for bit (one implementation serves both).
void check_packed_equivalence(int64_t B, int64_t T, int n_head, int64_t D, DType dt) {
  const int64_t C = n_head * D;
  std::printf("causal_attention(q, k, v) vs (qkv) B=%ld T=%ld n_head=%d D=%ld %s\n", long(B),
              long(T), n_head, long(D), name_of(dt));
  std::mt19937 rng(31);
  const Vec x = rounded(randn(B * T * 3 * C, rng, 1.5), dt);
  const Vec R = rounded(randn(B * T * C, rng), dt);
  Variable qkv(make_tensor(x, Shape{B, T, 3 * C}, dt), true);
  Tensor packed_out;
  {
    autograd::Tape tape;
    autograd::TapeScope scope(tape);
    Variable y = causal_attention(qkv, n_head);
    backward_with(tape, y, R);
    packed_out = y.value();
  }
  // Columns [part * C, (part + 1) * C) of every row of a (B, T, 3C) array.
  auto third = [&](const Vec& a, int part) {
    Vec t(B * T * C);
    for (int64_t row = 0; row < B * T; ++row)
      for (int64_t j = 0; j < C; ++j) t[row * C + j] = a[row * 3 * C + part * C + j];
    return t;
  };
  const Geometry g{B, T, n_head, n_head, D};
  const Result r = run(g, Case{{third(x, 0), third(x, 1), third(x, 2)}, R}, dt);
  const Vec dqkv = values(qkv.grad());
  const Shape s{B, T, C};
  EXPECT_TRUE(same_bits(r.out, packed_out)) << "out";
  EXPECT_TRUE(same_bits(r.dq, make_tensor(third(dqkv, 0), s, dt))) << "dq";
  EXPECT_TRUE(same_bits(r.dk, make_tensor(third(dqkv, 1), s, dt))) << "dk";
  EXPECT_TRUE(same_bits(r.dv, make_tensor(third(dqkv, 2), s, dt))) << "dv";
}

TEST(CausalAttentionGqa, SameBitsAsPackedF32) {
  check_packed_equivalence(2, 7, 3, 4, DType::kF32);
  check_packed_equivalence(2, 130, 2, 8, DType::kF32);
  check_packed_equivalence(1, 130, 4, 16, DType::kF32);
}
TEST(CausalAttentionGqa, SameBitsAsPackedBF16) {
  check_packed_equivalence(2, 130, 2, 16, DType::kBF16);
}

// Only the inputs that require a gradient get one, and it is the full backward's.
TEST(CausalAttentionGqa, GradientOnlyWhereRequired) {
  const Geometry g{2, 9, 4, 2, 8};
  const Case c = random_case(g, DType::kF32, 37);
  const Result full = run(g, c, DType::kF32);
  for (int which = 0; which < 3; ++which) {
    std::vector<Variable> x;
    const Shape shapes[3] = {Shape{g.B, g.T, g.q_width()}, Shape{g.B, g.T, g.kv_width()},
                             Shape{g.B, g.T, g.kv_width()}};
    for (int i = 0; i < 3; ++i)
      x.emplace_back(make_tensor(c.in[size_t(i)], shapes[i], DType::kF32), i == which);
    autograd::Tape tape;
    autograd::TapeScope scope(tape);
    Variable y = causal_attention(x[0], x[1], x[2], g.n_head, g.n_kv_head);
    backward_with(tape, y, c.R);
    const Tensor want[3] = {full.dq, full.dk, full.dv};
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(x[size_t(i)].grad().defined(), i == which) << "input " << i << " of " << which;
    }
    EXPECT_TRUE(same_bits(x[size_t(which)].grad(), want[which])) << "input " << which;
  }
}

// Changing token 4's q, k and v must leave the outputs of tokens 0..3 bit-identical.
TEST(CausalAttentionGqa, FutureTokensDoNotInfluenceThePast) {
  const Geometry g{2, 7, 4, 1, 8};
  const int64_t perturbed = 4;
  Case c = random_case(g, DType::kF32, 41);
  auto out = [&](const Case& cc) {
    Variable q(make_tensor(cc.in[0], Shape{g.B, g.T, g.q_width()}, DType::kF32), false);
    Variable k(make_tensor(cc.in[1], Shape{g.B, g.T, g.kv_width()}, DType::kF32), false);
    Variable v(make_tensor(cc.in[2], Shape{g.B, g.T, g.kv_width()}, DType::kF32), false);
    return causal_attention(q, k, v, g.n_head, g.n_kv_head).value().to_vector();
  };
  const std::vector<float> y0 = out(c);
  for (int i = 0; i < 3; ++i) {
    const int64_t width = i == 0 ? g.q_width() : g.kv_width();
    for (int64_t b = 0; b < g.B; ++b)
      for (int64_t j = 0; j < width; ++j) c.in[size_t(i)][(b * g.T + perturbed) * width + j] += 3;
  }
  const std::vector<float> y1 = out(c);
  const int64_t C = g.q_width();
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t t = 0; t < g.T; ++t) {
      bool same = true;
      for (int64_t j = 0; j < C; ++j)
        same = same && y0[(b * g.T + t) * C + j] == y1[(b * g.T + t) * C + j];
      EXPECT_EQ(same, t < perturbed) << "batch " << b << " token " << t;
    }
}

TEST(CausalAttentionGqaDeathTest, RejectsBadShapes) {
  Variable q(Tensor::zeros(Shape{1, 4, 24}), false);
  Variable kv(Tensor::zeros(Shape{1, 4, 12}), false);
  EXPECT_DEATH(causal_attention(q, kv, kv, 3, 2), "n_head a multiple of n_kv_head");
  EXPECT_DEATH(causal_attention(q, kv, kv, 4, 1), "n_kv_head");  // k width 12, want 6
  Variable kv16(Tensor::zeros(Shape{1, 4, 12}, DType::kBF16), false);
  EXPECT_DEATH(causal_attention(q, kv16, kv16, 4, 2), "dtypes");
}

}  // namespace
}  // namespace fd::ops
