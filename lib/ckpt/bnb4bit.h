// bnb4bit: Hugging Face model directories saved by transformers with
// `load_in_4bit` (bitsandbytes 4-bit), read and written as a file format.
// Quantizing and dequantizing are lib/quant's; this reads and writes the
// bytes, and refuses a file whose parts disagree.
//
// Per quantized linear `P` (every linear transformers converted; the rest of
// the model, embeddings, norms, lm_head, biases, is stored as usual):
//
//   P.weight                                  U8  [(n + 1) / 2, 1]  two 4-bit codes per byte
//   P.weight.absmax                           F32 [blocks], or U8 [blocks] with double quant
//   P.weight.quant_map                        F32 [16]   the 4-bit table
//   P.weight.nested_absmax                    F32 [ceil(blocks / 256)]  (double quant)
//   P.weight.nested_quant_map                 F32 [256]  the 8-bit map   (double quant)
//   P.weight.quant_state.bitsandbytes__nf4    U8  [len]  UTF-8 JSON (or __fp4):
//     {"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [out, in],
//      "nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": 0.0123}
//
// and config.json holds `quantization_config` (BitsAndBytesConfig.to_dict()).
// The JSON blob is bitsandbytes' QuantState.as_dict(packed=True): json.dumps
// with its default separators, keys in that order, numbers as Python writes
// them. docs/QUANTIZATION.md ("Hugging Face 4-bit directories") has the rules.
//
//   Bnb4bitDir d = Bnb4bitDir::open("llama-4bit");
//   for (const std::string& w : d.quantized()) { Bnb4bitWeight q = d.read(w); ... }
//   d.weights().read("model.norm.weight", t);  // the rest, as any HF directory
//
// Every refusal is one fd::Error (kUsage, exit 2) naming the file, the tensor
// and what to do.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "lib/ckpt/hf_dir.h"
#include "lib/tensor/tensor.h"

namespace fd::ckpt {

// The block sizes bitsandbytes' 4-bit kernels support (quantize_4bit, dequantize_4bit).
inline constexpr std::array<int64_t, 8> kBnbBlockSizes = {32, 64, 128, 256, 512, 1024, 2048, 4096};
// The nested block size of double quantization (quantize_4bit hard-codes it).
inline constexpr int64_t kBnbNestedBlockSize = 256;
// The quant_state blob's tensor-name suffix, before the quant type.
inline constexpr const char* kBnbQuantStateKey = "quant_state.bitsandbytes__";

// config.json's quantization_config, as transformers' BitsAndBytesConfig.to_dict()
// writes it. Defaults are BitsAndBytesConfig's (used for keys a file leaves out):
// note fp4 without double quantization, unlike QLoRA's and fdtrain's nf4 with it.
struct BnbQuantizationConfig {
  std::string quant_type = "fp4";         // bnb_4bit_quant_type: "nf4" or "fp4"
  bool double_quant = false;              // bnb_4bit_use_double_quant
  std::string compute_dtype = "float32";  // bnb_4bit_compute_dtype: float32, bfloat16, float16
  std::string quant_storage = "uint8";    // bnb_4bit_quant_storage: only uint8 is read
  double llm_int8_threshold = 6.0;        // int8-only settings, kept to be written back
  std::optional<std::vector<std::string>> llm_int8_skip_modules;  // null when absent
  bool llm_int8_enable_fp32_cpu_offload = false;
  bool llm_int8_has_fp16_weight = false;
};

// Parses a quantization_config object; `where` names it in messages. Refuses a
// method other than bitsandbytes, 8-bit, an unknown key, a value of the wrong
// type, a quant type other than nf4/fp4, a storage other than uint8.
BnbQuantizationConfig parse_bnb_quantization_config(const nlohmann::json& j,
                                                    const std::string& where);
// The object BitsAndBytesConfig.to_dict() gives (all 13 keys; json's std::map
// sorts them, as transformers' sort_keys=True does).
nlohmann::json bnb_quantization_config_json(const BnbQuantizationConfig& config);
// config.json's text with `config` as its quantization_config: `model_config`
// (e.g. nn::hf_config_json's, without a quantization_config) re-written as
// transformers writes config.json (keys sorted, 2-space indent, final newline).
std::string bnb4bit_config_json(std::string_view model_config, const BnbQuantizationConfig& config);

// Double quantization's part of a quantized weight (bitsandbytes' state2 and offset).
struct Bnb4bitNested {
  std::vector<float> absmax;                 // nested_absmax: one per 256 codes
  float offset = 0.0f;                       // nested_offset (the blob's JSON)
  std::array<float, 256> map{};              // nested_quant_map
  int64_t block_size = kBnbNestedBlockSize;  // nested_blocksize
  std::string dtype = "float32";             // nested_dtype
};

// One quantized weight as stored: the raw data, checked to be consistent.
struct Bnb4bitWeight {
  std::string quant_type = "nf4";  // "nf4" or "fp4"
  int64_t block_size = 64;         // one of kBnbBlockSizes
  std::vector<int64_t> shape;      // the weight's shape, e.g. {out_features, in_features}
  std::string dtype = "bfloat16";  // the weight's dtype before quantization (the blob's "dtype")
  std::vector<uint8_t> packed;     // (numel + 1) / 2 bytes, the earlier element in the high nibble
  std::vector<float> absmax;       // one per block; empty with double quant
  std::vector<uint8_t> absmax_codes;  // one per block with double quant (8-bit codes); else empty
  std::array<float, 16> quant_map{};  // the 4-bit table as saved (not checked against one)
  std::optional<Bnb4bitNested> nested;

