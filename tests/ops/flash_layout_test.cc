// The tensor-core attention's host-side logic (kernels/flash_layout.h), checked
// without a GPU:
//   - the causal tile walk visits every visible (query, key) pair and skips
//     only tiles that are wholly above the diagonal (or before a document);
//   - the swizzled shared-memory tile is a bijection, and every ldmatrix
//     phase (eight 16-byte row reads) meets no bank conflict;
//   - ldmatrix (emulated from the PTX rules) at the lanes' addresses, fed to
//     mma.m16n8k16 (emulated from the PTX fragment layouts), composes to the
//     products the kernels compute: S = X Y^T and O = P Y, with P taken from
//     the accumulators as the kernels take it (no data moving between lanes);
//   - the kernels' algorithm at tile level (online softmax over 64-key tiles,
//     P and dS rounded to bf16 before their products, the backward's two
//     passes) against float64 attention, within the GPU parity test's bf16
//     bound, for T not a multiple of 64, grouped-query heads and packed rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

#include "kernels/flash_layout.h"
#include "lib/base/rng.h"
#include "lib/tensor/dtype.h"

namespace fd::kernels::flash {
namespace {

TEST(FlashLayout, HeadTileAndWhichShapesFit) {
  EXPECT_EQ(head_tile(64), 64);   // GPT-2, TinyLlama
  EXPECT_EQ(head_tile(128), 128); // Llama, Qwen
  EXPECT_EQ(head_tile(32), 64);
  EXPECT_EQ(head_tile(96), 128);
  EXPECT_EQ(head_tile(8), 64);
  EXPECT_EQ(head_tile(0), 0);
  EXPECT_EQ(head_tile(12), 0);   // not a multiple of 8: SIMT
  EXPECT_EQ(head_tile(136), 0);  // above 128: SIMT
  EXPECT_TRUE(shapes_fit(64, 3 * 768, 3 * 768, 3 * 768));  // GPT-2's packed qkv
  EXPECT_FALSE(shapes_fit(64, 3 * 768 + 4, 3 * 768, 3 * 768));
  EXPECT_FALSE(shapes_fit(12, 36, 36, 36));
  // Shared memory: within the 163 KiB an sm_80 block may opt into (227 KiB on sm_90).
  EXPECT_EQ(forward_smem(64), 40u * 1024);
  EXPECT_EQ(forward_smem(128), 80u * 1024);
  EXPECT_LE(backward_smem(128), 163u * 1024);
}

TEST(FlashLayout, CausalTileWalkVisitsEveryVisiblePairAndSkipsTheRest) {
  for (int T : {1, 63, 64, 65, 130, 1024, 1000}) {
    for (int qt = 0; qt < tiles(T); ++qt) {
      const int q0 = qt * kTile, q_last = std::min(q0 + kTile, T) - 1;
      const int first = first_key_tile(0), last = last_key_tile(q0, T);
      EXPECT_EQ(first, 0);
      // Every key a query of the tile sees is in a visited tile...
      EXPECT_GE((last + 1) * kTile - 1, q_last) << T << " " << qt;
      // ...and every tile after `last` is above the diagonal for all the tile's queries.
      EXPECT_GT((last + 1) * kTile, q_last);
      EXPECT_LE(last * kTile, q_last);
    }
    for (int kt = 0; kt < tiles(T); ++kt) {
      const int k0 = kt * kTile, first = first_query_tile(k0);
      // Query tiles before `first` hold only queries before k0 (they see none of these keys).
      EXPECT_LE(first * kTile, k0);
      EXPECT_GT((first + 1) * kTile, k0);
    }
  }
  // Packed rows: the walk starts at the tile of the first query's document start;
  // starts never decrease along a row, so no later query of the tile sees an earlier key.
  const std::vector<int> starts = {0, 0, 0, 70, 70, 70, 200};  // per query, sampled
  for (int s : starts) EXPECT_LE(first_key_tile(s) * kTile, s);
}

TEST(FlashLayout, SwizzledTileIsABijectionAndLdmatrixPhasesAreConflictFree) {
  for (int kHs : {64, 128}) {
    std::vector<int> seen(size_t(kTile) * kHs, 0);
    for (int r = 0; r < kTile; ++r)
      for (int c = 0; c < kHs; ++c) {
        const int off = tile_offset(kHs, r, c);
        ASSERT_GE(off, 0);
        ASSERT_LT(off, kTile * kHs);
        ++seen[size_t(off)];
        if (c % 8 == 0) {
          EXPECT_EQ(off % 8, 0);  // a chunk starts 16-byte aligned
        }
      }
    for (int n : seen) EXPECT_EQ(n, 1);

    // One ldmatrix phase: lanes 8i .. 8i + 7 (matrix i) read 16 bytes each; the eight
    // must fall into eight different groups of four banks (byte offset / 16 mod 8).
    auto check = [&](auto address, int r0, int c0, const char* what) {
      for (int m = 0; m < 4; ++m) {
        std::set<int> groups;
        for (int j = 0; j < 8; ++j) {
          const RowCol rc = address(8 * m + j, r0, c0);
          groups.insert(tile_offset(kHs, rc.row, rc.col) * 2 / 16 % 8);
        }
        EXPECT_EQ(groups.size(), 8u) << what << " kHs " << kHs << " matrix " << m;
      }
    };
    for (int r0 = 0; r0 < kTile; r0 += 16)
      for (int c0 = 0; c0 < kHs; c0 += 16) {
        check(ldm_a, r0, c0, "A");
        check(ldm_b, r0, c0, "B");
        check(ldm_bt, r0, c0, "B^T");
      }
    // cp.async stores: 8 consecutive threads write 8 consecutive chunks of the tile.
    for (int e0 = 0; e0 < kTile * kHs / 8; e0 += 8) {
      std::set<int> groups;
      for (int e = e0; e < e0 + 8; ++e) {
        const int r = e / (kHs / 8), c = e % (kHs / 8);
        groups.insert(tile_offset(kHs, r, 8 * c) * 2 / 16 % 8);
      }
      EXPECT_EQ(groups.size(), 8u);
    }
  }
}

// ------------------------------------------- a warp, emulated from the PTX rules --

// A register holds two values (the low and the high 16 bits); values here are
// small integers, exact in fp32, so products compare exactly.
using Reg = std::array<float, 2>;
using Warp4 = std::array<std::array<Reg, 4>, 32>;  // [lane][register]

// ldmatrix.x4 from a swizzled tile: lanes 8i .. 8i + 7 give matrix i's row
// addresses (row, col of the row's first element); without trans lane l
// receives row l / 4, columns 2 (l % 4) + h; with trans row 2 (l % 4) + h, column l / 4.
template <typename Address>
Warp4 ldmatrix_x4(const std::vector<float>& tile, int kHs, Address address, bool trans) {
  Warp4 out{};
  for (int m = 0; m < 4; ++m) {
    float mat[8][8];
    for (int j = 0; j < 8; ++j) {
      const RowCol rc = address(8 * m + j);
      EXPECT_EQ(rc.col % 8, 0);
      for (int e = 0; e < 8; ++e) mat[j][e] = tile[size_t(tile_offset(kHs, rc.row, rc.col + e))];
    }
    for (int l = 0; l < 32; ++l)
      for (int h = 0; h < 2; ++h)
        out[size_t(l)][size_t(m)][size_t(h)] =
            trans ? mat[2 * (l % 4) + h][l / 4] : mat[l / 4][2 * (l % 4) + h];
  }
  return out;
}

// c (per lane, 4 accumulators) += A (16 x 16, regs a) B (16 x 8, regs b0, b1),
// the operands read through the PTX fragment layouts.
void mma(std::array<std::array<float, 4>, 32>& c, const Warp4& a, const Warp4& b, int b0, int b1) {
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l)
    for (int h = 0; h < 2; ++h) {
      for (int i = 0; i < 4; ++i) {
        const RowCol rc = frag_a(l, i, h);
        A[rc.row][rc.col] = a[size_t(l)][size_t(i)][size_t(h)];
      }
      for (int i = 0; i < 2; ++i) {
        const RowCol rc = frag_b(l, i, h);
        B[rc.row][rc.col] = b[size_t(l)][size_t(i == 0 ? b0 : b1)][size_t(h)];
      }
    }
  for (int l = 0; l < 32; ++l)
    for (int i = 0; i < 4; ++i) {
      const RowCol rc = frag_c(l, i);
      for (int k = 0; k < 16; ++k) c[size_t(l)][size_t(i)] += A[rc.row][k] * B[k][rc.col];
    }
}

std::vector<float> random_tile(int kHs, uint64_t seed) {
  std::vector<float> t(size_t(kTile) * kHs);
  for (size_t i = 0; i < t.size(); ++i) t[i] = float(int(hash_words(seed, 1, i) % 7) - 3);
  return t;
}
float at(const std::vector<float>& tile, int kHs, int r, int c) {
  return tile[size_t(tile_offset(kHs, r, c))];
}

TEST(FlashLayout, LdmatrixAndMmaComposeToTheKernelsProducts) {
  for (int kHs : {64, 128}) {
    const std::vector<float> X = random_tile(kHs, 1), Y = random_tile(kHs, 2);
    for (int x0 = 0; x0 < kTile; x0 += 16) {
      // S = X[x0 .. x0 + 16) Y^T, the loop of product_xyt.
      std::array<std::array<std::array<float, 4>, 32>, 8> s{};
      for (int kk = 0; kk < kHs / 16; ++kk) {
        const Warp4 a = ldmatrix_x4(
            X, kHs, [&](int l) { return ldm_a(l, x0, 16 * kk); }, false);
        for (int np = 0; np < 4; ++np) {
          const Warp4 b = ldmatrix_x4(
              Y, kHs, [&](int l) { return ldm_b(l, 16 * np, 16 * kk); }, false);
          mma(s[size_t(2 * np)], a, b, 0, 1);
          mma(s[size_t(2 * np + 1)], a, b, 2, 3);
        }
      }
      for (int j = 0; j < 8; ++j)
        for (int l = 0; l < 32; ++l)
          for (int i = 0; i < 4; ++i) {
            const RowCol rc = frag_c(l, i);
            float want = 0;
            for (int d = 0; d < kHs; ++d)
              want += at(X, kHs, x0 + rc.row, d) * at(Y, kHs, 8 * j + rc.col, d);
            ASSERT_EQ(s[size_t(j)][size_t(l)][size_t(i)], want) << kHs << " " << x0;
          }

      // O = P Y with P = those accumulators as A operands (to_a_operands), the loop of product_py.
      Warp4 p[4];
      for (int j = 0; j < 4; ++j)
        for (int l = 0; l < 32; ++l)
          for (int i = 0; i < 4; ++i)
            for (int h = 0; h < 2; ++h)
              p[j][size_t(l)][size_t(i)][size_t(h)] =
                  s[size_t(a_from_c_tile(j, i))][size_t(l)][size_t(a_from_c_value(i, h))];
      std::vector<std::array<std::array<float, 4>, 32>> o(size_t(kHs / 8));
      for (int kk = 0; kk < 4; ++kk)
        for (int np = 0; np < kHs / 16; ++np) {
          const Warp4 b = ldmatrix_x4(
              Y, kHs, [&](int l) { return ldm_bt(l, 16 * kk, 16 * np); }, true);
          mma(o[size_t(2 * np)], p[kk], b, 0, 1);
          mma(o[size_t(2 * np + 1)], p[kk], b, 2, 3);
        }
      for (int j = 0; j < kHs / 8; ++j)
        for (int l = 0; l < 32; ++l)
          for (int i = 0; i < 4; ++i) {
            const RowCol rc = frag_c(l, i);
            double want = 0;  // sum over keys of S[row][key] Y[key][col]
            for (int key = 0; key < kTile; ++key) {
              double srow = 0;
              for (int d = 0; d < kHs; ++d)
                srow += double(at(X, kHs, x0 + rc.row, d)) * at(Y, kHs, key, d);
              want += srow * at(Y, kHs, key, 8 * j + rc.col);
            }
            ASSERT_EQ(double(o[size_t(j)][size_t(l)][size_t(i)]), want) << kHs << " " << x0;
          }
    }
  }
}

// ---------------------------------------------- the algorithm, at tile level --

struct Problem {
  int B = 2, T = 130, H = 4, KV = 2, hs = 40;
  std::vector<int> starts;  // (B, T) document starts, or empty
  std::vector<float> q, k, v, dout;  // (B, T, heads, hs), values exact in bf16
};

float bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

Problem make_problem(bool packed) {
  Problem p;
  auto fill = [&](std::vector<float>& x, int heads, uint64_t stream) {
    x.resize(size_t(p.B) * p.T * heads * p.hs);
    for (size_t i = 0; i < x.size(); ++i)
      x[i] = bf16(float(uniform01(hash_words(7, stream, i))) * 2.0f - 1.0f);
  };
  fill(p.q, p.H, 1);
  fill(p.k, p.KV, 2);
  fill(p.v, p.KV, 3);
  fill(p.dout, p.H, 4);
  if (packed) {
    p.starts.resize(size_t(p.B) * p.T);
    for (int b = 0; b < p.B; ++b)
      for (int t = 0; t < p.T; ++t) p.starts[size_t(b * p.T + t)] = t < 50 ? 0 : t < 97 ? 50 : 97;
  }
  return p;
}

int start_of(const Problem& p, int b, int t) {
  return p.starts.empty() ? 0 : p.starts[size_t(b * p.T + t)];
}
bool visible(const Problem& p, int b, int r, int c) { return c <= r && c >= start_of(p, b, r); }
float elem(const std::vector<float>& x, const Problem& p, int heads, int b, int t, int h, int d) {
  return x[((size_t(b) * p.T + t) * heads + h) * p.hs + d];
}

struct Grads {
  std::vector<double> out, dq, dk, dv;
};

// float64 attention and its gradients, directly from the definitions.
Grads reference(const Problem& p) {
  Grads g;
  const size_t nq = size_t(p.B) * p.T * p.H * p.hs, nk = size_t(p.B) * p.T * p.KV * p.hs;
  g.out.assign(nq, 0);
  g.dq.assign(nq, 0);
  g.dk.assign(nk, 0);
  g.dv.assign(nk, 0);
  const double scale = 1.0 / std::sqrt(double(p.hs));
  for (int b = 0; b < p.B; ++b)
    for (int h = 0; h < p.H; ++h) {
      const int kvh = h / (p.H / p.KV);
      for (int r = 0; r < p.T; ++r) {
        std::vector<double> s(size_t(p.T), -INFINITY), pr(size_t(p.T), 0), dp(size_t(p.T), 0);
        double mx = -INFINITY;
        for (int c = 0; c < p.T; ++c) {
          if (!visible(p, b, r, c)) continue;
          double dot = 0;
          for (int d = 0; d < p.hs; ++d)
            dot += double(elem(p.q, p, p.H, b, r, h, d)) * elem(p.k, p, p.KV, b, c, kvh, d);
          s[size_t(c)] = dot * scale;
          mx = std::max(mx, s[size_t(c)]);
        }
        double sum = 0;
        for (int c = 0; c < p.T; ++c) sum += pr[size_t(c)] = std::exp(s[size_t(c)] - mx);
        double Dr = 0;
        for (int c = 0; c < p.T; ++c) {
          pr[size_t(c)] /= sum;
          for (int d = 0; d < p.hs; ++d) {
            const double o = pr[size_t(c)] * elem(p.v, p, p.KV, b, c, kvh, d);
            g.out[((size_t(b) * p.T + r) * p.H + h) * p.hs + d] += o;
          }
        }
        for (int d = 0; d < p.hs; ++d)
          Dr += g.out[((size_t(b) * p.T + r) * p.H + h) * p.hs + d] * elem(p.dout, p, p.H, b, r, h, d);
        for (int c = 0; c < p.T; ++c) {
          if (pr[size_t(c)] == 0) continue;
          double dpc = 0;
          for (int d = 0; d < p.hs; ++d)
            dpc += double(elem(p.dout, p, p.H, b, r, h, d)) * elem(p.v, p, p.KV, b, c, kvh, d);
          const double ds = pr[size_t(c)] * (dpc - Dr) * scale;
          for (int d = 0; d < p.hs; ++d) {
            g.dq[((size_t(b) * p.T + r) * p.H + h) * p.hs + d] += ds * elem(p.k, p, p.KV, b, c, kvh, d);
            g.dk[((size_t(b) * p.T + c) * p.KV + kvh) * p.hs + d] += ds * elem(p.q, p, p.H, b, r, h, d);
            g.dv[((size_t(b) * p.T + c) * p.KV + kvh) * p.hs + d] +=
                pr[size_t(c)] * elem(p.dout, p, p.H, b, r, h, d);
          }
        }
      }
    }
  return g;
}

// The kernels' algorithm in fp32 at tile level, walking tiles with the flash:: plan:
// forward with the online softmax (base 2) over the visited key tiles, P rounded to
// bf16 for P V; backward as the dK/dV kernel (query tiles from the diagonal, the
// group's heads in order) and the dQ kernel (key tiles up to the diagonal), P and
// dS rounded to bf16 before their products, lse and D as the kernels take them.
Grads tiled(const Problem& p) {
  Grads g = reference(p);  // sizes only
  std::fill(g.out.begin(), g.out.end(), 0);
  std::fill(g.dq.begin(), g.dq.end(), 0);
  std::fill(g.dk.begin(), g.dk.end(), 0);
  std::fill(g.dv.begin(), g.dv.end(), 0);
  const float scale = 1.0f / std::sqrt(float(p.hs)), scale_log2 = scale * 1.4426950408889634f;
  std::vector<float> lse(size_t(p.B) * p.H * p.T), D(lse.size());
  auto dot = [&](const std::vector<float>& x, int xh, int xr, const std::vector<float>& y, int yh,
                 int yr, int hx, int hy, int b) {
    float acc = 0;
    for (int d = 0; d < p.hs; ++d) acc += elem(x, p, xh, b, xr, hx, d) * elem(y, p, yh, b, yr, hy, d);
    return acc;
  };
  for (int b = 0; b < p.B; ++b)
    for (int h = 0; h < p.H; ++h) {
      const int kvh = h / (p.H / p.KV);
      for (int qt = 0; qt < tiles(p.T); ++qt) {
        const int q0 = qt * kTile;
        for (int r = q0; r < std::min(q0 + kTile, p.T); ++r) {
          float m = -INFINITY, l = 0;
          std::vector<float> o(size_t(p.hs), 0);
          for (int kt = first_key_tile(start_of(p, b, q0)); kt <= last_key_tile(q0, p.T); ++kt) {
            std::vector<float> s(kTile);
            float mx = -INFINITY;
            for (int j = 0; j < kTile; ++j) {
              const int c = kt * kTile + j;
              s[size_t(j)] = c < p.T && visible(p, b, r, c)
                                 ? dot(p.q, p.H, r, p.k, p.KV, c, h, kvh, b) * scale_log2
                                 : -INFINITY;
              mx = std::max(mx, s[size_t(j)]);
            }
            const float m_new = std::max(m, mx), m_use = m_new == -INFINITY ? 0.0f : m_new;
            const float corr = std::exp2(m - m_use);
            l *= corr;
            for (float& x : o) x *= corr;
            for (int j = 0; j < kTile; ++j) {
              const float e = std::exp2(s[size_t(j)] - m_use);
              l += e;
              const int c = kt * kTile + j;
              if (c >= p.T) continue;
              for (int d = 0; d < p.hs; ++d) o[size_t(d)] += bf16(e) * elem(p.v, p, p.KV, b, c, kvh, d);
            }
            m = m_new;
          }
          const size_t row = (size_t(b) * p.H + h) * p.T + r;
          lse[row] = (m + std::log2(l)) * 0.6931471805599453f;
          float Dr = 0;
          for (int d = 0; d < p.hs; ++d) {
            const float out = bf16(o[size_t(d)] / l);  // out is stored in bf16
            g.out[((size_t(b) * p.T + r) * p.H + h) * p.hs + d] = out;
            Dr += elem(p.dout, p, p.H, b, r, h, d) * out;
          }
          D[row] = Dr;
        }
      }
    }
  // P and dS of one (query, key) pair as the backward kernels recompute them.
  auto p_ds = [&](int b, int h, int r, int c, float* pr, float* ds) {
    const int kvh = h / (p.H / p.KV);
    const size_t row = (size_t(b) * p.H + h) * p.T + r;
    *pr = 0;
    *ds = 0;
    if (r >= p.T || c >= p.T || !visible(p, b, r, c)) return;
    *pr = std::exp2(dot(p.q, p.H, r, p.k, p.KV, c, h, kvh, b) * scale_log2 -
                    lse[row] * 1.4426950408889634f);
    *ds = *pr * (dot(p.dout, p.H, r, p.v, p.KV, c, h, kvh, b) - D[row]);
  };
  for (int b = 0; b < p.B; ++b)
    for (int kvh = 0; kvh < p.KV; ++kvh)
      for (int kt = 0; kt < tiles(p.T); ++kt)
        for (int c = kt * kTile; c < std::min((kt + 1) * kTile, p.T); ++c)
          for (int h = kvh * (p.H / p.KV); h < (kvh + 1) * (p.H / p.KV); ++h)
            for (int qt = first_query_tile(kt * kTile); qt < tiles(p.T); ++qt)
              for (int r = qt * kTile; r < std::min((qt + 1) * kTile, p.T); ++r) {
                float pr, ds;
                p_ds(b, h, r, c, &pr, &ds);
                for (int d = 0; d < p.hs; ++d) {
                  const size_t at = ((size_t(b) * p.T + c) * p.KV + kvh) * p.hs + d;
                  g.dv[at] += bf16(pr) * elem(p.dout, p, p.H, b, r, h, d);
                  g.dk[at] += double(bf16(ds) * elem(p.q, p, p.H, b, r, h, d)) * scale;
                }
              }
  for (int b = 0; b < p.B; ++b)
    for (int h = 0; h < p.H; ++h)
      for (int qt = 0; qt < tiles(p.T); ++qt) {
        const int q0 = qt * kTile;
        for (int r = q0; r < std::min(q0 + kTile, p.T); ++r)
          for (int kt = first_key_tile(start_of(p, b, q0)); kt <= last_key_tile(q0, p.T); ++kt)
            for (int c = kt * kTile; c < std::min((kt + 1) * kTile, p.T); ++c) {
              float pr, ds;
              p_ds(b, h, r, c, &pr, &ds);
              for (int d = 0; d < p.hs; ++d)
                g.dq[((size_t(b) * p.T + r) * p.H + h) * p.hs + d] +=
                    double(bf16(ds) * elem(p.k, p, p.KV, b, c, h / (p.H / p.KV), d)) * scale;
            }
      }
  return g;
}

// max |got - want| / max |want|: the GPU parity test's relative measure.
double rel_error(const std::vector<double>& got, const std::vector<double>& want) {
  double err = 0, mag = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::fabs(got[i] - want[i]));
    mag = std::max(mag, std::fabs(want[i]));
  }
  return err / mag;
}

TEST(FlashLayout, TiledAlgorithmMatchesFloat64AttentionWithinTheBf16Bound) {
  for (bool packed : {false, true}) {
    const Problem p = make_problem(packed);
    const Grads want = reference(p), got = tiled(p);
    EXPECT_LT(rel_error(got.out, want.out), 1e-2) << "out, packed " << packed;
    EXPECT_LT(rel_error(got.dq, want.dq), 1e-2) << "dq, packed " << packed;
    EXPECT_LT(rel_error(got.dk, want.dk), 1e-2) << "dk, packed " << packed;
    EXPECT_LT(rel_error(got.dv, want.dv), 1e-2) << "dv, packed " << packed;
    // And it is not trivially close: without P's rounding the error would be far smaller,
    // with a broken walk (one key tile too few) far larger.
    EXPECT_GT(rel_error(got.out, want.out), 1e-5);
  }
}

}  // namespace
}  // namespace fd::kernels::flash
