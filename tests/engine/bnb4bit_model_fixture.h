// A transformers 4-bit directory of a tiny Llama and its dequantized twin,
// for the tests that load a 4-bit directory into a model (WeightsSource, the
// QLoRA base) and for shell tests (tests/engine/make_bnb4bit_model.cc).
//
// The 4-bit directory is what transformers' save_pretrained writes for a
// model loaded with load_in_4bit: every linear of the decoder blocks
// (q/k/v/o, gate/up/down) quantized by lib/quant from random fp32 weights
// (blob dtype "float32"), embeddings, norms and lm_head stored in bf16,
// config.json with its quantization_config. The twin is a plain Hugging
// Face directory of the same model in fp32 (no quantization_config) whose
// every tensor is exactly what the 4-bit one stands for: the dequantized
// values of each quantized weight, the bf16 values of the rest widened.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "lib/base/atomic_file.h"
#include "lib/ckpt/bnb4bit.h"
#include "lib/ckpt/hf_dir.h"
#include "lib/engine/quant_io.h"
#include "lib/nn/config/hf_config.h"
#include "lib/quant/quantize.h"
#include "lib/tensor/tensor.h"
#include "tests/ckpt/bnb4bit_fixture.h"

namespace fd::engine::testing {

// A tiny Llama (ckpt's 4-bit fixture's): gate/up/down of 288 x 64 have 288 blocks of 64 (two
// nested blocks of 256); blocks of 128 end the 18432 elements evenly, 4096 not.
inline nn::DecoderConfig bnb4bit_tiny_llama() { return ckpt::testing::tiny_llama(); }

struct Bnb4bitModel {
  nn::DecoderConfig config;
  quant::QuantOptions options;
  std::vector<std::string> order;                         // the state dict's order
  std::map<std::string, quant::Quantized4bit> quantized;  // by weight name (P.weight)
  std::map<std::string, Tensor> plain;                    // bf16, as stored
  std::map<std::string, Tensor> twin;  // every tensor, fp32, as the twin holds it
};

namespace detail {

inline void write_text(const std::string& path, const std::string& text) {
  const std::string failed = write_file_atomically(path, text, path + ".tmp");
  if (!failed.empty()) throw std::runtime_error(failed);
}

// fp32 values scale * N(0, 1) (+ mean), deterministic per name and seed.
inline std::vector<float> normal_values(const std::string& name, int64_t n, uint32_t seed,
                                        float scale, float mean) {
  std::mt19937 rng(uint32_t(std::hash<std::string>{}(name)) ^ seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = mean + scale * normal(rng);
  return v;
}

}  // namespace detail

// Writes the 4-bit directory `dir` (one model.safetensors, or shards of at most
// max_shard_bytes split in state-dict order as transformers splits them) and, unless
// twin_dir is empty, the dequantized fp32 twin `twin_dir`; returns what they hold.
inline Bnb4bitModel make_bnb4bit_model(const std::string& dir, const std::string& twin_dir,
                                       const quant::QuantOptions& options, uint32_t seed = 0,
                                       int64_t max_shard_bytes = int64_t(1) << 30) {
  Bnb4bitModel m;
  m.config = bnb4bit_tiny_llama();
  m.options = options;
  const nn::DecoderConfig& c = m.config;
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  const int64_t q_out = int64_t(c.num_heads) * c.head_dim;
  const int64_t kv_out = int64_t(c.num_kv_heads) * c.head_dim;
  auto plain = [&](const std::string& name, Shape shape, float mean = 0.0f) {
    std::vector<float> v = detail::normal_values(name, shape.numel(), seed, 0.02f, mean);
    Tensor bf16 = Tensor::from_vector(v, shape, DType::kF32, MemCategory::kOther)
                      .to(DType::kBF16, MemCategory::kOther);
    m.plain[name] = bf16;
    m.twin[name] = bf16.to(DType::kF32, MemCategory::kOther);  // exact
    m.order.push_back(name);
  };
  auto linear = [&](const std::string& name, int64_t out, int64_t in) {
    std::vector<float> v = detail::normal_values(name, out * in, seed, 0.05f, 0.0f);
    m.quantized[name] = quant::quantize(v, {out, in}, options, name);
    m.twin[name] = quant::dequantize(m.quantized[name], DType::kF32);
    m.order.push_back(name);
  };
  plain("model.embed_tokens.weight", Shape{c.vocab_size, H});
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    linear(p + "self_attn.q_proj.weight", q_out, H);
    linear(p + "self_attn.k_proj.weight", kv_out, H);
    linear(p + "self_attn.v_proj.weight", kv_out, H);
    linear(p + "self_attn.o_proj.weight", H, q_out);
    linear(p + "mlp.gate_proj.weight", I, H);
    linear(p + "mlp.up_proj.weight", I, H);
    linear(p + "mlp.down_proj.weight", H, I);
    plain(p + "input_layernorm.weight", Shape{H}, 1.0f);
    plain(p + "post_attention_layernorm.weight", Shape{H}, 1.0f);
  }
  plain("model.norm.weight", Shape{H}, 1.0f);
  plain("lm_head.weight", Shape{c.vocab_size, H});

  std::filesystem::create_directories(dir);
  std::map<std::string, ckpt::Bnb4bitWeight> stored;
  std::vector<ckpt::Bnb4bitEntry> entries;
  for (const std::string& name : m.order) {
    if (m.plain.count(name)) {
      entries.emplace_back(name, m.plain.at(name));
    } else {
      stored[name] = to_bnb4bit(m.quantized.at(name), "float32");
      entries.emplace_back(name, &stored.at(name));
    }
  }
  ckpt::write_bnb4bit_weights(dir, entries, {{"format", "pt"}}, max_shard_bytes);
  ckpt::BnbQuantizationConfig q;
  q.quant_type = std::string(quant::quant_type_name(options.type));
  q.double_quant = options.double_quant;
  q.compute_dtype = "bfloat16";
  detail::write_text(dir + "/config.json",
                     ckpt::bnb4bit_config_json(nn::hf_config_json(c, "bfloat16"), q));

  if (!twin_dir.empty()) {
    std::filesystem::create_directories(twin_dir);
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const std::string& name : m.order) tensors.emplace_back(name, m.twin.at(name));
    ckpt::write_hf_weights(twin_dir, tensors, {{"format", "pt"}}, int64_t(1) << 30);
    detail::write_text(twin_dir + "/config.json", nn::hf_config_json(c, "float32"));
  }
  return m;
}

}  // namespace fd::engine::testing