  int64_t numel() const;
  int64_t num_blocks() const { return (numel() + block_size - 1) / block_size; }
};

// The quant_state blob's JSON text for `w`, exactly as bitsandbytes writes it.
std::string bnb4bit_quant_state_json(const Bnb4bitWeight& w);
// How Python's repr() (and so json.dumps) writes the double nearest `v`:
// "0.0123", "1e-05", "6.0", "-0.0". Throws fd::Error kUsage for ±inf and NaN.
std::string python_float_repr(double v);
// Checks `w`'s fields against each other (sizes, type, block size); throws
// fd::Error kUsage naming `where` otherwise.
void check_bnb4bit_weight(const Bnb4bitWeight& w, const std::string& where);

// A transformers 4-bit directory.
class Bnb4bitDir {
 public:
  // Opens `dir`: its weights (HfWeights::open) and its config.json, whose
  // quantization_config must say bitsandbytes 4-bit. Finds every quantized
  // weight (a tensor named P.weight.quant_state.bitsandbytes__TYPE), parses its
  // blob and checks, from the headers alone (no weight bytes read): the blob's
  // fields and their agreement with its name and with quantization_config
  // (quant type, double quant); every companion tensor present, of its dtype
  // and shape (packed bytes vs the blob's shape, absmax count vs blocks,
  // nested counts, maps of 16 and 256); no companion without its weight.
  static Bnb4bitDir open(const std::string& dir);

  const std::string& dir() const { return weights_.dir(); }
  const HfWeights& weights() const { return weights_; }
  const BnbQuantizationConfig& config() const { return config_; }
  // config.json without quantization_config, re-written as transformers writes
  // it: what nn::parse_hf_config reads.
  const std::string& model_config_json() const { return model_config_; }
  // The quantized weights' names ("model.layers.0.self_attn.q_proj.weight"), sorted.
  std::vector<std::string> quantized() const;
  bool is_quantized(const std::string& weight) const { return headers_.count(weight) != 0; }
  // The blob's fields of quantized weight `weight` (type, block size, shape,
  // dtype, nested block size, dtype and offset), as open() parsed them: no
  // tensor data (packed, absmax, maps empty). Throws fd::Error kUsage when
  // `weight` is not one of quantized().
  const Bnb4bitWeight& header(const std::string& weight) const;
  // The tensors that are stored as usual (not a quantized weight nor a companion), sorted.
  std::vector<std::string> plain() const;
  // Every tensor name in file order, companions included (HfWeights::file_order).
  std::vector<std::string> file_order() const { return weights_.file_order(); }
  // The quantized weight `weight` (one of quantized()), read and checked.
  Bnb4bitWeight read(const std::string& weight) const;

 private:
  explicit Bnb4bitDir(HfWeights w) : weights_(std::move(w)) {}
  HfWeights weights_;
  BnbQuantizationConfig config_;
  std::string model_config_;
  std::map<std::string, Bnb4bitWeight> headers_;  // the blob's fields; no data
};

// One tensor of a 4-bit directory to write: a plain tensor (CPU), or a
// quantized weight, which is written as its companion tensors.
using Bnb4bitEntry = std::pair<std::string, std::variant<Tensor, const Bnb4bitWeight*>>;

// Writes the weights of a 4-bit directory into `dir` (write_hf_tensors, in
// safetensors' order: what save_pretrained writes). A quantized weight named
// P.weight becomes P.weight, P.weight.absmax, P.weight.quant_map,
// [P.weight.nested_absmax, P.weight.nested_quant_map,]
// P.weight.quant_state.bitsandbytes__TYPE, in that (state-dict) order for the
// split into shards; a plain P.bias given right after P.weight goes between
// P.weight and its companions, where Linear4bit's state dict has it. Each quantized weight is
// checked first (check_bnb4bit_weight). config.json is the caller's (bnb4bit_config_json).
// With `placement` (every tensor written, companions included, to its shard:
// Bnb4bitDir::weights().placement() of the directory read), the shards are
// those instead of a split by size (write_hf_tensors).
void write_bnb4bit_weights(const std::string& dir, const std::vector<Bnb4bitEntry>& entries,
                           const std::map<std::string, std::string>& metadata,
                           int64_t max_shard_bytes,
                           const std::map<std::string, size_t>* placement = nullptr);

}  // namespace fd::ckpt
