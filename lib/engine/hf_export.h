// A model as a Hugging Face model directory: `fdtrain ckpt export --hf-dir`.
//
//   OUT/config.json                 nn::hf_config_json (model_type, architectures, ...;
//                                   bos/eos ids: export_token_ids)
//   OUT/model.safetensors           or model-0000i-of-0000N.safetensors + the index
//   OUT/tokenizer.json, ...         copied from the run's data.tokenizer, else from
//                                   model.init_from when it is a directory
//
// Tensor names are the model's own parameter names, which are already Hugging
// Face's (GPT-2's file names "wte.weight", "h.0.attn.c_attn.weight"; the Llama
// family's "model.layers.0.self_attn.q_proj.weight"); a tied model has no
// lm_head.weight. The directory is staged in a fresh OUT.tmp-XXXXXX beside it
// (make_temp_dir_beside, lib/base/atomic_file.h: never a directory that was
// there before) and renamed into place (ckpt::replace_directory), so OUT is at
// every moment absent, the old directory or the complete new one: a crash
// cannot leave a config.json beside missing or partial weights. A failed
// export removes its staging directory; a crash leaves OUT.tmp-XXXXXX, which
// is safe to delete.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lib/ckpt/bnb4bit.h"
#include "lib/nn/config/hf_config.h"
#include "lib/nn/decoder.h"
#include "lib/tensor/dtype.h"
#include "lib/tensor/tensor.h"

namespace fd::engine {

// transformers' default max_shard_size, "5GB" = 5 * 10^9 bytes.
inline constexpr int64_t kDefaultMaxShardBytes = 5'000'000'000;

// --max-shard-size as transformers reads it: bytes ("1000000"), or a number
// with a unit: KB, MB, GB (powers of 10: "5GB" = 5 * 10^9) or KiB, MiB, GiB
// (powers of 2); case-insensitive. Throws fd::Error kUsage for anything else
// or a size that is not positive.
int64_t parse_shard_size(const std::string& text);

// The tokenizer and generation files copied from a Hugging Face source
// directory when present: tokenizer.json, tokenizer_config.json,
// special_tokens_map.json, tokenizer.model (SentencePiece), vocab.json and
// merges.txt (GPT-2 BPE), added_tokens.json, generation_config.json.
const std::vector<std::string>& hf_tokenizer_files();

// The model's weights under their Hugging Face names, in `dtype` (CPU, in the
// model's parameter order). A LoRA model's adapters are merged into their
// base weights by merge_lora_into (lib/tensor/lora_merge.h: float64, rounded once to fp32):
//   Linear [out, in]:  W + (alpha / r) B A
//   Conv1D (in, out):  W + (alpha / r) (B A)^T
// and the adapters themselves are not returned. A 4-bit base weight (QLoRA) is dequantized first
// (Decoder::dequantized: the values the run computed with). `model` must be on the CPU.
std::vector<std::pair<std::string, Tensor>> hf_tensors(const nn::Decoder& model, DType dtype);

struct HfExportOptions {
  DType dtype = DType::kF32;  // of the weights (torch_dtype); f32, bf16 or f16
  int64_t max_shard_bytes = kDefaultMaxShardBytes;  // per safetensors file, as transformers
  bool overwrite = false;  // replace an existing non-empty OUT (an empty one is always replaced)
  std::string tokenizer_from;  // a directory to copy hf_tokenizer_files() from; "" = none
  std::map<std::string, std::string> metadata;  // every file's "__metadata__" (plus format pt)
  // config.json's bos_token_id / eos_token_id (export_token_ids); unset: the model config's ids,
  // null where it has none.
  std::optional<nn::HfTokenIds> token_ids;
};

// The bos_token_id / eos_token_id keys `ckpt export --hf-dir` writes for a run of `model` whose
// model.init_from is `init_from` and whose tokenizer files come from `tokenizer_dir` ("" none):
//   - a Hugging Face directory: its config.json's keys as they are there (ids, a list, null, or
//     no key: transformers then reads the same ids for the export as for the source);
//   - otherwise, with a tokenizer (the run's data.tokenizer): its bos_token and eos_token
//     (tokenizer_config.json) as ids, null where it names none;
//   - otherwise GPT-2 with GPT-2's vocabulary (50257): 50256 for both (<|endoftext|>), as
//     GPT-2's own config.json;
//   - otherwise null for both: fdtrain does not know them, and a missing key would read as the
//     family's default in transformers (LlamaConfig: bos 1, eos 2; GPT2Config: 50256), ids the
//     run's vocabulary may not even have.
// A directory whose config.json can no longer be read is warned about and counts as none.
nn::HfTokenIds export_token_ids(const nn::DecoderConfig& model, const std::string& init_from,
                                const std::string& tokenizer_dir = "");

// Checks what an export to `dir` can check before reading anything: `dtype`
// is f32, bf16 or f16, max_shard_bytes > 0, and `dir` is absent, an empty
// directory, or `overwrite`. Throws fd::Error kUsage saying what to do.
void check_hf_export_dir(const std::string& dir, const HfExportOptions& options);

// Writes `model` to the Hugging Face directory `dir` as described above.
// Returns the tokenizer files copied (names only). Throws fd::Error kUsage for
// a refused `dir` or a model config.json cannot describe, kRuntime on I/O
// failure (the staging directory is then removed; `dir` is as it was).
std::vector<std::string> write_hf_model(const nn::Decoder& model, const std::string& dir,
                                        const HfExportOptions& options);

// How write_bnb4bit_model writes a QLoRA model's 4-bit base.
struct Bnb4bitExportOptions {
  // config.json's quantization_config. Its quant type and double quantization are the model's
  // (Decoder::quantization()) whatever this says; the rest is written as given.
  ckpt::BnbQuantizationConfig config;
  // Each quantized weight's blob "dtype" (the weight's dtype before quantization), by parameter
  // name; a weight not named here gets `default_blob_dtype`.
  std::map<std::string, std::string> blob_dtype;
  std::string default_blob_dtype = "bfloat16";  // as transformers spells it
  // Every tensor written (companions included) -> its shard, as write_bnb4bit_weights takes it:
  // a 4-bit base directory's own split, to write it back byte for byte; null: split by
  // HfExportOptions::max_shard_bytes.
  const std::map<std::string, size_t>* placement = nullptr;
};

// Writes the frozen base of `model`, a QLoRA model (Decoder::quantization() set), to `dir` as a
// transformers 4-bit directory (docs/QUANTIZATION.md, "Hugging Face 4-bit directories"): each
// quantized block linear exactly as the model holds it (Decoder::quantized, to_bnb4bit: nothing
// is re-quantized), every other base tensor in options.dtype, config.json = hf_config_json's
// with `q.config` as its quantization_config, tokenizer files as write_hf_model. The LoRA
// adapters are not written. The safetensors metadata is {"format": "pt"} alone, what
// save_pretrained writes (the base does not change with the step, so a step would misdescribe
// it). Staged and renamed into place as write_hf_model. Returns the tokenizer files copied.
// Throws fd::Error kUsage for a model without quantization or a refused `dir`, kRuntime on
// I/O failure.
std::vector<std::string> write_bnb4bit_model(const nn::Decoder& model, const std::string& dir,
                                             const HfExportOptions& options,
                                             const Bnb4bitExportOptions& q);

// transformers' spelling of `dtype` ("float32", "bfloat16", "float16"), as config.json's
// torch_dtype and a blob's "dtype" write it. Throws fd::Error kUsage for another dtype.
const char* torch_dtype_name(DType dtype);

}  // namespace fd::engine
