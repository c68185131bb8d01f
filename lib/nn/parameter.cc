#include "lib/nn/parameter.h"

namespace fd::nn {

namespace {

int64_t aligned(int64_t n, int64_t unit) { return (n + unit - 1) / unit * unit; }

}  // namespace

int64_t FlatParamGroup::padded_numel(const std::vector<ParamSpec>& specs,
                                     const GroupLayout& layout) {
  FD_CHECK(layout.pad_multiple >= 1, "pad_multiple {}", layout.pad_multiple);
  int64_t total = 0;
  for (const auto& s : specs) total += aligned(s.shape.numel(), kAlignElems);
  return aligned(total, kAlignElems * layout.pad_multiple);
}

FlatParamGroup::FlatParamGroup(std::string name, std::vector<ParamSpec> specs, DType dtype,
                               const GroupLayout& layout)
    : name_(std::move(name)), dtype_(dtype) {
  std::vector<int64_t> offsets;
  int64_t offset = 0;
  for (const auto& s : specs) {
    offsets.push_back(offset);
    param_numel_ += s.shape.numel();
    offset += aligned(s.shape.numel(), kAlignElems);
  }
  const int64_t total = padded_numel(specs, layout);
  flat_params_ = layout.params_resident
                     ? Tensor::zeros(Shape{total}, dtype, layout.params_category)
                     : Tensor::released(Shape{total}, dtype, layout.params_category);
  if (layout.with_grads)
    flat_grads_ = layout.grads_resident
                      ? Tensor::zeros(Shape{total}, dtype, layout.grads_category)
                      : Tensor::released(Shape{total}, dtype, layout.grads_category);
  for (size_t i = 0; i < specs.size(); ++i) {
    Parameter p;
    p.name = specs[i].name;
    p.decay = specs[i].decay;
    p.offset = offsets[i];
    int64_t n = specs[i].shape.numel();
    p.value = flat_params_.flat_slice(offsets[i], n).reshape(specs[i].shape);
    if (layout.with_grads) p.grad = flat_grads_.flat_slice(offsets[i], n).reshape(specs[i].shape);
    params_.push_back(std::move(p));
  }
}

const Parameter& FlatParamGroup::param(const std::string& name) const {
  for (const auto& p : params_)
    if (p.name == name) return p;
  FD_CHECK(false, "group '{}' has no parameter '{}'", name_, name);
  __builtin_unreachable();
}

}  // namespace fd::nn
