// A transformers-format bitsandbytes 4-bit Llama directory made by fdtrain's own
// quantizer (lib/quant), for the tests of lib/ckpt/bnb4bit.h and the slices that
// load such a directory. It is laid out as transformers' save_pretrained of a
// model loaded with load_in_4bit and torch_dtype bfloat16 writes it: every
// linear inside the decoder blocks quantized (q/k/v/o, gate/up/down), the
// embeddings, norms and lm_head in bf16, config.json with its
// quantization_config, "__metadata__" {"format": "pt"}, each file's tensors in
// safetensors' order.
#pragma once

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "lib/base/atomic_file.h"
#include "lib/ckpt/bnb4bit.h"
#include "lib/nn/config/hf_config.h"
#include "lib/quant/quantize.h"
#include "lib/tensor/tensor.h"

namespace fd::ckpt::testing {

// A tiny Llama: gate/up/down of 288 x 64 have 288 blocks of 64, so two nested blocks.
inline nn::DecoderConfig tiny_llama() {
  nn::DecoderConfig c;
  c.family = nn::ModelFamily::kLlama;
  c.hidden_size = 64;
  c.intermediate_size = 288;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 96;
  c.max_position_embeddings = 128;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  return c;
}

// lib/quant's quantized weight as the file stores it; `dtype` the weight's before quantization.
inline Bnb4bitWeight to_bnb(const quant::Quantized4bit& q, const std::string& dtype) {
  Bnb4bitWeight w;
  w.quant_type = q.type == quant::QuantType::kNF4 ? "nf4" : "fp4";
  w.block_size = q.block_size;
  w.shape = q.shape;
  w.dtype = dtype;
  w.packed = q.packed;
  w.absmax = q.absmax;
  w.quant_map = quant::quant_map(q.type);
  if (q.nested) {
    w.absmax_codes = q.nested->codes;
    Bnb4bitNested n;
    n.absmax = q.nested->absmax;
    n.offset = q.nested->offset;
    n.map = q.nested->map;
    w.nested = std::move(n);
  }
  return w;
}

// bf16 values 0.02 N(0, 1) (norm weights near 1), deterministic per name.
inline Tensor bf16_values(const std::string& name, Shape shape, float mean = 0.0f) {
  Tensor t = Tensor::empty(shape, DType::kBF16, MemCategory::kOther, Device::cpu());
  std::mt19937 rng(uint32_t(std::hash<std::string>{}(name)));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  uint16_t* p = static_cast<uint16_t*>(t.raw());
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = f32_to_bf16(mean + 0.02f * normal(rng));
  return t;
}

struct Bnb4bitFixture {
  nn::DecoderConfig config;
  BnbQuantizationConfig qconfig;
  std::vector<std::string> order;                         // the state dict's order
  std::map<std::string, quant::Quantized4bit> quantized;  // by weight name (P.weight)
  std::map<std::string, Bnb4bitWeight> stored;            // the same as the file holds it
  std::map<std::string, Tensor> plain;                    // bf16
};

// Writes the directory `dir` (config.json and the weights: one model.safetensors unless
// max_shard_bytes splits them) and returns what it holds.
inline Bnb4bitFixture make_bnb4bit_llama(const std::string& dir, const quant::QuantOptions& options,
                                         int64_t max_shard_bytes = int64_t(1) << 30) {
  Bnb4bitFixture f;
  f.config = tiny_llama();
  f.qconfig.quant_type = options.type == quant::QuantType::kNF4 ? "nf4" : "fp4";
  f.qconfig.double_quant = options.double_quant;
  f.qconfig.compute_dtype = "bfloat16";
  const int64_t H = f.config.hidden_size, I = f.config.intermediate_size;
  const int64_t q_out = int64_t(f.config.num_heads) * f.config.head_dim;
  const int64_t kv_out = int64_t(f.config.num_kv_heads) * f.config.head_dim;
  auto plain = [&](const std::string& name, Shape shape, float mean = 0.0f) {
    f.plain[name] = bf16_values(name, shape, mean);
    f.order.push_back(name);
  };
  auto linear = [&](const std::string& name, int64_t out, int64_t in) {
    Tensor w = bf16_values(name, Shape{out, in});
    f.quantized[name] = quant::quantize(w, options, name);
    f.stored[name] = to_bnb(f.quantized[name], "bfloat16");
    f.order.push_back(name);
  };
  plain("model.embed_tokens.weight", Shape{f.config.vocab_size, H});
  for (int l = 0; l < f.config.num_layers; ++l) {
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
  plain("lm_head.weight", Shape{f.config.vocab_size, H});

  std::vector<Bnb4bitEntry> entries;
  for (const std::string& name : f.order) {
    if (f.plain.count(name))
      entries.emplace_back(name, f.plain.at(name));
    else
      entries.emplace_back(name, &f.stored.at(name));
  }
  write_bnb4bit_weights(dir, entries, {{"format", "pt"}}, max_shard_bytes);
  const std::string config =
      bnb4bit_config_json(nn::hf_config_json(f.config, "bfloat16"), f.qconfig);
  const std::string path = dir + "/config.json";
  const std::string failed = write_file_atomically(path, config, path + ".tmp");
  if (!failed.empty()) throw std::runtime_error(failed);
  return f;
}

}  // namespace fd::ckpt::testing
