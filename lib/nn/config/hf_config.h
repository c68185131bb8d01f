// Reading a Hugging Face config.json into a DecoderConfig, and writing one.
//
// Supported model_type: gpt2, llama, mistral, qwen2, qwen3. Every key of the
// file is either read, checked to have the one value fdtrain implements
// (pretraining_tp 1, attention_dropout 0, use_sliding_window false, ...), or on
// an explicit list of keys that only matter to the transformers runtime
// (torch_dtype, architectures, use_cache, ...). Anything else is refused:
// an unknown key may change the model, and fdtrain never silently ignores
// one (docs/DESIGN.md, decision 12).
#pragma once

#include <optional>
#include <string>

#include "lib/nn/config/decoder_config.h"

namespace fd::nn {

// Reads `dir_or_file` (a model directory holding config.json, or the file
// itself) and returns the validated configuration. Throws fd::Error(kUsage)
// naming the file, the field and its value, and what fdtrain supports, for: a
// missing file, a directory or FIFO in its place, a malformed file (line and
// column), an unsupported model_type, hidden_act or rope type, sliding-window
// attention turned on, a missing required field, a field of the wrong type or
// out of its range (every integer is checked to fit its type and its meaning
// before use, e.g. num_hidden_layers in [1, 4096], vocab_size and positions
// 32-bit, bos/eos ids below vocab_size, also in lists; every number finite,
// positive and bounded), a model of more than 2^40 parameters, an unknown key,
// a quantization_config (a quantized model: config::read_model_directory reads a
// bitsandbytes 4-bit directory's without it), and an inconsistent model
// (DecoderConfig::validate).
DecoderConfig read_hf_config(const std::string& dir_or_file);

// As read_hf_config, from JSON text; `where` names the source in messages.
DecoderConfig parse_hf_config(const std::string& json_text, const std::string& where);

// The config.json text transformers would write for `config` (save_pretrained:
// keys sorted, 2-space indent, a final newline): model_type, architectures
// (GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
// Qwen3ForCausalLM), every field read_hf_config reads under the family's own
// key names (GPT-2: n_layer, n_head, n_embd, n_positions, n_ctx, n_inner, ...),
// hidden_act silu / activation_function gelu_new, rope_scaling (an object, or
// null when unscaled), tie_word_embeddings, bos/eos (null when unknown), and
// torch_dtype = `torch_dtype` ("float32", "bfloat16"). It is the exact inverse
// of parse_hf_config: parsing it gives back `config`, field for field, which
// this function checks. Throws fd::Error(kUsage) naming the field when
// `config` is invalid or has a switch the family's config.json cannot express
// (a Mistral with biases, a Llama whose o_proj bias differs from q/k/v's, ...).
std::string hf_config_json(const DecoderConfig& config, const std::string& torch_dtype = "float32");

// bos_token_id and eos_token_id as a config.json states them: each key's JSON
// value as text ("1", "[128001, 128009]", "null"), or none when the key is
// absent. A DecoderConfig reads absent and null alike (no id), but
// transformers does not: an absent key is its config class's default
// (LlamaConfig and MistralConfig: bos 1, eos 2; GPT2Config: 50256 for both),
// null is none. Kept apart so that an export can state them as its source did.
struct HfTokenIds {
  std::optional<std::string> bos_token_id;
  std::optional<std::string> eos_token_id;
};

// The token-id keys of `dir_or_file`'s config.json as they are there, checked
// as read_hf_config checks them (bos an integer or null; eos an integer, a
// list of integers or null). Throws fd::Error(kUsage) naming the file.
HfTokenIds read_hf_token_ids(const std::string& dir_or_file);

// hf_config_json with bos_token_id and eos_token_id as `ids` states them (a
// value, null, or the key left out) instead of from `config`; the ids are
// checked as read_hf_config would check them (type, inside the vocabulary).
std::string hf_config_json(const DecoderConfig& config, const std::string& torch_dtype,
                           const HfTokenIds& ids);

}  // namespace fd::nn
