// Parameter and FlatParamGroup: named parameters living as views in one
// contiguous buffer per segment, with a matching flat gradient buffer.
//
// A segment (the embedding, one transformer block, the final norm) declares
// its parameters in order; the group lays them out back to back, each start
// aligned to kAlignElems elements, and allocates one parameter buffer and one
// gradient buffer. Optimizers, gradient clipping, and later ZeRO partitioning
// and checkpoints work on these flat buffers, never on individual tensors.
// Padding elements are zero in both buffers and stay zero.
//
// A group is built with alignment padding only: nothing in it depends on how
// many ranks will share it. Whoever partitions it (the ZeroEngine, over its
// communicator) pads it for that many shards with pad_for(), so one model can
// be built once and partitioned for any group.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "lib/autograd/variable.h"
#include "lib/tensor/tensor.h"

namespace fd::nn {

// A tensor-parallel parameter's place in the whole tensor it is part of (DESIGN 17): along
// dimension `dim`, which the whole tensor divides into `blocks` equal parts of `global`
// elements each, this parameter holds elements [offset, offset + n) of every part, n being its
// own size along `dim` divided by `blocks`. blocks is 1 except for a fused projection (GPT-2's
// c_attn, q | k | v, each part split alike). dim -1: the whole tensor (unsharded, or replicated
// over the tensor-parallel ranks).
struct TensorSlice {
  int dim = -1;
  int64_t offset = 0;
  int64_t global = 0;  // elements of one part along dim in the whole tensor
  int blocks = 1;
  bool whole() const { return dim < 0; }
  bool operator==(const TensorSlice&) const = default;
};

struct Parameter {
  std::string name;    // Hugging Face GPT-2 name, e.g. "h.0.attn.c_attn.weight"
  Tensor value;        // view into the group's flat parameter buffer
  Tensor grad;         // view into the group's flat gradient buffer
  bool decay = true;   // AdamW weight decay applies (2-D weights); off for biases and norms
  int64_t offset = 0;  // element offset of `value` within the group's flat buffer
  TensorSlice slice;   // tensor parallelism: which part of the whole tensor `value` is

  // The whole tensor's shape: value's, or with the sliced dimension's full length.
  Shape global_shape() const;

  // A leaf Variable whose gradient accumulates into `grad`.
  autograd::Variable var() const { return autograd::Variable::bound_leaf(value, grad); }
};

// How a group's flat buffers are accounted and whether they start allocated
// (their length is the parameters', aligned; FlatParamGroup::pad_for pads it
// for a partition).
struct GroupLayout {
  MemCategory params_category = MemCategory::kParams;  // accounting of the flat parameter buffer
  MemCategory grads_category = MemCategory::kGrads;    // accounting of the flat gradient buffer
  bool with_grads = true;  // false: frozen parameters, no gradient buffer at all
  // false: the parameter buffer starts released and holds nothing (ZeRO-3:
  // the engine fills each rank's shard through a ParamFill and gathers the
  // full buffer only around use), so no rank ever holds the whole model.
  bool params_resident = true;
  // false: the gradient buffer starts released too (ZeRO-2/3, whose full
  // gradients are transient buckets the engine acquires and zeroes around a
  // segment's backward).
  bool grads_resident = true;
};

// Fills elements [begin, begin + count) of parameter `p`'s values (row-major
// over its shape) into `out`: 1-D, `count` elements of p's dtype, on p's
// device. How a model's initial values (a file, a random init) reach a buffer
// that only holds part of them (zero_engine.h).
using ParamFill =
    std::function<void(const Parameter& p, int64_t begin, int64_t count, const Tensor& out)>;

// Elements [begin, begin + count) of `p` (row-major over its own shape) as runs of consecutive
// elements of its whole tensor (row-major over global_shape()): fn(global_begin, local_begin,
// n) for each run, in order. One run when p is whole.
void for_each_global_run(
    const Parameter& p, int64_t begin, int64_t count,
    const std::function<void(int64_t global_begin, int64_t local_begin, int64_t n)>& fn);
// A fill by parameter slices from `whole`, a fill by whole tensors: a sliced parameter's range
// is read run by run (for_each_global_run) from `whole`, which sees a stand-in parameter of the
// same name and decay with global_shape() (its value has no storage). Whole parameters pass
// through. What makes a tensor-parallel rank's parameters the same values as those of the
// unsharded model, from any source (a random init, a weights file, an adapter).
ParamFill global_fill(ParamFill whole);

struct ParamSpec {
  std::string name;
  Shape shape;
  bool decay;
  TensorSlice slice = {};
};

class FlatParamGroup {
 public:
  static constexpr int64_t kAlignElems = 16;  // 64 bytes of fp32

  // Total elements of a group of `specs` padded for `shards` equal, aligned
  // shards, without allocating: the numel() the constructor gives (shards 1:
  // alignment only) and the one pad_for(shards) gives. Memory estimates
  // (lib/engine/estimate.h) use it.
  static int64_t padded_numel(const std::vector<ParamSpec>& specs, int64_t shards = 1);

  // Lays out `specs` in order and allocates zeroed parameter and gradient
  // buffers of padded_numel(specs) elements (a buffer starts released, not
  // zeroed, when the layout says it is not resident).
  FlatParamGroup(std::string name, std::vector<ParamSpec> specs, DType dtype,
                 const GroupLayout& layout = {});
  FlatParamGroup(const FlatParamGroup&) = delete;
  FlatParamGroup& operator=(const FlatParamGroup&) = delete;

  const std::string& name() const { return name_; }
  DType dtype() const { return dtype_; }
  const std::vector<Parameter>& params() const { return params_; }
  // The parameter called `name`; FD_CHECK fails if there is none.
  const Parameter& param(const std::string& name) const;
  // Total elements including alignment padding (and the partition's, after pad_for).
  int64_t numel() const { return flat_params_.numel(); }
  // Pads both flat buffers to padded_numel(specs, shards) elements, so that
  // they split into `shards` equal, aligned shards (ZeRO: the ranks of the
  // engine's communicator); a no-op when numel() is that already. Padding is
  // partition state, like a buffer's residency, not the model's: parameter
  // offsets and values do not change, and every Parameter view (and any
  // Variable bound to one) stays valid, since the buffers keep their Storage
  // objects. A released buffer is only resized (nothing allocated); a resident
  // one gets new bytes of the new size, its values copied and the new padding
  // zero (both held for the copy, one group at a time). Call it before the
  // buffers are handed to anything that keeps its own views of them.
  void pad_for(int64_t shards) const;
  // Elements that belong to parameters (no padding).
  int64_t param_numel() const { return param_numel_; }
  const Tensor& flat_params() const { return flat_params_; }
  const Tensor& flat_grads() const { return flat_grads_; }
  void zero_grads() const { flat_grads_.zero_(); }

 private:
  std::string name_;
  DType dtype_;
  std::vector<Parameter> params_;
  // Mutable for pad_for() only (the tensors' length, never their storage).
  mutable Tensor flat_params_;
  mutable Tensor flat_grads_;
  int64_t param_numel_ = 0;
  int64_t aligned_numel_ = 0;  // the parameters' aligned lengths, without partition padding
};

}  // namespace fd::nn
