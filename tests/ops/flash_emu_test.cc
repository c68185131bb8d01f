// The tensor-core attention kernels' own code (kernels/attention_mma.cuh), run
// on the CPU under tests/ops/simt_emu.h's emulation of the CUDA execution
// model and of the PTX primitives, against float64 attention from the
// definitions (the GPU parity test's bf16 bound) and against the kernels'
// algorithm at tile level in fp32 (flash_reference.h's tiled(), far tighter:
// the same roundings, only the summation order differs). Head sizes 40 (a
// 64-column tile, zero-filled past 40), 64, 80 (a 96-column tile), 96 and
// 128; T not a multiple of 64; grouped-query heads and one KV head for all;
// packed rows; heads split over blocks; bf16 and f16; gradients added into f32
// and bf16 buffers. The backward's dQ accumulator starts as NaN and its
// ordered accumulation is checked by the emulator (a block waiting for a count
// an earlier block did not leave fails the launch). Every case runs three
// times, which must give the same bits: cp.async copies landing at their
// wait (a read before the wait sees NaN) with the warps in lockstep, and
// copies landing at once with each warp running as far as it can before the
// next, from the first warp or from the last (a refill racing another warp's
// reads corrupts them).
//
// The emulator's own checks are tested first: a deadlock, an out-of-bounds
// shared-memory access and a read before cp.async's wait are each caught.
// clang-format off
#include "tests/ops/simt_emu.h"  // first: defines FD_SIMT_EMU and the primitives
// clang-format on

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "kernels/attention_mma.cuh"
#include "kernels/flash_layout.h"
#include "tests/ops/flash_reference.h"

namespace fd::kernels {
namespace {

using flash_ref::Grads;
using flash_ref::Problem;
using simt_emu::Landing;
using simt_emu::Mode;
using simt_emu::Schedule;

// ThreadSanitizer does not follow the emulator's fibers (ucontext switches between
// stacks it does not know): every test here skips under it (make test-tsan).
#if defined(__SANITIZE_THREAD__)
#define SKIP_UNDER_TSAN() GTEST_SKIP() << "ThreadSanitizer does not follow the emulator's fibers"
#else
#define SKIP_UNDER_TSAN() (void)0
#endif

// ------------------------------------------------------- the emulator itself --

TEST(SimtEmu, ADeadlockIsReported) {
  SKIP_UNDER_TSAN();
  // Warp 1 skips the barrier warp 0 waits at.
  const auto body = [] {
    if (threadIdx.x < 32) mma::sync_threads();
  };
  try {
    simt_emu::launch({1, 1, 1}, {64, 1, 1}, 0, body);
    FAIL() << "no deadlock reported";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("deadlocked"), std::string::npos) << e.what();
  }
}

TEST(SimtEmu, AnOutOfBoundsSharedAccessIsReported) {
  SKIP_UNDER_TSAN();
  const auto body = [] {
    uint32_t r[4];
    mma::ldmatrix_x4(r, 1024 + 16 * uint32_t(threadIdx.x));  // the last lanes read past 1 KiB
  };
  try {
    simt_emu::launch({1, 1, 1}, {32, 1, 1}, 1024, body);
    FAIL() << "no bad access reported";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("past the launch's 1024 bytes"), std::string::npos)
        << e.what();
  }
}

