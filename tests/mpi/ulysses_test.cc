// The Ulysses exchange (lib/ops/ulysses.h) under mpirun -n 2 and -n 4, in the world and (at
// -n 4) in each sp group of a {dp: 2, sp: 2} mesh:
//   - exact values in f32, bf16 and f16: every element of the full (B, T, H, D) tensor carries
//     its own flat index (shifted to [-96, 96), exact in every dtype), so any block sent to the
//     wrong rank, head or position shows; sequence_to_heads gives rank r the whole sequence of
//     heads [r*H/S, (r+1)*H/S), heads_to_sequence positions [r*T/S, (r+1)*T/S) of every head;
//     the backward of each, fed a crafted gradient, equals the other's forward of it exactly;
//   - the round trip heads_to_sequence(sequence_to_heads(x)) is x bit for bit (random values in
//     every dtype), and its backward passes the gradient through bit for bit;
//   - attention Ulysses-style (q, k, v through sequence_to_heads on the same group,
//     causal_attention over the whole sequence with H/S query and Hkv/S key/value heads, the
//     output back through heads_to_sequence) equals one rank's causal_attention over the whole
//     sequence, output and the gradients of q, k and v, to <= 1e-6 relative (fp32; loss
//     sum(out * W), W fixed random): multi-head (H = Hkv = 8) and GQA (H = 8, Hkv = 4, each of
//     k and v exchanged with heads = 4), two seeds.
// Differences are printed as the largest over the ranks.
#include "lib/ops/ulysses.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "lib/autograd/tape.h"
#include "lib/ops/attention.h"
#include "tests/mpi/mpi_test_main.h"
#include "tests/mpi/tp_test_util.h"
#include "tests/ops/op_test_util.h"

namespace fd {
namespace {

using namespace fd::mpi_testing;
using namespace fd::ops;
using namespace fd::ops::testing;

using UlyssesOp = Variable (*)(const Variable&, int, dist::Communicator&);

// One op on `group`: x given, output gradient dy placed, backward run; y and dx returned.
struct OpRun {
  Vec y, dx;
};
OpRun run_op(UlyssesOp op, int heads, dist::Communicator& group, const Vec& x, const Shape& xs,
             const Vec& dy, DType dt) {
  Variable xv(make_tensor(x, xs, dt), true);
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  Variable y = op(xv, heads, group);
  EXPECT_EQ(y.dtype(), dt);
  backward_with(tape, y, dy);
  return {values(y.value()), values(xv.grad())};
}

// The full (B, T, H, D) tensor's element at (b, t, h, d): its flat index, shifted to be small
// (B*T*H*D <= 192 here: exact in bf16 and f16). `sign` tells a gradient from a value.
struct Code {
  int64_t T, H, D;
  double operator()(int64_t b, int64_t t, int64_t h, int64_t d, double sign = 1) const {
    return sign * double(((b * T + t) * H + h) * D + d - 96);
  }
};

// Rank r's side of the sequence layout, (B, Ts, H*D) with positions [r*Ts, (r+1)*Ts), and of
// the heads layout, (B, T, Hs*D) with heads [r*Hs, (r+1)*Hs), filled from `code`.
Vec sequence_side(const Code& c, int64_t B, int64_t Ts, int r, double sign) {
  Vec v;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < Ts; ++t)
      for (int64_t h = 0; h < c.H; ++h)
        for (int64_t d = 0; d < c.D; ++d) v.push_back(c(b, r * Ts + t, h, d, sign));
  return v;
}
Vec heads_side(const Code& c, int64_t B, int64_t Hs, int r, double sign) {
  Vec v;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t h = 0; h < Hs; ++h)
        for (int64_t d = 0; d < c.D; ++d) v.push_back(c(b, t, r * Hs + h, d, sign));
  return v;
}

TEST(Ulysses, ExactValuesInEveryDtype) {
  Groups groups = make_groups("sp");
  constexpr int64_t B = 2, Ts = 3, H = 4, D = 2;
  for (dist::Communicator* group : groups.all) {
    const int S = group->size(), r = group->rank();
    const int64_t T = Ts * S, Hs = H / S;
    const Code code{T, H, D};
    const Shape seq{B, Ts, H * D}, hds{B, T, Hs * D};
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
      if (g_comm->rank() == 0) std::printf("group of %d, %s\n", S, name_of(dt));
      const Vec x_seq = sequence_side(code, B, Ts, r, 1), x_heads = heads_side(code, B, Hs, r, 1);
      const Vec g_seq = sequence_side(code, B, Ts, r, -1), g_heads = heads_side(code, B, Hs, r, -1);
      const OpRun s2h = run_op(sequence_to_heads, int(H), *group, x_seq, seq, g_heads, dt);
      expect_exact("sequence_to_heads forward", s2h.y, x_heads);
      expect_exact("sequence_to_heads backward", s2h.dx, g_seq);
      const OpRun h2s = run_op(heads_to_sequence, int(H), *group, x_heads, hds, g_seq, dt);
      expect_exact("heads_to_sequence forward", h2s.y, x_seq);
      expect_exact("heads_to_sequence backward", h2s.dx, g_heads);
      // Each backward is the other's forward of the same gradient.
      const OpRun h2s_of_g = run_op(heads_to_sequence, int(H), *group, g_heads, hds, g_seq, dt);
      expect_exact("sequence_to_heads backward == heads_to_sequence", s2h.dx, h2s_of_g.y);
      const OpRun s2h_of_g = run_op(sequence_to_heads, int(H), *group, g_seq, seq, g_heads, dt);
      expect_exact("heads_to_sequence backward == sequence_to_heads", h2s.dx, s2h_of_g.y);
    }
  }
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

