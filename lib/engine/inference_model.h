// A trained model read back for inference (`fdtrain eval`, `fdtrain generate`).
//
//   InferenceModel m = fd::engine::load_inference_model("runs/quickstart");
//   m.model->forward(tokens) ...
//
// `path` is a Hugging Face model directory (config.json + model.safetensors
// or a sharded index: nn::read_hf_config, load_weights), a checkpoint (a run
// directory, its checkpoints directory or a step directory: anything
// resolve_step_dir() accepts) or a weights file (an `fdtrain ckpt export`
// .safetensors / .h5, or a Hugging Face GPT-2 model.safetensors). A directory
// holding config.json is read as a Hugging Face directory. The model is
// always fp32 on the CPU:
//  - a checkpoint: the model is assembled from its stored recipe
//    (assemble_for_inference(), assemble.h), the weights are its consolidated
//    fp32 master weights (what `ckpt export` writes). For a
//    LoRA run, the base is read from the recipe's model.init_from and the
//    adapters from the checkpoint; adapter dropout is off. The base must be
//    the file the adapters were trained on (find_lora_base(): its SHA-256 is
//    checked; a relative path is resolved from the current directory, and the
//    error says it was relative to the directory the run was started in).
//    A run or checkpoints directory is read at the step its `latest` names:
//    "using checkpoint step_N of PATH" is logged, with a warning when the run
//    went on past that step (summary.json "steps", else metrics.jsonl). A run
//    directory without checkpoints is refused with the reason
//    (checkpoint.every: 0, stopped before the first save, or removed).
//  - a weights file: the dimensions come from the tensor shapes, n_head from
//    the file's metadata (fdtrain exports record it). A file without n_head
//    (a Hugging Face GPT-2 model.safetensors) is read with GPT-2's head size
//    of 64, and a note says so.
// A Hugging Face directory's config.json is checked against its weights'
// headers before the model is allocated (check_weights_fit), and every weight
// read is checked to be finite, naming the tensor and the file.
// Every failure a user can cause is an fd::Error (kUsage) naming the path.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "lib/config/recipe.h"
#include "lib/nn/decoder.h"

namespace fd::engine {

struct InferenceModel {
  std::unique_ptr<nn::Decoder> model;        // fp32, on the CPU
  std::string source;                    // the step directory or the file read
  std::string description;               // one line: what was read, step, dimensions
  std::optional<config::Recipe> recipe;  // checkpoints only: the run's stored recipe
  // What the model was trained on, for eval and generate: the sequence length
  // (positions beyond it were never trained; 0 when unknown: a weights file),
  // and whether its tokens are bytes (the run's data.format is text; for a
  // weights file, a vocabulary of 256).
  int trained_seq_len = 0;
  bool byte_level = false;
  int32_t bos_token = -1;  // a Hugging Face directory's bos_token_id; -1: none known
  // The model's text tokenizer, a directory with tokenizer.json: the run's
  // data.tokenizer, or the Hugging Face directory itself when it holds one;
  // "" when none is known (byte-level models use bytes).
  std::string tokenizer_dir;
};

InferenceModel load_inference_model(const std::string& path);

}  // namespace fd::engine
