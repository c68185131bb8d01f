// Decoder::segment_specs with tensor parallelism (issue 39): for every parameter the T ranks'
// slices tile the whole tensor exactly once (each element of the global shape on one rank) and
// whole parameters are the unsharded model's on every rank; Megatron's choice of dimension per
// linear (column-parallel: output features, row-parallel: input features, GPT-2's Conv1D
// transposed), the vocabulary's uneven rows, replicated key/value heads, LoRA's split factor.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "lib/base/error.h"
#include "lib/nn/decoder.h"

namespace fd::nn {
namespace {

DecoderConfig llama() {
  DecoderConfig c;
  c.family = ModelFamily::kLlama;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.vocab_size = 37;
  c.max_position_embeddings = 64;
  c.attention_bias = true;
  return c;
}

DecoderConfig gpt2() {
  GptConfig c;
  c.n_layer = 2;
  c.n_head = 4;
  c.d_model = 32;
  c.vocab_size = 37;
  c.max_seq_len = 16;
  return gpt2_config(c);
}

std::map<std::string, ParamSpec> specs_of(const DecoderConfig& c, const LoraConfig& lora, int rank,
                                          int size) {
  std::map<std::string, ParamSpec> out;
  for (const SegmentSpec& s : Decoder::segment_specs(c, lora, TensorParallel{rank, size, nullptr}))
    for (const ParamSpec& p : s.params) out.emplace(p.name, p);
  return out;
}

// Every element of every whole tensor held by exactly one rank (whole parameters: by every rank,
// with the unsharded shape).
void check_tiling(const DecoderConfig& c, const LoraConfig& lora, int T) {
  SCOPED_TRACE(std::string(family_name(c.family)) + " T=" + std::to_string(T));
  const std::map<std::string, ParamSpec> one = specs_of(c, lora, 0, 1);
  std::map<std::string, std::multiset<int64_t>> held;
  for (int r = 0; r < T; ++r) {
    const std::map<std::string, ParamSpec> mine = specs_of(c, lora, r, T);
    ASSERT_EQ(mine.size(), one.size());
    for (const auto& [name, spec] : mine) {
      const ParamSpec& whole = one.at(name);
      if (spec.slice.whole()) {
        EXPECT_EQ(spec.shape, whole.shape) << name;
        continue;
      }
      Parameter p;
      p.name = name;
      p.value = Tensor::released(spec.shape, DType::kF32, MemCategory::kOther, Device::cpu());
      p.slice = spec.slice;
      EXPECT_EQ(p.global_shape(), whole.shape) << name;
      for_each_global_run(p, 0, spec.shape.numel(), [&](int64_t g, int64_t, int64_t n) {
        for (int64_t i = 0; i < n; ++i) held[name].insert(g + i);
      });
    }
  }
  for (const auto& [name, elems] : held) {
    const int64_t n = one.at(name).shape.numel();
    EXPECT_EQ(int64_t(elems.size()), n) << name;
    EXPECT_EQ(int64_t(std::set<int64_t>(elems.begin(), elems.end()).size()), n)
        << name << ": an element on two ranks";
  }
}

TEST(TensorSlices, TileEveryTensor) {
  LoraConfig lora;
  lora.r = 4;
  lora.alpha = 4;
  for (const DecoderConfig& c : {llama(), gpt2()}) {
    lora.modules.clear();
    for (const LinearShape& l : block_linears(c)) lora.modules.push_back(l.module);
    for (int T : {2, 4}) {
      check_tiling(c, {}, T);
      check_tiling(c, lora, T);
    }
  }
}

TEST(TensorSlices, MegatronDimensions) {
  const std::map<std::string, ParamSpec> l = specs_of(llama(), {}, 1, 2);
  const auto at = [&](const std::string& n) { return l.at("model.layers.0." + n); };
  EXPECT_EQ(at("self_attn.q_proj.weight").shape, (Shape{16, 32}));  // [out/T, in]
  EXPECT_EQ(at("self_attn.q_proj.weight").slice, (TensorSlice{0, 16, 32, 1}));
  EXPECT_EQ(at("self_attn.q_proj.bias").slice, (TensorSlice{0, 16, 32, 1}));
  EXPECT_EQ(at("self_attn.k_proj.weight").shape, (Shape{8, 32}));               // 1 of 2 kv heads
  EXPECT_EQ(at("self_attn.o_proj.weight").slice, (TensorSlice{1, 16, 32, 1}));  // [out, in/T]
  EXPECT_EQ(at("mlp.gate_proj.weight").shape, (Shape{24, 32}));
  EXPECT_EQ(at("mlp.down_proj.weight").shape, (Shape{32, 24}));
  EXPECT_TRUE(at("input_layernorm.weight").slice.whole());
  // Vocabulary rows 37 over 2: 19 + 18, rank 1 from row 19.
  EXPECT_EQ(l.at("model.embed_tokens.weight").shape, (Shape{18, 32}));
  EXPECT_EQ(l.at("model.embed_tokens.weight").slice, (TensorSlice{0, 19, 37, 1}));
  EXPECT_EQ(l.at("lm_head.weight").slice, (TensorSlice{0, 19, 37, 1}));
  // 2 kv heads over 4 ranks: whole on every rank.
  const std::map<std::string, ParamSpec> l4 = specs_of(llama(), {}, 3, 4);
  EXPECT_TRUE(l4.at("model.layers.1.self_attn.v_proj.weight").slice.whole());
  EXPECT_EQ(l4.at("model.layers.1.self_attn.q_proj.weight").shape, (Shape{8, 32}));
  // GPT-2's Conv1D (in, out): c_attn's q | k | v each split alike, c_proj by its input rows.
  const std::map<std::string, ParamSpec> g = specs_of(gpt2(), {}, 1, 2);
  EXPECT_EQ(g.at("h.0.attn.c_attn.weight").shape, (Shape{32, 48}));
  EXPECT_EQ(g.at("h.0.attn.c_attn.weight").slice, (TensorSlice{1, 16, 32, 3}));
  EXPECT_EQ(g.at("h.0.attn.c_attn.bias").slice, (TensorSlice{0, 16, 32, 3}));
  EXPECT_EQ(g.at("h.0.attn.c_proj.weight").slice, (TensorSlice{0, 16, 32, 1}));
  EXPECT_TRUE(g.at("h.0.attn.c_proj.bias").slice.whole());
  EXPECT_TRUE(g.at("wpe.weight").slice.whole());
}

TEST(TensorSlices, RefusalArithmetic) {
  EXPECT_EQ(tensor_parallel_refusal(llama(), 3),
            "4 query heads do not split over 3 ranks (4 % 3 = 1)");
  DecoderConfig c = llama();
  c.num_heads = 6;
  c.num_kv_heads = 3;
  EXPECT_EQ(tensor_parallel_refusal(c, 2),
            "3 key/value heads neither split over 2 ranks nor divide them (each rank's 3 query "
            "heads would read parts of different key/value heads)");
  c = llama();
  c.intermediate_size = 50;
  EXPECT_EQ(tensor_parallel_refusal(c, 4),
            "the MLP's inner width 50 does not split over 4 ranks (50 % 4 = 2)");
  EXPECT_EQ(tensor_parallel_refusal(llama(), 1), "");
  EXPECT_TRUE(kv_heads_replicated(llama(), 4));
  EXPECT_FALSE(kv_heads_replicated(llama(), 2));
}

}  // namespace
}  // namespace fd::nn
