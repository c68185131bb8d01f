// How the vectorised kernels split an index range into 128-bit steps and a
// scalar tail. Plain C++ and constexpr, so the kernels (device code, through
// --expt-relaxed-constexpr) and tests/ops/vec_plan_test.cc (host, no GPU) use
// the same arithmetic.
//
// A vector step moves `width` consecutive elements of every operand: one
// 16-byte access for the narrowest dtype, whole 16-byte accesses for the wider
// ones (an fp32 operand of a kernel that also has a 16-bit one moves 32 bytes
// per step). Step k covers [k * width, (k + 1) * width), so every operand's
// step starts a multiple of 16 bytes after its base pointer: the vector body
// needs only the base pointers aligned, and the elements after the last whole
// step go one at a time.
#pragma once

#include <cstdint>

namespace fd::kernels {

// Bytes one vector access moves (a uint4 load or store).
constexpr int kVecBytes = 16;

// Elements per vector step of a kernel whose narrowest operand has
// `min_elem_bytes` bytes (2 or 4): 8 or 4.
constexpr int vec_width(int min_elem_bytes) { return kVecBytes / min_elem_bytes; }

// Whether an address is a multiple of 16 bytes (a vector access may start there).
constexpr bool vec_aligned(uintptr_t address) { return address % kVecBytes == 0; }

// [0, n) split into `packs` vector steps of `width` elements, covering
// [0, tail_begin), and the scalar tail [tail_begin, n).
struct VecSplit {
  int64_t packs = 0;
  int64_t tail_begin = 0;
};

// The split of [0, n) for steps of `width` elements. aligned false (some
// operand's base pointer is not 16-byte aligned): no vector steps, all tail.
constexpr VecSplit vec_split(int64_t n, int width, bool aligned) {
  if (!aligned || width <= 0 || n <= 0) return {0, 0};
  const int64_t packs = n / width;
  return {packs, packs * width};
}

// The split of each row of a row kernel: rows of `cols` elements, row r
// starting at element r * ld of every operand (ld >= cols). Every row's start
// is 16-byte aligned only when ld is a multiple of width (and the base
// pointers are aligned); otherwise the rows go one element at a time.
constexpr VecSplit vec_split_rows(int64_t cols, int64_t ld, int width, bool aligned) {
  return vec_split(cols, width, aligned && width > 0 && ld % width == 0);
}

// The split of rope's B * T * C / 2 rotation pairs (kernels/rope.cu): a
// step of `width` pairs rotates x[i .. i + width) against x[i + h ..) of one
// head, h = D / 2, so packs only when h is a whole number of steps (then no
// step crosses a head and every step starts 16-byte aligned); else one pair
// at a time.
constexpr VecSplit rope_vec_split(int64_t pairs, int64_t D, int width, bool aligned) {
  return vec_split(pairs, width, aligned && width > 0 && (D / 2) % width == 0);
}

// Work items of a grid-stride loop over a split of [0, n): each vector step and
// each tail element is one item (for grid sizing).
constexpr int64_t vec_items(VecSplit s, int64_t n) { return s.packs + (n - s.tail_begin); }

}  // namespace fd::kernels
