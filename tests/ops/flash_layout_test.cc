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
#include "kernels/flash_layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

#include "lib/base/rng.h"
#include "lib/tensor/dtype.h"
#include "tests/ops/flash_reference.h"

namespace fd::kernels::flash {
namespace {

using namespace flash_ref;

TEST(FlashLayout, HeadTileAndWhichShapesFit) {
  EXPECT_EQ(head_tile(64), 64);    // GPT-2, TinyLlama
  EXPECT_EQ(head_tile(128), 128);  // Llama, Qwen
  EXPECT_EQ(head_tile(32), 64);
  EXPECT_EQ(head_tile(96), 96);  // Phi, some vision towers
  EXPECT_EQ(head_tile(80), 96);  // Qwen-VL, StableLM
  EXPECT_EQ(head_tile(104), 128);
  EXPECT_EQ(head_tile(8), 64);
  EXPECT_EQ(head_tile(0), 0);
  EXPECT_EQ(head_tile(12), 0);                             // not a multiple of 8: SIMT
  EXPECT_EQ(head_tile(136), 0);                            // above 128: SIMT
  EXPECT_TRUE(shapes_fit(64, 3 * 768, 3 * 768, 3 * 768));  // GPT-2's packed qkv
  EXPECT_FALSE(shapes_fit(64, 3 * 768 + 4, 3 * 768, 3 * 768));
  EXPECT_FALSE(shapes_fit(12, 36, 36, 36));
  // Shared memory: within the 163 KiB an sm_80 block may opt into (227 KiB on sm_90).
  EXPECT_EQ(forward_smem(64), 40u * 1024);
  EXPECT_EQ(forward_smem(128), 80u * 1024);
  EXPECT_LE(backward_smem(128), 163u * 1024);
}

TEST(FlashLayout, TheBackwardSplitsHeadsOnlyWhenTooFewBlocksWouldRun) {
  // GPT-2 124M, B 16, T 1024 on an H100 (132 SMs): 3,072 blocks, no split.
  EXPECT_EQ(head_splits(16, 12, 1, 1024, 132), 1);
  // Llama 3 8B, B 1, T 4096: 8 KV heads x 64 key tiles = 512 blocks, no split.
  EXPECT_EQ(head_splits(1, 8, 4, 4096, 132), 1);
  // MQA, B 1, T 1024, 32 query heads: 16 blocks; 32 parts of one head give 512 (17 does not
  // divide 32).
  EXPECT_EQ(head_splits(1, 1, 32, 1024, 132), 32);
  // Llama 3 8B, B 1, T 1024: 128 blocks; 2 parts give 256, 4 give 512 >= 264.
  EXPECT_EQ(head_splits(1, 8, 4, 1024, 132), 4);
  EXPECT_EQ(head_splits(1, 8, 4, 1024, 64), 1);  // 128 blocks fill 64 SMs twice
  // No group to split (MHA), or one head.
  EXPECT_EQ(head_splits(1, 12, 1, 64, 132), 1);
  for (int group : {1, 2, 3, 4, 6, 8, 32})
    for (int sms : {1, 16, 132})
      for (int T : {1, 100, 1024}) {
        const int s = head_splits(1, 2, group, T, sms);
        EXPECT_EQ(group % s, 0) << group << " " << sms << " " << T;
        EXPECT_GE(s, 1);
      }
  // The grids and scratch sizes follow.
  EXPECT_EQ(backward_grid(2, 1, 200, 4).x, 8u);
  EXPECT_EQ(backward_grid(2, 1, 200, 4).y, 4u);
  EXPECT_EQ(dkv_part_floats(2, 1, 200, 64, 1), 0u);
  EXPECT_EQ(dkv_part_floats(2, 1, 200, 64, 4), 2u * 2 * 4 * 256 * 64);
  EXPECT_EQ(dq_accum_floats(2, 4, 200, 128), 2u * 4 * 256 * 128);
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
  for (int kHs : {64, 96, 128}) {
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
        EXPECT_EQ(groups.size(), 8u)
            << what << " kHs " << kHs << " matrix " << m << " at " << r0 << ", " << c0;
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
      // A 96-column row ends with 4 chunks in groups 4 apart from the next row's first 4 only
      // every other pair of rows: those phases store with two-way conflicts (once per tile;
      // the ldmatrix reads above, many per tile, have none).
      EXPECT_GE(groups.size(), kHs == 96 ? 4u : 8u)
          << "cp.async, kHs " << kHs << " from chunk " << e0;
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
  for (int kHs : {64, 96, 128}) {
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
