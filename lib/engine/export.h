// `fdtrain ckpt export`: a checkpoint's weights as one file, or a LoRA run's
// adapters (PEFT) or merged model. The files are lib/ckpt's (export.h); what
// only the checkpoint's stored recipe says (n_head, the lora section, the
// base file model.init_from) is read here, as stored: the files it names need
// not exist (an adapter export needs none; the merged export checks the base
// itself).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "lib/engine/hf_export.h"
#include "lib/tensor/dtype.h"

namespace fd::engine {

// Writes the consolidated weights of the checkpoint at `path` (anything
// ckpt::resolve_step_dir() accepts) to `out` (.safetensors or .h5) in `dtype`
// (kF32 or kBF16): ckpt::export_checkpoint(), with n_head from the stored
// recipe (left out, with a warning, when the recipe does not validate).
// Refuses an existing `out` unless `overwrite`, and a LoRA run's checkpoint.
// Returns a one-line summary.
std::string export_checkpoint(const std::string& path, const std::string& out, DType dtype,
                              bool overwrite);

// A LoRA run's checkpoint as a PEFT adapter directory `dir`
// (ckpt::export_lora_adapter(), the settings from the recipe's lora section,
// the base from model.init_from). The stored recipe must validate and have a
// lora section, or fd::Error kUsage says so. Returns a one-line summary.
std::string export_lora_adapter(const std::string& path, const std::string& dir, DType dtype,
                                bool overwrite);

// A LoRA run's checkpoint merged into its base (model.init_from, which must
// be the file the adapters were trained on and fit the recipe's model) as
// `out` (ckpt::export_merged_lora()). Same recipe requirements as above.
// Returns a one-line summary.
std::string export_merged_lora(const std::string& path, const std::string& out, DType dtype,
                               bool overwrite);

// `--hf-dir`'s settings.
struct HfDirExport {
  std::optional<DType> dtype;  // fp32 or bf16; none: the run's precision (fp32, bf16, fp16)
  bool merge_lora = false;     // required for a LoRA run's checkpoint, refused for another
  bool overwrite = false;      // replace an existing non-empty directory
  int64_t max_shard_bytes = kDefaultMaxShardBytes;
  bool max_shard_given = false;  // --max-shard-size given: --quantized then splits by it
  // QLoRA runs (model.quantize): write the base as the run held it in 4 bits, as a transformers
  // 4-bit directory, without the adapters. Refused with merge_lora and for other runs.
  bool quantized = false;
};

// The checkpoint at `path` as a Hugging Face model directory `dir`
// (write_hf_model(), hf_export.h): the model of its stored recipe
// (assemble_for_inference()) with its fp32 master weights, in the dtype
// asked for. A LoRA run's checkpoint needs `merge_lora`: the adapters are
// merged into the base (model.init_from, checked to be the file they were
// trained on); without it the export is refused, naming --merge-lora and
// --lora-adapter DIR. When model.init_from is a directory, its tokenizer files
// are copied. Refused before the checkpoint is read: an existing non-empty
// `dir` without `overwrite`. Returns a one-line summary.
//
// A QLoRA run (model.quantize): `merge_lora` merges the adapters into the base dequantized from
// 4 bits (Decoder::dequantized, the values the run computed with), and says so. `quantized`
// instead writes the base alone exactly as the run held it (write_bnb4bit_model): each block
// linear's 4-bit weight as stored, the blob dtype the run's compute dtype's (or, for a 4-bit
// model.init_from, that directory's own, with its other quantization_config keys and, unless
// --max-shard-size is given, its split into shards), quantization_config's compute dtype the
// run's, everything else in `dtype` (default the run's compute dtype). The base read back from
// a 4-bit directory is so written back byte for byte (model.safetensors; config.json when it
// is as transformers writes it).
std::string export_hf_dir(const std::string& path, const std::string& dir,
                          const HfDirExport& options);

// `fdtrain ckpt inspect`: the checkpoint at `path` described and every checksum
// verified (ckpt::inspect_checkpoint); a usage fd::Error on any problem.
std::string inspect_checkpoint(const std::string& path);

// `fdtrain ckpt diff`: the weights of checkpoints `a` and `b` compared tensor by
// tensor and overall, relative to `b` (ckpt::diff_checkpoints).
std::string diff_checkpoints(const std::string& a, const std::string& b);

}  // namespace fd::engine
