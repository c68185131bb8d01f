// vocab_parallel_cross_entropy in one process: on a world of one (LocalCommunicator) it is
// linear_cross_entropy, bit for bit; its gradients against float64 finite differences; on
// meta with a CountingCommunicator (a simulated rank of T) its collectives' bytes and its
// activation peak, 1/T of the unsharded logits. vocab_parallel_token_logps likewise: on a
// world of one linear_token_logps bit for bit, its gradients against finite differences, and
// its collectives' bytes those of the loss. Several ranks: tests/mpi/vocab_parallel_test.cc.
#include "lib/ops/vocab_parallel_cross_entropy.h"

#include <fmt/format.h>

#include "lib/dist/counting_communicator.h"
#include "lib/dist/local_communicator.h"
#include "lib/ops/linear_cross_entropy.h"
#include "tests/ops/op_test_util.h"

namespace fd::ops {
namespace {

using namespace fd::ops::testing;

struct Result {
  Vec loss, dh, dw;  // dw empty when the weight is frozen
};

// The head on h (R, C) and w (V, C): the loss (kLoss, one value) or the per-row log-probs
// (kLogps, R values), and the gradients for seeds g (one per value); through the vocabulary-
// parallel op over a world of one when `group` is set, else the unsharded op.
enum class Op { kLoss, kLogps };
Result run_op(Op op, const Vec& h, const Vec& w, int64_t R, int64_t C, int64_t V, DType dt,
              const std::vector<float>& targets, int ignore, int64_t chunk,
              dist::Communicator* group, bool train_w, const Vec& g) {
  Variable hv(make_tensor(h, Shape{R, C}, dt), true);
  Variable wv(make_tensor(w, Shape{V, C}, dt), train_w);
  Tensor tg = Tensor::from_vector(targets, Shape{R}, DType::kI32);
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  Variable y;
  if (op == Op::kLoss)
    y = group != nullptr ? vocab_parallel_cross_entropy(hv, wv, tg, 0, V, *group, ignore, chunk)
                         : linear_cross_entropy(hv, wv, tg, ignore, chunk);
  else
    y = group != nullptr ? vocab_parallel_token_logps(hv, wv, tg, 0, V, *group, ignore, chunk)
                         : linear_token_logps(hv, wv, tg, ignore, chunk);
  EXPECT_EQ(y.dtype(), DType::kF32);
  EXPECT_EQ(y.shape().numel(), op == Op::kLoss ? 1 : R);
  backward_with(tape, y, g);
  Result r{values(y.value()), values(hv.grad()), {}};
  if (train_w)
    r.dw = values(wv.grad());
  else
    EXPECT_FALSE(wv.slot()->grad.defined()) << "a frozen weight must get no gradient";
  return r;
}

// Loss and gradients (seed `seed`).
Result run(const Vec& h, const Vec& w, int64_t R, int64_t C, int64_t V, DType dt,
           const std::vector<float>& targets, int ignore, int64_t chunk, dist::Communicator* group,
           bool train_w = true, double seed = 1.3) {
  return run_op(Op::kLoss, h, w, R, C, V, dt, targets, ignore, chunk, group, train_w, {seed});
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

// A group of one computes exactly what linear_cross_entropy computes: every rescale is
// exp(0) = 1 and every all-reduce the identity.
TEST(VocabParallelCrossEntropy, WorldOfOneIsLinearCrossEntropyBitForBit) {
  constexpr int64_t R = 21, C = 16, V = 37;
  std::mt19937 rng(5);
  const Vec h = randn(R * C, rng), w = randn(V * C, rng, 0.5);
  dist::LocalCommunicator one;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (int ignore : {-1, 3}) {
      const std::vector<float> tg = make_targets(R, V, ignore, 4);
      for (int64_t chunk : {1, 5, 7, 8, 21, 1000}) {
        for (bool train_w : {true, false}) {
          std::printf("%s ignore_index=%d chunk_rows=%lld%s\n", name_of(dt), ignore,
                      (long long)chunk, train_w ? "" : " (frozen weight)");
          const Result ref = run(h, w, R, C, V, dt, tg, ignore, chunk, nullptr, train_w);
          const Result got = run(h, w, R, C, V, dt, tg, ignore, chunk, &one, train_w);
          expect_close("loss vs linear_cross_entropy", got.loss, ref.loss, 1e-7);
          expect_close("dh vs linear_cross_entropy", got.dh, ref.dh, 1e-7);
          if (train_w) expect_close("dW vs linear_cross_entropy", got.dw, ref.dw, 1e-7);
          std::printf("  bitwise equal: loss %lld/1, dh %lld/%zu, dW %lld/%zu\n",
                      (long long)bitwise_equal(got.loss, ref.loss),
                      (long long)bitwise_equal(got.dh, ref.dh), ref.dh.size(),
                      (long long)bitwise_equal(got.dw, ref.dw), ref.dw.size());
          EXPECT_EQ(bitwise_equal(got.loss, ref.loss), 1);
          EXPECT_EQ(bitwise_equal(got.dh, ref.dh), int64_t(ref.dh.size()));
          EXPECT_EQ(bitwise_equal(got.dw, ref.dw), int64_t(ref.dw.size()));
        }
      }
    }
  }
}

void check_against_fd(DType dt, int64_t chunk) {
  constexpr int64_t R = 5, C = 4, V = 7;
  std::printf(
      "vocab_parallel_cross_entropy (world of one) %s chunk_rows=%lld vs finite "
      "differences\n",
      name_of(dt), (long long)chunk);
  std::mt19937 rng(11);
  const std::vector<Vec> in = {rounded(randn(R * C, rng), dt), rounded(randn(V * C, rng), dt)};
  const std::vector<float> tg = make_targets(R, V, -1, 3);
  const double seed = 0.7;
  dist::LocalCommunicator one;
  const Result got = run(in[0], in[1], R, C, V, dt, tg, -1, chunk, &one, true, seed);
  const RefFn ref = linear_cross_entropy_reference(R, C, V, tg, -1);
  expect_close("loss", got.loss, ref(in), dt == DType::kF32 ? 1e-6 : 1e-5);
  expect_close("dh", got.dh, fd_grad(ref, in, 0, {seed}), tol_for(dt));
  expect_close("dW", got.dw, fd_grad(ref, in, 1, {seed}), tol_for(dt));
}

TEST(VocabParallelCrossEntropy, FiniteDifferencesF32) {
  for (int64_t chunk : {2, 5, 64}) check_against_fd(DType::kF32, chunk);
}
TEST(VocabParallelCrossEntropy, FiniteDifferencesBF16) { check_against_fd(DType::kBF16, 2); }

// Every target ignored: loss 0, zero gradients, and no collective at all.
TEST(VocabParallelCrossEntropy, AllIgnoredGivesZeroLossZeroGradAndNoTraffic) {
  dist::CountingCommunicator counting(0, 1);
  const std::vector<float> tg(6, -1.0f);
  const Result r =
      run(Vec(6 * 4, 0.5), Vec(5 * 4, 0.25), 6, 4, 5, DType::kF32, tg, -1, 4, &counting);
  EXPECT_EQ(r.loss[0], 0.0);
  for (double g : r.dh) EXPECT_EQ(g, 0.0);
  for (double g : r.dw) EXPECT_EQ(g, 0.0);
  EXPECT_EQ(counting.bytes_sent(), 0);
}

// Forward + backward of rank `rank`'s shard of a (V, C) head over R rows, on meta with a
// counting communicator of `T` ranks: the bytes it sends and the kActivations peak.
struct MetaRun {
  int64_t bytes = 0;
  int64_t peak = 0;
};
MetaRun meta_run(int rank, int T, int64_t R, int64_t C, int64_t V, int64_t chunk, bool want_dh) {
  DeviceScope scope(Device::meta());
  const VocabRange range = vocab_shard_range(V, rank, T);
  Variable h(Tensor::empty(Shape{R, C}), want_dh);
  Variable w =
      Variable::bound_leaf(Tensor::empty(Shape{range.count, C}, DType::kF32, MemCategory::kParams),
                           Tensor::zeros(Shape{range.count, C}, DType::kF32, MemCategory::kGrads));
  Tensor tg = Tensor::empty(Shape{R}, DType::kI32, MemCategory::kOther);
  dist::CountingCommunicator counting(rank, T);
  MemoryAccountant& acct = MemoryAccountant::global();
  const int64_t base = acct.current(MemCategory::kActivations);
  acct.reset_peaks();
  {
    autograd::Tape tape;
    autograd::TapeScope tscope(tape);
    Variable loss = vocab_parallel_cross_entropy(h, w, tg, range.begin, V, counting, -1, chunk);
    tape.backward(loss);
  }
  return {counting.bytes_sent(), acct.peak(MemCategory::kActivations) - base};
}

// On meta every row counts: per chunk of n rows two all-reduces forward (n and 2n f32) and,
// when dh is wanted, one of n*C f32 backward; ring model 2(T-1)/T of the bytes.
TEST(VocabParallelCrossEntropy, MetaCountsItsCollectives) {
  constexpr int64_t R = 10, C = 8, V = 37;
  for (int T : {2, 4}) {
    for (int64_t chunk : {3, 10}) {
      for (bool want_dh : {true, false}) {
        const MetaRun m = meta_run(1, T, R, C, V, chunk, want_dh);
        const int64_t buffer_bytes = 3 * R * 4 + (want_dh ? R * C * 4 : 0);
        const int64_t expect = 2 * (T - 1) * buffer_bytes / T;
        std::printf("T=%d chunk_rows=%lld dh %s: %lld bytes sent (expected %lld)\n", T,
                    (long long)chunk, want_dh ? "wanted" : "not wanted", (long long)m.bytes,
                    (long long)expect);
        EXPECT_EQ(m.bytes, expect);
      }
    }
  }
}

// Qwen's vocabulary over T = 4 ranks, 1024 rows: with one chunk of every row (the largest
// temporary the op can make) the peak is about 1/T of the unsharded fp32 logits, plus O(rows);
// with 64-row chunks, one chunk of this rank's logits.
TEST(VocabParallelCrossEntropy, ActivationPeakIsAQuarterOfTheLogits) {
  constexpr int64_t V = 151936, C = 64, R = 1024;
  constexpr int T = 4;
  const int64_t logits = R * V * 4;
  for (int64_t chunk : {R, int64_t{64}}) {
    for (int rank : {0, T - 1}) {
      const int64_t v_local = vocab_shard_range(V, rank, T).count;
      const MetaRun m = meta_run(rank, T, R, C, V, chunk, true);
      const int64_t scratch = chunk * v_local * 4;
      // The scratch, dh, lse and targets (R * (C + 2) * 4), the row statistics and the chunk's
      // dh partial (chunk * (C + 4) * 4).
      const int64_t bound = scratch + R * (C + 2) * 4 + chunk * (C + 4) * 4 + 4096;
      std::printf(
          "rank %d of %d, chunk_rows %lld: peak %lld bytes = %.4f x the fp32 logits "
          "(%lld); bound %lld\n",
          rank, T, (long long)chunk, (long long)m.peak, double(m.peak) / double(logits),
          (long long)logits, (long long)bound);
      EXPECT_LE(m.peak, bound);
      if (chunk == R) {
        EXPECT_LE(double(m.peak), double(logits) / T + double(R * (2 * C + 8) * 4));
      }
    }
  }
}

TEST(VocabParallelCrossEntropy, ShardRangesTileTheVocabulary) {
  const std::vector<std::pair<int64_t, int64_t>> want = {{0, 10}, {10, 9}, {19, 9}, {28, 9}};
  for (int r = 0; r < 4; ++r) {
    const VocabRange got = vocab_shard_range(37, r, 4);
    EXPECT_EQ(got.begin, want[size_t(r)].first) << "rank " << r;
    EXPECT_EQ(got.count, want[size_t(r)].second) << "rank " << r;
  }
  for (int T : {1, 2, 3, 5, 8}) {
    int64_t next = 0;
    for (int r = 0; r < T; ++r) {
      const VocabRange got = vocab_shard_range(50257, r, T);
      EXPECT_EQ(got.begin, next);
      EXPECT_GE(got.count, 50257 / T);
      next = got.begin + got.count;
    }
    EXPECT_EQ(next, 50257);
  }
}

TEST(VocabParallelTokenLogps, WorldOfOneIsLinearTokenLogpsBitForBit) {
  constexpr int64_t R = 21, C = 16, V = 37;
  std::mt19937 rng(6);
  const Vec h = randn(R * C, rng), w = randn(V * C, rng, 0.5), g = randn(R, rng);
  dist::LocalCommunicator one;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (int ignore : {-1, 3}) {
      const std::vector<float> tg = make_targets(R, V, ignore, 4);
      for (int64_t chunk : {1, 5, 8, 21, 1000}) {
        for (bool train_w : {true, false}) {
          const Result ref =
              run_op(Op::kLogps, h, w, R, C, V, dt, tg, ignore, chunk, nullptr, train_w, g);
          const Result got =
              run_op(Op::kLogps, h, w, R, C, V, dt, tg, ignore, chunk, &one, train_w, g);
          std::printf(
              "token logps %s ignore_index=%d chunk_rows=%lld%s: bitwise equal logps %lld/%zu, "
              "dh %lld/%zu, dW %lld/%zu\n",
              name_of(dt), ignore, (long long)chunk, train_w ? "" : " (frozen weight)",
              (long long)bitwise_equal(got.loss, ref.loss), ref.loss.size(),
              (long long)bitwise_equal(got.dh, ref.dh), ref.dh.size(),
              (long long)bitwise_equal(got.dw, ref.dw), ref.dw.size());
          EXPECT_EQ(bitwise_equal(got.loss, ref.loss), int64_t(ref.loss.size()));
          EXPECT_EQ(bitwise_equal(got.dh, ref.dh), int64_t(ref.dh.size()));
          EXPECT_EQ(bitwise_equal(got.dw, ref.dw), int64_t(ref.dw.size()));
        }
      }
    }
  }
}

TEST(VocabParallelTokenLogps, FiniteDifferences) {
  constexpr int64_t R = 5, C = 4, V = 7;
  dist::LocalCommunicator one;
  for (int64_t chunk : {2, 64}) {
    std::printf("token logps (world of one) chunk_rows=%lld vs float64 finite differences\n",
                (long long)chunk);
    std::mt19937 rng(12);
    const std::vector<Vec> in = {rounded(randn(R * C, rng), DType::kF32),
                                 rounded(randn(V * C, rng), DType::kF32)};
    const Vec g = randn(R, rng);
    const std::vector<float> tg = make_targets(R, V, -1, 3);
    const Result got =
        run_op(Op::kLogps, in[0], in[1], R, C, V, DType::kF32, tg, -1, chunk, &one, true, g);
    const RefFn ref = token_logps_reference(R, C, V, tg, -1);
    expect_close("logps", got.loss, ref(in), 1e-6);
    expect_close("dh", got.dh, fd_grad(ref, in, 0, g), 1e-4);
    expect_close("dW", got.dw, fd_grad(ref, in, 1, g), 1e-4);
  }
}

// The per-row op's collectives are the loss's: the same bytes on meta for a rank of T.
TEST(VocabParallelTokenLogps, MetaCountsTheLossCollectives) {
  constexpr int64_t R = 10, C = 8, V = 37;
  for (int T : {2, 4}) {
    for (int64_t chunk : {3, 10}) {
      DeviceScope scope(Device::meta());
      const VocabRange range = vocab_shard_range(V, 1, T);
      Variable h(Tensor::empty(Shape{R, C}), true);
      Variable w(Tensor::empty(Shape{range.count, C}), true);
      Tensor tg = Tensor::empty(Shape{R}, DType::kI32, MemCategory::kOther);
      dist::CountingCommunicator counting(1, T);
      {
        autograd::Tape tape;
        autograd::TapeScope tscope(tape);
        Variable lp = vocab_parallel_token_logps(h, w, tg, range.begin, V, counting, -1, chunk);
        lp.slot()->ensure_grad();  // meta: nothing is read
        tape.run_backward();
      }
      EXPECT_EQ(counting.bytes_sent(), meta_run(1, T, R, C, V, chunk, true).bytes)
          << "T=" << T << " chunk_rows=" << chunk;
    }
  }
}

TEST(VocabParallelCrossEntropyDeathTest, OutOfRangeTargetOrShardFailsCheck) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  dist::LocalCommunicator one;
  Variable h(Tensor::zeros(Shape{2, 3}), false), w(Tensor::zeros(Shape{5, 3}), false);
  Tensor tg = Tensor::from_vector({0, 5}, Shape{2}, DType::kI32);
  EXPECT_DEATH(vocab_parallel_cross_entropy(h, w, tg, 0, 5, one), "outside \\[0, 5\\)");
  EXPECT_DEATH(vocab_parallel_cross_entropy(h, w, tg, 2, 6, one), "rows \\[2, 7\\)");
  EXPECT_DEATH(vocab_shard_range(3, 0, 4), "vocab_shard_range");
  EXPECT_DEATH(vocab_parallel_token_logps(h, w, tg, 2, 6, one), "rows \\[2, 7\\)");
}

}  // namespace
}  // namespace fd::ops
