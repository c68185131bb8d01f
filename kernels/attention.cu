// attention: fused causal multi-head attention, FlashAttention-2 style, in fp32
// FMA arithmetic (no tensor cores): the kernels for fp32 inputs and for shapes the
// tensor-core kernels (attention_mma.cu) do not take, and for every call while
// set_attention_kernels(kSimt) (comparisons). The public entry points below choose. q, k and v are
// read through a base pointer and a row stride each (GPT-2's packed qkv: thirds of one tensor,
// stride 3C), and query head h reads key/value head h / group (group = n_head / n_kv_head:
// grouped-query and multi-query attention).
//
// The T x T scores never exist: a block holds one tile of rows in shared
// memory and loops over the tiles of the other side that the causal mask
// leaves visible, skipping every tile above the diagonal.
//
// forward     one block per (64-query tile, batch*head); loops over the key
//             tiles up to the diagonal with an online softmax (running max and
//             sum per row, fp32, base-2 exponentials). Writes out and the
//             natural-log logsumexp of each scaled score row, lse[(b*nh + h)*T + t].
// backward    three kernels, all deterministic (no atomics, every output
//             element written by exactly one thread, fixed summation orders):
//             1. D[row] = rowsum(dO * O)                (one warp per row)
//             2. dK, dV: one block per (key tile, batch*kv head), looping over
//                the group's query heads in order and, for each, over the query
//                tiles at or below the diagonal, P recomputed from q, k and lse;
//                dV += P^T dO, dS = P * (dO V^T - D), dK += scale dS^T Q. The
//                sum over the group stays in registers: still no atomics.
//             3. dQ: one block per query tile, looping over the key tiles up to
//                the diagonal; dQ += scale dS K (P and dS recomputed again).
//             The results are added to dq's, dk's and dv's priors (GradOut), in their dtype.
//
// Tiles. 128 threads = 8 (ty) x 16 (tx). A block's own tile (the "X" side:
// queries in forward and dQ, keys in dK/dV) has 8*kXR rows, thread (ty, tx)
// owning rows ty*kXR .. ty*kXR+kXR-1; the streamed tile (the "Y" side) has 64
// rows, the thread owning rows tx, tx+16, tx+32, tx+48. So each thread computes
// a kXR x 4 block of scores, and the 16 threads sharing a row are one half-warp
// (the row max and sum are shuffle reductions). Outputs (rows x head dims) are
// owned as kXR rows x kHs/16 columns per thread, in float4 column groups.
// Row tiles live in shared memory as fp32 [row][d] with a row stride of
// kHs + 4 floats (float4 reads with no bank conflicts), the score tiles as
// [row][col] with stride 64 + 4. Head sizes up to 128 are padded to 32, 64 or
// 128 with zeros. Shared memory per block, forward / dK,dV / dQ: 44 / 71 / 54
// KiB at kHs = 32, 68 / 103 / 86 KiB at 64, 116 / 117 / 108 KiB at 128 (the
// backward tiles of the block's own side shrink to 32 rows there); all fit the
// 163 KiB an sm_80 block may opt into.
//
// Speed: the inner loops issue about one 16-byte shared load per 8-10 FMAs,
// so they are FMA-bound; expect a good fraction of the fp32 FMA peak, and
// roughly 3.5x the forward's time for the backward (seven T x T x hs products
// instead of two: the price of no atomics).
#include <cuda_runtime.h>

#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>
#include <exception>
#include <string>

#include "kernels/attention.cuh"
#include "kernels/common.cuh"
#include "kernels/flash_layout.h"
#include "kernels/kernels.h"