TEST(SimtEmu, ACopyLandsAtItsWaitAndLdmatrixAndMmaFollowThePtxLayouts) {
  SKIP_UNDER_TSAN();
  // A 16 x 16 identity-like A and a B of known values through ldmatrix and mma:
  // C = A B computed by the warp equals the matrix product.
  std::vector<uint16_t> a(16 * 16), b(8 * 16);  // a row-major 16 x 16; b stored n-major (8 x 16)
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) a[size_t(r * 16 + c)] = f32_to_bf16(float((r + 2 * c) % 5) - 2);
  for (int n = 0; n < 8; ++n)
    for (int k = 0; k < 16; ++k) b[size_t(n * 16 + k)] = f32_to_bf16(float((3 * n + k) % 7) - 3);
  std::vector<float> c(16 * 8, 0.0f);
  bool stale_seen = false;
  const auto body = [&] {
    uint16_t* s = mma::dynamic_smem<uint16_t>();
    const int l = int(threadIdx.x);
    // Rows of a at 0 .. 511, rows of b at 512 ..: 16-byte chunks, one per lane (and a second).
    for (int e = l; e < 48; e += 32) {
      const bool is_a = e < 32;
      const int row = is_a ? e / 2 : (e - 32) / 2, half = e % 2;
      const uint16_t* src =
          is_a ? &a[size_t(row * 16 + 8 * half)] : &b[size_t(row * 16 + 8 * half)];
      mma::cp_async16(mma::smem_addr(s + (is_a ? 0 : 256) + row * 16 + 8 * half), src, true);
    }
    mma::cp_async_commit();
    if (l == 0 && std::isnan(bf16_to_f32(s[0]))) stale_seen = true;  // not landed yet
    mma::cp_async_wait<0>();
    mma::sync_threads();
    uint32_t ar[4], br[4];
    // A: matrices (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15).
    mma::ldmatrix_x4(ar, mma::smem_addr(s + (l % 16) * 16 + 8 * (l / 16)));
    // B[k][n] = b[n][k]: matrices (n 0-7, k 0-7), (n 0-7, k 8-15); lanes 16.. repeat them.
    mma::ldmatrix_x4(br, mma::smem_addr(s + 256 + (l % 8) * 16 + 8 * ((l / 8) % 2)));
    float acc[4] = {0, 0, 0, 0};
    mma::mma16816<DT::kBF16>(acc, ar, br[0], br[1]);
    const int g = l / 4, t = l % 4;
    for (int i = 0; i < 4; ++i) c[size_t((g + 8 * (i / 2)) * 8 + 2 * t + i % 2)] = acc[i];
  };
  simt_emu::launch({1, 1, 1}, {32, 1, 1}, 1024, body);
  EXPECT_TRUE(stale_seen) << "a copy landed before its wait";
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 8; ++n) {
      float want = 0;
      for (int k = 0; k < 16; ++k)
        want += bf16_to_f32(a[size_t(r * 16 + k)]) * bf16_to_f32(b[size_t(n * 16 + k)]);
      EXPECT_EQ(c[size_t(r * 8 + n)], want) << r << " " << n;
    }
}

// ------------------------------------------------------------ the kernels --

struct KernelRun {
  Grads got;                          // out, dq, dk, dv as the kernels wrote them (less the priors)
  std::vector<unsigned char> raw[3];  // dq, dk, dv's bytes
  std::vector<uint16_t> out16;
  std::vector<float> lse;
  int splits = 1;  // the backward's head splits
};

