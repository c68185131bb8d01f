// The weights of a Hugging Face model directory, read and written as named
// tensors: one `model.safetensors`, or shards listed by
// `model.safetensors.index.json`, as transformers' save_pretrained writes them:
//
//   {"metadata": {"total_size": 497759232},
//    "weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors", ...}}
//
//   HfWeights w = HfWeights::open("Llama-3.2-1B");
//   TensorInfo i = w.info("model.embed_tokens.weight");
//   w.read_range("model.embed_tokens.weight", begin, count, my_partition);
//
// Names are the file's own (no renaming: mapping them onto a model is the
// engine's). open() parses every shard's header once and checks the index
// against the shards; tensor bytes are read (pread) only when asked for, and
// read_rows() and read_range() read only the rows or elements asked for, so a
// ZeRO-3 rank never holds a whole tensor. Only F32, BF16 and F16 tensors can
// be read as tensors; any tensor's stored bytes can be read with read_raw()
// (bitsandbytes' U8 tensors, lib/ckpt/bnb4bit.h). Not thread-safe. What is read is checked to be
// finite (lib/ckpt/finite.h): a NaN or an infinity is refused naming the shard, the tensor and the
// element. The index is read as a configuration file (a regular file of at most 64 MiB, nested at
// most 8 deep) and each weight_map value must be a plain file name of the directory (no "../", no
// absolute path, no subdirectory).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lib/tensor/safetensors.h"
#include "lib/tensor/tensor.h"

namespace fd::ckpt {

// "model.safetensors", "model.safetensors.index.json".
inline constexpr const char* kHfWeightsFile = "model.safetensors";
inline constexpr const char* kHfIndexFile = "model.safetensors.index.json";

struct TensorInfo {
  DType dtype = DType::kF32;  // the file's: kF32, kBF16 or kF16
  Shape shape;
};

// A tensor's entry as the file states it, whatever its dtype.
struct RawTensorInfo {
  std::string dtype;  // the file's dtype name: "F32", "BF16", "U8", ...
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;  // checked at open() to equal numel(shape) x the dtype's size
};

class HfWeights {
 public:
  // Opens the weights of model directory `dir`: its index when there is one,
  // else its model.safetensors. Throws fd::Error kUsage naming the path and
  // what to do when neither exists, the index is malformed or names a missing
  // shard, a shard is malformed or truncated, or the index and the shards
  // disagree (a tensor missing from its shard, or a shard holding a tensor the
  // index does not list).
  static HfWeights open(const std::string& dir);

  HfWeights(HfWeights&&) noexcept;
  HfWeights& operator=(HfWeights&&) noexcept;
  ~HfWeights();

  const std::string& dir() const { return dir_; }
  // Tensor names, sorted.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  // dtype and shape of `name`. Throws fd::Error kUsage when it is absent or
  // of a dtype other than F32, BF16, F16.
  TensorInfo info(const std::string& name) const;
  // The entry of `name` as stored, any dtype. Throws fd::Error kUsage when it is absent.
  RawTensorInfo raw_info(const std::string& name) const;
  // The stored bytes of `name`, any dtype, as they are in the file (no
  // conversion, no finiteness check: the caller knows what they hold). Throws
  // fd::Error kUsage when it is absent or larger than `max_bytes`, kRuntime
  // when the file can no longer be read.
  std::vector<uint8_t> read_raw(const std::string& name, uint64_t max_bytes = UINT64_MAX) const;
  // Tensor names in the order their bytes lie in the files: file by file (in
  // file-name order), each by data offset.
  std::vector<std::string> file_order() const;
  // Which file holds each tensor: the index of the file in file-name order
  // (0 for model.safetensors), for write_hf_tensors to write the same split.
  std::map<std::string, size_t> placement() const;
  // The "__metadata__" of model.safetensors, or of the first shard.
  std::map<std::string, std::string> metadata() const;

  // Reads `name` into `out` (any device; shape must equal info(name).shape),
  // converting to out's dtype. Throws fd::Error kUsage on a shape mismatch or
  // an unsupported dtype, kRuntime when the file can no longer be read.
  void read(const std::string& name, const Tensor& out) const;
  // Reads rows [row0, row0 + rows) of the 2-D tensor `name` into `out` of
  // shape (rows, cols), reading only those rows' bytes. Throws fd::Error
  // kUsage when `name` is not 2-D, the range is out of bounds or out's shape
  // is not (rows, cols).
  void read_rows(const std::string& name, int64_t row0, int64_t rows, const Tensor& out) const;
  // Reads elements [begin, begin + count) of `name` (row-major) into the 1-D
  // `out` of `count` elements, reading only those elements' bytes. Throws
  // fd::Error kUsage when the range is out of bounds or out's shape is not (count).
  void read_range(const std::string& name, int64_t begin, int64_t count, const Tensor& out) const;

 private:
  struct Shard;
  HfWeights() = default;
  void read_bytes(const std::string& name, uint64_t offset, const Shape& shape,
                  const Tensor& out) const;

  std::string dir_;
  std::vector<std::unique_ptr<Shard>> shards_;  // in file-name order
  std::map<std::string, size_t> where_;         // tensor name -> index into shards_
};

// Writes `tensors` (CPU tensors, unique names, any fdtrain float dtype) into
// model directory `dir` (created if needed) as transformers does: one
// model.safetensors when their bytes total at most `max_shard_bytes`, else
// shards model-00001-of-0000N.safetensors (tensors in the given order, a new
// shard whenever the next tensor would overflow the current one; a tensor
// larger than max_shard_bytes gets a shard of its own) plus
// model.safetensors.index.json with {"metadata": {"total_size": bytes},
// "weight_map": {...}}. `metadata` goes into every file's "__metadata__".
// Each file is written to a temporary name and renamed, the index last; weight
// files of an earlier write that this one does not replace (a stale index,
// model.safetensors, shards of another count) are removed afterwards. Other
// files in `dir` (config.json, the tokenizer) are left alone. A reader racing
// the writer sees the old or new index; where they mix, open() refuses the
// mismatch rather than mixing weights. Throws fd::Error kRuntime on I/O
// failure, kUsage on a bad argument.
void write_hf_weights(const std::string& dir,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata, int64_t max_shard_bytes);

// As write_hf_weights, from tensors given as bytes of any safetensors dtype (U8
// included). With `safetensors_order`, each file's tensors are laid out as the
// safetensors library's writer (which transformers' save_pretrained calls)
// lays them out: by dtype, descending in its Dtype enum's order (F32 before
// BF16 before F16 before U8), then by name; the split into shards follows
// `tensors`' order either way. With `placement` (tensor name -> shard index
// from 0, every shard non-empty, e.g. HfWeights::placement() of the directory
// the tensors were read from), each tensor goes to the shard it names instead,
// and max_shard_bytes only has to be positive.
void write_hf_tensors(const std::string& dir,
                      const std::vector<std::pair<std::string, TensorBytes>>& tensors,
                      const std::map<std::string, std::string>& metadata, int64_t max_shard_bytes,
                      bool safetensors_order,
                      const std::map<std::string, size_t>* placement = nullptr);

}  // namespace fd::ckpt
