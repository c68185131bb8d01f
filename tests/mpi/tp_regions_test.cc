// The tensor-parallel region operators (lib/ops/tp_regions.h) under mpirun -n 2 and -n 4, in the
// world and (at -n 4) in each tp group of a {dp: 2, tp: 2} mesh:
//   - exact results, forward and backward, in f32, bf16 and f16, with inputs whose sums are
//     small integers (exact in every dtype, nccl-tests style): rank r contributes (r + 1) *
//     (1 + i % 5) at element i, so the sum over S ranks is S(S+1)/2 * (1 + i % 5); gathered
//     slices carry their global index (i % 61 - 30), so a misplaced block shows;
//   - Megatron's MLP identity: with A (C, F) split by columns and B (F, C) by rows over the
//     ranks, reduce_from_tp_region(copy_to_tp_region(x) A_i B_i) equals x A B, and the
//     gradients of x, A_i and B_i the unsharded ones and their slices (<= 1e-6 relative, fp32;
//     two seeds); the same in the sequence-parallel form, gather_from_sequence_region before
//     and reduce_scatter_to_sequence_region after, on each rank's slice of the sequence;
//   - the SP pair: gather(reduce_scatter(x)) equals reduce_from_tp_region(x), forward and
//     backward (random fp32 inputs: <= 1e-6 relative, the sum orders of MPI's reduce-scatter
//     and all-reduce may differ).
// Differences are printed as the largest over the ranks.
#include "lib/ops/tp_regions.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "lib/autograd/tape.h"
#include "lib/ops/matmul.h"
#include "tests/mpi/mpi_test_main.h"
#include "tests/mpi/tp_test_util.h"
#include "tests/ops/op_test_util.h"

namespace fd {
namespace {

using namespace fd::mpi_testing;
using namespace fd::ops;
using namespace fd::ops::testing;

// Rank r's contribution at element i and the sum over S ranks.
double part(int r, int64_t i) { return double(r + 1) * double(1 + i % 5); }
double part_sum(int S, int64_t i) { return double(S * (S + 1) / 2) * double(1 + i % 5); }
// A global index's value in a gathered tensor.
double tag(int64_t i) { return double(i % 61 - 30); }

// One op on `group`: x given, output gradient dy placed, backward run; y and dx returned.
struct OpRun {
  Vec y, dx;
};
OpRun run_op(Variable (*op)(const Variable&, dist::Communicator&), dist::Communicator& group,
             const Vec& x, const Shape& xs, const Vec& dy, DType dt) {
  Variable xv(make_tensor(x, xs, dt), true);
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  Variable y = op(xv, group);
  EXPECT_EQ(y.dtype(), dt);
  backward_with(tape, y, dy);
  return {values(y.value()), values(xv.grad())};
}

TEST(TpRegions, ExactResultsInEveryDtype) {
  Groups groups = make_groups();
  constexpr int64_t B = 2, Ts = 3, C = 2;
  for (dist::Communicator* group : groups.all) {
    const int S = group->size(), r = group->rank();
    const int64_t T = Ts * S, n_full = B * T * C, n_shard = B * Ts * C;
    // Global index of element i of rank r's (B, Ts, C) slice in the (B, T, C) sequence.
    auto global = [&](int64_t i) {
      const int64_t b = i / (Ts * C), t = (i / C) % Ts, c = i % C;
      return (b * T + r * Ts + t) * C + c;
    };
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
      if (g_comm->rank() == 0) std::printf("group of %d, %s\n", S, name_of(dt));
      const Shape full{B, T, C}, shard{B, Ts, C};
      const Vec mine = fill(n_full, [&](int64_t i) { return part(r, i); });
      const Vec summed = fill(n_full, [&](int64_t i) { return part_sum(S, i); });
      {  // f: identity forward, sum backward.
        const OpRun f = run_op(copy_to_tp_region, *group, mine, full, mine, dt);
        expect_exact("copy_to_tp_region forward", f.y, mine);
        expect_exact("copy_to_tp_region backward", f.dx, summed);
      }
      {  // g: sum forward, identity backward.
        const OpRun g = run_op(reduce_from_tp_region, *group, mine, full, mine, dt);
        expect_exact("reduce_from_tp_region forward", g.y, summed);
        expect_exact("reduce_from_tp_region backward", g.dx, mine);
      }
      {  // gather: the tagged slices in rank order; backward the sum of rank r's block.
        const Vec x = fill(n_shard, [&](int64_t i) { return tag(global(i)); });
        const OpRun a = run_op(gather_from_sequence_region, *group, x, shard, mine, dt);
        expect_exact("gather_from_sequence_region forward", a.y, fill(n_full, tag));
        expect_exact("gather_from_sequence_region backward", a.dx,
                     fill(n_shard, [&](int64_t i) { return part_sum(S, global(i)); }));
      }
      {  // reduce-scatter: rank r's block of the sum; backward the tagged slices gathered.
        const Vec dy = fill(n_shard, [&](int64_t i) { return tag(global(i)); });
        const OpRun s = run_op(reduce_scatter_to_sequence_region, *group, mine, full, dy, dt);
        expect_exact("reduce_scatter_to_sequence_region forward", s.y,
                     fill(n_shard, [&](int64_t i) { return part_sum(S, global(i)); }));
        expect_exact("reduce_scatter_to_sequence_region backward", s.dx, fill(n_full, tag));
      }
    }
  }
}

// Columns [c0, c0 + n) of a row-major (rows, cols) matrix; rows [r0, r0 + n) likewise.
Vec columns(const Vec& m, int64_t rows, int64_t cols, int64_t c0, int64_t n) {
  Vec out;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = c0; j < c0 + n; ++j) out.push_back(m[size_t(i * cols + j)]);
  return out;
}
Vec rows_of(const Vec& m, int64_t cols, int64_t r0, int64_t n) {
  return Vec(m.begin() + r0 * cols, m.begin() + (r0 + n) * cols);
}
struct MlpGrads {
  Vec y, dx, da, db;
};

