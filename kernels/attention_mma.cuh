// attention_mma.cuh: the kernels of causal attention on tensor cores, FlashAttention-2 style, for
// bf16 and fp16 q, k, v (fp32 accumulation): mma.sync.m16n8k16 (sm_80 and
// later), operands staged in shared memory by cp.async and read by ldmatrix.
// The index math (tile walk, swizzle, lane addresses, fragments) is in
// kernels/flash_layout.h and checked on the CPU by tests/ops/flash_layout_test.cc.
//
// Blocks are 4 warps; a block owns 64 rows of one side (queries in forward and
// dQ, keys in dK/dV), 16 per warp, and streams 64-row tiles of the other side.
// A warp's 16 x 64 score tile is 8 accumulator tiles of m16n8; the softmax is
// taken on the accumulators in registers (a row's 64 values are spread over
// the quad of 4 lanes that share it: two shuffles reduce it), and the
// probabilities, rounded to 16 bits, are already the A operand of the next
// product (flash::a_from_c_tile): no trip through shared memory.
//
// forward     grid (B * n_head, query tiles), the last (longest) query tiles
//             first. Q is loaded once; K and V tiles are double-buffered
//             (the next tile's cp.async runs while this one is computed). Key
//             tiles above the diagonal are skipped; the diagonal tile (and,
//             with packed rows, any tile) is masked per element. Online
//             softmax in base 2 with a running max and per-lane partial sums
//             (the quad's sums are added once, at the end). Writes out and the
//             natural-log logsumexp lse[(b * n_head + h) * T + t].
// backward    FlashAttention-2's, deterministic, no atomics: D = rowsum(dO * O)
//             (attention.cu), then one kernel, grid (B * n_kv_head, key
//             tiles), 8 warps: each block holds one 64-key tile's dK and dV
//             (fp32, split over the warps) and walks the group's query heads
//             in order and, for each, the query tiles at or below the
//             diagonal, the next tile's Q and dO loading while this one is
//             computed: S^T = K Q^T, dP^T = V dO^T, P^T = exp2(S^T - lse),
//             dS^T = P^T (dP^T - D) (rounded to 16 bits into shared memory),
//             dV += P^T dO, dK += dS^T Q, and dQ's part dS K, added into an
//             fp32 accumulator in key tile order (each block waits for the
//             block of the previous key tile, which CUDA started first); a
//             last pass adds the accumulator into dq. Every sum (over
//             queries, the group's heads, key tiles) runs in one fixed order.
//             Results are added to dq's, dk's and dv's priors (GradOut: none,
//             the gradient in place, or another) in grad_dt, scaled by
//             1/sqrt(hs) where the chain rule puts it.
//
// Head sizes: the tile is 64, 96 or 128 columns (flash::head_tile); columns past
// hs are loaded as zeros (cp.async's zero fill) and never stored. Rows past T
// are zeros, masked out of every softmax, never stored.
//
// Work per (query, key) pair visited, in products of hs multiply-adds: forward
// 2 (S, O), backward 5 (S^T, dP^T, dV, dK, dQ), as FlashAttention-2's.
//
// The launchers are in attention_mma.cu. This header is also compiled for the
// CPU by tests/ops/flash_emu_test.cc, over tests/ops/simt_emu.h's emulation of
// the primitives (kernels/mma_ops.cuh).
#pragma once

#include <cstdint>

#include "kernels/attention.cuh"
#include "kernels/flash_layout.h"
#include "kernels/kernels.h"
#if !defined(FD_SIMT_EMU)
#include "kernels/mma_ops.cuh"
#endif