namespace fd::kernels {
namespace {

constexpr int kThreads = 128;  // 8 x 16
constexpr int kYR = 4;         // streamed-tile rows per thread: tx + 16 * j
constexpr int kYTile = 16 * kYR;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int kHs>
constexpr int row_stride() {
  return kHs + 4;
}
constexpr int kPStride = kYTile + 4;  // score tiles: [row][64 cols]

// ------------------------------------------------------- shared-memory tiles --

// dst[r][d] (row stride kHs + 4) = element (row0 + r, d) of a row-major
// matrix at src + offset with row stride ld, for r < kRows, d < kHs; zero for
// rows at or past T and for d >= hs.
template <DT kDt, int kHs, int kRows>
__device__ __forceinline__ void load_tile(const void* src, int64_t offset, int64_t ld, int row0,
                                          int T, int hs, float* dst) {
  constexpr int kLd = row_stride<kHs>();
  static_assert(kRows * kHs % kThreads == 0, "tiles split evenly over the threads");
  // A fixed trip count, unrolled, so that many loads are in flight at once.
#pragma unroll 8
  for (int it = 0; it < kRows * kHs / kThreads; ++it) {
    const int e = threadIdx.x + it * kThreads;
    const int r = e / kHs, d = e % kHs;
    float v = 0.0f;
    if (row0 + r < T && d < hs) v = load_as_float(src, kDt, offset + int64_t(row0 + r) * ld + d);
    dst[r * kLd + d] = v;
  }
}

// dst[r] = factor * src[row0 + r] for r < n, zero past T.
__device__ __forceinline__ void load_vec(const float* src, int row0, int T, int n, float factor,
                                         float* dst) {
  for (int r = threadIdx.x; r < n; r += kThreads)
    dst[r] = row0 + r < T ? factor * src[row0 + r] : 0.0f;
}

// ------------------------------------------------------------ micro-kernels --

__device__ __forceinline__ float component(const float4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// acc[i][j] += sum_d X[ty*kXR + i][d] * Y[tx + 16 j][d]: a kXR x 4 block of
// X Y^T, both tiles [row][d] with stride kHs + 4. The X reads are half-warp
// broadcasts, the Y reads cover all banks once per quarter-warp.
template <int kXR, int kHs>
__device__ __forceinline__ void dot_tile(const float* __restrict__ X, const float* __restrict__ Y,
                                         int tx, int ty, float (&acc)[kXR][kYR]) {
  constexpr int kLd = row_stride<kHs>();
#pragma unroll 2
  for (int d = 0; d < kHs; d += 4) {
    float4 y[kYR];
#pragma unroll
    for (int j = 0; j < kYR; ++j)
      y[j] = *reinterpret_cast<const float4*>(Y + (tx + 16 * j) * kLd + d);
#pragma unroll
    for (int i = 0; i < kXR; ++i) {
      const float4 x = *reinterpret_cast<const float4*>(X + (ty * kXR + i) * kLd + d);
#pragma unroll
      for (int j = 0; j < kYR; ++j) {
        acc[i][j] = fmaf(x.x, y[j].x, acc[i][j]);
        acc[i][j] = fmaf(x.y, y[j].y, acc[i][j]);
        acc[i][j] = fmaf(x.z, y[j].z, acc[i][j]);
        acc[i][j] = fmaf(x.w, y[j].w, acc[i][j]);
      }
    }
  }
}

// Output columns of thread tx (kHs / 16 of them): float4 groups 16 apart when
// there are at least 4, else a contiguous pair.
template <int kHs>
__device__ __forceinline__ int out_col(int tx, int u) {
  constexpr int kEC = kHs / 16;
  if constexpr (kEC >= 4) {
    return ((u / 4) * 16 + tx) * 4 + u % 4;
  } else {
    return tx * kEC + u;
  }
}

// y[u] = row[out_col(tx, u)].
template <int kHs>
__device__ __forceinline__ void load_cols(const float* row, int tx, float (&y)[kHs / 16]) {
  constexpr int kEC = kHs / 16;
  if constexpr (kEC >= 4) {
#pragma unroll
    for (int g = 0; g < kEC / 4; ++g) {
      const float4 v = *reinterpret_cast<const float4*>(row + (g * 16 + tx) * 4);
      y[g * 4 + 0] = v.x;
      y[g * 4 + 1] = v.y;
      y[g * 4 + 2] = v.z;
      y[g * 4 + 3] = v.w;
    }
  } else {
    static_assert(kEC == 2, "head size tiles are 32, 64 or 128");
    const float2 v = *reinterpret_cast<const float2*>(row + tx * 2);
    y[0] = v.x;
    y[1] = v.y;
  }
}

// acc[i][u] += sum_{j < 64} S[ty*kXR + i][j] * Y[j][out_col(tx, u)]: S a score
// tile [row][j] with stride 68, Y a row tile [j][d] with stride kHs + 4.
template <int kXR, int kHs>
__device__ __forceinline__ void mul_tile(const float* __restrict__ S, const float* __restrict__ Y,
                                         int tx, int ty, float (&acc)[kXR][kHs / 16]) {
  constexpr int kLd = row_stride<kHs>();
  constexpr int kEC = kHs / 16;
#pragma unroll 1
  for (int j = 0; j < kYTile; j += 4) {
    float4 s[kXR];
#pragma unroll
    for (int i = 0; i < kXR; ++i)
      s[i] = *reinterpret_cast<const float4*>(S + (ty * kXR + i) * kPStride + j);
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      float y[kEC];
      load_cols<kHs>(Y + (j + jj) * kLd, tx, y);
#pragma unroll
      for (int i = 0; i < kXR; ++i) {
        const float p = component(s[i], jj);
#pragma unroll
        for (int u = 0; u < kEC; ++u) acc[i][u] = fmaf(p, y[u], acc[i][u]);
      }
    }
  }
}

// Max and sum over the 16 threads of a half-warp (the threads sharing a row).
// Every thread of the warp must call them.
__device__ __forceinline__ float row_max(float v) {
#pragma unroll
  for (int offset = 8; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}
__device__ __forceinline__ float row_sum(float v) {
#pragma unroll
  for (int offset = 8; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// ------------------------------------------------------------------ forward --

constexpr int kFwdXR = 8;  // 64 queries per block

template <int kHs>
constexpr size_t forward_smem() {
  constexpr int kRows = 8 * kFwdXR;
  return sizeof(float) * (size_t(kRows) * row_stride<kHs>()         // Q
                          + 2 * size_t(kYTile) * row_stride<kHs>()  // K, V
                          + size_t(kRows) * kPStride);              // P
}

// grid (B * n_head, query tiles); the last query tiles (the most key tiles)
// are scheduled first.
template <DT kDt, int kHs>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(const void* q, const void* k, const void* v, void* out, float* lse,
                             Geometry g) {
  constexpr int kXR = kFwdXR;
  constexpr int kBr = 8 * kXR;
  constexpr int kLd = row_stride<kHs>();
  constexpr int kEC = kHs / 16;
  static_assert(kBr == kYTile, "the causal tile walk assumes square tiles");
  extern __shared__ float4 smem4[];
  float* Qs = reinterpret_cast<float*>(smem4);  // [kBr][kLd]
  float* Ks = Qs + kBr * kLd;                   // [64][kLd]
  float* Vs = Ks + kYTile * kLd;                // [64][kLd]
  float* Ps = Vs + kYTile * kLd;                // [kBr][kPStride]

  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int bh = blockIdx.x, b = bh / g.n_head, h = bh % g.n_head, kvh = h / g.group;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kBr;
  const int T = g.T;
  const int64_t q_off = g.head(b, h, g.ldq);
  const int64_t k_off = g.head(b, kvh, g.ldk), v_off = g.head(b, kvh, g.ldv);

  load_tile<kDt, kHs, kBr>(q, q_off, g.ldq, q0, T, g.hs, Qs);

  float o[kXR][kEC];
  float m[kXR], l[kXR];
#pragma unroll
  for (int i = 0; i < kXR; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int u = 0; u < kEC; ++u) o[i][u] = 0.0f;
  }

  // Key tiles 0 .. the one holding the tile's last query (square tiles: the
  // diagonal tile starts at q0, so every query row sees key k0 in every tile).
  // (Packed rows: from the tile holding the first query's document start; a row may then
  // see no key of a tile before its document's, which the -inf guard below handles.)
  const int last_q = min(q0 + kBr, T) - 1;
  for (int k0 = g.first_key(b, q0) / kYTile * kYTile; k0 <= last_q; k0 += kYTile) {
    __syncthreads();  // the previous tile's K, V and P are no longer read
    load_tile<kDt, kHs, kYTile>(k, k_off, g.ldk, k0, T, g.hs, Ks);
    load_tile<kDt, kHs, kYTile>(v, v_off, g.ldv, k0, T, g.hs, Vs);
    __syncthreads();

    float s[kXR][kYR];
#pragma unroll
    for (int i = 0; i < kXR; ++i)
#pragma unroll
      for (int j = 0; j < kYR; ++j) s[i][j] = 0.0f;
    dot_tile<kXR, kHs>(Qs, Ks, tx, ty, s);

#pragma unroll
    for (int i = 0; i < kXR; ++i) {
      const int r = q0 + ty * kXR + i;
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < kYR; ++j) {
        const int c = k0 + tx + 16 * j;
        s[i][j] = (c < T && r < T && g.visible(b, r, c)) ? s[i][j] * g.scale_log2 : -INFINITY;
        mx = fmaxf(mx, s[i][j]);
      }
      const float m_new = fmaxf(m[i], row_max(mx));
      // Without packing m_new is finite (key k0 is visible to every row); a packed
      // row sees none of a tile before its document starts: no inf - inf then.
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      const float corr = exp2f(m[i] - m_use);
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kYR; ++j) {
        s[i][j] = exp2f(s[i][j] - m_use);
        sum += s[i][j];
        Ps[(ty * kXR + i) * kPStride + tx + 16 * j] = s[i][j];
      }
      l[i] = l[i] * corr + row_sum(sum);
      m[i] = m_new;
#pragma unroll
      for (int u = 0; u < kEC; ++u) o[i][u] *= corr;
    }
    __syncthreads();  // P complete
    mul_tile<kXR, kHs>(Ps, Vs, tx, ty, o);
  }

  float* lse_row = lse + int64_t(bh) * T;
#pragma unroll
  for (int i = 0; i < kXR; ++i) {
    const int r = q0 + ty * kXR + i;
    if (r >= T) continue;
    const float inv = 1.0f / l[i];
    const int64_t o_off = (int64_t(b) * T + r) * g.C + int64_t(h) * g.hs;
#pragma unroll
    for (int u = 0; u < kEC; ++u) {
      const int col = out_col<kHs>(tx, u);
      if (col < g.hs) store_from_float(out, kDt, o_off + col, o[i][u] * inv);
    }
    if (tx == 0) lse_row[r] = (m[i] + log2f(l[i])) * kLn2;
  }
}

// ----------------------------------------------------------------- backward --

// D[(b*nh + h)*T + t] = sum_d dO[b, t, h*hs + d] * O[b, t, h*hs + d]; one warp per row.
__global__ void attention_rowdot_kernel(const void* out, const void* dout, DT dt, float* D,
                                        int64_t rows, int T, int C, int n_head, int hs) {
  const int lane = threadIdx.x % 32;
  const int64_t warp0 = grid_start() / 32, warps = grid_step() / 32;
  for (int64_t row = warp0; row < rows; row += warps) {
    const int64_t t = row % T, bh = row / T;
    const int64_t b = bh / n_head, h = bh % n_head;
    const int64_t off = (b * T + t) * C + h * hs;
    float acc = 0.0f;
    for (int d = lane; d < hs; d += 32) {
      acc = fmaf(load_as_float(dout, dt, off + d), load_as_float(out, dt, off + d), acc);
    }
    acc = warp_sum(acc);
    if (lane == 0) D[row] = acc;
  }
}

// 8 rows per thread (64-row tiles) up to kHs = 64; 4 (32-row tiles) at 128,
// which keeps shared memory near 116 KiB and the accumulators in registers.
template <int kHs>
constexpr int bwd_xr() {
  return kHs >= 128 ? 4 : 8;
}

template <int kHs>
constexpr size_t dkdv_smem() {
  constexpr int kBc = 8 * bwd_xr<kHs>();
  return sizeof(float) * (2 * size_t(kBc) * row_stride<kHs>()       // K, V
                          + 2 * size_t(kYTile) * row_stride<kHs>()  // Q, dO
                          + 2 * size_t(kBc) * kPStride              // P^T, dS^T
                          + 2 * size_t(kYTile));                    // lse (base 2), D
}

// grid (B * n_kv_head, key tiles of 8*kXR keys); key tile 0 (the most query
// tiles) is scheduled first. dk = prior + scale dS^T Q, dv = prior + P^T dO, summed over
// the group's query heads; a dk or dv with a null out is not written.
template <DT kDt, int kHs>
__global__ void __launch_bounds__(kThreads)
    attention_dkdv_kernel(const void* q, const void* k, const void* v, const void* dout,
                          const float* lse, const float* D, GradOut dk_out, GradOut dv_out,
                          DT grad_dt, Geometry g) {
  constexpr int kXR = bwd_xr<kHs>();
  constexpr int kBc = 8 * kXR;
  constexpr int kLd = row_stride<kHs>();
  constexpr int kEC = kHs / 16;
  extern __shared__ float4 smem4[];
  float* Ks = reinterpret_cast<float*>(smem4);  // [kBc][kLd]
  float* Vs = Ks + kBc * kLd;                   // [kBc][kLd]
  float* Qs = Vs + kBc * kLd;                   // [64][kLd]
  float* dOs = Qs + kYTile * kLd;               // [64][kLd]
  float* Pt = dOs + kYTile * kLd;               // [kBc][kPStride]: P^T
  float* dSt = Pt + kBc * kPStride;             // [kBc][kPStride]: dS^T
  float* lse2 = dSt + kBc * kPStride;           // [64]
  float* Ds = lse2 + kYTile;                    // [64]

  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int b = blockIdx.x / g.n_kv_head, kvh = blockIdx.x % g.n_kv_head;
  const int k0 = blockIdx.y * kBc;
  const int T = g.T;
  const int64_t k_off = g.head(b, kvh, g.ldk), v_off = g.head(b, kvh, g.ldv);

  load_tile<kDt, kHs, kBc>(k, k_off, g.ldk, k0, T, g.hs, Ks);
  load_tile<kDt, kHs, kBc>(v, v_off, g.ldv, k0, T, g.hs, Vs);

  float dk[kXR][kEC], dv[kXR][kEC];
#pragma unroll
  for (int i = 0; i < kXR; ++i)
#pragma unroll
    for (int u = 0; u < kEC; ++u) dk[i][u] = dv[i][u] = 0.0f;

  // The group's query heads in order (one for plain multi-head attention).
  for (int h = kvh * g.group; h < (kvh + 1) * g.group; ++h) {
    const int64_t bh = int64_t(b) * g.n_head + h;
    const int64_t q_off = g.head(b, h, g.ldq), o_off = g.head(b, h, g.C);
    // Query tiles from the one holding key k0 (queries before it see none of these keys).
    for (int q0 = (k0 / kYTile) * kYTile; q0 < T; q0 += kYTile) {
      __syncthreads();  // the previous query tile is no longer read
      load_tile<kDt, kHs, kYTile>(q, q_off, g.ldq, q0, T, g.hs, Qs);
      load_tile<kDt, kHs, kYTile>(dout, o_off, g.C, q0, T, g.hs, dOs);
      load_vec(lse + bh * T, q0, T, kYTile, kLog2e, lse2);
      load_vec(D + bh * T, q0, T, kYTile, 1.0f, Ds);
      __syncthreads();

      float s[kXR][kYR], dp[kXR][kYR];
#pragma unroll
      for (int i = 0; i < kXR; ++i)
#pragma unroll
        for (int j = 0; j < kYR; ++j) s[i][j] = dp[i][j] = 0.0f;
      dot_tile<kXR, kHs>(Ks, Qs, tx, ty, s);    // s[i][j] = k_c . q_r
      dot_tile<kXR, kHs>(Vs, dOs, tx, ty, dp);  // dp[i][j] = v_c . dO_r

#pragma unroll
      for (int i = 0; i < kXR; ++i) {
        const int c = k0 + ty * kXR + i;
#pragma unroll
        for (int j = 0; j < kYR; ++j) {
          const int rl = tx + 16 * j, r = q0 + rl;
          const float p =
              (r < T && g.visible(b, r, c)) ? exp2f(s[i][j] * g.scale_log2 - lse2[rl]) : 0.0f;
          Pt[(ty * kXR + i) * kPStride + rl] = p;
          dSt[(ty * kXR + i) * kPStride + rl] = p * (dp[i][j] - Ds[rl]);
        }
      }
      __syncthreads();  // P^T and dS^T complete
      mul_tile<kXR, kHs>(Pt, dOs, tx, ty, dv);
      mul_tile<kXR, kHs>(dSt, Qs, tx, ty, dk);
    }
  }

#pragma unroll
  for (int i = 0; i < kXR; ++i) {
    const int c = k0 + ty * kXR + i;
    if (c >= T) continue;
    const int64_t k_at = k_off + int64_t(c) * g.ldk, v_at = v_off + int64_t(c) * g.ldv;
#pragma unroll
    for (int u = 0; u < kEC; ++u) {
      const int col = out_col<kHs>(tx, u);
      if (col >= g.hs) continue;
      const int64_t kk = k_at + col, vv = v_at + col;
      if (dk_out.out != nullptr) {
        store_from_float(dk_out.out, grad_dt, kk,
                         load_as_float_or_zero(dk_out.prior, grad_dt, kk) + g.scale * dk[i][u]);
      }
      if (dv_out.out != nullptr) {
        store_from_float(dv_out.out, grad_dt, vv,
                         load_as_float_or_zero(dv_out.prior, grad_dt, vv) + dv[i][u]);
      }
    }
  }
}

template <int kHs>
constexpr size_t dq_smem() {
  constexpr int kBr = 8 * bwd_xr<kHs>();
  return sizeof(float) * (2 * size_t(kBr) * row_stride<kHs>()       // Q, dO
                          + 2 * size_t(kYTile) * row_stride<kHs>()  // K, V
                          + size_t(kBr) * kPStride                  // dS
                          + 2 * size_t(kBr));                       // lse (base 2), D
}

// grid (B * n_head, query tiles of 8*kXR queries); the last query tiles first.
// dq = prior + scale dS K.
template <DT kDt, int kHs>
__global__ void __launch_bounds__(kThreads)
    attention_dq_kernel(const void* q, const void* k, const void* v, const void* dout,
                        const float* lse, const float* D, GradOut dq_out, DT grad_dt, Geometry g) {
  constexpr int kXR = bwd_xr<kHs>();
  constexpr int kBr = 8 * kXR;
  constexpr int kLd = row_stride<kHs>();
  constexpr int kEC = kHs / 16;
  extern __shared__ float4 smem4[];
  float* Qs = reinterpret_cast<float*>(smem4);  // [kBr][kLd]
  float* dOs = Qs + kBr * kLd;                  // [kBr][kLd]
  float* Ks = dOs + kBr * kLd;                  // [64][kLd]
  float* Vs = Ks + kYTile * kLd;                // [64][kLd]
  float* dSs = Vs + kYTile * kLd;               // [kBr][kPStride]
  float* lse2 = dSs + kBr * kPStride;           // [kBr]
  float* Ds = lse2 + kBr;                       // [kBr]

  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int bh = blockIdx.x, b = bh / g.n_head, h = bh % g.n_head, kvh = h / g.group;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kBr;
  const int T = g.T;
  const int64_t q_off = g.head(b, h, g.ldq), o_off = g.head(b, h, g.C);
  const int64_t k_off = g.head(b, kvh, g.ldk), v_off = g.head(b, kvh, g.ldv);

  load_tile<kDt, kHs, kBr>(q, q_off, g.ldq, q0, T, g.hs, Qs);
  load_tile<kDt, kHs, kBr>(dout, o_off, g.C, q0, T, g.hs, dOs);
  load_vec(lse + int64_t(bh) * T, q0, T, kBr, kLog2e, lse2);
  load_vec(D + int64_t(bh) * T, q0, T, kBr, 1.0f, Ds);

  float dq[kXR][kEC];
#pragma unroll
  for (int i = 0; i < kXR; ++i)
#pragma unroll
    for (int u = 0; u < kEC; ++u) dq[i][u] = 0.0f;

  const int last_q = min(q0 + kBr, T) - 1;
  for (int k0 = g.first_key(b, q0) / kYTile * kYTile; k0 <= last_q; k0 += kYTile) {
    __syncthreads();  // the previous key tile and dS are no longer read
    load_tile<kDt, kHs, kYTile>(k, k_off, g.ldk, k0, T, g.hs, Ks);
    load_tile<kDt, kHs, kYTile>(v, v_off, g.ldv, k0, T, g.hs, Vs);
    __syncthreads();

    float s[kXR][kYR], dp[kXR][kYR];
#pragma unroll
    for (int i = 0; i < kXR; ++i)
#pragma unroll
      for (int j = 0; j < kYR; ++j) s[i][j] = dp[i][j] = 0.0f;
    dot_tile<kXR, kHs>(Qs, Ks, tx, ty, s);    // s[i][j] = q_r . k_c
    dot_tile<kXR, kHs>(dOs, Vs, tx, ty, dp);  // dp[i][j] = dO_r . v_c

#pragma unroll
    for (int i = 0; i < kXR; ++i) {
      const int rl = ty * kXR + i, r = q0 + rl;
#pragma unroll
      for (int j = 0; j < kYR; ++j) {
        const int c = k0 + tx + 16 * j;
        const float p =
            (r < T && g.visible(b, r, c)) ? exp2f(s[i][j] * g.scale_log2 - lse2[rl]) : 0.0f;
        dSs[rl * kPStride + tx + 16 * j] = p * (dp[i][j] - Ds[rl]);
      }
    }
    __syncthreads();  // dS complete
    mul_tile<kXR, kHs>(dSs, Ks, tx, ty, dq);
  }

#pragma unroll
  for (int i = 0; i < kXR; ++i) {
    const int r = q0 + ty * kXR + i;
    if (r >= T) continue;
    const int64_t q_at = q_off + int64_t(r) * g.ldq;
#pragma unroll
    for (int u = 0; u < kEC; ++u) {
      const int col = out_col<kHs>(tx, u);
      if (col >= g.hs) continue;
      const int64_t qq = q_at + col;
      store_from_float(dq_out.out, grad_dt, qq,
                       load_as_float_or_zero(dq_out.prior, grad_dt, qq) + g.scale * dq[i][u]);
    }
  }
}

// ----------------------------------------------------------------- launchers --

// Owns a device_alloc block for the length of a launcher (freed blocks stay
// valid for kernels already queued: the allocator's one-stream rule).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes), p_(device_alloc(bytes)) {}
  ~DeviceBuffer() {
    try {  // a destructor does not throw (std::terminate): the block is lost
      device_free(p_, bytes_);
    } catch (const std::exception&) {
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  float* floats() const { return static_cast<float*>(p_); }

 private:
  size_t bytes_;
  void* p_;
};

// Checks the shapes shared by forward and backward and returns the geometry.
Geometry check_shapes(const char* what, DT dt, const AttentionShape& a) {
  require_float(dt, what);
  require(a.B >= 0 && a.T >= 0, what, "negative batch or sequence length");
  require(a.n_head > 0 && a.n_kv_head > 0 && a.n_head % a.n_kv_head == 0, what,
          ("n_head (" + std::to_string(a.n_head) + ") must be a positive multiple of n_kv_head (" +
           std::to_string(a.n_kv_head) + ")")
              .c_str());
  require(a.hs > 0 && a.hs <= 128, what,
          ("head size " + std::to_string(a.hs) + " is outside the supported 1..128").c_str());
  const int64_t C = a.n_head * a.hs;
  require(a.ld_q >= C && a.ld_k >= a.n_kv_head * a.hs && a.ld_v >= a.n_kv_head * a.hs, what,
          "a row stride is shorter than its rows");
  require(a.T <= int64_t(65535) * 32 && a.ld_q <= INT_MAX && a.ld_k <= INT_MAX && a.ld_v <= INT_MAX,
          what, "T or a row stride too large");
  require(a.B * a.n_head <= INT_MAX, what, "B * n_head too large");
  const float scale = 1.0f / sqrtf(float(a.hs));
  return Geometry{.T = int(a.T),
                  .C = int(C),
                  .n_head = int(a.n_head),
                  .n_kv_head = int(a.n_kv_head),
                  .group = int(a.n_head / a.n_kv_head),
                  .hs = int(a.hs),
                  .ldq = a.ld_q,
                  .ldk = a.ld_k,
                  .ldv = a.ld_v,
                  .scale = scale,
                  .scale_log2 = scale * kLog2e,
                  .starts = a.starts};
}

template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes, const char* what) {
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)),
             what);
}

