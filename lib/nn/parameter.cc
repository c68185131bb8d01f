#include "lib/nn/parameter.h"

#include <algorithm>

namespace fd::nn {

namespace {

int64_t aligned(int64_t n, int64_t unit) { return (n + unit - 1) / unit * unit; }

}  // namespace

int64_t FlatParamGroup::padded_numel(const std::vector<ParamSpec>& specs, int64_t shards) {
  FD_CHECK(shards >= 1, "padding for {} shards", shards);
  int64_t total = 0;
  for (const auto& s : specs) total += aligned(s.shape.numel(), kAlignElems);
  return aligned(total, kAlignElems * shards);
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
  aligned_numel_ = offset;
  const int64_t total = padded_numel(specs);
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

void FlatParamGroup::pad_for(int64_t shards) const {
  FD_CHECK(shards >= 1, "group '{}' padded for {} shards", name_, shards);
  const int64_t total = aligned(aligned_numel_, kAlignElems * shards);
  if (total == numel()) return;
  auto resize = [&](Tensor& flat) {
    if (!flat.defined()) return;
    const std::shared_ptr<Storage> storage = flat.storage();
    const MemCategory category = storage->category();
    Tensor fresh;
    if (storage->resident() && storage->bytes() > 0) {
      fresh = Tensor::empty(Shape{total}, dtype_, category, flat.device());
      const int64_t kept = std::min(total, flat.numel());  // parameters, then zeros
      fresh.flat_slice(0, kept).copy_from(flat.flat_slice(0, kept));
      if (total > kept) fresh.flat_slice(kept, total - kept).zero_();
    } else {
      fresh = Tensor::released(Shape{total}, dtype_, category, flat.device());
    }
    // The storage keeps its identity (every view stays valid); `fresh` leaves
    // with the old bytes and frees them.
    storage->swap_bytes(*fresh.storage());
    flat = Tensor::view_of(storage, 0, Shape{total}, dtype_);
  };
  resize(flat_params_);
  resize(flat_grads_);
}

const Parameter& FlatParamGroup::param(const std::string& name) const {
  for (const auto& p : params_)
    if (p.name == name) return p;
  FD_CHECK(false, "group '{}' has no parameter '{}'", name_, name);
  __builtin_unreachable();
}

}  // namespace fd::nn