// y = x A B on (B, T, C) x, A (C, F), B (F, C), with output gradient dy: the unsharded chain
// when `group` is null; else rank r's columns of A and rows of B, inside f and g, or (with
// `sp`) between the sequence-parallel gather and reduce-scatter, x and dy then being this
// rank's slices of the sequence.
MlpGrads mlp(const Vec& x, const Vec& a, const Vec& b, const Vec& dy, int64_t Bn, int64_t T,
             int64_t C, int64_t F, dist::Communicator* group, bool sp) {
  const int S = group != nullptr ? group->size() : 1, r = group != nullptr ? group->rank() : 0;
  const int64_t Fs = F / S, Ts = sp ? T / S : T;
  Variable xv(
      make_tensor(sp ? seq_slice(x, Bn, T, C, r * Ts, Ts) : x, Shape{Bn, Ts, C}, DType::kF32),
      true);
  Variable av(make_tensor(columns(a, C, F, r * Fs, Fs), Shape{C, Fs}, DType::kF32), true);
  Variable bv(make_tensor(rows_of(b, C, r * Fs, Fs), Shape{Fs, C}, DType::kF32), true);
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  Variable in = group == nullptr ? xv
                : sp             ? gather_from_sequence_region(xv, *group)
                                 : copy_to_tp_region(xv, *group);
  Variable partial = matmul(matmul(in, av), bv);
  Variable y = group == nullptr ? partial
               : sp             ? reduce_scatter_to_sequence_region(partial, *group)
                                : reduce_from_tp_region(partial, *group);
  backward_with(tape, y, sp ? seq_slice(dy, Bn, T, C, r * Ts, Ts) : dy);
  return {values(y.value()), values(xv.grad()), values(av.grad()), values(bv.grad())};
}

