// Whole-checkpoint operations: open and cross-check all shards of a step
// directory, inspect (verify every checksum), consolidate the sharded fp32
// master weights into full tensors, export them as one file, and load
// weights from such a file (or a Hugging Face GPT-2 model.safetensors) into
// a model.
//
// Export formats (docs/FORMAT.md):
//   .safetensors  Hugging Face GPT-2 names and layouts (Conv1D weights (in, out),
//                 lm head tied to wte.weight, so not stored); __metadata__ with
//                 format "pt", step, source, n_layer, n_head, d_model, vocab_size,
//                 max_seq_len, precision, dtype, fdtrain_version.
//   .h5           one dataset per parameter at the root, named as above (float32,
//                 or uint16 with a `dtype` attribute "bf16"), Fletcher32-checksummed;
//                 the same metadata as root attributes.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "lib/ckpt/manifest.h"
#include "lib/ckpt/shard.h"
#include "lib/nn/module.h"
#include "lib/tensor/tensor.h"

namespace fd::ckpt {

// All shards of one step directory, opened and checked against the manifest
// and each other (step, world size, stage, precision, rank, layout, segment
// sizes, full coverage of every parameter).
struct Checkpoint {
  std::string dir;
  Manifest manifest;
  std::vector<ShardReader> shards;  // rank order
  const ShardMeta& meta() const { return shards.front().meta(); }
};

// Opens the checkpoint at `path` (anything resolve_step_dir() accepts),
// after checking every shard against the manifest's digests (when it has
// them). Throws fd::Error kUsage naming the offending file.
Checkpoint open_checkpoint(const std::string& path);

// Every parameter of the checkpoint at `step_dir` assembled by name from the
// shards' fp32 master weights, converted to `dtype` (round to nearest even).
std::map<std::string, Tensor> consolidate(const std::string& step_dir, DType dtype);
// As consolidate(), in canonical order (the checkpoint's layout order).
std::vector<std::pair<std::string, Tensor>> consolidate_ordered(const Checkpoint& ckpt,
                                                                DType dtype);

// A human-readable report of the checkpoint at `path`: step, world size,
// stage, precision, each shard's ranges and datasets with sizes, and, after
// reading every dataset in full, "checksums ok". Throws fd::Error kUsage on
// any problem (the message names the file).
std::string inspect_checkpoint(const std::string& path);

// Writes the consolidated weights of the checkpoint at `path` to `out`
// (.safetensors or .h5, by extension) in `dtype` (kF32 or kBF16), via
// `out`.tmp and rename. Refuses to replace an existing `out` unless
// `overwrite`, and refuses a LoRA run's checkpoint (see below). Returns a
// one-line summary.
std::string export_checkpoint(const std::string& path, const std::string& out, DType dtype,
                              bool overwrite);

// Checkpoints of LoRA runs hold only the adapters (parameters named
// h.N.<module>.lora_{A,B}.weight, lib/ckpt/peft.h); export_checkpoint()
// refuses them and points to the two exports below. Both read the adapter
// settings (lora section) and the base's path (model.init_from) from the
// checkpoint's stored recipe, which must validate (as stored: the files it
// names need not exist) or fd::Error kUsage lists its errors. Only the merged
// export reads the base, which must then be the file the adapters were
// trained on (find_lora_base(), lib/ckpt/lora_base.h).

// Writes the LoRA parameters of the checkpoint at `path` in `dtype` (kF32 or
// kBF16) as a PEFT adapter directory `dir` (write_peft_adapter(): keys
// base_model.model.transformer.h.N.<module>.lora_{A,B}.weight, adapter_config.json
// from the recipe, base_model_name_or_path = model.init_from). Refuses an
// existing `dir` unless `overwrite`. Returns a one-line summary.
std::string export_lora_adapter(const std::string& path, const std::string& dir, DType dtype,
                                bool overwrite);

// Writes the full model: the base from model.init_from (checked to be the
// file the adapters were trained on by its SHA-256, read as load_weights()
// reads it, and checked against the recipe's model dimensions) with the
// checkpoint's fp32 LoRA deltas merged in (merge_lora(), scaling alpha / r),
// as `out` (.safetensors or .h5, Hugging Face GPT-2 names, as
// export_checkpoint() writes) in `dtype` (kF32 or kBF16). The metadata also
// records "base" and "lora" (r, alpha, targets, layers). Refuses an existing
// `out` unless `overwrite`. Returns a one-line summary.
std::string export_merged_lora(const std::string& path, const std::string& out, DType dtype,
                               bool overwrite);

// Compares the weights of two checkpoints (or exports' sources) tensor by
// tensor: per tensor ||a - b|| / ||b|| and max |a - b|, then the whole model's
// ||a - b|| / ||b||, which it also stores in *total_relative. Both must hold
// the same parameters (different names or shapes: fd::Error kUsage).
std::string diff_checkpoints(const std::string& a, const std::string& b, double* total_relative);

// What a weights file (anything load_weights() reads) holds, without reading
// its tensors: the metadata (a .safetensors "__metadata__", an .h5 export's
// string root attributes; see above) and the shape of every tensor under the
// names load_weights() maps it to ("transformer." stripped, mask buffers and
// lm_head.weight left out). Throws fd::Error kUsage for a missing or
// malformed file.
struct WeightsInfo {
  std::map<std::string, std::string> metadata;
  std::map<std::string, std::vector<int64_t>> shapes;
};
WeightsInfo read_weights_info(const std::string& file);

// Copies the weights in `file` into `model`'s parameters, converting dtype
// (round to nearest even). `file` is an fdtrain export (.safetensors or .h5)
// or a Hugging Face GPT-2 model.safetensors: an optional "transformer."
// prefix is stripped, the causal-mask buffers h.N.attn.bias / masked_bias are
// skipped, and lm_head.weight, if present, is ignored (the head is tied to
// wte; a note is logged if it differs). Every model parameter must be present
// with its shape and nothing else may be: otherwise fd::Error kUsage, prefixed
// with `where` (e.g. "recipes/x.yaml:3:14: model.init_from"), naming the file,
// the tensor, both shapes and the recipe change that would fit the file.
void load_weights(const std::string& file, const nn::Module& model, const std::string& where);

}  // namespace fd::ckpt
