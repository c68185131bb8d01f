// Parameter and FlatParamGroup: named parameters living as views in one
// contiguous buffer per segment, with a matching flat gradient buffer.
//
// A segment (the embedding, one transformer block, the final norm) declares
// its parameters in order; the group lays them out back to back, each start
// aligned to kAlignElems elements, and allocates one parameter buffer and one
// gradient buffer. Optimizers, gradient clipping, and later ZeRO partitioning
// and checkpoints work on these flat buffers, never on individual tensors.
// Padding elements are zero in both buffers and stay zero.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "lib/autograd/variable.h"
#include "lib/tensor/tensor.h"

namespace fd::nn {

struct Parameter {
  std::string name;    // Hugging Face GPT-2 name, e.g. "h.0.attn.c_attn.weight"
  Tensor value;        // view into the group's flat parameter buffer
  Tensor grad;         // view into the group's flat gradient buffer
  bool decay = true;   // AdamW weight decay applies (2-D weights); off for biases and norms
  int64_t offset = 0;  // element offset of `value` within the group's flat buffer

  // A leaf Variable whose gradient accumulates into `grad`.
  autograd::Variable var() const { return autograd::Variable::bound_leaf(value, grad); }
};

// How a group's flat buffers are sized and accounted.
struct GroupLayout {
  // The total length is padded to a multiple of kAlignElems * pad_multiple, so
  // that it splits into pad_multiple equal, aligned shards (ZeRO: the world size).
  int64_t pad_multiple = 1;
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
using ParamFill = std::function<void(const Parameter& p, int64_t begin, int64_t count,
                                     const Tensor& out)>;

struct ParamSpec {
  std::string name;
  Shape shape;
  bool decay;
};

class FlatParamGroup {
 public:
  static constexpr int64_t kAlignElems = 16;  // 64 bytes of fp32

  // Total elements (alignment and world padding included) of a group of
  // `specs` laid out as `layout` says, without allocating: the numel() the
  // constructor gives. Memory estimates (lib/engine/estimate.h) use it.
  static int64_t padded_numel(const std::vector<ParamSpec>& specs, const GroupLayout& layout = {});

  // Lays out `specs` in order and allocates zeroed parameter and gradient
  // buffers (the parameter buffer released, not zeroed, when
  // !layout.params_resident).
  FlatParamGroup(std::string name, std::vector<ParamSpec> specs, DType dtype,
                 const GroupLayout& layout = {});
  FlatParamGroup(const FlatParamGroup&) = delete;
  FlatParamGroup& operator=(const FlatParamGroup&) = delete;

  const std::string& name() const { return name_; }
  DType dtype() const { return dtype_; }
  const std::vector<Parameter>& params() const { return params_; }
  // The parameter called `name`; FD_CHECK fails if there is none.
  const Parameter& param(const std::string& name) const;
  // Total elements including alignment padding.
  int64_t numel() const { return flat_params_.numel(); }
  // Elements that belong to parameters (no padding).
  int64_t param_numel() const { return param_numel_; }
  const Tensor& flat_params() const { return flat_params_; }
  const Tensor& flat_grads() const { return flat_grads_; }
  void zero_grads() const { flat_grads_.zero_(); }

 private:
  std::string name_;
  DType dtype_;
  std::vector<Parameter> params_;
  Tensor flat_params_;
  Tensor flat_grads_;
  int64_t param_numel_ = 0;
};

}  // namespace fd::nn
