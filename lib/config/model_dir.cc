#include "lib/config/model_dir.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "lib/base/error.h"
#include "lib/base/input_file.h"
#include "lib/nn/config/hf_config.h"

namespace fd::config {
namespace {

using nlohmann::json;

// quantization_config's keys that decide what the recipe must say. lib/config does not link
// fd_ckpt: ckpt::parse_bnb_quantization_config (lib/ckpt/bnb4bit.cc) reads and checks every key
// when the weights are loaded; this reads the same keys the same way, and no more.
HfQuantization hf_quantization(const json& q, const std::string& where) {
  if (!q.is_object())
    usage_error(
        "{}: quantization_config = {}: expected an object (transformers' "
        "BitsAndBytesConfig)",
        where, q.dump());
  auto expected = [&](const char* key, const char* want) {
    usage_error("{}: quantization_config.{} = {}: expected {}", where, key, q[key].dump(), want);
  };
  auto boolean = [&](const char* key, bool dflt) {
    if (!q.contains(key)) return dflt;
    if (!q[key].is_boolean()) expected(key, "true or false");
    return q[key].get<bool>();
  };
  if (q.contains("quant_method") && q["quant_method"] != "bitsandbytes")
    usage_error(
        "{}: quantization_config.quant_method is {}: a model quantized that way cannot be "
        "read; fdtrain reads bitsandbytes 4-bit directories (load_in_4bit) as a QLoRA base; "
        "give the model in bf16/fp32 (model.quantize quantizes it) or saved with load_in_4bit",
        where, q["quant_method"].dump());
  // transformers writes both the property (load_in_8bit) and its field (_load_in_8bit).
  if (boolean("load_in_8bit", false) || boolean("_load_in_8bit", false))
    usage_error(
        "{}: quantization_config says load_in_8bit (bitsandbytes LLM.int8()): 8-bit weights "
        "cannot be read; fdtrain reads bitsandbytes 4-bit directories (load_in_4bit) as a QLoRA "
        "base; give the model in bf16/fp32 (model.quantize quantizes it) or saved with "
        "load_in_4bit",
        where);
  if (!boolean("load_in_4bit", false) && !boolean("_load_in_4bit", false))
    usage_error(
        "{}: quantization_config does not say load_in_4bit: true; fdtrain reads bitsandbytes "
        "4-bit directories only; give the model in bf16/fp32 (model.quantize quantizes it) or "
        "saved with load_in_4bit",
        where);
  HfQuantization h;
  if (q.contains("bnb_4bit_quant_type")) {
    const json& t = q["bnb_4bit_quant_type"];
    if (t == "nf4")
      h.type = QuantTypeName::kNf4;
    else if (t == "fp4")
      h.type = QuantTypeName::kFp4;
    else
      expected("bnb_4bit_quant_type", "\"nf4\" or \"fp4\" (bitsandbytes' 4-bit types)");
  }
  h.double_quant = boolean("bnb_4bit_use_double_quant", h.double_quant);
  return h;
}

}  // namespace

nn::DecoderConfig decoder_config(const ModelOptions& m) {
  if (m.arch == Arch::kGpt2)
    return nn::gpt2_config({m.n_layer, m.n_head, m.d_model, m.vocab_size, m.max_seq_len});
  nn::DecoderConfig c;
  c.family = m.arch == Arch::kLlama     ? nn::ModelFamily::kLlama
             : m.arch == Arch::kMistral ? nn::ModelFamily::kMistral
             : m.arch == Arch::kQwen2   ? nn::ModelFamily::kQwen2
                                        : nn::ModelFamily::kQwen3;
  c.hidden_size = m.d_model;
  c.intermediate_size = m.d_ff;
  c.num_layers = m.n_layer;
  c.num_heads = m.n_head;
  c.num_kv_heads = m.n_kv_head;
  c.head_dim = m.head_dim;
  c.vocab_size = m.vocab_size;
  c.max_position_embeddings = m.max_seq_len;
  c.norm = nn::NormKind::kRmsNorm;
  c.norm_eps = m.norm_eps;
  c.positions = nn::PositionKind::kRope;
  c.rope_theta = m.rope_theta;
  c.rope_scaling.kind = m.rope_scaling == RopeScalingName::kLinear   ? nn::RopeScalingKind::kLinear
                        : m.rope_scaling == RopeScalingName::kLlama3 ? nn::RopeScalingKind::kLlama3
                                                                     : nn::RopeScalingKind::kDefault;
  c.rope_scaling.factor = m.rope_factor;
  c.rope_scaling.low_freq_factor = m.rope_low_freq_factor;
  c.rope_scaling.high_freq_factor = m.rope_high_freq_factor;
  c.rope_scaling.original_max_position_embeddings = m.rope_original_max_seq_len;
  c.attention_bias = m.attention_bias;
  c.o_proj_bias = m.attention_bias && m.arch != Arch::kQwen2;
  c.mlp_bias = m.mlp_bias;
  c.qk_norm = m.qk_norm;
  c.mlp = nn::MlpKind::kSwiGlu;
  c.tie_word_embeddings = m.tie_embeddings;
  return c;
}

ModelOptions model_options(const nn::DecoderConfig& c, const std::string& where) {
  auto refuse = [&](const std::string& what) {
    usage_error("{}: {}; fdtrain recipes cannot state this model", where, what);
  };
  auto narrow = [&](int64_t v, const char* field) {
    if (v > INT32_MAX) refuse(fmt::format("{} {} is too large", field, v));
    return int(v);
  };
  ModelOptions m;
  m.n_layer = c.num_layers;
  m.n_head = c.num_heads;
  m.d_model = narrow(c.hidden_size, "hidden_size");
  m.vocab_size = narrow(c.vocab_size, "vocab_size");
  m.max_seq_len = narrow(c.max_position_embeddings, "max_position_embeddings");
  if (c.family == nn::ModelFamily::kGpt2) {
    m.arch = Arch::kGpt2;
    if (c.intermediate_size != 4 * c.hidden_size)
      refuse(fmt::format("a gpt2 model with n_inner {} (fdtrain's GPT-2 MLP is 4 x n_embd = {})",
                         c.intermediate_size, 4 * c.hidden_size));
    if (!c.tie_word_embeddings)
      refuse("a gpt2 model with tie_word_embeddings false (fdtrain's GPT-2 ties its head to wte)");
    if (c.norm_eps != 1e-5)
      refuse(fmt::format("a gpt2 model with layer_norm_epsilon {} (fdtrain's GPT-2 uses 1e-5)",
                         c.norm_eps));
    return m;
  }
  switch (c.family) {
    case nn::ModelFamily::kLlama:
      m.arch = Arch::kLlama;
      break;
    case nn::ModelFamily::kMistral:
      m.arch = Arch::kMistral;
      break;
    case nn::ModelFamily::kQwen2:
      m.arch = Arch::kQwen2;
      break;
    default:
      m.arch = Arch::kQwen3;
      break;
  }
  m.n_kv_head = c.num_kv_heads;
  m.head_dim = c.head_dim;
  m.d_ff = narrow(c.intermediate_size, "intermediate_size");
  m.norm_eps = c.norm_eps;
  m.rope_theta = c.rope_theta;
  m.rope_scaling = c.rope_scaling.kind == nn::RopeScalingKind::kLinear   ? RopeScalingName::kLinear
                   : c.rope_scaling.kind == nn::RopeScalingKind::kLlama3 ? RopeScalingName::kLlama3
                                                                          : RopeScalingName::kNone;
  if (m.rope_scaling != RopeScalingName::kNone) {
    m.rope_factor = c.rope_scaling.factor;
    if (m.rope_scaling == RopeScalingName::kLlama3) {
      m.rope_low_freq_factor = c.rope_scaling.low_freq_factor;
      m.rope_high_freq_factor = c.rope_scaling.high_freq_factor;
      m.rope_original_max_seq_len = narrow(c.rope_scaling.original_max_position_embeddings,
                                           "original_max_position_embeddings");
    }
  }
  m.tie_embeddings = c.tie_word_embeddings;
  m.attention_bias = c.attention_bias;
  m.mlp_bias = c.mlp_bias;
  m.qk_norm = c.qk_norm;
  if (c.mlp_bias && m.arch != Arch::kLlama) refuse("mlp_bias outside a llama model");
  if (c.o_proj_bias != (c.attention_bias && m.arch != Arch::kQwen2))
    refuse("an o_proj bias that does not follow attention_bias");
  return m;
}

ModelDirectory read_model_directory(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  std::error_code ec;
  ModelDirectory d;
  // Without the file, nn::read_hf_config words the refusal.
  if (!std::filesystem::exists(path, ec)) {
    d.model = model_options(nn::read_hf_config(dir), path);
    return d;
  }
  std::string text = read_input_file(path, "the model's config.json");
  json j;
  // Text that is not a JSON object: nn::parse_hf_config names the line and column.
  if (try_parse_json(text, j).empty() && j.is_object() && j.contains("quantization_config")) {
    d.quantization = hf_quantization(j["quantization_config"], path);
    j.erase("quantization_config");
    text = j.dump(2);
  }
  d.model = model_options(nn::parse_hf_config(text, path), path);
  return d;
}

}  // namespace fd::config
