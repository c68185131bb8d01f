// Packed batches (a bad doc_starts or position is a bug in the caller: FD_CHECK):
// causal_attention with doc_starts (block-diagonal attention per document)
// and rope with per-token positions, against float64 references and against running each
// document on its own.
#include <cmath>

#include "lib/base/error.h"
#include "lib/ops/attention.h"
#include "lib/ops/rope.h"
#include "tests/ops/op_test_util.h"

namespace fd::ops {
namespace {

using namespace fd::ops::testing;

// (B, T) starts from each row's document lengths.
std::vector<int32_t> starts_of(const std::vector<std::vector<int>>& docs, int64_t T) {
  std::vector<int32_t> s;
  for (const auto& row : docs) {
    int32_t at = 0;
    for (int len : row) {
      for (int i = 0; i < len; ++i) s.push_back(at);
      at += len;
    }
    EXPECT_EQ(at, T);
  }
  return s;
}

Tensor starts_tensor(const std::vector<int32_t>& s, int64_t B, int64_t T) {
  std::vector<float> f(s.begin(), s.end());
  return Tensor::from_vector(f, Shape{B, T}, DType::kI32, MemCategory::kOther);
}

// Inputs {q (B,T,H*D), k (B,T,KV*D), v}: softmax over keys [start_i, i] only, float64.
RefFn reference(int64_t B, int64_t T, int H, int KV, int64_t D, const std::vector<int32_t>& st) {
  return [=](const std::vector<Vec>& in) {
    const Vec &q = in[0], &k = in[1], &v = in[2];
    Vec out(size_t(B * T * H * D));
    Vec p(static_cast<size_t>(T));
    for (int64_t b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h) {
        const int kvh = h / (H / KV);
        for (int64_t i = 0; i < T; ++i) {
          const int64_t lo = st[size_t(b * T + i)];
          double m = -INFINITY;
          for (int64_t j = lo; j <= i; ++j) {
            double s = 0;
            for (int64_t d = 0; d < D; ++d)
              s += q[size_t((b * T + i) * H * D + h * D + d)] *
                   k[size_t((b * T + j) * KV * D + kvh * D + d)];
            p[size_t(j)] = s / std::sqrt(double(D));
            m = std::max(m, p[size_t(j)]);
          }
          double z = 0;
          for (int64_t j = lo; j <= i; ++j) z += (p[size_t(j)] = std::exp(p[size_t(j)] - m));
          for (int64_t d = 0; d < D; ++d) {
            double o = 0;
            for (int64_t j = lo; j <= i; ++j)
              o += p[size_t(j)] / z * v[size_t((b * T + j) * KV * D + kvh * D + d)];
            out[size_t((b * T + i) * H * D + h * D + d)] = o;
          }
        }
      }
    return out;
  };
}

TEST(PackedAttention, MatchesFloat64ReferenceWithGradients) {
  const int64_t B = 2, T = 9, D = 4;
  const int H = 4, KV = 2;
  const std::vector<int32_t> st = starts_of({{3, 1, 5}, {9}}, T);
  std::mt19937 rng(5);
  std::vector<Vec> in = {randn(B * T * H * D, rng), randn(B * T * KV * D, rng),
                         randn(B * T * KV * D, rng)};
  const Vec R = randn(B * T * H * D, rng);
  Variable q(make_tensor(in[0], Shape{B, T, H * D}, DType::kF32), true);
  Variable k(make_tensor(in[1], Shape{B, T, KV * D}, DType::kF32), true);
  Variable v(make_tensor(in[2], Shape{B, T, KV * D}, DType::kF32), true);
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  Variable y = causal_attention(q, k, v, H, KV, starts_tensor(st, B, T));
  const RefFn ref = reference(B, T, H, KV, D, st);
  expect_close("out", values(y.value()), ref(in), 1e-5);
  backward_with(tape, y, R);
  expect_close("grad q", values(q.grad()), fd_grad(ref, in, 0, R), 1e-4);
  expect_close("grad k", values(k.grad()), fd_grad(ref, in, 1, R), 1e-4);
  expect_close("grad v", values(v.grad()), fd_grad(ref, in, 2, R), 1e-4);
}

// Documents across the 128-row query blocks of the implementation: a packed row gives what
// each document gives alone (outputs and gradients), within fp32 rounding.
TEST(PackedAttention, EqualsEachDocumentAlone) {
  const int64_t T = 300, D = 8;
  const int H = 2;
  const std::vector<int> lens = {100, 40, 1, 119, 40};
  const std::vector<int32_t> st = starts_of({lens}, T);
  std::mt19937 rng(7);
  const Vec x = randn(T * 3 * H * D, rng), R = randn(T * H * D, rng);
  Variable qkv(make_tensor(x, Shape{1, T, 3 * H * D}, DType::kF32), true);
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  Variable y = causal_attention(qkv, H, starts_tensor(st, 1, T));
  backward_with(tape, y, R);
  const Vec packed_y = values(y.value()), packed_g = values(qkv.grad());

  Vec alone_y, alone_g;
  int64_t at = 0;
  for (int len : lens) {
    const int64_t C3 = 3 * H * D, C = H * D;
    Vec xd(x.begin() + at * C3, x.begin() + (at + len) * C3);
    Vec rd(R.begin() + at * C, R.begin() + (at + len) * C);
    Variable d(make_tensor(xd, Shape{1, len, C3}, DType::kF32), true);
    autograd::Tape t2;
    autograd::TapeScope s2(t2);
    Variable yd = causal_attention(d, H);
    backward_with(t2, yd, rd);
    for (double e : values(yd.value())) alone_y.push_back(e);
    for (double e : values(d.grad())) alone_g.push_back(e);
    at += len;
  }
  expect_close("out: packed vs alone", packed_y, alone_y, 1e-6);
  expect_close("grad: packed vs alone", packed_g, alone_g, 1e-6);
}

// Every start 0: the plain kernel's results, bit for bit.
TEST(PackedAttention, OneDocumentPerRowIsBitwisePlainAttention) {
  const int64_t B = 2, T = 150, C = 16;
  std::mt19937 rng(9);
  const Vec x = randn(B * T * 3 * C, rng);
  Variable a(make_tensor(x, Shape{B, T, 3 * C}, DType::kF32), false);
  const std::vector<float> plain = causal_attention(a, 2).value().to_vector();
  const std::vector<float> packed =
      causal_attention(a, 2, starts_tensor(std::vector<int32_t>(size_t(B * T), 0), B, T))
          .value()
          .to_vector();
  EXPECT_EQ(plain, packed);
}

TEST(PackedAttention, RefusesStartsThatAreNotDocuments) {
  const int64_t T = 4;
  Variable a(make_tensor(Vec(size_t(T * 3 * 4), 0.5), Shape{1, T, 12}, DType::kF32), false);
  for (const std::vector<int32_t>& bad :
       {std::vector<int32_t>{1, 1, 1, 1}, std::vector<int32_t>{0, 0, 1, 1},
        std::vector<int32_t>{0, 0, 3, 3}, std::vector<int32_t>{0, -1, 2, 2}}) {
    EXPECT_DEATH(causal_attention(a, 1, starts_tensor(bad, 1, T)), "doc_starts\\[0, ");
  }
  EXPECT_DEATH(causal_attention(a, 1, starts_tensor({0, 0, 0, 0, 0}, 1, 5)), "want i32 \\(B, T\\)");
}

// rope with positions: each token rotated by its position within its document, which is
// exactly (bit for bit) what the document alone gets.
TEST(PackedRope, PositionsRestartPerDocument) {
  const int64_t T = 10, D = 8, C = 2 * D;
  RopeOptions o;
  o.head_dim = D;
  const RopeTables tables = rope_tables(o, 16);
  std::mt19937 rng(11);
  const Vec x = randn(T * C, rng);
  const std::vector<int> lens = {4, 6};
  std::vector<float> pos;
  for (int len : lens)
    for (int i = 0; i < len; ++i) pos.push_back(float(i));
  Variable xv(make_tensor(x, Shape{1, T, C}, DType::kF32), true);
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  Variable y = rope(xv, tables.cos, tables.sin,
                    Tensor::from_vector(pos, Shape{1, T}, DType::kI32, MemCategory::kOther));
  const Vec R = randn(T * C, rng);
  backward_with(tape, y, R);
  Vec alone_y, alone_g;
  int64_t at = 0;
  for (int len : lens) {
    Vec xd(x.begin() + at * C, x.begin() + (at + len) * C);
    Vec rd(R.begin() + at * C, R.begin() + (at + len) * C);
    Variable d(make_tensor(xd, Shape{1, len, C}, DType::kF32), true);
    autograd::Tape t2;
    autograd::TapeScope s2(t2);
    Variable yd = rope(d, tables.cos, tables.sin);
    backward_with(t2, yd, rd);
    for (double e : values(yd.value())) alone_y.push_back(e);
    for (double e : values(d.grad())) alone_g.push_back(e);
    at += len;
  }
  EXPECT_EQ(values(y.value()), alone_y);
  EXPECT_EQ(values(xv.grad()), alone_g);
  // A position past the tables is refused.
  std::vector<float> far(size_t(T), 16.0f);
  EXPECT_DEATH(rope(xv, tables.cos, tables.sin,
                    Tensor::from_vector(far, Shape{1, T}, DType::kI32, MemCategory::kOther)),
               "outside the tables");
}

}  // namespace
}  // namespace fd::ops
