// Helpers for the engine tests that load what lib/ckpt writes into a model:
// the checkpoint tests' TestModel (tests/ckpt/ckpt_test_util.h, a GPT-2's
// tensors without lib/nn) as the source, an nn::Decoder of its size as the target.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>

#include "lib/nn/decoder.h"
#include "tests/ckpt/ckpt_test_util.h"
#include "tests/ckpt/lora_test_util.h"

namespace fd::engine::testing {

using ckpt::testing::error_of;
using ckpt::testing::run_command;
using ckpt::testing::same_bytes;
using ckpt::testing::TempDir;
using ckpt::testing::TestModel;
using ckpt::testing::TestParam;
using ckpt::testing::tiny_config;
using ckpt::testing::TinyConfig;

inline nn::GptConfig gpt_config(const TinyConfig& c) {
  nn::GptConfig g;
  g.n_layer = c.n_layer;
  g.n_head = c.n_head;
  g.d_model = c.d_model;
  g.vocab_size = c.vocab_size;
  g.max_seq_len = c.max_seq_len;
  return g;
}

// A GPT of `c` with GPT-2's initialisation from `seed` (so its values differ
// from any TestModel's until weights are loaded).
inline std::unique_ptr<nn::Decoder> make_gpt(const TinyConfig& c, uint64_t seed,
                                         DType dtype = DType::kF32) {
  auto m = std::make_unique<nn::Decoder>(gpt_config(c), dtype);
  m->init_weights(seed);
  return m;
}

// Every parameter of `a` and `b` bitwise equal, in the same (canonical) order.
inline void expect_same_weights(const TestModel& a, const nn::Decoder& b) {
  auto pa = a.parameters();
  auto pb = b.parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i]->name, pb[i]->name);
    EXPECT_TRUE(same_bytes(pa[i]->value, pb[i]->value)) << pa[i]->name;
  }
}

}  // namespace fd::engine::testing
