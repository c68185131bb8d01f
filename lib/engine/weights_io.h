// Filling a model's parameters from a weights file (model.init_from, a LoRA
// run's base, `fdtrain eval`/`generate` of an export). The file is read by
// lib/ckpt (WeightsFile, lib/ckpt/weights_file.h); this matches its tensors
// to the model's parameters.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lib/nn/decoder.h"
#include "lib/nn/module.h"
#include "lib/quant/quantize.h"

namespace fd::engine {

// Copies the weights in `file` into `model`'s parameters, converting dtype
// (round to nearest even). `file` is a Hugging Face model directory (its
// model.safetensors or sharded index, lib/ckpt/hf_dir.h; names as the
// family's, for GPT-2 with or without "transformer."), an fdtrain export
// (.safetensors or .h5) or a Hugging Face GPT-2 model.safetensors. An
// optional "transformer." prefix is stripped, the causal-mask buffers
// h.N.attn.bias / masked_bias are skipped, and lm_head.weight beside a tied
// head is not used (a note is logged if it differs from the embedding); an
// untied head (lm_head.weight a parameter) is loaded like any other. A LoRA model gets its frozen
// base (the adapters keep their own values). Every such parameter must be present with its shape
// and nothing else may be: otherwise fd::Error kUsage, prefixed with `where` (e.g.
// "recipes/x.yaml:3:14: model.init_from"), naming the file, the tensor, both shapes and the recipe
// change that would fit the file.
//
// `held`: the dtype a run held this base in (a QLoRA run's compute dtype), for a model built in
// fp32 to evaluate or export that run: every value is rounded to `held` (nearest even) before
// it is stored or, for a 4-bit base, quantized, as the run's own model did, so that the model
// holds the base the run trained over. A 4-bit directory's weights are the stored ones either
// way. kF32: the values as read.
void load_weights(const std::string& file, const nn::Module& model, const std::string& where,
                  DType held = DType::kF32);

// The tensors of a weights file or model directory (as load_weights reads
// them), checked against `model` at construction and read by element range:
// a ZeRO-3 rank reads only its shard of a model directory's tensors.
//
// A transformers 4-bit directory (config.json with a quantization_config,
// lib/ckpt/bnb4bit.h) is a source too: each quantized weight must be a
// parameter of the model with the blob's shape, all of them of one quant
// type, block size and double quantization, their tables bitsandbytes'
// (engine/quant_io.h); the other tensors are checked as in any directory.
// Nothing is re-quantized: read_quantized() gives a weight as stored, and
// read() its dequantized values, so a model with a bf16 or fp32 base loads
// the directory as its dequantized twin (docs/QUANTIZATION.md).
class WeightsSource {
 public:
  // Opens `file` and checks it against the parameters of `model` that load
  // from it (the frozen base of a LoRA model, else every parameter): fd::Error
  // kUsage as load_weights says. `model` must outlive the source.
  WeightsSource(const std::string& file, const nn::Module& model, const std::string& where);
  ~WeightsSource();
  WeightsSource(const WeightsSource&) = delete;
  WeightsSource& operator=(const WeightsSource&) = delete;

  // Whether `p` (one of model's parameters) is filled from the file.
  bool fills(const nn::Parameter& p) const;
  // Elements [begin, begin + count) of p's tensor (row-major) into `out`
  // (count elements, any dtype: converted, round to nearest even). A
  // quantized weight gives its dequantized fp32 values (quant::block_absmax,
  // quant::dequantize_range), converted the same way; the last weight
  // decoded is kept for the next range of it.
  void read(const nn::Parameter& p, int64_t begin, int64_t count, const Tensor& out) const;

  // A 4-bit directory's {type, block size, double quantization}, which every
  // quantized weight of it shares; nullopt for any other source.
  std::optional<quant::QuantOptions> stored_quantization() const;
  // Whether `p` is filled from a quantized weight of a 4-bit directory.
  bool stores_quantized(const nn::Parameter& p) const;
  // p's weight exactly as stored (stores_quantized(p) must hold). Throws
  // fd::Error kUsage, prefixed with `where`, when the file no longer reads
  // as it did when opened (an absmax that is not finite, a table that is not
  // bitsandbytes').
  quant::Quantized4bit read_quantized(const nn::Parameter& p) const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Checks, before a model of `config` is built, that `file` (as load_weights
// reads it) holds every parameter of its base with its shape and nothing
// else, reading headers only: a config.json whose sizes disagree with its
// weights (a vocab_size of 5,000,000 beside a 256-row embedding) is refused
// naming the tensor before any memory is allocated for the model. A 4-bit
// directory's quantized weight has its blob's shape; its tables are not read
// here (WeightsSource reads them). fd::Error kUsage as load_weights.
void check_weights_fit(const std::string& file, const nn::DecoderConfig& config,
                       const std::string& where);

// Whether `path` is a transformers 4-bit directory as WeightsSource reads one: a directory
// whose config.json has a quantization_config, or one of whose tensors is a bitsandbytes
// quant_state (ckpt::Bnb4bitDir::open then says what is wrong with it). Reads config.json and
// the safetensors headers only; false for a file, and for a directory without a
// quantization_config whose weights cannot be read (opening it as a weights source says why).
bool is_bnb4bit_directory(const std::string& path);

// Where a training run's parameters start from: the base (every parameter
// without LoRA) from model.init_from, a LoRA run's adapters from lora.adapter
// (a PEFT directory), whatever no file gives from the family's random
// initialisation (Decoder::init_values) with `seed`.
struct InitialWeights {
  uint64_t seed = 0;
  std::string init_from;                     // weights file or model directory; "" = random base
  std::string init_from_where;               // message prefix, e.g. "r.yaml:3:14: model.init_from"
  std::string adapter;                       // PEFT directory; "" = adapters from their init
  std::string adapter_where;                 // message prefix, e.g. "r.yaml:12:12: lora.adapter"
  std::vector<std::string> adapter_targets;  // lora.targets as the recipe says them (messages)
};

// Opens every file `w` names and checks it against `model` (fd::Error kUsage
// prefixed with its where: a tensor missing or of the wrong shape, as
// load_weights; an adapter whose r, targets or layers differ from model's
// lora(), or missing a tensor), and returns the fill that gives any element
// range of any of model's parameters from them: what the ZeroEngine fills
// each rank's part with (all of it under stages 0-2, its shard under stage
// 3). The fill owns the open files; `model` must outlive it.
nn::ParamFill initial_weights(const nn::Decoder& model, const InitialWeights& w);

}  // namespace fd::engine
