// A weights file read as named tensors: an fdtrain export (.safetensors or
// .h5, lib/ckpt/export.h) or a Hugging Face GPT-2 model.safetensors.
//
//   WeightsFile w = WeightsFile::open("gpt2/model.safetensors");
//   for (const auto& [name, shape] : w.shapes()) ... w.load(name) ...
//
// Tensors are listed under fdtrain's GPT-2 names: an optional "transformer."
// prefix is stripped, the causal-mask buffers h.N.attn.bias / masked_bias are
// left out, and lm_head.weight (fdtrain ties the head to wte.weight) is set
// aside (lm_head()). Putting the tensors into a model is the engine's
// (lib/engine/weights_io.h); this reads the format only.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lib/tensor/tensor.h"

namespace fd::ckpt {

class WeightsFile {
 public:
  // Opens `path`: HDF5 (by its signature: an .h5 export, one dataset per
  // tensor at the root) or else safetensors. Reads the header only. Throws
  // fd::Error kUsage naming the file when it is missing or malformed.
  static WeightsFile open(const std::string& path);

  WeightsFile(WeightsFile&&) noexcept;
  WeightsFile& operator=(WeightsFile&&) noexcept;
  ~WeightsFile();

  const std::string& path() const { return path_; }
  // Every tensor's shape, by fdtrain name (in name order).
  const std::map<std::string, std::vector<int64_t>>& shapes() const { return shapes_; }
  // The name the file stores tensor `name` under (e.g. "transformer.wte.weight").
  const std::string& stored_name(const std::string& name) const;
  // Tensor `name` (a key of shapes()) as stored (f32, bf16 or f16), on the
  // CPU. Throws fd::Error kUsage naming the file when it cannot be read or
  // holds a NaN or an infinity (lib/ckpt/finite.h).
  Tensor load(const std::string& name) const;
  // The file's metadata: a .safetensors "__metadata__", or an .h5 export's
  // string root attributes.
  std::map<std::string, std::string> metadata() const;

  // The file's lm_head.weight, if it has one: its stored name and shape.
  struct LmHead {
    std::string stored_name;
    std::vector<int64_t> shape;
  };
  const std::optional<LmHead>& lm_head() const { return lm_head_; }
  Tensor load_lm_head() const;  // requires lm_head()

  class Source;  // the format's reader (weights_file.cc: safetensors, HDF5)

 private:
  WeightsFile() = default;
  std::string path_;
  std::unique_ptr<Source> source_;
  std::map<std::string, std::vector<int64_t>> shapes_;
  std::map<std::string, std::string> stored_;  // fdtrain name -> the file's name
  std::optional<LmHead> lm_head_;
};

// A GPT-2 model's dimensions as a set of tensors implies them (-1: unknown):
// n_layer from the highest h.N, vocab_size and d_model from wte.weight,
// max_seq_len from wpe.weight.
struct ImpliedDims {
  int64_t n_layer = -1, d_model = -1, vocab_size = -1, max_seq_len = -1;
};
ImpliedDims implied_dims(const std::map<std::string, std::vector<int64_t>>& shapes);

// The clause a load error ends with, in recipe terms: "; the file holds a
// model with n_layer 2, d_model 16, ...: set model.n_layer to 2 to load it"
// (or "...: check model.n_head and the file" when the dimensions agree), ""
// when the file implies none.
std::string dims_hint(const ImpliedDims& file, const ImpliedDims& model);

}  // namespace fd::ckpt