namespace fd::kernels::mma {

using flash::kThreads;
using flash::kTile;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// ------------------------------------------------------- tiles and products --

// A 64-row swizzled tile of kHs 16-bit columns in shared memory.
template <int kHs>
struct Tile {
  uint16_t* base;
  __device__ uint32_t addr(int row, int col) const {
    return smem_addr(base + flash::tile_offset(kHs, row, col));
  }
};

// Starts the asynchronous load of rows [row0, row0 + 64) of one head of a
// row-major operand (element (r, d) at src[offset + r * ld + d]) into `tile`;
// rows at or past T and columns at or past hs are zero-filled. All threads
// of the block (kBlockThreads) call it; the caller commits and waits.
template <int kHs, int kBlockThreads = kThreads>
__device__ __forceinline__ void load_tile_async(const void* src, int64_t offset, int64_t ld,
                                                int row0, int T, int hs, Tile<kHs> tile) {
  constexpr int kChunks = kHs / 8;  // 16-byte chunks per row
  static_assert(kTile * kChunks % kBlockThreads == 0, "chunks split evenly over the threads");
  const uint16_t* base = static_cast<const uint16_t*>(src);
#pragma unroll
  for (int it = 0; it < kTile * kChunks / kBlockThreads; ++it) {
    const int e = threadIdx.x + it * kBlockThreads;
    const int r = e / kChunks, c = e % kChunks;
    const bool valid = row0 + r < T && c * 8 < hs;
    const uint16_t* from = valid ? base + offset + int64_t(row0 + r) * ld + c * 8 : base;
    cp_async16(tile.addr(r, c * 8), from, valid);
  }
}

// acc (16 x 8 kN: kN accumulator tiles) = rows [x0, x0 + 16) of X times rows
// [y0, y0 + 8 kN) of Y, transposed: acc[j][i] = X[x0 + row] . Y[y0 + 8 j + col]
// over kHs columns, (row, col) = flash::frag_c(lane, i).
template <DT kDt, int kHs, int kN>
__device__ __forceinline__ void product_xyt(Tile<kHs> X, int x0, Tile<kHs> Y, int y0, int lane,
                                            float (&acc)[kN][4]) {
  static_assert(kN % 2 == 0, "n tiles come in pairs (one ldmatrix.x4)");
#pragma unroll
  for (int j = 0; j < kN; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < kHs / 16; ++kk) {
    uint32_t a[4];
    const flash::RowCol pa = flash::ldm_a(lane, x0, 16 * kk);
    ldmatrix_x4(a, X.addr(pa.row, pa.col));
#pragma unroll
    for (int np = 0; np < kN / 2; ++np) {
      uint32_t b[4];
      const flash::RowCol pb = flash::ldm_b(lane, y0 + 16 * np, 16 * kk);
      ldmatrix_x4(b, Y.addr(pb.row, pb.col));
      mma16816<kDt>(acc[2 * np], a, b[0], b[1]);
      mma16816<kDt>(acc[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// The 16 x 64 accumulators p (fp32) as four A operands of 16 x 16, rounded to kDt.
template <DT kDt>
__device__ __forceinline__ void to_a_operands(const float (&p)[8][4], uint32_t (&a)[4][4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float(&c)[4] = p[flash::a_from_c_tile(j, i)];
      a[j][i] = pack2<kDt>(c[flash::a_from_c_value(i, 0)], c[flash::a_from_c_value(i, 1)]);
    }
}

// acc (16 x 8 kN: kN accumulator tiles) += P (16 x 64, as A operands) times
// rows [0, 64), columns [c0, c0 + 8 kN) of Y.
template <DT kDt, int kHs, int kN>
__device__ __forceinline__ void product_py(const uint32_t (&p)[4][4], Tile<kHs> Y, int c0, int lane,
                                           float (&acc)[kN][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
    for (int np = 0; np < kN / 2; ++np) {
      uint32_t b[4];
      const flash::RowCol pb = flash::ldm_bt(lane, 16 * kk, c0 + 16 * np);
      ldmatrix_x4_trans(b, Y.addr(pb.row, pb.col));
      mma16816<kDt>(acc[2 * np], p[kk], b[0], b[1]);
      mma16816<kDt>(acc[2 * np + 1], p[kk], b[2], b[3]);
    }
  }
}

// The same with P read from a 64 x 64 tile in shared memory, 16 x 16 at a time:
// rows [x0, x0 + 16) of the tile, or with kTransposed the transpose of its
// columns [x0, x0 + 16) (P[r][c] = tile[c][x0 + r]).
template <DT kDt, int kHs, int kN, bool kTransposed>
__device__ __forceinline__ void product_tile_y(Tile<kTile> A, int x0, Tile<kHs> Y, int c0, int lane,
                                               float (&acc)[kN][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    uint32_t a[4];
    if constexpr (kTransposed) {
      const flash::RowCol pa = flash::ldm_a_trans(lane, x0, 16 * kk);
      ldmatrix_x4_trans(a, A.addr(pa.row, pa.col));
    } else {
      const flash::RowCol pa = flash::ldm_a(lane, x0, 16 * kk);
      ldmatrix_x4(a, A.addr(pa.row, pa.col));
    }
#pragma unroll
    for (int np = 0; np < kN / 2; ++np) {
      uint32_t b[4];
      const flash::RowCol pb = flash::ldm_bt(lane, 16 * kk, c0 + 16 * np);
      ldmatrix_x4_trans(b, Y.addr(pb.row, pb.col));
      mma16816<kDt>(acc[2 * np], a, b[0], b[1]);
      mma16816<kDt>(acc[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// Max and sum over the quad of four lanes that share a row.
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, shfl_xor(v, 1));
  return fmaxf(v, shfl_xor(v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += shfl_xor(v, 1);
  return v + shfl_xor(v, 2);
}

// The first key row r of batch row b sees (0 without packed rows); r < T.
__device__ __forceinline__ int row_start(const Geometry& g, int b, int r) {
  return g.starts == nullptr ? 0 : g.starts[int64_t(b) * g.T + r];
}

// Element `at` of a gradient's prior (GradOut): 0 where it has none.
__device__ __forceinline__ float prior_at(GradOut dst, DT grad_dt, int64_t at) {
  return dst.prior != nullptr ? load_as_float(dst.prior, grad_dt, at) : 0.0f;
}

// dst (grad_dt) = its prior + factor * acc for a warp's 16 x 8 kN accumulators
// at rows [r0, r0 + 16), columns [c0, c0 + 8 kN) of a row-major operand
// (element (r, d) at offset + r * ld + d); rows at or past T and columns at or
// past hs are not written.
template <int kN>
__device__ __forceinline__ void add_rows(GradOut dst, DT grad_dt, int64_t offset, int64_t ld,
                                         int r0, int c0, const Geometry& g, int lane, float factor,
                                         const float (&acc)[kN][4]) {
#pragma unroll
  for (int j = 0; j < kN; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const flash::RowCol rc = flash::frag_c(lane, i);
      const int r = r0 + rc.row, d = c0 + 8 * j + rc.col;
      if (r >= g.T || d >= g.hs) continue;
      const int64_t at = offset + int64_t(r) * ld + d;
      store_from_float(dst.out, grad_dt, at, prior_at(dst, grad_dt, at) + factor * acc[j][i]);
    }
}

// ------------------------------------------------------------------ forward --

template <DT kDt, int kHs>
__global__ void __launch_bounds__(kThreads)
    flash_forward_kernel(const void* q, const void* k, const void* v, void* out, float* lse,
                         Geometry g) {
  uint16_t* smem = dynamic_smem<uint16_t>();
  constexpr int kElems = kTile * kHs;
  // Q, then K and V double-buffered: buffer i of K at 1 + i, of V at 3 + i tiles.
  const Tile<kHs> Qs{smem};
  const auto Ks = [&](int i) { return Tile<kHs>{smem + (1 + i) * kElems}; };
  const auto Vs = [&](int i) { return Tile<kHs>{smem + (3 + i) * kElems}; };

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int bh = blockIdx.x, b = bh / g.n_head, h = bh % g.n_head, kvh = h / g.group;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kTile;
  const int T = g.T;
  const int64_t q_off = g.head(b, h, g.ldq);
  const int64_t k_off = g.head(b, kvh, g.ldk), v_off = g.head(b, kvh, g.ldv);

  const int kt_first = flash::first_key_tile(g.first_key(b, q0));
  const int kt_last = flash::last_key_tile(q0, T);

  load_tile_async<kHs>(q, q_off, g.ldq, q0, T, g.hs, Qs);
  load_tile_async<kHs>(k, k_off, g.ldk, kt_first * kTile, T, g.hs, Ks(0));
  load_tile_async<kHs>(v, v_off, g.ldv, kt_first * kTile, T, g.hs, Vs(0));
  cp_async_commit();

  // This lane's two rows (g and g + 8 of the warp's 16) and where they start.
  const int r0 = q0 + flash::kRowsPerWarp * warp;
  int rows[2], starts[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    rows[half] = r0 + flash::frag_c(lane, 2 * half).row;
    starts[half] = rows[half] < T ? row_start(g, b, rows[half]) : 0;
  }

  float o[kHs / 8][4];
#pragma unroll
  for (int j = 0; j < kHs / 8; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) o[j][i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.0f, 0.0f};  // this lane's part of each row's sum

  for (int kt = kt_first; kt <= kt_last; ++kt) {
    const int buf = (kt - kt_first) % 2;
    if (kt < kt_last) {  // the next tile travels while this one is computed
      load_tile_async<kHs>(k, k_off, g.ldk, (kt + 1) * kTile, T, g.hs, Ks(buf ^ 1));
      load_tile_async<kHs>(v, v_off, g.ldv, (kt + 1) * kTile, T, g.hs, Vs(buf ^ 1));
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    sync_threads();  // this tile (and Q) visible to every warp

    float s[8][4];
    product_xyt<kDt, kHs, 8>(Qs, flash::kRowsPerWarp * warp, Ks(buf), 0, lane, s);

    const int k0 = kt * kTile;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int half = i / 2;
        const int c = k0 + 8 * j + flash::frag_c(lane, i).col;
        const int r = rows[half];
        const bool seen = r < T && c <= r && c >= starts[half];
        s[j][i] = seen ? s[j][i] * g.scale_log2 : -INFINITY;
        mx[half] = fmaxf(mx[half], s[j][i]);
      }
    float corr[2], m_use[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float m_new = fmaxf(m[half], quad_max(mx[half]));
      // A row that sees no key of this tile (packed rows, or a row past T) keeps
      // m = -inf: subtract 0 instead, so no inf - inf.
      m_use[half] = m_new == -INFINITY ? 0.0f : m_new;
      corr[half] = exp2f(m[half] - m_use[half]);
      m[half] = m_new;
      l[half] *= corr[half];
    }
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        s[j][i] = exp2f(s[j][i] - m_use[i / 2]);
        l[i / 2] += s[j][i];
      }
#pragma unroll
    for (int j = 0; j < kHs / 8; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) o[j][i] *= corr[i / 2];

    uint32_t p[4][4];
    to_a_operands<kDt>(s, p);
    product_py<kDt, kHs, kHs / 8>(p, Vs(buf), 0, lane, o);
    sync_threads();  // every warp done with this buffer before it is refilled
  }

  float inv[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float total = quad_sum(l[half]);
    inv[half] = total > 0.0f ? 1.0f / total : 0.0f;
    if (lane % 4 == 0 && rows[half] < T) {
      lse[int64_t(bh) * T + rows[half]] = (m[half] + log2f(total)) * kLn2;
    }
  }
  const int64_t o_off = int64_t(b) * T * g.C + int64_t(h) * g.hs;
#pragma unroll
  for (int j = 0; j < kHs / 8; ++j)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const flash::RowCol rc = flash::frag_c(lane, 2 * half);
      const int r = r0 + rc.row, d = 8 * j + rc.col;  // d even: (d, d + 1) is one 32-bit word
      if (r >= T || d >= g.hs) continue;
      *reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(out) + o_off + int64_t(r) * g.C + d) =
          pack2<kDt>(o[j][2 * half] * inv[half], o[j][2 * half + 1] * inv[half]);
    }
}

// ----------------------------------------------------------------- backward --

// Scores to probabilities and their gradients on a warp's 16 x 8 kN tile:
// s = exp2(s * scale_log2 - lse2) where the key is visible to the query,
// else 0; dp = s * (dp - D). `query` and `key` give an accumulator's query and
// key row; lse2 and D are per query (base-2 lse), visible() as Geometry's.
template <int kN, typename QueryOf, typename KeyOf, typename Lse2Of, typename DOf, typename StartOf>
__device__ __forceinline__ void probabilities(float (&s)[kN][4], float (&dp)[kN][4],
                                              const Geometry& g, int lane, QueryOf query, KeyOf key,
                                              Lse2Of lse2, DOf d_of, StartOf start) {
#pragma unroll
  for (int j = 0; j < kN; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const flash::RowCol rc = flash::frag_c(lane, i);
      const int r = query(j, rc), c = key(j, rc);
      const bool seen = r < g.T && c <= r && c >= start(j, rc);
      const float p = seen ? exp2f(s[j][i] * g.scale_log2 - lse2(j, rc)) : 0.0f;
      s[j][i] = p;
      dp[j][i] = p * (dp[j][i] - d_of(j, rc));
    }
}

// A warp's 16 x 8 kN accumulators, rounded to kDt, into rows [r0, r0 + 16),
// columns [c0, c0 + 8 kN) of a 64 x 64 tile (two neighbouring values per store).
template <DT kDt, int kN>
__device__ __forceinline__ void store_tile(Tile<kTile> A, int r0, int c0, int lane,
                                           const float (&acc)[kN][4]) {
#pragma unroll
  for (int j = 0; j < kN; ++j)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const flash::RowCol rc = flash::frag_c(lane, 2 * half);  // rc.col even
      *reinterpret_cast<uint32_t*>(A.base +
                                   flash::tile_offset(kTile, r0 + rc.row, c0 + 8 * j + rc.col)) =
          pack2<kDt>(acc[j][2 * half], acc[j][2 * half + 1]);
    }
}

// grid flash::backward_grid (B * n_kv_head * splits, key tiles; key tile 0,
// which has the most query tiles, first), flash::kBwdThreads threads. One block
// holds one 64-key tile of one KV head, its dK and dV, and walks (head, query
// tile) pairs: its part of the group's heads (all of them when splits is 1) in
// order and, for each, the query tiles from its own on that see any of its
// keys. With splits > 1 its dK and dV go to dkv_parts for
// flash_dkv_finish_kernel to add up. Per pair, five products:
//   S^T = K Q^T and dP^T = V dO^T   warp w: keys 16 (w % 4) .., queries 32 (w / 4) ..
//   P^T, dS^T                      rounded to 16 bits into shared memory
//   dV += P^T dO, dK += dS^T Q     warp w: keys 16 (w % 4) .., head columns kHs / 2 (w / 4) ..
//   dQ part = dS K                 warp w: queries 16 (w % 4) .., the same columns
// The dQ parts of a query tile are added into dq_accum (fp32, rows padded to
// whole tiles, kHs columns) in key tile order: the first key tile the query
// tile sees stores its part, each later one waits until dq_count (one per
// head and query tile, zero at launch) says its predecessor has added, adds,
// and counts on. So dQ's sums run in one fixed order, with no atomics.
// The next pair's Q and dO tiles load while this pair is computed.
template <DT kDt, int kHs>
__global__ void __launch_bounds__(flash::kBwdThreads)
    flash_backward_kernel(const void* q, const void* k, const void* v, const void* dout,
                          const float* lse, const float* D, GradOut dk_out, GradOut dv_out,
                          DT grad_dt, float* dq_accum, int* dq_count, int splits, float* dkv_parts,
                          Geometry g) {
  uint16_t* smem = dynamic_smem<uint16_t>();
  constexpr int kElems = kTile * kHs;
  constexpr int kCols = kHs / 2;  // head columns per warp in dK, dV and dQ
  constexpr int kN = kCols / 8;   // their accumulator tiles
  const Tile<kHs> Ks{smem}, Vs{smem + kElems};
  const auto Qs = [&](int i) { return Tile<kHs>{smem + (2 + i) * kElems}; };
  const auto dOs = [&](int i) { return Tile<kHs>{smem + (4 + i) * kElems}; };
  const Tile<kTile> Pt{smem + 6 * kElems}, dSt{smem + 6 * kElems + kTile * kTile};
  // Two buffers of the query tile's base-2 lse, D and document starts.
  float* values = reinterpret_cast<float*>(smem + 6 * kElems + 2 * kTile * kTile);
  const auto lse2s = [&](int i) { return values + 3 * kTile * i; };
  const auto Ds = [&](int i) { return values + 3 * kTile * i + kTile; };
  const auto starts = [&](int i) {
    return reinterpret_cast<int*>(values + 3 * kTile * i + 2 * kTile);
  };

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int x0 = flash::kRowsPerWarp * (warp % 4);  // keys k0 + x0 .. (and dQ's queries q0 + x0 ..)
  const int half = warp / 4;                        // which half of the queries, of the columns
  const int bkv = blockIdx.x / splits, split = blockIdx.x % splits;
  const int b = bkv / g.n_kv_head, kvh = bkv % g.n_kv_head;
  const int kt = blockIdx.y, k0 = kt * kTile;
  const int T = g.T, tiles = flash::tiles(T);
  const int64_t k_off = g.head(b, kvh, g.ldk), v_off = g.head(b, kvh, g.ldv);
  // Pair n: head kvh * group + split * heads + n / per_head, query tile kt + n % per_head.
  const int heads = g.group / splits, per_head = tiles - kt, pairs = heads * per_head;
  const auto head_of = [&](int n) { return kvh * g.group + split * heads + n / per_head; };
  const auto tile_of = [&](int n) { return kt + n % per_head; };
  // The first key tile query tile qt sees (packed rows: its first query's document start).
  const auto first_tile = [&](int qt) { return flash::first_key_tile(g.first_key(b, qt * kTile)); };
  const auto next_pair = [&](int n) {  // the first pair from n on that sees this block's keys
    while (n < pairs && first_tile(tile_of(n)) > kt) ++n;
    return n;
  };
  const auto load_pair = [&](int n, int buf) {
    const int h = head_of(n), q0 = tile_of(n) * kTile;
    load_tile_async<kHs, flash::kBwdThreads>(q, g.head(b, h, g.ldq), g.ldq, q0, T, g.hs, Qs(buf));
    load_tile_async<kHs, flash::kBwdThreads>(dout, g.head(b, h, g.C), g.C, q0, T, g.hs, dOs(buf));
  };

  load_tile_async<kHs, flash::kBwdThreads>(k, k_off, g.ldk, k0, T, g.hs, Ks);
  load_tile_async<kHs, flash::kBwdThreads>(v, v_off, g.ldv, k0, T, g.hs, Vs);
  int n = next_pair(0);
  if (n < pairs) load_pair(n, 0);
  cp_async_commit();

  float dk[kN][4], dv[kN][4];
#pragma unroll
  for (int j = 0; j < kN; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) dk[j][i] = dv[j][i] = 0.0f;

  for (int buf = 0; n < pairs; buf ^= 1) {
    const int h = head_of(n), qt = tile_of(n), q0 = qt * kTile;
    const int64_t bh = int64_t(b) * g.n_head + h;
    const int next = next_pair(n + 1);
    if (next < pairs) {  // the next pair's tiles travel while this one is computed
      load_pair(next, buf ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    for (int r = threadIdx.x; r < kTile; r += flash::kBwdThreads) {
      const bool in = q0 + r < T;
      lse2s(buf)[r] = in ? lse[bh * T + q0 + r] * kLog2e : 0.0f;
      Ds(buf)[r] = in ? D[bh * T + q0 + r] : 0.0f;
      starts(buf)[r] = in ? row_start(g, b, q0 + r) : 0;
    }
    sync_threads();  // this pair's tiles and values visible to every warp

    // S^T and dP^T: this warp's 16 keys (rows) by 32 queries (columns).
    float s[4][4], dp[4][4];
    product_xyt<kDt, kHs, 4>(Ks, x0, Qs(buf), 32 * half, lane, s);
    product_xyt<kDt, kHs, 4>(Vs, x0, dOs(buf), 32 * half, lane, dp);
    const auto local = [&](int j, flash::RowCol rc) { return 32 * half + 8 * j + rc.col; };
    probabilities(
        s, dp, g, lane, [&](int j, flash::RowCol rc) { return q0 + local(j, rc); },
        [&](int, flash::RowCol rc) { return k0 + x0 + rc.row; },
        [&](int j, flash::RowCol rc) { return lse2s(buf)[local(j, rc)]; },
        [&](int j, flash::RowCol rc) { return Ds(buf)[local(j, rc)]; },
        [&](int j, flash::RowCol rc) { return starts(buf)[local(j, rc)]; });
    store_tile<kDt>(Pt, x0, 32 * half, lane, s);
    store_tile<kDt>(dSt, x0, 32 * half, lane, dp);
    sync_threads();  // P^T and dS^T whole

    product_tile_y<kDt, kHs, kN, false>(Pt, x0, dOs(buf), kCols * half, lane, dv);
    product_tile_y<kDt, kHs, kN, false>(dSt, x0, Qs(buf), kCols * half, lane, dk);
    if (dq_accum != nullptr) {
      float dq[kN][4];
#pragma unroll
      for (int j = 0; j < kN; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) dq[j][i] = 0.0f;
      product_tile_y<kDt, kHs, kN, true>(dSt, x0, Ks, kCols * half, lane, dq);
      int* count = dq_count + bh * tiles + qt;
      const bool first = first_tile(qt) == kt;
      if (!first) {
        if (threadIdx.x == 0) wait_count(count, kt);
        sync_threads();
      }
      float* rows = dq_accum + (bh * tiles * kTile + q0) * kHs;
#pragma unroll
      for (int j = 0; j < kN; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const flash::RowCol rc = flash::frag_c(lane, i);
          float* at = rows + (x0 + rc.row) * kHs + kCols * half + 8 * j + rc.col;
          store_l2(at, first ? dq[j][i] : load_l2(at) + dq[j][i]);
        }
      sync_threads();  // every part added; P^T, dS^T, Q and dO no longer read
      if (threadIdx.x == 0) release_count(count, kt + 1);
    } else {
      sync_threads();  // P^T, dS^T, Q and dO no longer read
    }
    n = next;
  }

  if (splits > 1) {  // this part's sums, for flash_dkv_finish_kernel
    const int64_t rows = int64_t(tiles) * kTile;
    float* dk_part = dkv_parts + (int64_t(blockIdx.x) * rows + k0) * kHs;
    float* dv_part = dk_part + int64_t(gridDim.x) * rows * kHs;
#pragma unroll
    for (int j = 0; j < kN; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const flash::RowCol rc = flash::frag_c(lane, i);
        const int64_t at = int64_t(x0 + rc.row) * kHs + kCols * half + 8 * j + rc.col;
        dk_part[at] = dk[j][i];
        dv_part[at] = dv[j][i];
      }
    return;
  }
  if (dk_out.out != nullptr) {
    add_rows<kN>(dk_out, grad_dt, k_off, g.ldk, k0 + x0, kCols * half, g, lane, g.scale, dk);
  }
  if (dv_out.out != nullptr) {
    add_rows<kN>(dv_out, grad_dt, v_off, g.ldv, k0 + x0, kCols * half, g, lane, 1.0f, dv);
  }
}

// Element e of a walk over (batch row b, head h of `heads`, t, d < hs), d fastest
// (the last passes' order: coalesced for the fp32 scratch and for the gradient).
struct HeadElement {
  int b, h, t, d;
  int64_t bh;  // b * heads + h
};
__device__ __forceinline__ HeadElement head_element(int64_t e, int heads, const Geometry& g) {
  const int64_t row = e / g.hs;  // bh * T + t
  const int64_t bh = row / g.T;
  return {int(bh / heads), int(bh % heads), int(row % g.T), int(e % g.hs), bh};
}

// With the group's heads split over `splits` blocks: dk = its prior + scale *
// (the sum of the parts' dK in part order), dv = its prior + the same of dV,
// over the B * n_kv_head * T * hs elements, grid-stride.
template <int kHs>
__global__ void __launch_bounds__(flash::kBwdThreads)
    flash_dkv_finish_kernel(const float* dkv_parts, GradOut dk, GradOut dv, DT grad_dt, int64_t B,
                            int splits, Geometry g) {
  const int64_t rows = int64_t(flash::tiles(g.T)) * kTile;
  const int64_t dv_offset = B * g.n_kv_head * splits * rows * kHs;
  const int64_t total = B * g.n_kv_head * g.T * g.hs;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const HeadElement x = head_element(e, g.n_kv_head, g);
    float sk = 0.0f, sv = 0.0f;
    for (int s = 0; s < splits; ++s) {
      const int64_t at = ((x.bh * splits + s) * rows + x.t) * kHs + x.d;
      sk += dkv_parts[at];
      sv += dkv_parts[dv_offset + at];
    }
    if (dk.out != nullptr) {
      const int64_t at = g.head(x.b, x.h, g.ldk) + int64_t(x.t) * g.ldk + x.d;
      store_from_float(dk.out, grad_dt, at, prior_at(dk, grad_dt, at) + g.scale * sk);
    }
    if (dv.out != nullptr) {
      const int64_t at = g.head(x.b, x.h, g.ldv) + int64_t(x.t) * g.ldv + x.d;
      store_from_float(dv.out, grad_dt, at, prior_at(dv, grad_dt, at) + sv);
    }
  }
}

// dq (grad_dt) = its prior + scale * dq_accum over the B * n_head * T * hs
// elements (flash_backward_kernel's layout), grid-stride.
template <int kHs>
__global__ void __launch_bounds__(flash::kBwdThreads)
    flash_dq_finish_kernel(const float* dq_accum, GradOut dq, DT grad_dt, int64_t B, Geometry g) {
  const int tiles = flash::tiles(g.T);
  const int64_t total = B * g.n_head * g.T * g.hs;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const HeadElement x = head_element(e, g.n_head, g);
    const float part = dq_accum[(x.bh * tiles * kTile + x.t) * kHs + x.d];
    const int64_t at = g.head(x.b, x.h, g.ldq) + int64_t(x.t) * g.ldq + x.d;
    store_from_float(dq.out, grad_dt, at, prior_at(dq, grad_dt, at) + g.scale * part);
  }
}

}  // namespace fd::kernels::mma
