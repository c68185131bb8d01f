// The index math of the tensor-core attention kernels (kernels/attention_mma.cu),
// in plain C++ so that the CPU tests (tests/ops/flash_layout_test.cc) check it
// without a GPU: which key tiles a query tile visits, where an element lives
// in a swizzled shared-memory tile, which addresses each lane hands to
// ldmatrix, and which matrix elements each lane holds in the fragments of
// mma.sync.m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16", 16-bit
// operands, fp32 accumulators).
//
// Lane l of a warp is written g = l / 4 (its "group", a row) and t = l % 4
// (its place in the quad of four lanes that share that row).
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define FD_HD __host__ __device__
#else
#define FD_HD
#endif

namespace fd::kernels::flash {

// ---------------------------------------------------------------- the plan --

constexpr int kWarps = 4;              // per forward block
constexpr int kThreads = 32 * kWarps;  // 128
constexpr int kRowsPerWarp = 16;       // the M of m16n8k16
// 64: queries (or keys) per block and per streamed tile
constexpr int kTile = kWarps * kRowsPerWarp;
// The backward's blocks: 8 warps over one 64-key tile, warps w and w + 4 on the
// same 16 keys (w % 4), each on half of the query tile (scores) and half of
// the head tile (dK, dV, dQ): the accumulators a warp holds are halved.
constexpr int kBwdWarps = 8;
constexpr int kBwdThreads = 32 * kBwdWarps;  // 256

// The head-size tile for head size hs: 64, 96 or 128 columns (shared-memory
// rows of 128, 192 or 256 bytes, which the swizzle below is made for: head
// sizes 80 and 96 take 96, not 128, so a tile wastes at most 16 columns); 0
// when hs is not a multiple of 8 in 8..128 (the SIMT kernels take those).
FD_HD constexpr int head_tile(int64_t hs) {
  if (hs <= 0 || hs > 128 || hs % 8 != 0) return 0;
  return hs <= 64 ? 64 : hs <= 96 ? 96 : 128;
}

// Whether a 16-bit attention call can take the tensor-core kernels: a head
// tile exists and every 16-byte chunk of a row (8 elements) starts 16-byte
// aligned (row strides and head offsets multiples of 8 elements; the caller
// also checks that the base pointers are 16-byte aligned).
FD_HD constexpr bool shapes_fit(int64_t hs, int64_t ld_q, int64_t ld_k, int64_t ld_v) {
  return head_tile(hs) != 0 && ld_q % 8 == 0 && ld_k % 8 == 0 && ld_v % 8 == 0;
}

// Shared memory of each kernel, in bytes, for head tile kHs: 64-row tiles of
// kHs 16-bit values (forward: Q, and K and V double-buffered; backward: K and
// V, Q and dO double-buffered, the 64 x 64 tiles of P^T and dS^T, and two
// buffers of the query tile's 64 lse, D and document starts, 4 bytes each).
constexpr size_t tile_bytes(int kHs) { return size_t(kTile) * kHs * 2; }
constexpr size_t forward_smem(int kHs) { return 5 * tile_bytes(kHs); }
constexpr size_t backward_smem(int kHs) {
  return 6 * tile_bytes(kHs) + 2 * tile_bytes(kTile) + 2 * 3 * kTile * 4;
}

// The key tiles query tile [q0, q0 + 64) visits under the causal mask: from
// the tile holding first_key (0, or with packed rows the first query's
// document start) to the tile holding the tile's last query (min(q0 + 64, T) - 1).
// Every tile after it is above the diagonal: never loaded, never computed.
FD_HD constexpr int first_key_tile(int first_key) { return first_key / kTile; }
FD_HD constexpr int last_key_tile(int q0, int T) {
  return ((q0 + kTile < T ? q0 + kTile : T) - 1) / kTile;
}
// The query tiles key tile [k0, k0 + 64) is visible to: from the one holding
// k0 (queries before k0 see none of these keys) to the last.
FD_HD constexpr int first_query_tile(int k0) { return k0 / kTile; }
FD_HD constexpr int tiles(int T) { return (T + kTile - 1) / kTile; }

// How many parts the backward splits each KV head's group of query heads into,
// so that its blocks fill a GPU of `sms` multiprocessors (two blocks each)
// when few KV heads and a short sequence leave it idle: MQA at B 1, T 1024 is
// 16 blocks for 132 SMs. The smallest divisor of group that gives 2 sms
// blocks, else group; 1 when B * n_kv_head * tiles already does. Each part
// sums its heads' dK and dV, and a last pass adds the parts in order.
FD_HD constexpr int head_splits(int64_t B, int n_kv_head, int group, int T, int sms) {
  const int64_t blocks = B * n_kv_head * tiles(T), want = 2 * int64_t(sms);
  for (int s = 1; s < group; ++s)
    if (group % s == 0 && blocks * s >= want) return s;
  return group < 1 ? 1 : group;
}

// The launches: forward grid (B * n_head, query tiles); backward grid
// (B * n_kv_head * splits, key tiles) with its fp32 dQ accumulator (rows padded
// to whole tiles, head-tile columns), one count per (batch row, head, query
// tile), and with splits > 1 the parts' fp32 dK and dV (the same row layout).
struct Grid {
  unsigned x, y;
};
FD_HD constexpr Grid forward_grid(int64_t B, int n_head, int T) {
  return {unsigned(B * n_head), unsigned(tiles(T))};
}
FD_HD constexpr Grid backward_grid(int64_t B, int n_kv_head, int T, int splits) {
  return {unsigned(B * n_kv_head * splits), unsigned(tiles(T))};
}
constexpr size_t dq_accum_floats(int64_t B, int n_head, int T, int kHs) {
  return size_t(B) * size_t(n_head) * size_t(tiles(T)) * kTile * size_t(kHs);
}
constexpr size_t dq_counts(int64_t B, int n_head, int T) {
  return size_t(B) * size_t(n_head) * size_t(tiles(T));
}
// dK's parts, then dV's.
constexpr size_t dkv_part_floats(int64_t B, int n_kv_head, int T, int kHs, int splits) {
  return splits <= 1 ? 0 : 2 * dq_accum_floats(B, n_kv_head * splits, T, kHs);
}

// ------------------------------------------------------ shared-memory tiles --

// A tile holds rows of kHs 16-bit values, row r's 16-byte chunk c (elements
// 8c .. 8c + 7) stored at chunk c ^ (r % 8) of the row: eight consecutive rows'
// chunk c then fall into eight different groups of four 4-byte banks (a group
// is a 16-byte column of the 128-byte bank period), so ldmatrix (eight 16-byte
// row reads per 8x8 matrix) and the cp.async stores meet no bank conflict.
// A 96-column tile has 12 chunks a row: the first 8 swizzle as above (a row of
// 192 bytes moves the groups by 4 every other row, which the XOR absorbs), the
// last 4 as 8 + ((c - 8) ^ ((r / 2) % 4)): four values on the even rows, four
// on the odd ones, whose groups differ by 4; its cp.async stores meet two-way
// conflicts in some phases (a row's last 4 chunks against the next row's first
// 4). (tests/ops/flash_layout_test.cc checks every phase for 64, 96 and 128.)
FD_HD constexpr int swizzled_chunk(int kHs, int row, int chunk) {
  if (kHs == 96 && chunk >= 8) return 8 + ((chunk - 8) ^ ((row >> 1) & 3));
  return chunk ^ (row & 7);
}

// Element offset of (row, col) in a swizzled tile of head tile kHs; col % 8
// is kept (chunks move whole).
FD_HD constexpr int tile_offset(int kHs, int row, int col) {
  return row * kHs + swizzled_chunk(kHs, row, col / 8) * 8 + col % 8;
}

// ------------------------------------------------- ldmatrix lane addresses --
// ldmatrix.x4 loads four 8x8 matrices of 16-bit values; lanes 8i .. 8i + 7
// give the addresses of matrix i's eight rows (16 bytes each) and register i
// of every lane receives matrix i. Without .trans lane l receives row l / 4,
// columns 2 (l % 4) and 2 (l % 4) + 1 of each matrix; with .trans, column
// l / 4 of rows 2 (l % 4) and 2 (l % 4) + 1.

struct RowCol {
  int row, col;
};

// An A operand (16 x 16, row-major in the tile) at (r0, c0): matrices
// (rows 0-7, cols 0-7), (rows 8-15, cols 0-7), (rows 0-7, cols 8-15),
// (rows 8-15, cols 8-15), which are a0 .. a3 of the A fragment.
FD_HD constexpr RowCol ldm_a(int lane, int r0, int c0) {
  return {r0 + lane % 16, c0 + 8 * (lane / 16)};
}

// B operands of two n8k16 mma's, B[k][n] = tile[n][k] (the tile's rows are the
// n side: keys in S = Q K^T), n from n0 (16 rows), k from k0 (16 columns):
// matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15),
// which are b0, b1 of the first mma and b0, b1 of the second. No .trans.
FD_HD constexpr RowCol ldm_b(int lane, int n0, int k0) {
  return {n0 + lane % 8 + 8 * (lane / 16), k0 + 8 * ((lane / 8) % 2)};
}

// B operands of two n8k16 mma's, B[k][n] = tile[k][n] (the tile's rows are the
// k side: keys in O = P V), k from k0 (16 rows), n from n0 (16 columns):
// matrices (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15)
// loaded with .trans, which are b0, b1 of the first mma and b0, b1 of the second.
FD_HD constexpr RowCol ldm_bt(int lane, int k0, int n0) {
  return {k0 + lane % 8 + 8 * ((lane / 8) % 2), n0 + 8 * (lane / 16)};
}

// An A operand (16 x 16) taken transposed from a tile: A[r][c] = tile[c][r]
// for r from r0, c from c0 (the tile's rows are A's columns: dS = (dS^T)^T in
// dQ = dS K), loaded with .trans: matrix i (A rows 8 (i % 2) .., columns
// 8 (i / 2) ..) is the tile's rows c0 + 8 (i / 2) .., columns r0 + 8 (i % 2) ..
FD_HD constexpr RowCol ldm_a_trans(int lane, int r0, int c0) {
  return {c0 + lane % 8 + 8 * (lane / 16), r0 + 8 * ((lane / 8) % 2)};
}

// ------------------------------------------------------- mma.m16n8k16 fragments --

// Accumulator c[i] (i < 4) of lane l: row g + 8 (i / 2), column 2 t + i % 2.
FD_HD constexpr RowCol frag_c(int lane, int i) {
  return {lane / 4 + 8 * (i / 2), 2 * (lane % 4) + i % 2};
}
// A register a[i] (i < 4) of lane l holds two values: row g + 8 (i % 2),
// columns 2 t + 8 (i / 2) + h for h = 0 (low 16 bits) and 1 (high 16 bits).
FD_HD constexpr RowCol frag_a(int lane, int i, int h) {
  return {lane / 4 + 8 * (i % 2), 2 * (lane % 4) + 8 * (i / 2) + h};
}
// B register b[i] (i < 2) of lane l holds two values: k = 2 t + 8 i + h, n = g.
FD_HD constexpr RowCol frag_b(int lane, int i, int h) {
  return {2 * (lane % 4) + 8 * i + h, lane / 4};
}

// The accumulators of two neighbouring n8 tiles (2j and 2j + 1: 16 columns)
// are, value for value, the A operand of the next product over those 16
// columns (P = softmax(S) feeding P V): A register i takes accumulator tile
// 2j + i / 2, values 2 (i % 2) and 2 (i % 2) + 1. So the conversion is a
// rounding to 16 bits and no data moves between lanes.
FD_HD constexpr int a_from_c_tile(int j, int i) { return 2 * j + i / 2; }
FD_HD constexpr int a_from_c_value(int i, int h) { return 2 * (i % 2) + h; }

}  // namespace fd::kernels::flash
