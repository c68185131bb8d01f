// The vocabulary-parallel cross-entropy (lib/ops/vocab_parallel_cross_entropy.h) under
// mpirun -n 2 and -n 4. Each rank of a tensor-parallel group holds its slice of a (V, C) head
// (vocab_shard_range: uneven when T does not divide V, as for V = 37) and every rank also
// computes the unsharded ops::linear_cross_entropy from the full weight. Checked, in the world
// and (at -n 4) in each tp group of a {dp: 2, tp: 2} mesh:
//   - the loss equals the unsharded op's to <= 1e-6 relative and is bitwise the same on every
//     rank; dh equals the unsharded dh; each rank's dW the rows it holds of the unsharded dW;
//   - with ignored targets (ignore_index -1 and a valid id), chunks that do not divide the rows,
//     chunks whose targets are all ignored, every target ignored (0, zero gradients, no hang),
//     a frozen shard, and bf16 operands (gradients then within one bf16 rounding);
//   - dh and each dW shard against float64 finite differences of the full loss;
//   - the activation peak of one rank's op, on the CPU: its (rows, V/T) logits plus O(rows),
//     against the unsharded op's (rows, V); the same rank on meta with a CountingCommunicator
//     (as the estimate runs it) allocates the same and counts the bytes MPI sent.
// vocab_parallel_token_logps (the per-row log-probabilities) likewise: the values equal the
// unsharded ops::linear_token_logps's to 1e-6 and bitwise on every rank, dh (all-reduced, or
// the partials summed by the caller with reduce_dh false) and each dW shard equal the unsharded
// gradients for per-row seeds, and both against float64 finite differences.
// Differences are printed as the largest over the ranks.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "lib/dist/counting_communicator.h"
#include "lib/ops/linear_cross_entropy.h"
#include "lib/ops/vocab_parallel_cross_entropy.h"
#include "tests/mpi/mpi_test_main.h"
#include "tests/mpi/tp_test_util.h"
#include "tests/ops/op_test_util.h"