TEST(TpRegions, MegatronMlpEqualsTheUnshardedChain) {
  Groups groups = make_groups();
  constexpr int64_t Bn = 2, T = 4, C = 6, F = 8;
  for (dist::Communicator* group : groups.all) {
    const int S = group->size(), r = group->rank();
    const int64_t Fs = F / S, Ts = T / S;
    for (unsigned seed : {3u, 17u}) {
      std::mt19937 rng(seed);  // the same on every rank: x and dy replicated, A and B whole
      const Vec x = randn(Bn * T * C, rng), a = randn(C * F, rng, 0.5), b = randn(F * C, rng, 0.5),
                dy = randn(Bn * T * C, rng);
      const MlpGrads ref = mlp(x, a, b, dy, Bn, T, C, F, nullptr, false);
      for (bool sp : {false, true}) {
        if (g_comm->rank() == 0)
          std::printf("group of %d, seed %u, %s\n", S, seed,
                      sp ? "sequence parallel (gather / reduce-scatter)" : "f / g");
        const MlpGrads got = mlp(x, a, b, dy, Bn, T, C, F, group, sp);
        expect_close_all("y", got.y, sp ? seq_slice(ref.y, Bn, T, C, r * Ts, Ts) : ref.y, 1e-6);
        expect_close_all("dx", got.dx, sp ? seq_slice(ref.dx, Bn, T, C, r * Ts, Ts) : ref.dx, 1e-6);
        expect_close_all("dA_i (columns of dA)", got.da, columns(ref.da, C, F, r * Fs, Fs), 1e-6);
        expect_close_all("dB_i (rows of dB)", got.db, rows_of(ref.db, C, r * Fs, Fs), 1e-6);
      }
    }
  }
}

Variable sp_round_trip(const Variable& x, dist::Communicator& group) {
  return gather_from_sequence_region(reduce_scatter_to_sequence_region(x, group), group);
}

TEST(TpRegions, ReduceScatterThenGatherIsTheAllReduce) {
  Groups groups = make_groups();
  constexpr int64_t B = 3, Ts = 2, C = 5;
  for (dist::Communicator* group : groups.all) {
    const int S = group->size(), r = group->rank();
    const int64_t n = B * Ts * S * C;
    const Shape shape{B, Ts * S, C};
    if (g_comm->rank() == 0) std::printf("group of %d\n", S);
    for (DType dt : {DType::kF32, DType::kBF16}) {  // exact
      const Vec mine = fill(n, [&](int64_t i) { return part(r, i); });
      const OpRun pair = run_op(sp_round_trip, *group, mine, shape, mine, dt);
      const OpRun all = run_op(reduce_from_tp_region, *group, mine, shape, mine, dt);
      expect_exact(std::string("exact forward ") + name_of(dt), pair.y, all.y);
      expect_exact(std::string("exact backward ") + name_of(dt), pair.dx,
                   fill(n, [&](int64_t i) { return part_sum(S, i); }));
    }
    for (unsigned seed : {5u, 9u}) {  // random fp32, each rank its own x, the same dy
      std::mt19937 rng(seed + 100u * unsigned(r)), shared(seed);
      const Vec x = randn(n, rng), dy = randn(n, shared);
      const OpRun pair = run_op(sp_round_trip, *group, x, shape, dy, DType::kF32);
      const OpRun all = run_op(reduce_from_tp_region, *group, x, shape, dy, DType::kF32);
      expect_close_all("forward vs all-reduce (seed " + std::to_string(seed) + ")", pair.y, all.y,
                       1e-6);
      // The pair's backward all-reduces dy (a reduce-scatter of the all-gather); g's is dy.
      Vec dy_sum(dy.size());
      for (size_t i = 0; i < dy.size(); ++i) dy_sum[i] = double(S) * double(float(dy[i]));
      expect_close_all("backward: S * dy", pair.dx, dy_sum, 1e-6);
      expect_close_all("g's backward: dy", all.dx, rounded(dy, DType::kF32), 0);
    }
  }
}

}  // namespace
}  // namespace fd

int main(int argc, char** argv) {
  return fd::dist::testing::run_mpi_tests(argc, argv, &fd::mpi_testing::g_comm);
}
