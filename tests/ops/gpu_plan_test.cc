// Host-side plans of the GPU kernels, checked without a GPU (kernels/kernels.h
// is a plain header): the chunked head's padded row stride.
#include <gtest/gtest.h>

#include <cstdint>

#include "kernels/kernels.h"

namespace fd::kernels {
namespace {

// Rows of the head's logits scratch are padded to a multiple of 128 elements:
// 512 B aligned in fp32 and 256 B in 16 bits, never by 128 or more.
TEST(HeadStride, PadsTheVocabularyToAMultipleOf128) {
  EXPECT_EQ(head_stride(50257), 50304);    // GPT-2, as llm.c pads it
  EXPECT_EQ(head_stride(128256), 128256);  // Llama 3: already a multiple
  EXPECT_EQ(head_stride(151936), 151936);  // Qwen2 / Qwen3
  EXPECT_EQ(head_stride(300), 384);        // the GPU parity test's
  EXPECT_EQ(head_stride(1), 128);
  for (int64_t V = 1; V < 5000; V += 7) {
    const int64_t s = head_stride(V);
    EXPECT_GE(s, V);
    EXPECT_LT(s - V, 128);
    EXPECT_EQ(s * 4 % 512, 0);
    EXPECT_EQ(s * 2 % 256, 0);
  }
}

}  // namespace
}  // namespace fd::kernels
