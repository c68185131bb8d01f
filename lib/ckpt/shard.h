// One rank's checkpoint shard: an HDF5 file holding the rank's ranges of
// every segment's flat space (fp32 master weights, Adam moments, parameters
// in the compute dtype) and, as attributes, everything needed to resume.
//
// The full file format is in docs/FORMAT.md. In short:
//   /                  attributes: format_version, step, world_size, rank, zero_stage,
//                      precision, optimizer_step, seed, skipped_steps, fdtrain_version,
//                      recipe, and loss_scale* (fp16 only)
//   /layout/{name,segment,offset,ndim,shape,decay}   one row per parameter, canonical order
//                      (tensor-parallel shards: also slice_dim, slice_offset, slice_global,
//                      slice_blocks, and root attributes tensor_size, tensor_rank,
//                      tensor_replicas)
//   /segments/<segment>  attributes segment_numel, offset, count; datasets master,
//                      exp_avg, exp_avg_sq (float32) and params (float32, or uint16 with a
//                      `dtype` attribute "bf16"/"f16"), chunked with Fletcher32 checksums.
//
// There is no separate data-sampler or RNG state: data order and
// initialisation are counter-based functions of (seed, step), so `seed` and
// `step` are that state.
//
// Not thread-safe: HDF5 is the serial build; use shards from one thread.
//
// A shard is self-describing and world-size independent in its addressing:
// ranges carry global element offsets, so a loader at another world size or
// ZeRO stage reads whichever ranges it now owns (ShardReader::read).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lib/ckpt/manifest.h"  // kFormatVersion, Manifest, step_dir_name, shard_file_name
#include "lib/tensor/tensor.h"