template <DT kDt, int kHs>
void launch_forward(const void* q, const void* k, const void* v, void* out, float* lse, int64_t B,
                    const Geometry& g) {
  const cudaStream_t s = stream();  // first: makes the runtime's device current on this thread
  constexpr size_t kSmem = forward_smem<kHs>();
  auto kernel = attention_forward_kernel<kDt, kHs>;
  allow_smem(kernel, kSmem, "attention_forward: shared memory");
  const dim3 grid(unsigned(B * g.n_head), unsigned((g.T + 8 * kFwdXR - 1) / (8 * kFwdXR)));
  kernel<<<grid, kThreads, kSmem, s>>>(q, k, v, out, lse, g);
  check_launch("attention_forward");
}

template <DT kDt, int kHs>
void launch_backward(const void* q, const void* k, const void* v, const void* dout,
                     const float* lse, const float* D, GradOut dq, GradOut dk, GradOut dv,
                     DT grad_dt, int64_t B, const Geometry& g) {
  const cudaStream_t s = stream();
  constexpr int kTile = 8 * bwd_xr<kHs>();
  const unsigned tiles = unsigned((g.T + kTile - 1) / kTile);
  if (dk.out != nullptr || dv.out != nullptr) {
    constexpr size_t kSmem = dkdv_smem<kHs>();
    auto kernel = attention_dkdv_kernel<kDt, kHs>;
    allow_smem(kernel, kSmem, "attention_backward: shared memory");
    kernel<<<dim3(unsigned(B * g.n_kv_head), tiles), kThreads, kSmem, s>>>(q, k, v, dout, lse, D,
                                                                           dk, dv, grad_dt, g);
    check_launch("attention_backward (dK, dV)");
  }
  if (dq.out != nullptr) {
    constexpr size_t kSmem = dq_smem<kHs>();
    auto kernel = attention_dq_kernel<kDt, kHs>;
    allow_smem(kernel, kSmem, "attention_backward: shared memory");
    kernel<<<dim3(unsigned(B * g.n_head), tiles), kThreads, kSmem, s>>>(q, k, v, dout, lse, D, dq,
                                                                        grad_dt, g);
    check_launch("attention_backward (dQ)");
  }
}

