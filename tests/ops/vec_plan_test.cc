// The vectorised kernels' index plan (kernels/vec_plan.h), checked without a
// GPU: every element is visited exactly once, by a whole 16-byte step or by
// the tail, and every step starts 16-byte aligned for every operand.
#include "kernels/vec_plan.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace fd::kernels {
namespace {

// The loops of common.cuh's for_each_step, run for every thread of a launch
// whose threads start at 0 .. step - 1: how often each element of [0, n) is
// visited, and whether any vector step leaves [0, n) or starts off a multiple
// of width.
struct Visits {
  std::vector<int> count;
  bool step_outside = false;
  bool step_misplaced = false;
};

Visits run_loops(int64_t n, VecSplit s, int width, int64_t step) {
  Visits v;
  v.count.assign(size_t(n), 0);
  for (int64_t start = 0; start < step; ++start) {
    for (int64_t k = start; k < s.packs; k += step) {
      const int64_t i = k * width;
      if (i % width != 0) v.step_misplaced = true;
      if (i < 0 || i + width > n) {
        v.step_outside = true;
        continue;
      }
      for (int j = 0; j < width; ++j) ++v.count[size_t(i + j)];
    }
    for (int64_t i = s.tail_begin + start; i < n; i += step) ++v.count[size_t(i)];
  }
  return v;
}

TEST(VecPlan, WidthIsOne16ByteAccessOfTheNarrowestDtype) {
  EXPECT_EQ(kVecBytes, 16);
  EXPECT_EQ(vec_width(2), 8);  // bf16 / f16: 8 per uint4
  EXPECT_EQ(vec_width(4), 4);  // f32: 4 per float4
  EXPECT_TRUE(vec_aligned(0));
  EXPECT_TRUE(vec_aligned(4096));
  EXPECT_TRUE(vec_aligned(48));
  EXPECT_FALSE(vec_aligned(8));
  EXPECT_FALSE(vec_aligned(4098));
}

TEST(VecPlan, SplitVisitsEveryElementOnce) {
  for (int width : {4, 8}) {
    for (int64_t n = 0; n <= 70; ++n) {
      for (bool aligned : {true, false}) {
        const VecSplit s = vec_split(n, width, aligned);
        EXPECT_LE(s.tail_begin, n);
        EXPECT_EQ(s.tail_begin, s.packs * width);
        if (aligned) {
          EXPECT_LT(n - s.tail_begin, width) << "n " << n << " width " << width;
        } else {
          EXPECT_EQ(s.packs, 0);  // unaligned: everything one at a time
          EXPECT_EQ(s.tail_begin, 0);
        }
        EXPECT_EQ(vec_items(s, n), s.packs + (n - s.tail_begin));
        for (int64_t step : {1, 3, 32, 256}) {  // one thread, odd strides, a warp, a block
          const Visits v = run_loops(n, s, width, step);
          EXPECT_FALSE(v.step_outside);
          EXPECT_FALSE(v.step_misplaced);
          for (int64_t i = 0; i < n; ++i) {
            ASSERT_EQ(v.count[size_t(i)], 1)
                << "element " << i << " of " << n << ", width " << width << ", step " << step;
          }
        }
      }
    }
  }
}

TEST(VecPlan, LargeCountsSplitWithoutOverflow) {
  const int64_t n = (int64_t(1) << 40) + 5;  // beyond int32 elements and packs
  const VecSplit s = vec_split(n, 8, true);
  EXPECT_EQ(s.packs, int64_t(1) << 37);
  EXPECT_EQ(s.tail_begin, int64_t(1) << 40);
  EXPECT_EQ(vec_items(s, n), (int64_t(1) << 37) + 5);
}

// Byte offset of element e of an operand with elem_bytes-byte elements.
int64_t byte_at(int64_t e, int elem_bytes) { return e * elem_bytes; }

TEST(VecPlan, RowStepsStartAlignedInEveryOperand) {
  for (int width : {4, 8}) {
    for (int64_t ld = 1; ld <= 64; ++ld) {
      for (int64_t cols = 1; cols <= ld; cols += 5) {
        const VecSplit s = vec_split_rows(cols, ld, width, true);
        if (ld % width != 0) {
          EXPECT_EQ(s.packs, 0) << "ld " << ld << " width " << width;
          continue;
        }
        EXPECT_EQ(s.packs, cols / width);
        // Operands of 2 bytes (only in a kernel whose width is 8) and 4 bytes.
        for (int elem_bytes : {2, 4}) {
          if (elem_bytes == 2 && width != 8) continue;
          for (int64_t r = 0; r < 5; ++r) {
            for (int64_t k = 0; k < s.packs; ++k) {
              EXPECT_EQ(byte_at(r * ld + k * width, elem_bytes) % kVecBytes, 0);
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(vec_split_rows(64, 64, 8, false).packs, 0);       // a base pointer unaligned
  EXPECT_EQ(vec_split_rows(50257, 50257, 8, true).packs, 0);  // GPT-2's vocabulary, unpadded
  EXPECT_EQ(vec_split_rows(50257, 50304, 8, true).tail_begin, 50256);  // padded (head_stride)
}

TEST(VecPlan, RopeStepsStayInsideOneHalfHead) {
  for (int width : {4, 8}) {
    for (int64_t D = 2; D <= 64; D += 2) {
      const int64_t h = D / 2;
      const int64_t C = 3 * D, rows = 2;  // 3 heads, 2 rows of (B, T)
      const int64_t pairs_per_row = C / 2, pairs = rows * pairs_per_row;
      const VecSplit s = rope_vec_split(pairs, D, width, true);
      if (h % width != 0) {
        EXPECT_EQ(s.packs, 0) << "D " << D << " width " << width;
        continue;
      }
      EXPECT_EQ(s.tail_begin, pairs);  // whole steps only
      for (int64_t k = 0; k < s.packs; ++k) {
        // rope_kernel's index arithmetic for the step's first and last pair.
        const int64_t p0 = k * width, p1 = p0 + width - 1;
        EXPECT_EQ(p0 / pairs_per_row, p1 / pairs_per_row);  // one (b, t) row
        const int64_t q0 = p0 % pairs_per_row, q1 = p1 % pairs_per_row;
        EXPECT_EQ(q0 / h, q1 / h);              // one head
        EXPECT_EQ(q1 % h - q0 % h, width - 1);  // consecutive i
        const int64_t lo_at = (p0 / pairs_per_row) * C + (q0 / h) * D + q0 % h;
        for (int elem_bytes : {2, 4}) {
          if (elem_bytes == 2 && width != 8) continue;
          EXPECT_EQ(byte_at(lo_at, elem_bytes) % kVecBytes, 0);
          EXPECT_EQ(byte_at(lo_at + h, elem_bytes) % kVecBytes, 0);
        }
        // The fp32 cos/sin rows: row * D + i and + h.
        EXPECT_EQ(byte_at(q0 % h, 4) % kVecBytes, 0);
        EXPECT_EQ(byte_at(D + q0 % h + h, 4) % kVecBytes, 0);
      }
    }
  }
  EXPECT_EQ(rope_vec_split(1024, 64, 8, false).packs, 0);
}

}  // namespace
}  // namespace fd::kernels
