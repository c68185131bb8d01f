#include "lib/nn/config/decoder_config.h"

#include <fmt/format.h>

#include <string>
#include <vector>

#include "lib/base/error.h"

namespace fd::nn {

const char* family_name(ModelFamily family) {
  switch (family) {
    case ModelFamily::kGpt2:
      return "gpt2";
    case ModelFamily::kLlama:
      return "llama";
    case ModelFamily::kMistral:
      return "mistral";
    case ModelFamily::kQwen2:
      return "qwen2";
    case ModelFamily::kQwen3:
      return "qwen3";
  }
  return "?";
}

const std::vector<LoraTarget>& lora_targets(ModelFamily f) {
  static const std::vector<LoraTarget> gpt2 = {
      {"c_attn", {"attn.c_attn"}},      {"c_proj", {"attn.c_proj", "mlp.c_proj"}},
      {"attn.c_proj", {"attn.c_proj"}}, {"c_fc", {"mlp.c_fc"}},
      {"mlp.c_proj", {"mlp.c_proj"}},   {"all-linear", {}}};
  static const std::vector<LoraTarget> llama = {
      {"q_proj", {"self_attn.q_proj"}}, {"k_proj", {"self_attn.k_proj"}},
      {"v_proj", {"self_attn.v_proj"}}, {"o_proj", {"self_attn.o_proj"}},
      {"gate_proj", {"mlp.gate_proj"}}, {"up_proj", {"mlp.up_proj"}},
      {"down_proj", {"mlp.down_proj"}}, {"all-linear", {}}};
  return f == ModelFamily::kGpt2 ? gpt2 : llama;
}

std::vector<std::string> lora_target_names(ModelFamily family) {
  std::vector<std::string> out;
  for (const LoraTarget& t : lora_targets(family)) out.emplace_back(t.name);
  return out;
}

int64_t DecoderConfig::num_params() const {
  const int64_t H = hidden_size, I = intermediate_size, V = vocab_size, D = head_dim;
  const int64_t q_out = int64_t{num_heads} * D, kv_out = int64_t{num_kv_heads} * D;
  const int64_t norm_params = norm == NormKind::kLayerNorm ? 2 * H : H;  // weight (+ bias)

  int64_t attn = H * q_out + 2 * H * kv_out + q_out * H;  // q, k, v, o weights
  if (attention_bias) attn += q_out + 2 * kv_out;
  if (o_proj_bias) attn += H;
  if (qk_norm) attn += 2 * D;

  int64_t mlp_params = 0;
  if (mlp == MlpKind::kSwiGlu) {
    mlp_params = 3 * H * I;  // gate, up (I, H); down (H, I)
    if (mlp_bias) mlp_params += 2 * I + H;
  } else {
    mlp_params = 2 * H * I;  // c_fc (H, I); c_proj (I, H)
    if (mlp_bias) mlp_params += I + H;
  }

  int64_t total = V * H;  // token embedding
  if (positions == PositionKind::kLearned) total += max_position_embeddings * H;
  total += int64_t{num_layers} * (2 * norm_params + attn + mlp_params);
  total += norm_params;  // final norm
  if (!tie_word_embeddings) total += V * H;
  return total;
}

double DecoderConfig::flops_per_token(int seq_len) const {
  const int64_t lookup_only = tie_word_embeddings ? 0 : vocab_size * hidden_size;
  return 6.0 * double(num_params() - lookup_only) +
         12.0 * num_layers * double(seq_len) * double(int64_t{num_heads} * head_dim);
}

std::string DecoderConfig::summary() const {
  if (family == ModelFamily::kGpt2)
    return fmt::format("GPT-2 L{} H{} C{} V{} T{}", num_layers, num_heads, hidden_size, vocab_size,
                       max_position_embeddings);
  return fmt::format("{} L{} hidden {} heads {} (kv {}) head_dim {} I{} V{} T{}{}",
                     family_name(family), num_layers, hidden_size, num_heads, num_kv_heads,
                     head_dim, intermediate_size, vocab_size, max_position_embeddings,
                     tie_word_embeddings ? ", tied head" : "");
}

void DecoderConfig::validate() const {
  const char* fam = family_name(family);
  auto positive = [&](const char* field, int64_t v) {
    if (v <= 0) usage_error("{} config: {} is {}; it must be positive", fam, field, v);
  };
  positive("hidden_size", hidden_size);
  positive("intermediate_size", intermediate_size);
  positive("num_layers", num_layers);
  positive("num_heads", num_heads);
  positive("num_kv_heads", num_kv_heads);
  positive("head_dim", head_dim);
  positive("vocab_size", vocab_size);
  positive("max_position_embeddings", max_position_embeddings);
  if (num_heads % num_kv_heads != 0)
    usage_error(
        "{} config: num_kv_heads ({}) does not divide num_heads ({}); each key/value head "
        "must serve the same number of query heads",
        fam, num_kv_heads, num_heads);
  if (!(norm_eps > 0.0))
    usage_error("{} config: norm eps is {}; it must be positive", fam, norm_eps);
  if (family == ModelFamily::kGpt2 && int64_t{num_heads} * head_dim != hidden_size)
    usage_error(
        "gpt2 config: num_heads ({}) x head_dim ({}) is not hidden_size ({}); GPT-2's fused "
        "c_attn needs heads that tile hidden_size",
        num_heads, head_dim, hidden_size);
  if (family == ModelFamily::kGpt2 && num_kv_heads != num_heads)
    usage_error("gpt2 config: num_kv_heads ({}) must equal num_heads ({}); GPT-2 has no GQA",
                num_kv_heads, num_heads);
  for (int64_t id : eos_token_ids)
    if (id < 0 || id >= vocab_size)
      usage_error("{} config: eos token id {} is outside the vocabulary (vocab_size {})", fam, id,
                  vocab_size);
  if (bos_token_id && (*bos_token_id < 0 || *bos_token_id >= vocab_size))
    usage_error("{} config: bos token id {} is outside the vocabulary (vocab_size {})", fam,
                *bos_token_id, vocab_size);
  if (positions != PositionKind::kRope) return;

  if (head_dim % 2 != 0)
    usage_error("{} config: head_dim is {}; RoPE rotates pairs, so it must be even", fam, head_dim);
  if (!(rope_theta > 0.0))
    usage_error("{} config: rope_theta is {}; it must be positive", fam, rope_theta);
  const RopeScaling& s = rope_scaling;
  if (s.kind == RopeScalingKind::kDefault) return;
  if (!(s.factor > 0.0))
    usage_error("{} config: rope_scaling factor is {}; it must be positive", fam, s.factor);
  if (s.kind != RopeScalingKind::kLlama3) return;
  if (s.original_max_position_embeddings <= 0)
    usage_error(
        "{} config: rope_scaling original_max_position_embeddings is {}; llama3 scaling needs "
        "the context it was trained at",
        fam, s.original_max_position_embeddings);
  if (!(s.low_freq_factor > 0.0) || !(s.high_freq_factor > s.low_freq_factor))
    usage_error(
        "{} config: rope_scaling low_freq_factor {} / high_freq_factor {}; llama3 scaling needs "
        "0 < low_freq_factor < high_freq_factor",
        fam, s.low_freq_factor, s.high_freq_factor);
}

DecoderConfig gpt2_config(const GptConfig& config) {
  DecoderConfig c;
  c.family = ModelFamily::kGpt2;
  c.hidden_size = config.d_model;
  c.intermediate_size = 4 * int64_t{config.d_model};
  c.num_layers = config.n_layer;
  c.num_heads = config.n_head;
  c.num_kv_heads = config.n_head;
  c.head_dim = config.n_head > 0 ? config.d_model / config.n_head : 0;
  c.vocab_size = config.vocab_size;
  c.max_position_embeddings = config.max_seq_len;
  c.norm = NormKind::kLayerNorm;
  c.norm_eps = 1e-5;
  c.positions = PositionKind::kLearned;
  c.attention_bias = true;
  c.o_proj_bias = true;
  c.mlp = MlpKind::kGeluTanh;
  c.mlp_bias = true;
  c.tie_word_embeddings = true;
  return c;
}

std::string tensor_parallel_refusal(const DecoderConfig& c, int T) {
  if (T <= 1) return {};
  if (c.num_heads % T != 0)
    return fmt::format("{} query heads do not split over {} ranks ({} % {} = {})", c.num_heads, T,
                       c.num_heads, T, c.num_heads % T);
  if (c.num_kv_heads % T != 0 && T % c.num_kv_heads != 0)
    return fmt::format(
        "{} key/value heads neither split over {} ranks nor divide them (each rank's {} query "
        "heads would read parts of different key/value heads)",
        c.num_kv_heads, T, c.num_heads / T);
  if (c.intermediate_size % T != 0)
    return fmt::format("the MLP's inner width {} does not split over {} ranks ({} % {} = {})",
                       c.intermediate_size, T, c.intermediate_size, T, c.intermediate_size % T);
  if (c.vocab_size < T)
    return fmt::format("a vocabulary of {} does not split over {} ranks", c.vocab_size, T);
  return {};
}

namespace {

// A split weight of a block in the 4-bit layout [out, in]: `column` splits the rows (`parts`
// equal parts, each split over the ranks: GPT-2's fused q | k | v), else the input features.
struct SplitWeight {
  const char* module;
  int64_t out, in;
  bool column;
  int parts = 1;
};

// Why `w`'s slices over T ranks do not fall on blocks of `bs` elements, or empty.
std::string block_misfit(const SplitWeight& w, int T, int64_t bs) {
  if (w.column) {
    // Rank t's rows of part b start at (b * part + t * rows) * in; all such are multiples of bs
    // exactly when one rank's run of rows * in elements is.
    const int64_t rows = w.out / w.parts / T, run = rows * w.in;
    if (run % bs == 0) return {};
    return fmt::format(
        "{} (column-parallel, [{}, {}]) gives each rank {} rows x {} = {} "
        "elements per part, not a multiple of {} ({} % {} = {})",
        w.module, w.out, w.in, rows, w.in, run, bs, run, bs, run % bs);
  }
  const int64_t cols = w.in / T;  // each row: rank t's features [t * cols, (t + 1) * cols)
  if (cols % bs == 0) return {};
  return fmt::format(
      "{} (row-parallel, [{}, {}]) gives each rank {} input features per row, "
      "not a multiple of {} ({} % {} = {})",
      w.module, w.out, w.in, cols, bs, cols, bs, cols % bs);
}

std::vector<SplitWeight> split_weights(const DecoderConfig& c, int T) {
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  if (c.family == ModelFamily::kGpt2)
    return {{"attn.c_attn", 3 * H, H, true, 3},
            {"attn.c_proj", H, H, false},
            {"mlp.c_fc", I, H, true},
            {"mlp.c_proj", H, I, false}};
  const int64_t q = int64_t(c.num_heads) * c.head_dim, kv = int64_t(c.num_kv_heads) * c.head_dim;
  std::vector<SplitWeight> out = {{"self_attn.q_proj", q, H, true}};
  if (!kv_heads_replicated(c, T)) {  // replicated key/value weights are whole on every rank
    out.push_back({"self_attn.k_proj", kv, H, true});
    out.push_back({"self_attn.v_proj", kv, H, true});
  }
  out.push_back({"self_attn.o_proj", H, q, false});
  out.push_back({"mlp.gate_proj", I, H, true});
  out.push_back({"mlp.up_proj", I, H, true});
  out.push_back({"mlp.down_proj", H, I, false});
  return out;
}

}  // namespace

std::string quantized_tensor_parallel_refusal(const DecoderConfig& c, int T, int64_t block_size) {
  if (T <= 1) return {};
  const std::vector<SplitWeight> weights = split_weights(c, T);
  auto first_misfit = [&](int64_t bs) {
    for (const SplitWeight& w : weights)
      if (std::string why = block_misfit(w, T, bs); !why.empty()) return why;
    return std::string();
  };
  const std::string why = first_misfit(block_size);
  if (why.empty()) return {};
  // bitsandbytes' 4-bit block sizes (quant::kBlockSizes), largest first.
  int64_t fits = 0;
  for (int64_t bs : {4096, 2048, 1024, 512, 256, 128, 64, 32})
    if (fits == 0 && first_misfit(bs).empty()) fits = bs;
  return fmt::format("{}: a rank's slice would cut 4-bit blocks of {} elements; {}", why,
                     block_size,
                     fits > 0 ? fmt::format("the largest block size whose blocks every rank's "
                                            "slices hold whole is {}",
                                            fits)
                              : std::string("no supported block size (32 to 4096) fits these "
                                            "slices"));
}

bool kv_heads_replicated(const DecoderConfig& c, int T) { return T > 1 && c.num_kv_heads % T != 0; }

std::string ulysses_refusal(const DecoderConfig& c, int T, int S) {
  if (S <= 1) return {};
  const int hq = c.num_heads / T;
  const int hkv = kv_heads_replicated(c, T) ? 1 : c.num_kv_heads / T;
  const std::string per =
      T > 1 ? fmt::format(" (per tensor-parallel rank: {} / {})", c.num_heads, T) : "";
  if (hq % S != 0)
    return fmt::format(
        "{} query heads{} do not split over {} sequence-parallel ranks ({} % {} = {})", hq, per, S,
        hq, S, hq % S);
  if (hkv % S != 0 && S % hkv != 0)
    return fmt::format(
        "{} key/value heads{} neither split over {} sequence-parallel ranks nor divide them", hkv,
        T > 1 ? " per tensor-parallel rank" : "", S);
  return {};
}

}  // namespace fd::nn