// Calls f.template operator()<kDt, kHs>() for the runtime dtype and the head
// size tile (32, 64 or 128) that holds hs.
template <typename F>
void dispatch(DT dt, int hs, F&& f) {
  auto by_hs = [&]<DT kDt>() {
    if (hs <= 32) {
      f.template operator()<kDt, 32>();
    } else if (hs <= 64) {
      f.template operator()<kDt, 64>();
    } else {
      f.template operator()<kDt, 128>();
    }
  };
  dispatch_dt(dt, by_hs);
}

std::atomic<AttentionKernels> g_attention_kernels{AttentionKernels::kTensorCores};
// attention_launches(): forward on tensor cores, forward SIMT, backward ditto.
std::atomic<int64_t> g_launches[4];

}  // namespace

AttentionLaunches attention_launches() {
  return {g_launches[0].load(), g_launches[1].load(), g_launches[2].load(), g_launches[3].load()};
}

void set_attention_kernels(AttentionKernels which) { g_attention_kernels.store(which); }
AttentionKernels attention_kernels() { return g_attention_kernels.load(); }

bool attention_on_tensor_cores(DT dt, const AttentionShape& a, const void* q, const void* k,
                               const void* v, const void* out) {
  return attention_kernels() == AttentionKernels::kTensorCores &&
         (dt == DT::kBF16 || dt == DT::kF16) && flash::shapes_fit(a.hs, a.ld_q, a.ld_k, a.ld_v) &&
         all_vec_aligned(q, k, v, out);
}

