#include "lib/ops/linear_cross_entropy.h"

#include <fmt/format.h>

#include <cstring>

#include "lib/ops/cross_entropy.h"
#include "lib/ops/matmul.h"
#include "tests/ops/op_test_util.h"

namespace fd::ops {
namespace {

using namespace fd::ops::testing;

struct Result {
  Vec loss, dh, dw;  // dw empty when the weight is frozen
};

// loss and gradients (seed `seed`) of the fused op (chunk_rows > 0) or of
// matmul(h, w^T) + cross_entropy (chunk_rows == 0), on h (B, T, C) and w (V, C).
Result run(const Vec& h, const Vec& w, int64_t B, int64_t T, int64_t C, int64_t V, DType dt,
           const std::vector<float>& targets, int ignore, int64_t chunk_rows, bool train_w = true,
           double seed = 1.3) {
  Variable hv(make_tensor(h, Shape{B, T, C}, dt), true);
  Variable wv(make_tensor(w, Shape{V, C}, dt), train_w);
  Tensor tg = Tensor::from_vector(targets, Shape{B, T}, DType::kI32);
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  Variable loss = chunk_rows > 0 ? linear_cross_entropy(hv, wv, tg, ignore, chunk_rows)
                                 : cross_entropy(matmul(hv, wv, {}, {.trans_b = true}), tg, ignore);
  EXPECT_EQ(loss.dtype(), DType::kF32);
  EXPECT_EQ(loss.shape().numel(), 1);
  backward_with(tape, loss, {seed});
  Result r{values(loss.value()), values(hv.grad()), {}};
  if (train_w)
    r.dw = values(wv.grad());
  else
    EXPECT_FALSE(wv.slot()->grad.defined()) << "a frozen weight must get no gradient";
  return r;
}

std::vector<float> make_targets(int64_t rows, int64_t V, int ignore, int every) {
  std::vector<float> t;
  for (int64_t r = 0; r < rows; ++r)
    t.push_back(every > 0 && r % every == 1 ? float(ignore) : float((r * 7 + 2) % V));
  return t;
}

int64_t bitwise_equal(const Vec& a, const Vec& b) {
  int64_t n = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) n += a[i] == b[i];
  return n;
}

// Against matmul + cross_entropy on the same f32 inputs, for chunks that divide the rows,
// do not, are a single row, and cover every row.
TEST(LinearCrossEntropy, MatchesMatmulPlusCrossEntropyF32) {
  constexpr int64_t B = 3, T = 7, C = 16, V = 37, R = B * T;
  std::mt19937 rng(5);
  const Vec h = randn(R * C, rng), w = randn(V * C, rng, 0.5);
  for (int ignore : {-1, 3}) {
    const std::vector<float> tg = make_targets(R, V, ignore, 4);
    const Result ref = run(h, w, B, T, C, V, DType::kF32, tg, ignore, 0);
    for (int64_t chunk : {1, 5, 7, 21, 1000}) {
      std::printf("linear_cross_entropy f32 ignore_index=%d chunk_rows=%lld\n", ignore,
                  (long long)chunk);
      const Result got = run(h, w, B, T, C, V, DType::kF32, tg, ignore, chunk);
      expect_close("loss vs matmul+cross_entropy", got.loss, ref.loss, 1e-6);
      expect_close("dh vs matmul+cross_entropy", got.dh, ref.dh, 1e-6);
      expect_close("dW vs matmul+cross_entropy", got.dw, ref.dw, 1e-6);
      std::printf("  bitwise equal: loss %lld/1, dh %lld/%zu, dW %lld/%zu\n",
                  (long long)bitwise_equal(got.loss, ref.loss),
                  (long long)bitwise_equal(got.dh, ref.dh), ref.dh.size(),
                  (long long)bitwise_equal(got.dw, ref.dw), ref.dw.size());
      if (chunk >= R) {
        // One chunk: the forward's softmax is kept and the backward runs no logits GEMM; its
        // gradients are the bits of matmul + cross_entropy, as the recomputing path's were.
        EXPECT_EQ(bitwise_equal(got.dh, ref.dh), int64_t(ref.dh.size()));
        EXPECT_EQ(bitwise_equal(got.dw, ref.dw), int64_t(ref.dw.size()));
      }
      for (int64_t r = 0; r < R; ++r) {
        if (int(tg[size_t(r)]) != ignore) continue;
        for (int64_t c = 0; c < C; ++c)
          EXPECT_EQ(got.dh[size_t(r * C + c)], 0.0) << "ignored row " << r << " got a gradient";
      }
    }
  }
}

void check_against_fd(DType dt, int64_t chunk, bool train_w) {
  constexpr int64_t B = 1, T = 5, C = 4, V = 7, R = B * T;
  std::printf("linear_cross_entropy %s chunk_rows=%lld vs finite differences%s\n", name_of(dt),
              (long long)chunk, train_w ? "" : " (frozen weight)");
  std::mt19937 rng(11);
  const std::vector<Vec> in = {rounded(randn(R * C, rng), dt), rounded(randn(V * C, rng), dt)};
  const std::vector<float> tg = make_targets(R, V, -1, 3);
  const double seed = 0.7;
  const Result got = run(in[0], in[1], B, T, C, V, dt, tg, -1, chunk, train_w, seed);
  const RefFn ref = linear_cross_entropy_reference(R, C, V, tg, -1);
  expect_close("loss", got.loss, ref(in), dt == DType::kF32 ? 1e-6 : 1e-5);
  expect_close("dh", got.dh, fd_grad(ref, in, 0, {seed}), tol_for(dt));
  if (train_w) expect_close("dW", got.dw, fd_grad(ref, in, 1, {seed}), tol_for(dt));
}

TEST(LinearCrossEntropy, FiniteDifferencesF32) {
  for (int64_t chunk : {2, 5, 64}) check_against_fd(DType::kF32, chunk, true);
}
TEST(LinearCrossEntropy, FiniteDifferencesBF16) { check_against_fd(DType::kBF16, 2, true); }
TEST(LinearCrossEntropy, FiniteDifferencesF16) { check_against_fd(DType::kF16, 3, true); }
TEST(LinearCrossEntropy, FrozenWeightGetsNoGradient) { check_against_fd(DType::kBF16, 2, false); }

// Every target ignored: loss 0 and nothing added to either gradient.
TEST(LinearCrossEntropy, AllIgnoredGivesZeroLossAndZeroGrad) {
  const std::vector<float> tg(6, -1.0f);
  const Result r = run(Vec(6 * 4, 0.5), Vec(5 * 4, 0.25), 2, 3, 4, 5, DType::kF32, tg, -1, 4);
  EXPECT_EQ(r.loss[0], 0.0);
  for (double g : r.dh) EXPECT_EQ(g, 0.0);
  for (double g : r.dw) EXPECT_EQ(g, 0.0);
}

using Bytes = int64_t;

// kActivations peak over forward + backward, relative to just before the op.
Bytes activation_peak(Device device, int64_t R, int64_t C, int64_t V, int64_t chunk) {
  DeviceScope scope(device);
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> hv(size_t(R * C)), wv(size_t(V * C)), tv(static_cast<size_t>(R));
  for (float& x : hv) x = dist(rng);
  for (float& x : wv) x = 0.1f * dist(rng);
  for (size_t i = 0; i < tv.size(); ++i) tv[i] = float((i * 7919) % size_t(V));
  // The weight's gradient lives with the other parameter gradients, as in training.
  Variable w =
      Variable::bound_leaf(Tensor::from_vector(wv, Shape{V, C}, DType::kF32, MemCategory::kParams),
                           Tensor::zeros(Shape{V, C}, DType::kF32, MemCategory::kGrads));
  Variable h(Tensor::from_vector(hv, Shape{4, R / 4, C}), true);
  Tensor tg = Tensor::from_vector(tv, Shape{4, R / 4}, DType::kI32, MemCategory::kOther);
  MemoryAccountant& acct = MemoryAccountant::global();
  const Bytes base = acct.current(MemCategory::kActivations);
  acct.reset_peaks();
  {
    autograd::Tape tape;
    autograd::TapeScope tscope(tape);
    Variable loss = chunk > 0 ? linear_cross_entropy(h, w, tg, -1, chunk)
                              : cross_entropy(matmul(h, w, {}, {.trans_b = true}), tg);
    tape.backward(loss);
  }
  return acct.peak(MemCategory::kActivations) - base;
}

// The chunk plan: one chunk whenever every row's fp32 logits fit the budget (at least 64 MiB),
// else chunks of a multiple of 16 rows, at least 16, each within the budget.
TEST(HeadChunkPlan, OneChunkWhenTheLogitsFitElseChunksWithinTheBudget) {
  constexpr int64_t MiB = int64_t{1} << 20;
  // Llama-S: 1024 rows x 32000 = 125 MiB of logits; the blocks keep more than that.
  HeadChunkPlan p = head_chunk_plan(1024, 32000, 280 * MiB);
  EXPECT_TRUE(p.one_chunk());
  EXPECT_EQ(p.chunk_rows, 1024);
  EXPECT_EQ(p.chunks, 1);
  EXPECT_EQ(p.logits_bytes, 1024 * 32000 * 4);
  // A budget under the minimum is the minimum: 64 MiB / (32000 x 4) = 524 rows -> 512.
  for (int64_t held : {int64_t{0}, int64_t{-5}, 10 * MiB}) {
    p = head_chunk_plan(1024, 32000, held);
    EXPECT_EQ(p.budget_bytes, kHeadMinBudgetBytes);
    EXPECT_EQ(p.chunk_rows, 512);
    EXPECT_EQ(p.chunks, 2);
    EXPECT_FALSE(p.one_chunk());
  }
  // Qwen's vocabulary: 96 rows per chunk at 64 MiB, 11 chunks for 1024 rows (the last short).
  p = head_chunk_plan(1024, 151936, 0);
  EXPECT_EQ(p.chunk_rows, 96);
  EXPECT_EQ(p.chunks, 11);
  EXPECT_LE(p.logits_bytes, p.budget_bytes);
  // Exactly at the budget is one chunk; one byte under is not.
  p = head_chunk_plan(4096, 8192, 4096 * 8192 * 4);
  EXPECT_TRUE(p.one_chunk());
  p = head_chunk_plan(4096, 8192, 4096 * 8192 * 4 - 1);
  EXPECT_EQ(p.chunks, 2);
  EXPECT_EQ(p.chunk_rows, 4080);  // 4095 rows fit: the multiple of 16 below
  // A vocabulary too large for 16 rows in the budget still takes 16 rows a chunk.
  p = head_chunk_plan(100, int64_t{8} << 20, 0);
  EXPECT_EQ(p.chunk_rows, 16);
  EXPECT_EQ(p.chunks, 7);
  // Small heads, and no rows at all: one chunk.
  EXPECT_TRUE(head_chunk_plan(21, 37, 0).one_chunk());
  EXPECT_EQ(head_chunk_plan(0, 37, 0).chunks, 1);
  // Every row count up to 4 chunks' worth: chunks x chunk_rows covers the rows, one chunk less
  // would not, and every chunk's logits are within the budget.
  for (int64_t rows = 1; rows <= 2100; rows += 13) {
    p = head_chunk_plan(rows, 32000, 0);
    EXPECT_GE(p.chunks * p.chunk_rows, rows);
    EXPECT_LT((p.chunks - 1) * p.chunk_rows, rows);
    EXPECT_LE(std::min(p.chunk_rows, rows) * 32000 * 4, p.budget_bytes);
  }
}

// Qwen's vocabulary, 4 x 256 rows: the chunked head's activation peak is about one
// chunk of fp32 logits, against two full (R, V) tensors (logits and their gradient).
TEST(LinearCrossEntropy, ActivationPeakIsAChunkNotTheLogits) {
  constexpr int64_t V = 151936, C = 64, R = 4 * 256, chunk = 64;
  const Bytes chunked = activation_peak(Device::cpu(), R, C, V, chunk);
  EXPECT_EQ(activation_peak(Device::meta(), R, C, V, chunk), chunked);
  // The unchunked path allocates 2 x 622 MB; meta allocations equal the CPU's (meta_test.cc).
  const Bytes unchunked = activation_peak(Device::meta(), R, C, V, 0);
  const Bytes logits = R * V * 4, scratch = chunk * V * 4;
  std::printf("activation peak, forward+backward, V=%lld C=%lld R=%lld:\n", (long long)V,
              (long long)C, (long long)R);
  std::printf("  matmul + cross_entropy     %12lld bytes (%.3fx the fp32 logits)\n",
              (long long)unchunked, double(unchunked) / double(logits));
  std::printf("  linear_cross_entropy/%-4lld  %12lld bytes (%.3fx; one chunk is %lld)\n",
              (long long)chunk, (long long)chunked, double(chunked) / double(logits),
              (long long)scratch);
  EXPECT_LE(double(chunked), 0.25 * double(logits));
  EXPECT_GE(unchunked, logits);
  // One chunk of logits plus dh, lse and targets (R * (C + 2) * 4).
  EXPECT_LE(chunked, scratch + R * (C + 2) * 4 + 4096);
  // One chunk over every row keeps its softmax from the forward to the backward, which then
  // allocates no scratch of its own: the peak is still one buffer of logits.
  const Bytes one = activation_peak(Device::cpu(), R, C, V, R);
  EXPECT_EQ(activation_peak(Device::meta(), R, C, V, R), one);
  std::printf("  linear_cross_entropy/%-4lld  %12lld bytes (one chunk, kept)\n", (long long)R,
              (long long)one);
  EXPECT_GE(one, logits);
  EXPECT_LE(one, logits + R * (C + 2) * 4 + 4096);
}

// linear_token_logps against float64: the per-row log-probabilities of log_softmax(h @ w^T),
// and the gradients of sum_r g_r * logp_r for arbitrary per-row seeds g, for chunks that divide
// the rows, do not, and cover every row, with ignored rows and a frozen weight.
TEST(LinearTokenLogps, MatchesFloat64ValuesAndGradients) {
  constexpr int64_t B = 2, T = 5, C = 6, V = 11, R = B * T;
  std::mt19937 rng(11);
  const Vec h = randn(R * C, rng), w = randn(V * C, rng, 0.7), g = randn(R, rng);
  const std::vector<float> targets = make_targets(R, V, -1, 3);
  // float64 reference.
  Vec logp(R, 0.0), dh(R * C, 0.0), dw(V * C, 0.0);
  for (int64_t r = 0; r < R; ++r) {
    if (targets[size_t(r)] < 0) continue;
    Vec z(V);
    double m = -1e300;
    for (int64_t v = 0; v < V; ++v) {
      double acc = 0.0;
      for (int64_t c = 0; c < C; ++c) acc += h[size_t(r * C + c)] * w[size_t(v * C + c)];
      z[size_t(v)] = acc;
      m = std::max(m, acc);
    }
    double sum = 0.0;
    for (double x : z) sum += std::exp(x - m);
    const double lse = m + std::log(sum);
    const int t = int(targets[size_t(r)]);
    logp[size_t(r)] = z[size_t(t)] - lse;
    for (int64_t v = 0; v < V; ++v) {
      const double dz = g[size_t(r)] * ((v == t ? 1.0 : 0.0) - std::exp(z[size_t(v)] - lse));
      for (int64_t c = 0; c < C; ++c) {
        dh[size_t(r * C + c)] += dz * w[size_t(v * C + c)];
        dw[size_t(v * C + c)] += dz * h[size_t(r * C + c)];
      }
    }
  }
  for (int64_t chunk : {int64_t{1}, int64_t{3}, int64_t{4}, R}) {
    for (bool train_w : {true, false}) {
      Variable hv(make_tensor(h, Shape{B, T, C}, DType::kF32), true);
      Variable wv(make_tensor(w, Shape{V, C}, DType::kF32), train_w);
      Tensor tg = Tensor::from_vector(targets, Shape{B, T}, DType::kI32);
      autograd::Tape tape;
      autograd::TapeScope scope(tape);
      Variable lp = linear_token_logps(hv, wv, tg, -1, chunk);
      ASSERT_EQ(lp.shape(), Shape{R});
      const Vec got = values(lp.value());
      backward_with(tape, lp, g);
      expect_close(fmt::format("logps chunk {}", chunk), got, logp, 1e-5);
      expect_close(fmt::format("dh chunk {}", chunk), values(hv.grad()), dh, 1e-4);
      if (train_w)
        expect_close(fmt::format("dw chunk {}", chunk), values(wv.grad()), dw, 1e-4);
      else
        EXPECT_FALSE(wv.slot()->grad.defined()) << "a frozen weight must get no gradient";
      for (int64_t r = 0; r < R; ++r) {
        if (targets[size_t(r)] < 0) {
          EXPECT_EQ(got[size_t(r)], 0.0) << "ignored row " << r;
        }
      }
    }
  }
}

// The per-row seeds -1/count reproduce linear_cross_entropy's gradient exactly: one backward.
TEST(LinearTokenLogps, MeanOfNegativesIsTheCrossEntropy) {
  constexpr int64_t B = 3, T = 4, C = 8, V = 13, R = B * T;
  std::mt19937 rng(3);
  const Vec h = randn(R * C, rng), w = randn(V * C, rng, 0.5);
  const std::vector<float> targets = make_targets(R, V, -1, 4);
  int64_t live = 0;
  for (float t : targets) live += t >= 0;
  const Result ce = run(h, w, B, T, C, V, DType::kF32, targets, -1, 5, true, 1.0);
  Variable hv(make_tensor(h, Shape{B, T, C}, DType::kF32), true);
  Variable wv(make_tensor(w, Shape{V, C}, DType::kF32), true);
  Tensor tg = Tensor::from_vector(targets, Shape{B, T}, DType::kI32);
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  Variable lp = linear_token_logps(hv, wv, tg, -1, 5);
  const Vec got = values(lp.value());
  double mean = 0.0;
  for (double x : got) mean -= x;
  mean /= double(live);
  backward_with(tape, lp, Vec(R, -1.0 / double(live)));
  EXPECT_NEAR(mean, ce.loss[0], 1e-6 * std::abs(ce.loss[0]));
  expect_close("dh", values(hv.grad()), ce.dh, 1e-6);
  expect_close("dw", values(wv.grad()), ce.dw, 1e-6);
}

TEST(LinearCrossEntropyDeathTest, OutOfRangeTargetFailsCheck) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Variable h(Tensor::zeros(Shape{2, 3}), false), w(Tensor::zeros(Shape{5, 3}), false);
  Tensor tg = Tensor::from_vector({0, 5}, Shape{2}, DType::kI32);
  EXPECT_DEATH(linear_cross_entropy(h, w, tg), "outside");
}

}  // namespace
}  // namespace fd::ops
