// Reading and writing the safetensors format (Hugging Face checkpoints, PEFT
// adapters, fdtrain's own exports and the PyTorch golden data).
//
// Layout: an 8-byte little-endian u64 header length n; n bytes of JSON
// {name: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]},
//  "__metadata__": {string: string}}; then the raw row-major little-endian
// bytes, offsets relative to the first byte after the header.
//
// open() reads and validates the whole header up front (a regular file, a
// header of at most 100 MB nested at most 8 deep, no tensor named twice,
// offsets in range, non-overlapping, matching shape x dtype size, known
// dtypes), so a malformed file is rejected with one fd::Error (kUsage) naming
// the file and the problem; nothing here crashes or blocks on bad input (a
// FIFO is refused by what it is). Tensor bytes are read on load(), so
// opening a multi-GB checkpoint to list its names is cheap.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "lib/tensor/tensor.h"

namespace fd {

class SafetensorsFile {
 public:
  // One tensor's header entry.
  struct Entry {
    std::string dtype;  // the file's dtype name: "F32", "BF16", "F16", "I32", "F64", ...
    std::vector<int64_t> shape;
    uint64_t begin = 0;  // byte offsets into the data section, [begin, end)
    uint64_t end = 0;
  };

  // Reads and validates the header of `path`; throws fd::Error (kUsage) when
  // the file is missing, unreadable or not a well-formed safetensors file.
  static SafetensorsFile open(const std::string& path);

  const std::string& path() const { return path_; }
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  // Tensor names in sorted order (without "__metadata__").
  std::vector<std::string> names() const;
  // The header entry of `name`; throws fd::Error (kUsage) if absent.
  const Entry& entry(const std::string& name) const;
  // Shape and dtype of `name`. dtype() throws fd::Error (kUsage) for dtypes
  // fdtrain cannot hold (anything but F32, BF16, F16, I32).
  Shape shape(const std::string& name) const;
  DType dtype(const std::string& name) const;
  // The "__metadata__" map (empty if the file has none).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // File offset of the data section (8 + header length): tensor `name`'s
  // bytes lie at [data_start() + entry(name).begin, data_start() + entry(name).end),
  // for readers that fetch only part of a tensor.
  uint64_t data_start() const { return data_start_; }

  // A new CPU tensor holding a copy of `name`, in the file's dtype. Throws
  // fd::Error (kUsage) if absent or of an unsupported dtype, (kRuntime) if
  // the file can no longer be read.
  Tensor load(const std::string& name, MemCategory category = MemCategory::kOther) const;

 private:
  SafetensorsFile() = default;

  std::string path_;
  uint64_t data_start_ = 0;  // file offset of the data section: 8 + header length
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Writes `tensors` (CPU tensors of any fdtrain dtype, unique names, in this
// order in the data section) and `metadata` to `path`. The file is written to
// a fresh path.tmp-XXXXXX (make_temp_file_beside: never a file of the user's)
// and renamed, so a reader never sees a partial file. Throws
// fd::Error (kRuntime) on I/O failure, (kUsage) on a duplicate or reserved name.
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// A tensor to write as its bytes: any dtype the format defines ("F32", "BF16",
// "U8", ...), for tensors fdtrain has no DType for (bitsandbytes' packed 4-bit
// weights and their statistics are U8). The bytes are not owned.
struct TensorBytes {
  std::string dtype;  // the file's dtype name
  std::vector<int64_t> shape;
  const void* data = nullptr;
  uint64_t nbytes = 0;  // must equal numel(shape) x the dtype's element size
};
// A view of CPU tensor `t` (its dtype's file name, its shape, its bytes).
TensorBytes tensor_bytes(const Tensor& t);
// Size in bytes of one element of file dtype `dtype` ("U8": 1, "F32": 4, ...); 0 if unknown.
size_t safetensors_element_size(const std::string& dtype);

// As above, from bytes. Throws fd::Error (kUsage) on an unknown dtype or a
// byte count that does not match the shape, as a reader would refuse it.
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, TensorBytes>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace fd