void attention_forward(const void* q, const void* k, const void* v, void* out, float* lse, DT dt,
                       const AttentionShape& a) {
  const Geometry g = check_shapes("attention_forward", dt, a);
  if (a.B == 0 || a.T == 0) return;
  require(q != nullptr && k != nullptr && v != nullptr && out != nullptr && lse != nullptr,
          "attention_forward", "null pointer");
  if (attention_on_tensor_cores(dt, a, q, k, v, out)) {
    attention_forward_mma(q, k, v, out, lse, dt, a.B, g);
    g_launches[0].fetch_add(1);
    return;
  }
  g_launches[1].fetch_add(1);
  dispatch(dt, g.hs,
           [&]<DT kDt, int kHs>() { launch_forward<kDt, kHs>(q, k, v, out, lse, a.B, g); });
}

void attention_backward(const void* q, const void* k, const void* v, const void* out,
                        const float* lse, const void* dout, DT dt, GradOut dq, GradOut dk,
                        GradOut dv, DT grad_dt, const AttentionShape& a) {
  const Geometry g = check_shapes("attention_backward", dt, a);
  require_float(grad_dt, "attention_backward (gradients)");
  if (a.B == 0 || a.T == 0 || (dq.out == nullptr && dk.out == nullptr && dv.out == nullptr)) return;
  require(q != nullptr && k != nullptr && v != nullptr && out != nullptr && lse != nullptr &&
              dout != nullptr,
          "attention_backward", "null pointer");
  const int64_t rows = a.B * a.n_head * a.T;
  DeviceBuffer D(size_t(rows) * sizeof(float));
  attention_rowdot_kernel<<<grid_for(rows * 32), kBlock, 0, stream()>>>(
      out, dout, dt, D.floats(), rows, g.T, g.C, g.n_head, g.hs);
  check_launch("attention_backward (D)");
  if (attention_on_tensor_cores(dt, a, q, k, v, dout)) {
    attention_backward_mma(q, k, v, dout, lse, D.floats(), dt, dq, dk, dv, grad_dt, a.B, g);
    g_launches[2].fetch_add(1);
    return;
  }
  g_launches[3].fetch_add(1);
  dispatch(dt, g.hs, [&]<DT kDt, int kHs>() {
    launch_backward<kDt, kHs>(q, k, v, dout, lse, D.floats(), dq, dk, dv, grad_dt, a.B, g);
  });
}

}  // namespace fd::kernels