namespace fd::ckpt {

// One contiguous range of one segment's flat space held by the writing rank.
struct SegmentRange {
  std::string segment;    // FlatParamGroup name: "embed", "h.0", ..., "final"
  int64_t segment_numel;  // padded numel of the segment in the writer's layout
  int64_t offset;         // global element offset of the range within the segment's flat space
  int64_t count;          // elements
  Tensor master;          // fp32, count: master weights (fp32 runs: the parameters themselves)
  Tensor exp_avg;         // fp32, count: Adam m
  Tensor exp_avg_sq;      // fp32, count: Adam v
  Tensor params;          // compute dtype (f32/bf16/f16), count: the model's parameters.
                          // May be left undefined when it equals `master` (fp32 runs):
                          // nothing is stored and read("params") returns master.
  // State that does not fit in memory (ZeRO-Infinity offload): when set,
  // master, exp_avg and exp_avg_sq are undefined and stream(fn) hands them to
  // fn a piece at a time, in order: fn(offset within the range, master,
  // exp_avg, exp_avg_sq, params), fp32 CPU tensors of the piece's length, and
  // when stream_params is set (and `params` undefined) the parameters in that
  // dtype. They are written as they come, a whole HDF5 chunk at a time.
  using PieceFn = std::function<void(int64_t offset, const Tensor& master, const Tensor& exp_avg,
                                     const Tensor& exp_avg_sq, const Tensor& params)>;
  std::function<void(const PieceFn&)> stream;
  std::optional<DType> stream_params;
};

// Where a parameter lives (the flat layout), world-size independent.
struct ParamLayout {
  std::string name;            // Hugging Face GPT-2 name, e.g. "h.0.attn.c_attn.weight"
  std::string segment;         // the segment holding it
  int64_t offset;              // element offset within the segment's flat space
  std::vector<int64_t> shape;  // this row's tensor (a tp rank's slice: its part)
  bool decay;                  // AdamW weight decay applies
  // Tensor parallelism (lib/ckpt/slices.h; nn::TensorSlice's fields): which part of the whole
  // tensor `shape` is. slice_dim -1: the whole tensor.
  int slice_dim = -1;
  int64_t slice_offset = 0;
  int64_t slice_global = 0;  // elements of one part along slice_dim in the whole tensor
  int slice_blocks = 1;
  bool whole() const { return slice_dim < 0; }
};

struct LossScalerState {
  double scale;
  int64_t iter;
  int64_t last_overflow_iter;
  int hysteresis_left;
};

struct ShardMeta {
  int format_version = kFormatVersion;
  int64_t step = 0;  // optimizer steps completed (the run resumes at this 0-based step)
  int world_size = 1;
  int rank = 0;
  int zero_stage = 0;
  std::string precision;       // "fp32" | "bf16" | "fp16"
  std::string recipe_yaml;     // the full resolved recipe
  int64_t optimizer_step = 0;  // AdamW's step counter (bias correction)
  int64_t seed = 0;            // the run's seed: data order and init are counter-based in
                               // (seed, step), so (seed, step) is the sampler position and
                               // the RNG state
  std::optional<LossScalerState> loss_scaler;  // fp16 only
  int64_t skipped_steps = 0;                   // steps skipped for fp16 overflow
  std::vector<ParamLayout> layout;             // every parameter in canonical order
  std::string fdtrain_version;
  std::string
      base_sha256;  // LoRA: SHA-256 of the frozen base's file (model.init_from); "" otherwise
  // Pipeline-parallel runs (parallel.pipeline > 1): the layout that wrote the
  // checkpoint. Informational (a resume at another layout reshards through the
  // segments' global ranges); absent from the file when stages == 1.
  struct Pipeline {
    int stages = 1, replicas = 1;  // world_size = stages * replicas (* tensor.size)
    int stage = 0, replica = 0;    // of this shard's rank
    std::vector<int> blocks;       // transformer blocks per stage
    std::string schedule;          // "1f1b" | "gpipe"
    bool operator==(const Pipeline&) const = default;
  };
  Pipeline pipeline;
  // Tensor-parallel runs (parallel.tensor > 1): the writer's layout. Each parameter's row of
  // /layout then has its slice of the whole tensor; absent from the file when size == 1.
  // Checked on read: size >= 2, rank < size, rank == the shard's rank modulo size (world rank
  // = (stage x replicas + replica) x size + tp rank), size x replicas x pipeline stages ==
  // world_size.
  struct TensorLayout {
    int size = 1, rank = 0;  // tp ranks, this shard's rank's coordinate
    int replicas = 1;        // data-parallel replicas (world_size = replicas x size)
    bool operator==(const TensorLayout&) const = default;
  };
  TensorLayout tensor;
};

// Writes one rank's shard to `path` (the caller picks the directory and
// renames it into place). Tensors must be CPU tensors of `count` elements;
// at most one range per segment. HDF5 writes the structure and the small datasets; the state
// datasets of 64 KiB or more are written after it, past the page cache (write_regions). The
// file is on its device before returning; returns its size and CRC-32C (the manifest's
// digest), computed without reading the state back. Throws fd::Error kRuntime on I/O failure
// (disk full: says so).
FileDigest write_shard(const std::string& path, const ShardMeta& meta,
                       const std::vector<SegmentRange>& ranges);

// The most memory write_shard() holds beyond its inputs while it writes a range of `count`
// elements, bytes: write_regions's bounce buffers for its datasets, or, through HDF5, about two
// chunks of the largest (fp32) dataset (measured; tests/cli/process_memory.sh holds the
// estimate to it); a streamed range (SegmentRange::stream) also stages one chunk of each field
// (`params_bytes` per element for streamed 16-bit parameters, 0 without). What a save adds to
// a rank's peak resident memory (lib/engine/process_memory.h).
int64_t write_buffer_bytes(int64_t count, bool streamed, int params_bytes);

class ShardReader {  // RAII over the HDF5 file; movable, not copyable
 public:
  // Opens and validates `path`: HDF5 signature, format version (a different
  // version -> an error naming both versions), required attributes and
  // datasets, ranges consistent with segment_numel. Throws fd::Error kUsage
  // with the file name, what is wrong and what to do.
  static ShardReader open(const std::string& path);

  ShardReader(ShardReader&&) noexcept;
  ShardReader& operator=(ShardReader&&) noexcept;
  ~ShardReader();

  const std::string& path() const;
  const ShardMeta& meta() const;
  struct RangeInfo {
    std::string segment;
    int64_t segment_numel, offset, count;
    DType params_dtype;
  };
  // The file's ranges, in the order they were written.
  const std::vector<RangeInfo>& ranges() const;
  // The range of `segment`, or nullptr if this file holds none.
  const RangeInfo* find_range(const std::string& segment) const;

  // Reads elements [global_offset, global_offset + count) of `field`
  // ("master", "exp_avg", "exp_avg_sq" as fp32; "params" converted to
  // `out`'s dtype) of `segment`, which must lie inside this file's range of
  // that segment, into `out` (count elements on the CPU or the GPU; fp32 fields
  // are converted too if `out` is not f32). Checksums are verified on read:
  // corruption -> fd::Error kUsage naming the file, segment and dataset.
  void read(const std::string& segment, const std::string& field, int64_t global_offset,
            int64_t count, const Tensor& out) const;

 private:
  struct Impl;
  explicit ShardReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fd::ckpt
