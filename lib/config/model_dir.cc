#include "lib/config/model_dir.h"

#include "lib/base/error.h"

namespace fd::config {

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

}  // namespace fd::config