std::vector<uint16_t> to16(const std::vector<float>& x, DT dt) {
  std::vector<uint16_t> y(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    y[i] = dt == DT::kBF16 ? f32_to_bf16(x[i]) : f32_to_f16(x[i]);
  return y;
}

// Where the gradients' priors are (kernels.h's GradOut): none (the outputs
// start as NaN: a kernel reading them fails the comparison), the outputs
// themselves (starting at the prior values: +=), or a separate buffer of those
// values (read; the outputs start as NaN). With a prior, `got` is the output
// minus the prior.
enum class Prior { kNone, kInPlace, kSeparate };

// A prior's elements: small, so that a 16-bit gradient keeps most of the term.
double prior_value(size_t i) { return double(int(i % 13) - 6) / 1024.0; }

// Forward, D = rowsum(dO * O) as kernels/attention.cu takes it, then the
// backward and dQ's last pass, launched as kernels/attention_mma.cu launches them.
template <DT kDt, int kHs>
KernelRun run_kernels(const Problem& p, DT grad_dt, int sms, Mode mode,
                      Prior prior_at = Prior::kNone) {
  const std::vector<uint16_t> q = to16(p.q, kDt), k = to16(p.k, kDt), v = to16(p.v, kDt),
                              dout = to16(p.dout, kDt);
  Geometry g{};
  g.T = p.T;
  g.C = p.H * p.hs;
  g.n_head = p.H;
  g.n_kv_head = p.KV;
  g.group = p.H / p.KV;
  g.hs = p.hs;
  g.ldq = p.H * p.hs;
  g.ldk = g.ldv = p.KV * p.hs;
  g.scale = 1.0f / std::sqrt(float(p.hs));
  g.scale_log2 = g.scale * 1.4426950408889634f;
  g.starts = p.starts.empty() ? nullptr : p.starts.data();

  KernelRun run;
  run.out16.assign(q.size(), 0);
  run.lse.assign(size_t(p.B) * p.H * p.T, 0.0f);
  const flash::Grid fwd = flash::forward_grid(p.B, p.H, p.T);
  simt_emu::launch(
      {fwd.x, fwd.y, 1}, {flash::kThreads, 1, 1}, flash::forward_smem(kHs),
      [&] {
        mma::flash_forward_kernel<kDt, kHs>(q.data(), k.data(), v.data(), run.out16.data(),
                                            run.lse.data(), g);
      },
      mode);

  std::vector<float> D(run.lse.size());
  for (int b = 0; b < p.B; ++b)
    for (int h = 0; h < p.H; ++h)
      for (int t = 0; t < p.T; ++t) {
        float acc = 0;
        for (int d = 0; d < p.hs; ++d) {
          const size_t at = ((size_t(b) * p.T + t) * p.H + h) * p.hs + d;
          acc += simt_emu::to_float<kDt>(dout[at]) * simt_emu::to_float<kDt>(run.out16[at]);
        }
        D[(size_t(b) * p.H + h) * p.T + t] = acc;
      }

  const size_t width = grad_dt == DT::kF32 ? 4 : 2;
  // NaN in f32, bf16 and f16 alike.
  std::vector<unsigned char> dq(q.size() * width, 0xFF), dk(k.size() * width, 0xFF),
      dv(v.size() * width, 0xFF);
  auto prior_of = [&](size_t n) {
    std::vector<unsigned char> x(n * width);
    for (size_t i = 0; i < n; ++i)
      mma::store_from_float(x.data(), grad_dt, int64_t(i), float(prior_value(i)));
    return x;
  };
  std::vector<unsigned char> pq = prior_of(q.size()), pk = prior_of(k.size()),
                             pv = prior_of(v.size());
  if (prior_at == Prior::kInPlace) {
    dq = pq;
    dk = pk;
    dv = pv;
  }
  auto grad = [&](std::vector<unsigned char>& out, const std::vector<unsigned char>& prior) {
    return GradOut{out.data(), prior_at == Prior::kNone      ? nullptr
                               : prior_at == Prior::kInPlace ? out.data()
                                                             : prior.data()};
  };
  const GradOut gq = grad(dq, pq), gk = grad(dk, pk), gv = grad(dv, pv);
  // dQ's accumulator starts as NaN: every element read must have been stored first.
  std::vector<float> accum(flash::dq_accum_floats(p.B, p.H, p.T, kHs), NAN);
  std::vector<int> counts(flash::dq_counts(p.B, p.H, p.T), 0);
  const int splits = flash::head_splits(p.B, p.KV, p.H / p.KV, p.T, sms);
  std::vector<float> parts(flash::dkv_part_floats(p.B, p.KV, p.T, kHs, splits), NAN);
  const flash::Grid bwd = flash::backward_grid(p.B, p.KV, p.T, splits);
  simt_emu::launch(
      {bwd.x, bwd.y, 1}, {flash::kBwdThreads, 1, 1}, flash::backward_smem(kHs),
      [&] {
        mma::flash_backward_kernel<kDt, kHs>(q.data(), k.data(), v.data(), dout.data(),
                                             run.lse.data(), D.data(), gk, gv, grad_dt,
                                             accum.data(), counts.data(), splits, parts.data(), g);
      },
      mode);
  simt_emu::launch(
      {3, 1, 1}, {flash::kBwdThreads, 1, 1}, 0,
      [&] { mma::flash_dq_finish_kernel<kHs>(accum.data(), gq, grad_dt, p.B, g); }, mode);
  if (splits > 1) {
    simt_emu::launch(
        {3, 1, 1}, {flash::kBwdThreads, 1, 1}, 0,
        [&] { mma::flash_dkv_finish_kernel<kHs>(parts.data(), gk, gv, grad_dt, p.B, splits, g); },
        mode);
  }
  run.splits = splits;

  auto widen = [&](const std::vector<unsigned char>& x, const std::vector<unsigned char>& prior,
                   size_t n) {
    std::vector<double> y(n);
    for (size_t i = 0; i < n; ++i) {
      y[i] = mma::load_as_float(x.data(), grad_dt, int64_t(i));
      if (prior_at != Prior::kNone) y[i] -= mma::load_as_float(prior.data(), grad_dt, int64_t(i));
    }
    return y;
  };
  run.raw[0] = dq;
  run.raw[1] = dk;
  run.raw[2] = dv;
  run.got.dq = widen(dq, pq, q.size());
  run.got.dk = widen(dk, pk, k.size());
  run.got.dv = widen(dv, pv, v.size());
  run.got.out.resize(q.size());
  for (size_t i = 0; i < q.size(); ++i) run.got.out[i] = simt_emu::to_float<kDt>(run.out16[i]);
  return run;
}

float f16_round(float x) { return f16_to_f32(f32_to_f16(x)); }

struct Case {
  const char* name;
  DT dt;
  int hs;
  bool packed;
  DT grad_dt;
  int B = 1, T = 130, KV = 2;  // over 4 query heads
  int sms = 1;                 // the GPU's size, for the backward's head splits
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class FlashEmu : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { SKIP_UNDER_TSAN(); }
};

TEST_P(FlashEmu, KernelsMatchFloat64AttentionAndTheirTiledAlgorithm) {
  const Case c = GetParam();
  // T = 130: three query tiles, the last with 2 rows.
  Problem p = flash_ref::make_problem(c.packed, c.B, c.T, 4, c.KV, c.hs);
  if (c.dt == DT::kF16) {  // inputs exact in f16 too
    for (auto* x : {&p.q, &p.k, &p.v, &p.dout})
      for (float& e : *x) e = f16_round(e);
  }
  const Grads want = flash_ref::reference(p);
  const Grads tiled = flash_ref::tiled(p, c.dt == DT::kBF16 ? flash_ref::bf16 : f16_round);

  auto run = [&](Mode mode, Prior prior = Prior::kNone) {
    const int tile = flash::head_tile(c.hs);
    if (c.dt == DT::kBF16) {
      return tile == 64   ? run_kernels<DT::kBF16, 64>(p, c.grad_dt, c.sms, mode, prior)
             : tile == 96 ? run_kernels<DT::kBF16, 96>(p, c.grad_dt, c.sms, mode, prior)
                          : run_kernels<DT::kBF16, 128>(p, c.grad_dt, c.sms, mode, prior);
    }
    return tile == 64   ? run_kernels<DT::kF16, 64>(p, c.grad_dt, c.sms, mode, prior)
           : tile == 96 ? run_kernels<DT::kF16, 96>(p, c.grad_dt, c.sms, mode, prior)
                        : run_kernels<DT::kF16, 128>(p, c.grad_dt, c.sms, mode, prior);
  };
  // The reference run, and two in which one warp at a time runs ahead with every
  // copy landing at once (a refill not fenced off from another warp's reads shows).
  const KernelRun late = run({Landing::kLate, Schedule::kLockstep});
  const KernelRun low = run({Landing::kEarly, Schedule::kLowWarpsFirst});
  const KernelRun high = run({Landing::kEarly, Schedule::kHighWarpsFirst});

  const char* names[] = {"out", "dq", "dk", "dv"};
  const std::vector<double>* got[] = {&late.got.out, &late.got.dq, &late.got.dk, &late.got.dv};
  const std::vector<double>* f64[] = {&want.out, &want.dq, &want.dk, &want.dv};
  const std::vector<double>* tiled_parts[] = {&tiled.out, &tiled.dq, &tiled.dk, &tiled.dv};
  const std::vector<double>* low_parts[] = {&low.got.out, &low.got.dq, &low.got.dk, &low.got.dv};
  const std::vector<double>* high_parts[] = {&high.got.out, &high.got.dq, &high.got.dk,
                                             &high.got.dv};
  // The 16-bit gradient buffers add one rounding of the result.
  const double tight = c.grad_dt == DT::kF32 ? 2e-3 : 8e-3;
  for (size_t i = 0; i < 4; ++i) {
    const char* name = names[i];
    const double to_f64 = flash_ref::rel_error(*got[i], *f64[i]);
    const double to_tiled = flash_ref::rel_error(*got[i], *tiled_parts[i]);
    EXPECT_LT(to_f64, 1e-2) << name;
    EXPECT_LT(to_tiled, i == 0 ? 2e-3 : tight) << name;
    EXPECT_EQ(*got[i], *low_parts[i]) << name << ": warps running ahead (from warp 0) changed it";
    EXPECT_EQ(*got[i], *high_parts[i])
        << name << ": warps running ahead (from the last) changed it";
    std::printf("  %s: against float64 %.2e, against the tiled algorithm %.2e\n", name, to_f64,
                to_tiled);
  }
  if (c.sms > 1) {
    EXPECT_GT(late.splits, 1) << "the case meant to split the heads did not";
  }
  EXPECT_EQ(late.lse, low.lse);
  EXPECT_EQ(late.lse, high.lse);

  // The gradients added to priors: in place (+=) and from a separate buffer (a borrowed
  // gradient, read only) give the same bits, and less the prior, the gradient (one more
  // rounding of the sum in the gradient's dtype).
  const KernelRun in_place = run({Landing::kLate, Schedule::kLockstep}, Prior::kInPlace);
  const KernelRun separate = run({Landing::kLate, Schedule::kLockstep}, Prior::kSeparate);
  const double sum_rounding = c.grad_dt == DT::kF32 ? 1e-5 : 1e-2;
  for (size_t i = 1; i < 4; ++i) {
    EXPECT_EQ(in_place.raw[i - 1], separate.raw[i - 1]) << names[i];
    const std::vector<double>* with_prior[] = {nullptr, &separate.got.dq, &separate.got.dk,
                                               &separate.got.dv};
    const double e = flash_ref::rel_error(*with_prior[i], *got[i]);
    EXPECT_LT(e, sum_rounding) << names[i] << " added to a prior";
    std::printf("  %s added to a prior, less the prior: %.2e from the gradient alone\n", names[i],
                e);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, FlashEmu,
    ::testing::Values(
        Case{"bf16_hs64", DT::kBF16, 64, false, DT::kF32},
        Case{"bf16_hs64_packed", DT::kBF16, 64, true, DT::kF32},
        Case{"bf16_hs40_packed_bf16_grads", DT::kBF16, 40, true, DT::kBF16},
        Case{"f16_hs64", DT::kF16, 64, false, DT::kF32},
        // A 132-SM GPU: the backward splits the two heads per KV head in 2.
        Case{"bf16_hs128_split", DT::kBF16, 128, false, DT::kF32, 1, 130, 2, 132},
        Case{"bf16_hs96_packed", DT::kBF16, 96, true, DT::kF32},
        // 80 columns in the 96-column tile, heads split in 2.
        Case{"f16_hs80_split", DT::kF16, 80, false, DT::kF32, 1, 130, 2, 132},
        // Two batch rows, one KV head for four query heads, four tiles.
        Case{"bf16_hs64_mqa_b2_packed", DT::kBF16, 64, true, DT::kF32, 2, 200, 1},
        // The same split over the four heads (2 x 4 tiles x 4 = 32 blocks for 16 SMs).
        Case{"bf16_hs64_mqa_b2_packed_split", DT::kBF16, 64, true, DT::kF32, 2, 200, 1, 16}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace fd::kernels