namespace fd {
namespace {

using namespace fd::mpi_testing;
using namespace fd::ops;
using namespace fd::ops::testing;

// bf16 gradients: each element within one bf16 rounding of the reference's (both round an
// fp32 value; the sharded one's sums run in another order).
void expect_within_one_bf16_rounding(const std::string& name, const Vec& got, const Vec& ref) {
  int64_t bad = 0;
  for (size_t i = 0; i < got.size() && i < ref.size(); ++i)
    bad += std::abs(got[i] - ref[i]) > std::ldexp(std::abs(ref[i]), -7);
  EXPECT_EQ(bad, 0) << name << ": " << bad << " elements more than one bf16 rounding apart";
}

struct Result {
  Vec loss, dh, dw;  // dw empty when the weight is frozen
};

// The head on h (R, C): the loss (kLoss, one value) or the per-row log-probs (kLogps, R values)
// and the gradients for seeds g (one per value); the unsharded op over the full w (V, C) when
// `group` is null, else this rank's shard of rows [range.begin, range.begin + range.count) of w
// over `group` (reduce_dh false: dh is this rank's partial).
enum class Op { kLoss, kLogps };
Result run_op(Op op, const Vec& h, const Vec& w, int64_t R, int64_t C, int64_t V, DType dt,
              const std::vector<float>& targets, int ignore, int64_t chunk,
              dist::Communicator* group, bool train_w, const Vec& g, bool reduce_dh = true) {
  VocabRange range{0, V};
  if (group != nullptr) range = vocab_shard_range(V, group->rank(), group->size());
  const Vec rows(w.begin() + range.begin * C, w.begin() + (range.begin + range.count) * C);
  Variable hv(make_tensor(h, Shape{R, C}, dt), true);
  Variable wv(make_tensor(rows, Shape{range.count, C}, dt), train_w);
  Tensor tg = Tensor::from_vector(targets, Shape{R}, DType::kI32);
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  Variable y;
  if (op == Op::kLoss)
    y = group != nullptr ? vocab_parallel_cross_entropy(hv, wv, tg, range.begin, V, *group, ignore,
                                                        chunk, reduce_dh)
                         : linear_cross_entropy(hv, wv, tg, ignore, chunk);
  else
    y = group != nullptr ? vocab_parallel_token_logps(hv, wv, tg, range.begin, V, *group, ignore,
                                                      chunk, reduce_dh)
                         : linear_token_logps(hv, wv, tg, ignore, chunk);
  backward_with(tape, y, g);
  Result r{values(y.value()), values(hv.grad()), {}};
  if (train_w)
    r.dw = values(wv.grad());
  else
    EXPECT_FALSE(wv.slot()->grad.defined()) << "a frozen weight must get no gradient";
  return r;
}

// The loss and its gradients for seed `seed`.
Result run(const Vec& h, const Vec& w, int64_t R, int64_t C, int64_t V, DType dt,
           const std::vector<float>& targets, int ignore, int64_t chunk, dist::Communicator* group,
           bool train_w, double seed) {
  return run_op(Op::kLoss, h, w, R, C, V, dt, targets, ignore, chunk, group, train_w, {seed});
}

// Targets: the first `ignore_first` rows and every `every`-th row (from row 1) ignored.
std::vector<float> make_targets(int64_t rows, int64_t V, int ignore, int every,
                                int64_t ignore_first = 0) {
  std::vector<float> t;
  for (int64_t r = 0; r < rows; ++r) {
    const bool ignored = r < ignore_first || (every > 0 && r % every == 1);
    t.push_back(ignored ? float(ignore) : float((r * 7 + 2) % V));
  }
  return t;
}

// The loss, bitwise, on every rank of the world.
void expect_same_loss_everywhere(double loss) {
  std::vector<double> all(size_t(g_comm->size()));
  g_comm->all_gather_f64(&loss, all.data(), 1);
  for (int r = 0; r < g_comm->size(); ++r)
    EXPECT_EQ(all[size_t(r)], loss)
        << "rank " << r << "'s loss differs from rank " << g_comm->rank() << "'s";
}

struct Case {
  int64_t R, C, V;
  DType dt;
  int ignore, every;
  int64_t ignore_first;
  int64_t chunk;
  bool train_w;
};

void check_case(dist::Communicator& group, const Case& c) {
  if (g_comm->rank() == 0)
    std::printf(
        "T=%d R=%lld C=%lld V=%lld %s ignore_index=%d every=%d first=%lld "
        "chunk_rows=%lld%s\n",
        group.size(), (long long)c.R, (long long)c.C, (long long)c.V, name_of(c.dt), c.ignore,
        c.every, (long long)c.ignore_first, (long long)c.chunk, c.train_w ? "" : " (frozen shard)");
  std::mt19937 rng(7);  // the same inputs on every rank
  const Vec h = randn(c.R * c.C, rng), w = randn(c.V * c.C, rng, 0.5);
  const std::vector<float> tg = make_targets(c.R, c.V, c.ignore, c.every, c.ignore_first);
  const double seed = 1.3;
  const Result ref = run(h, w, c.R, c.C, c.V, c.dt, tg, c.ignore, c.chunk, nullptr, true, seed);
  const Result got = run(h, w, c.R, c.C, c.V, c.dt, tg, c.ignore, c.chunk, &group, c.train_w, seed);
  const VocabRange range = vocab_shard_range(c.V, group.rank(), group.size());
  const Vec ref_dw(ref.dw.begin() + range.begin * c.C,
                   ref.dw.begin() + (range.begin + range.count) * c.C);
  expect_same_loss_everywhere(got.loss[0]);
  expect_close_all("loss vs unsharded", got.loss, ref.loss, 1e-6);
  const double grad_tol = c.dt == DType::kF32 ? 1e-6 : 4e-3;
  expect_close_all("dh vs unsharded", got.dh, ref.dh, grad_tol);
  if (c.train_w) expect_close_all("dW shard vs unsharded rows", got.dw, ref_dw, grad_tol);
  if (c.dt != DType::kF32) {
    expect_within_one_bf16_rounding("dh", got.dh, ref.dh);
    if (c.train_w) expect_within_one_bf16_rounding("dW", got.dw, ref_dw);
  }
  for (int64_t r = 0; r < c.R; ++r) {
    if (int(tg[size_t(r)]) != c.ignore) continue;
    for (int64_t k = 0; k < c.C; ++k)
      EXPECT_EQ(got.dh[size_t(r * c.C + k)], 0.0) << "ignored row " << r << " got a gradient";
  }
}

TEST(VocabParallel, MatchesUnshardedF32) {
  Groups groups = make_groups();
  for (dist::Communicator* group : groups.all)
    for (int ignore : {-1, 3})
      for (int64_t chunk : {1, 5, 7, 8, 21, 1000})
        check_case(*group, {21, 16, 37, DType::kF32, ignore, 4, 0, chunk, true});
}

// Whole chunks of ignored targets are skipped on every rank alike; a frozen shard.
TEST(VocabParallel, IgnoredChunksAndFrozenShard) {
  Groups groups = make_groups();
  for (dist::Communicator* group : groups.all) {
    check_case(*group, {21, 16, 37, DType::kF32, -1, 0, 8, 4, true});
    check_case(*group, {21, 16, 37, DType::kF32, -1, 3, 0, 5, false});
  }
}

TEST(VocabParallel, MatchesUnshardedBF16) {
  Groups groups = make_groups();
  for (dist::Communicator* group : groups.all)
    for (int64_t chunk : {5, 1000})
      check_case(*group, {21, 16, 37, DType::kBF16, -1, 4, 0, chunk, true});
}

// Every target ignored: 0 on every rank, zero gradients, and the call returns (no rank waits
// in a collective the others skip).
TEST(VocabParallel, AllIgnoredGivesZeroLossAndZeroGrad) {
  Groups groups = make_groups();
  for (dist::Communicator* group : groups.all) {
    std::mt19937 rng(3);
    const Vec h = randn(6 * 4, rng), w = randn(7 * 4, rng);
    const Result r =
        run(h, w, 6, 4, 7, DType::kF32, std::vector<float>(6, -1.0f), -1, 4, group, true, 1.0);
    EXPECT_EQ(r.loss[0], 0.0);
    for (double g : r.dh) EXPECT_EQ(g, 0.0);
    for (double g : r.dw) EXPECT_EQ(g, 0.0);
  }
}

// dh and this rank's dW rows against central differences of the full float64 loss.
TEST(VocabParallel, FiniteDifferences) {
  constexpr int64_t R = 5, C = 4, V = 7;  // 7 over 4 ranks: 2, 2, 2, 1 rows
  Groups groups = make_groups();
  for (dist::Communicator* group : groups.all) {
    for (int64_t chunk : {2, 64}) {
      if (g_comm->rank() == 0)
        std::printf("T=%d chunk_rows=%lld vs float64 finite differences\n", group->size(),
                    (long long)chunk);
      std::mt19937 rng(11);
      const std::vector<Vec> in = {rounded(randn(R * C, rng), DType::kF32),
                                   rounded(randn(V * C, rng), DType::kF32)};
      const std::vector<float> tg = make_targets(R, V, -1, 3);
      const double seed = 0.7;
      const Result got = run(in[0], in[1], R, C, V, DType::kF32, tg, -1, chunk, group, true, seed);
      const RefFn ref = linear_cross_entropy_reference(R, C, V, tg, -1);
      const Vec fd_dw = fd_grad(ref, in, 1, {seed});
      const VocabRange range = vocab_shard_range(V, group->rank(), group->size());
      expect_close_all("loss vs float64", got.loss, ref(in), 1e-6);
      expect_close_all("dh vs finite differences", got.dh, fd_grad(ref, in, 0, {seed}), 1e-4);
      expect_close_all(
          "dW shard vs finite differences", got.dw,
          Vec(fd_dw.begin() + range.begin * C, fd_dw.begin() + (range.begin + range.count) * C),
          1e-4);
    }
  }
}

TEST(VocabParallel, TokenLogpsMatchUnsharded) {
  constexpr int64_t R = 21, C = 16, V = 37;  // 37 over 2 and 4 ranks: uneven shards
  Groups groups = make_groups();
  for (dist::Communicator* group : groups.all) {
    for (int ignore : {-1, 3}) {
      for (int64_t chunk : {1, 5, 8, 1000}) {
        for (bool reduce_dh : {true, false}) {
          if (g_comm->rank() == 0)
            std::printf("token logps T=%d ignore_index=%d chunk_rows=%lld reduce_dh=%d\n",
                        group->size(), ignore, (long long)chunk, int(reduce_dh));
          std::mt19937 rng(8);  // the same inputs on every rank
          const Vec h = randn(R * C, rng), w = randn(V * C, rng, 0.5), g = randn(R, rng);
          const std::vector<float> tg = make_targets(R, V, ignore, 4);
          const Result ref =
              run_op(Op::kLogps, h, w, R, C, V, DType::kF32, tg, ignore, chunk, nullptr, true, g);
          Result got = run_op(Op::kLogps, h, w, R, C, V, DType::kF32, tg, ignore, chunk, group,
                              true, g, reduce_dh);
          if (!reduce_dh) group->all_reduce_f64(got.dh.data(), int64_t(got.dh.size()));
          std::vector<double> all(size_t(R * group->size()));  // every rank's, bitwise
          group->all_gather_f64(got.loss.data(), all.data(), R);
          for (int k = 0; k < group->size(); ++k)
            expect_exact(fmt::format("logps: rank {}'s equal this rank's", k),
                         Vec(all.begin() + k * R, all.begin() + (k + 1) * R), got.loss);
          expect_close_all("logps vs unsharded", got.loss, ref.loss, 1e-6);
          expect_close_all("dh vs unsharded", got.dh, ref.dh, 1e-6);
          const VocabRange range = vocab_shard_range(V, group->rank(), group->size());
          expect_close_all("dW shard vs unsharded rows", got.dw,
                           Vec(ref.dw.begin() + range.begin * C,
                               ref.dw.begin() + (range.begin + range.count) * C),
                           1e-6);
          for (int64_t r = 0; r < R; ++r) {
            if (int(tg[size_t(r)]) == ignore) {
              EXPECT_EQ(got.loss[size_t(r)], 0.0) << "ignored row " << r;
            }
          }
        }
      }
    }
  }
}

// dh and this rank's dW rows of sum_r g_r logp_r against central differences in float64.
TEST(VocabParallel, TokenLogpsFiniteDifferences) {
  constexpr int64_t R = 5, C = 4, V = 7;  // 7 over 4 ranks: 2, 2, 2, 1 rows
  Groups groups = make_groups();
  for (dist::Communicator* group : groups.all) {
    std::mt19937 rng(13);
    const std::vector<Vec> in = {rounded(randn(R * C, rng), DType::kF32),
                                 rounded(randn(V * C, rng), DType::kF32)};
    const Vec g = randn(R, rng);
    const std::vector<float> tg = make_targets(R, V, -1, 3);
    const RefFn ref = token_logps_reference(R, C, V, tg, -1);
    if (g_comm->rank() == 0)
      std::printf("token logps T=%d vs float64 finite differences\n", group->size());
    const Result got =
        run_op(Op::kLogps, in[0], in[1], R, C, V, DType::kF32, tg, -1, 2, group, true, g);
    const Vec fd_dw = fd_grad(ref, in, 1, g);
    const VocabRange range = vocab_shard_range(V, group->rank(), group->size());
    expect_close_all("logps vs float64", got.loss, ref(in), 1e-6);
    expect_close_all("dh vs finite differences", got.dh, fd_grad(ref, in, 0, g), 1e-4);
    expect_close_all(
        "dW shard vs finite differences", got.dw,
        Vec(fd_dw.begin() + range.begin * C, fd_dw.begin() + (range.begin + range.count) * C),
        1e-4);
  }
}

// One rank's forward + backward on `device` (the CPU, or meta with a counting communicator):
// the kActivations peak relative to just before the op and the bytes `group` sent.
struct Usage {
  int64_t peak = 0;
  int64_t bytes = 0;
};
Usage usage(Device device, dist::Communicator* group, int64_t R, int64_t C, int64_t V,
            int64_t chunk) {
  DeviceScope scope(device);
  VocabRange range{0, V};
  if (group != nullptr) range = vocab_shard_range(V, group->rank(), group->size());
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> hv(size_t(R * C)), wv(size_t(range.count * C)), tv(static_cast<size_t>(R));
  for (float& x : hv) x = dist(rng);
  for (float& x : wv) x = 0.1f * dist(rng);
  for (size_t i = 0; i < tv.size(); ++i) tv[i] = float((i * 7919) % size_t(V));
  // The weight's gradient lives with the other parameter gradients, as in training.
  Variable w = Variable::bound_leaf(
      Tensor::from_vector(wv, Shape{range.count, C}, DType::kF32, MemCategory::kParams),
      Tensor::zeros(Shape{range.count, C}, DType::kF32, MemCategory::kGrads));
  Variable h(Tensor::from_vector(hv, Shape{R, C}), true);
  Tensor tg = Tensor::from_vector(tv, Shape{R}, DType::kI32, MemCategory::kOther);
  MemoryAccountant& acct = MemoryAccountant::global();
  const int64_t base = acct.current(MemCategory::kActivations);
  acct.reset_peaks();
  if (group != nullptr) group->reset_counters();
  {
    autograd::Tape tape;
    autograd::TapeScope tscope(tape);
    Variable loss = group != nullptr
                        ? vocab_parallel_cross_entropy(h, w, tg, range.begin, V, *group, -1, chunk)
                        : linear_cross_entropy(h, w, tg, -1, chunk);
    tape.backward(loss);
  }
  return {acct.peak(MemCategory::kActivations) - base, group != nullptr ? group->bytes_sent() : 0};
}

// One chunk of every row: the largest temporary either op makes is its (R, V_local) fp32
// logits, and the sharded op's peak is 1/T of the unsharded logits plus O(rows). The same
// rank on meta with a counting communicator (what the estimate will run) makes the same
// allocations and counts the bytes MPI sent.
TEST(VocabParallel, ActivationPeakIsOneTthOfTheLogits) {
  constexpr int64_t R = 256, C = 16, V = 4099;  // 4099 = 2 * 2049 + 1 = 4 * 1024 + 3
  const int T = g_comm->size();
  const int64_t logits = R * V * 4;
  const int64_t v_local = vocab_shard_range(V, g_comm->rank(), T).count;
  const int64_t unsharded = usage(Device::cpu(), nullptr, R, C, V, R).peak;
  for (int64_t chunk : {R, int64_t{32}}) {
    const Usage sharded = usage(Device::cpu(), g_comm, R, C, V, chunk);
    dist::CountingCommunicator counting(g_comm->rank(), T);
    const Usage meta = usage(Device::meta(), &counting, R, C, V, chunk);
    const std::vector<double> worst = worst_over_ranks({double(sharded.peak)});
    if (g_comm->rank() == 0)
      std::printf(
          "T=%d chunk_rows=%lld: activation peak %.0f bytes (worst rank) = %.4f x the "
          "fp32 logits (%lld); unsharded, one chunk: %lld (%.4f x); rank 0 sent %lld "
          "bytes (meta, counted: %lld)\n",
          T, (long long)chunk, worst[0], worst[0] / double(logits), (long long)logits,
          (long long)unsharded, double(unsharded) / double(logits), (long long)sharded.bytes,
          (long long)meta.bytes);
    // The scratch (chunk, V_local), dh, lse and targets (R * (C + 2) * 4), the row statistics
    // and the chunk's dh partial (chunk * (C + 4) * 4).
    EXPECT_LE(sharded.peak, chunk * v_local * 4 + R * (C + 2) * 4 + chunk * (C + 4) * 4 + 4096);
    if (chunk == R) {
      EXPECT_LE(double(sharded.peak), double(logits) / T + double(R * (2 * C + 8) * 4 + 4096));
    }
    EXPECT_EQ(meta.peak, sharded.peak) << "meta allocations differ from the CPU's";
    EXPECT_EQ(meta.bytes, sharded.bytes) << "the counting communicator's bytes differ from MPI's";
    // Forward 3R floats, backward R*C floats, all-reduced: 2(T-1)/T of the bytes (ring model).
    EXPECT_EQ(sharded.bytes, 2 * (T - 1) * (3 * R + R * C) * 4 / T);
  }
}

}  // namespace
}  // namespace fd

int main(int argc, char** argv) {
  return fd::dist::testing::run_mpi_tests(argc, argv, &fd::mpi_testing::g_comm);
}
