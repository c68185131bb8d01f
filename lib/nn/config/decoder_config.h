// DecoderConfig: the one decoder-only transformer fdtrain knows, as a
// configuration (docs/DESIGN.md, decision 12). GPT-2, Llama 2/3, Mistral,
// SmolLM and Qwen2/3 are the same stack of blocks
//   x += o_proj(attention(norm_1(x)));  x += mlp(norm_2(x))
// with switches for the norm, the positions, the attention's biases and
// q/k norm, the MLP and the head. The family (model_type) names where a
// configuration came from and which Hugging Face tensor names it uses; the
// switches alone decide the computation.
//
// A DecoderConfig is a plain value: read_hf_config (hf_config.h) fills one
// from a Hugging Face config.json, the recipe's model section another;
// validate() refuses inconsistent ones. nn::Decoder (decoder.h) builds the
// model. GptConfig is the GPT-2 shorthand (n_layer, n_head, d_model, ...)
// that gpt2_config expands.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fd::nn {

// GPT-2 by its five numbers (the recipe's and tests' shorthand): LayerNorm,
// learned positions, biased attention, GELU-tanh MLP of 4 * d_model, tied head.
struct GptConfig {
  int n_layer = 4;
  int n_head = 4;
  int d_model = 128;
  int vocab_size = 256;
  int max_seq_len = 256;
};

// Where a configuration came from: the Hugging Face model_type.
enum class ModelFamily { kGpt2, kLlama, kMistral, kQwen2, kQwen3 };
enum class NormKind {
  kLayerNorm,  // (x - mean) / sqrt(var + eps) * w + b (GPT-2)
  kRmsNorm,    // x * rsqrt(mean(x^2) + eps) * w, computed in fp32 (Llama family)
};
enum class PositionKind {
  kLearned,  // a (max_position_embeddings, hidden) table added to the embeddings (GPT-2)
  kRope,     // rotary embeddings on q and k, "rotate_half" pairing of i and i + head_dim/2
};
enum class RopeScalingKind {
  kDefault,  // inv_freq[i] = theta^(-2i/head_dim), unscaled
  kLinear,   // positions divided by factor (all frequencies divided by factor)
  kLlama3,   // Llama 3.1's frequency-dependent scaling (docs/REFERENCE.md)
};
enum class MlpKind {
  kGeluTanh,  // c_proj(gelu_tanh(c_fc(x))) (GPT-2's gelu_new)
  kSwiGlu,    // down(silu(gate(x)) * up(x)) (Llama family)
};

// The Hugging Face model_type of each family ("gpt2", "llama", ...).
const char* family_name(ModelFamily family);

// The LoRA target names a recipe may write for a family, with the block
// modules each names: GPT-2 c_attn, c_proj (both projections, as PEFT's
// suffix matching), attn.c_proj, c_fc, mlp.c_proj; the Llama family q_proj,
// k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; both all-linear
// (`modules` empty: every linear layer of a block).
struct LoraTarget {
  const char* name;
  std::vector<const char*> modules;
};
const std::vector<LoraTarget>& lora_targets(ModelFamily family);
std::vector<std::string> lora_target_names(ModelFamily family);

struct RopeScaling {
  RopeScalingKind kind = RopeScalingKind::kDefault;
  double factor = 1.0;            // linear, llama3: how much longer the context gets
  double low_freq_factor = 1.0;   // llama3: wavelengths above orig / low are divided by factor
  double high_freq_factor = 4.0;  // llama3: wavelengths below orig / high are kept
  int64_t original_max_position_embeddings = 0;  // llama3: the context trained before scaling
  bool operator==(const RopeScaling&) const = default;
};

struct DecoderConfig {
  ModelFamily family = ModelFamily::kLlama;  // model_type; decides tensor names, not math
  int64_t hidden_size = 0;                   // H: the residual stream's width
  int64_t intermediate_size = 0;             // I: the MLP's inner width
  int num_layers = 0;                        // L: blocks
  int num_heads = 0;                         // nH: query heads
  int num_kv_heads = 0;    // nKV: key/value heads; nH / nKV query heads share each (GQA)
  int head_dim = 0;        // D: per head; nH * D may differ from H (Qwen3: 16 * 128 vs 1024)
  int64_t vocab_size = 0;  // V: rows of the embedding (and of the head)
  int64_t max_position_embeddings = 0;  // learned: rows of the table; RoPE: trained context

