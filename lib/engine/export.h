// `fdtrain ckpt export`: a checkpoint's weights as one file, or a LoRA run's
// adapters (PEFT) or merged model. The files are lib/ckpt's (export.h); what
// only the checkpoint's stored recipe says (n_head, the lora section, the
// base file model.init_from) is read here, as stored: the files it names need
// not exist (an adapter export needs none; the merged export checks the base
// itself).
#pragma once

#include <string>

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

}  // namespace fd::engine