TEST(Ulysses, RoundTripIsTheIdentityBitForBit) {
  Groups groups = make_groups("sp");
  constexpr int64_t B = 3, Ts = 2, H = 8, D = 3;
  for (dist::Communicator* group : groups.all) {
    const int S = group->size(), r = group->rank();
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
      std::mt19937 rng(41u + 7u * unsigned(r));  // each rank its own slice
      const Tensor xv = make_tensor(randn(B * Ts * H * D, rng), Shape{B, Ts, H * D}, dt);
      const Tensor dyv = make_tensor(randn(B * Ts * H * D, rng), Shape{B, Ts, H * D}, dt);
      Variable x(xv, true);
      autograd::Tape tape;
      autograd::TapeScope scope(tape);
      Variable mid = sequence_to_heads(x, int(H), *group);
      EXPECT_EQ(mid.shape(), (Shape{B, Ts * S, H / S * D}));
      Variable y = heads_to_sequence(mid, int(H), *group);
      y.slot()->ensure_grad().copy_from(dyv);
      tape.run_backward();
      const int bad = int(!same_bits(y.value(), xv)) + 2 * int(!same_bits(x.grad(), dyv));
      std::vector<double> worst = worst_over_ranks({double(bad)});
      if (g_comm->rank() == 0)
        std::printf("group of %d, %s: round trip %s\n", S, name_of(dt),
                    worst[0] == 0 ? "bit for bit, forward and backward" : "DIFFERS");
      EXPECT_EQ(bad & 1, 0) << "forward differs on rank " << g_comm->rank();
      EXPECT_EQ(bad & 2, 0) << "backward differs on rank " << g_comm->rank();
    }
  }
}

struct AttentionRun {
  Vec out, dq, dk, dv;
};

// causal_attention over q (B, T, H*D), k and v (B, T, Hkv*D) with loss sum(out * w): over the
// whole sequence on this rank when `group` is null; else Ulysses-style on `group`, q, k, v, w
// being this rank's slices of positions [r*T/S, (r+1)*T/S).
AttentionRun attention(const Vec& q, const Vec& k, const Vec& v, const Vec& w, int64_t B, int64_t T,
                       int H, int Hkv, int64_t D, dist::Communicator* group) {
  const int S = group != nullptr ? group->size() : 1, r = group != nullptr ? group->rank() : 0;
  const int64_t Ts = T / S;
  auto slice = [&](const Vec& m, int64_t C) {
    return group != nullptr ? seq_slice(m, B, T, C, r * Ts, Ts) : m;
  };
  Variable qv(make_tensor(slice(q, H * D), Shape{B, Ts, H * D}, DType::kF32), true);
  Variable kv(make_tensor(slice(k, Hkv * D), Shape{B, Ts, Hkv * D}, DType::kF32), true);
  Variable vv(make_tensor(slice(v, Hkv * D), Shape{B, Ts, Hkv * D}, DType::kF32), true);
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  Variable out;
  if (group == nullptr) {
    out = causal_attention(qv, kv, vv, H, Hkv);
  } else {
    Variable qh = sequence_to_heads(qv, H, *group);
    Variable kh = sequence_to_heads(kv, Hkv, *group);
    Variable vh = sequence_to_heads(vv, Hkv, *group);
    out = heads_to_sequence(causal_attention(qh, kh, vh, H / S, Hkv / S), H, *group);
  }
  backward_with(tape, out, slice(w, H * D));
  return {values(out.value()), values(qv.grad()), values(kv.grad()), values(vv.grad())};
}

TEST(Ulysses, AttentionEqualsTheWholeSequenceOnOneRank) {
  Groups groups = make_groups("sp");
  constexpr int64_t B = 2, D = 4;
  constexpr int H = 8;
  for (dist::Communicator* group : groups.all) {
    const int S = group->size(), r = group->rank();
    const int64_t T = 3 * S, Ts = T / S;
    for (int Hkv : {8, 4}) {
      for (unsigned seed : {5u, 23u}) {
        if (g_comm->rank() == 0)
          std::printf("group of %d, %d query heads, %d key/value heads, seed %u\n", S, H, Hkv,
                      seed);
        std::mt19937 rng(seed);  // the same on every rank: the whole sequence
        const Vec q = randn(B * T * H * D, rng), k = randn(B * T * Hkv * D, rng),
                  v = randn(B * T * Hkv * D, rng), w = randn(B * T * H * D, rng);
        const AttentionRun ref = attention(q, k, v, w, B, T, H, Hkv, D, nullptr);
        const AttentionRun got = attention(q, k, v, w, B, T, H, Hkv, D, group);
        expect_close_all("out", got.out, seq_slice(ref.out, B, T, H * D, r * Ts, Ts), 1e-6);
        expect_close_all("dq", got.dq, seq_slice(ref.dq, B, T, H * D, r * Ts, Ts), 1e-6);
        expect_close_all("dk", got.dk, seq_slice(ref.dk, B, T, Hkv * D, r * Ts, Ts), 1e-6);
        expect_close_all("dv", got.dv, seq_slice(ref.dv, B, T, Hkv * D, r * Ts, Ts), 1e-6);
      }
    }
  }
}

}  // namespace
}  // namespace fd

int main(int argc, char** argv) {
  return fd::dist::testing::run_mpi_tests(argc, argv, &fd::mpi_testing::g_comm);
}
