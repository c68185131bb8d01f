// Whole-checkpoint operations: open and cross-check all shards of a step
// directory, inspect (verify every checksum), consolidate the sharded fp32
// master weights into full tensors, and export them as one file (read back by
// WeightsFile, lib/ckpt/weights_file.h) or as a PEFT adapter.
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

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lib/ckpt/manifest.h"
#include "lib/ckpt/peft.h"
#include "lib/ckpt/shard.h"
#include "lib/tensor/tensor.h"

namespace fd::ckpt {

// All shards of one step directory, opened and checked against the manifest
// and each other (step, world size, stage, precision, rank, layout, segment
// sizes, full coverage of every parameter).
//
// A tensor-parallel checkpoint (ShardMeta::tensor.size T > 1) holds T different flat spaces
// under each segment name, one per tp rank: shards are checked per tp rank (one layout, the
// manifest's segments of that tp rank, every element of every parameter held), and the tp
// ranks' slices must tile the same whole tensors.
struct Checkpoint {
  std::string dir;
  Manifest manifest;
  std::vector<ShardReader> shards;  // rank order
  const ShardMeta& meta() const { return shards.front().meta(); }
  // The shards of each tp rank, in rank order; one entry (every shard) without tensor
  // parallelism.
  std::vector<std::vector<size_t>> tp_shards;
  int tensor_size() const { return int(tp_shards.size()); }
  // tp rank t's layout: its slices' shapes and flat offsets (meta().layout when t = 0).
  const std::vector<ParamLayout>& layout(int t) const {
    return shards[tp_shards[size_t(t)].front()].meta().layout;
  }
  // Parameter i of the canonical order's row in every tp rank's layout.
  std::vector<const ParamLayout*> rows(size_t i) const;
  // Every parameter as a whole tensor, canonical order: global shapes, no slice (segment and
  // offset are tp rank 0's). meta().layout without tensor parallelism.
  std::vector<ParamLayout> whole_layout;
};

// Opens the checkpoint at `path` (anything resolve_step_dir() accepts),
// after checking every shard against the manifest's digests (when it has
// them). Throws fd::Error kUsage naming the offending file.
Checkpoint open_checkpoint(const std::string& path);

// Every parameter of the checkpoint at `step_dir` assembled by name from the
// shards' fp32 master weights, converted to `dtype` (round to nearest even): whole
// tensors (a tensor-parallel checkpoint's slices assembled; whole parameters from tp rank 0),
// the same as a checkpoint of the same weights without tensor parallelism gives.
std::map<std::string, Tensor> consolidate(const std::string& step_dir, DType dtype);
// As consolidate(), in canonical order (the checkpoint's layout order).
std::vector<std::pair<std::string, Tensor>> consolidate_ordered(const Checkpoint& ckpt,
                                                                DType dtype);

// A human-readable report of the checkpoint at `path`: step, world size,
// stage, precision, each shard's ranges and datasets with sizes, and, after
// reading every dataset in full, "checksums ok". Throws fd::Error kUsage on
// any problem (the message names the file).
std::string inspect_checkpoint(const std::string& path);

// True when the checkpoint holds LoRA parameters (names with .lora_A. or
// .lora_B., lib/ckpt/peft.h): a LoRA run's checkpoint holds only the adapters.
bool is_lora_checkpoint(const Checkpoint& c);

// The checks an export makes before it reads anything, so that a bad
// argument is refused before a large checkpoint is opened: `dtype` is kF32 or
// kBF16 ("--dtype must be fp32 or bf16"), and `out` ends in .safetensors or
// .h5 and does not exist unless `overwrite`, and is never anything but a
// regular file (a directory, FIFO or device is refused even with
// `overwrite`: check_export_file), or the adapter directory `dir` is absent,
// empty, or with `overwrite` a PEFT adapter directory (adapter_config.json:
// check_export_dir; nothing else is ever replaced). Throws fd::Error kUsage.
// The exports below make them too. Where an output may be (not inside a run's
// own files) is lib/engine's (run_dir.h, check_output_path).
void check_export_file(const std::string& out, DType dtype, bool overwrite);
void check_export_dir(const std::string& dir, DType dtype, bool overwrite);

// Exports read the checkpoint's tensors; what only its stored recipe says
// (n_head, the LoRA settings, the base file) the caller passes in: lib/ckpt
// does not read recipes (lib/engine/export.h reads them and calls these).

// Writes the consolidated weights of checkpoint `c` to `out` (.safetensors or
// .h5, by extension) in `dtype` (kF32 or kBF16), via `out`.tmp and rename.
// The metadata's dimensions come from the layout; `n_head` is recorded when
// given. Refuses to replace an
// existing `out` unless `overwrite`, and refuses a LoRA checkpoint (pointing
// to the two exports below). Returns a one-line summary.
std::string export_checkpoint(const Checkpoint& c, const std::string& out, DType dtype,
                              bool overwrite, std::optional<int64_t> n_head);

// A GPT-2 model's dimensions, as a recipe's model section gives them.
struct ModelDims {
  int64_t n_layer = 0, n_head = 0, d_model = 0, vocab_size = 0, max_seq_len = 0;
};

// The LoRA exports of checkpoint `c` (a LoRA run's: parameters named
// h.N.<module>.lora_{A,B}.weight), with `spec` the run's lora section and
// spec.base its model.init_from. Only the merged export reads the base, which
// must then be the file the adapters were trained on (find_lora_base(),
// lib/ckpt/lora_base.h).

// Writes the LoRA parameters of `c` in `dtype` (kF32 or kBF16) as a PEFT
// adapter directory `dir` (write_peft_adapter(): keys
// base_model.model.transformer.h.N.<module>.lora_{A,B}.weight, or for the Llama
// family base_model.model.model.layers.N.<module>.lora_{A,B}.weight, adapter_config.json
// from `spec`, base_model_name_or_path = spec.base). Refuses an existing `dir`
// unless `overwrite`. Returns a one-line summary.
std::string export_lora_adapter(const Checkpoint& c, const std::string& dir, DType dtype,
                                bool overwrite, const LoraSpec& spec);

// Writes the full model: the base spec.base (checked to be the file the
// adapters were trained on by its SHA-256, read as WeightsFile reads it, and
// checked against `model`'s dimensions) with the checkpoint's fp32 LoRA
// deltas merged in (merge_lora(), scaling alpha / r), as `out` (.safetensors
// or .h5, Hugging Face GPT-2 names, as export_checkpoint() writes) in `dtype`
// (kF32 or kBF16), its tensors in `order` (the model's parameter names in
// layout order, which the engine takes from the model family's; names not in
// it last, by name). The metadata records `model`'s dimensions, "base" and
// "lora" (r, alpha, targets, layers). Refuses an existing `out` unless
// `overwrite`. Returns a one-line summary.
std::string export_merged_lora(const Checkpoint& c, const std::string& out, DType dtype,
                               bool overwrite, const LoraSpec& spec, const ModelDims& model,
                               const std::vector<std::string>& order);

// Compares the weights of two checkpoints (or exports' sources) tensor by
// tensor: per tensor ||a - b|| / ||b|| and max |a - b|, then the whole model's
// ||a - b|| / ||b||, which it also stores in *total_relative. Both must hold
// the same parameters (different names or shapes: fd::Error kUsage).
std::string diff_checkpoints(const std::string& a, const std::string& b, double* total_relative);

}  // namespace fd::ckpt