  NormKind norm = NormKind::kRmsNorm;  // every norm in the model (two per block + final)
  double norm_eps = 1e-5;              // added to the variance / mean square

  PositionKind positions = PositionKind::kRope;
  double rope_theta = 10000.0;  // RoPE base
  RopeScaling rope_scaling;     // RoPE only

  bool attention_bias = false;  // q, k, v projections have biases (GPT-2, Qwen2)
  bool o_proj_bias = false;     // the output projection has a bias (GPT-2)
  bool qk_norm = false;         // RMSNorm over each head of q and k before RoPE (Qwen3)

  MlpKind mlp = MlpKind::kSwiGlu;
  bool mlp_bias = false;  // the MLP's linear layers have biases (GPT-2)

  bool tie_word_embeddings = false;  // the lm head reuses the embedding matrix

  std::optional<int64_t> bos_token_id;  // none: the model has no BOS token
  std::vector<int64_t> eos_token_ids;   // generation stops at any of these; may be empty

  // Parameters of the model: embeddings (+ learned positions), per block the
  // two norms, q/k/v/o (+ biases, + q/k norms) and the MLP, the final norm,
  // and the lm head unless tied. Checked against published counts in
  // tests/nn/hf_config_test.cc (GPT-2 124,439,808; Llama-3.2-1B 1,235,814,400).
  int64_t num_params() const;
  // Training FLOPs per token, forward + backward: 6 N + 12 L T nH D (nanoGPT/PaLM), with N
  // the parameters that multiply (an untied input embedding is a lookup: not counted).
  double flops_per_token(int seq_len) const;
  // One line for logs: "GPT-2 L4 H4 C128 V256 T256" or
  // "llama L6 hidden 512 heads 8 (kv 2) head_dim 64 I1408 V32000 T2048".
  std::string summary() const;

  // Throws fd::Error(kUsage) naming the first inconsistent field: sizes not
  // positive, num_kv_heads not dividing num_heads, an odd head_dim with RoPE,
  // a RoPE scaling without a usable factor, a GPT-2 whose heads do not tile
  // hidden_size (its fused c_attn is (H, 3H)), ...
  void validate() const;

  // Field by field (doubles exactly).
  bool operator==(const DecoderConfig&) const = default;
};

// Tensor parallelism over `size` ranks (Megatron-LM's layout, nn::Decoder): the query heads,
// the MLP's inner width and the vocabulary split over the ranks; the key/value heads split when
// `size` divides them, else (when they divide `size`) every rank holds all of them and uses
// the one its query heads read. Empty when `config` can be split so, else why not, with the
// arithmetic ("12 query heads do not split over 8 ranks"), without a location or a remedy (the
// caller names the recipe's field). size 1: always empty.
std::string tensor_parallel_refusal(const DecoderConfig& config, int size);
// Whether the key/value heads are whole on every rank of a `size`-way split (GQA with fewer
// KV heads than ranks). Only meaningful when tensor_parallel_refusal(config, size) is empty.
bool kv_heads_replicated(const DecoderConfig& config, int size);

// QLoRA on a `size`-way tensor-parallel split: each rank stores its slice of every block
// linear as the whole tensor's 4-bit blocks (quantize the whole weight, keep the rank's blocks:
// nn::Decoder), which needs every slice to start and end on a block of `block_size` elements of
// the weight's [out, in] layout: a column-parallel slice's rows times in, a row-parallel slice's
// in / size features per row. Empty when they do, else which weight does not, with the
// arithmetic and the largest supported block size that fits (or none). The split itself must be
// valid (tensor_parallel_refusal empty). size 1: always empty.
std::string quantized_tensor_parallel_refusal(const DecoderConfig& config, int size,
                                              int64_t block_size);

// DeepSpeed-Ulysses over `sequence` ranks on top of a `tensor`-way split (nn::Decoder,
// SequenceParallel): each tensor-parallel rank's query heads must split over the sequence
// ranks, and its key/value heads split over them or divide them (then every one is gathered).
// Empty when they do, else why not, with the arithmetic. tensor_parallel_refusal(config, tensor)
// must be empty. sequence 1: always empty.
std::string ulysses_refusal(const DecoderConfig& config, int tensor, int sequence);

// The DecoderConfig computing what nn::Decoder computes for `config`: LayerNorm
// (eps 1e-5), learned positions, biased attention and GELU-tanh MLP (4H), tied
// head. No BOS/EOS: a GptConfig does not know its tokenizer.
DecoderConfig gpt2_config(const GptConfig& config);

}  // namespace fd::nn
