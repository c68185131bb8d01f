#include "lib/nn/parameter.h"

#include <algorithm>
#include <map>
#include <memory>

namespace fd::nn {

namespace {

int64_t aligned(int64_t n, int64_t unit) { return (n + unit - 1) / unit * unit; }

}  // namespace

Shape Parameter::global_shape() const {
  if (slice.whole()) return value.shape();
  std::vector<int64_t> dims;
  for (int d = 0; d < value.shape().ndim(); ++d) dims.push_back(value.shape()[d]);
  dims[size_t(slice.dim)] = slice.global * slice.blocks;
  return Shape(std::span<const int64_t>(dims));
}

void for_each_global_run(const Parameter& p, int64_t begin, int64_t count,
                         const std::function<void(int64_t, int64_t, int64_t)>& fn) {
  FD_CHECK(begin >= 0 && count >= 0 && begin + count <= p.value.numel(),
           "elements [{}, {}) of {} ({} elements)", begin, begin + count, p.name, p.value.numel());
  if (count == 0) return;
  if (p.slice.whole()) {
    fn(begin, begin, count);
    return;
  }
  const TensorSlice& s = p.slice;
  const Shape& shape = p.value.shape();
  // Row-major: rows over the dimensions before dim, each holding shape[dim] (globally
  // global * blocks) times `inner` elements. A run is one part's elements of one such row.
  int64_t inner = 1;
  for (int d = s.dim + 1; d < int(shape.ndim()); ++d) inner *= shape[d];
  const int64_t part = shape[s.dim] / s.blocks;  // this slice's elements of one part along dim
  FD_CHECK(part * s.blocks == shape[s.dim] && s.offset + part <= s.global,
           "{}: slice [{}, {}) of parts of {} along dim {} in {} blocks does not fit shape {}",
           p.name, s.offset, s.offset + part, s.global, s.dim, s.blocks, shape.str());
  const int64_t run = part * inner;  // consecutive elements, locally and globally
  const int64_t end = begin + count;
  for (int64_t at = begin; at < end;) {
    const int64_t r = at / run;  // which run: (outer row, block)
    const int64_t row = r / s.blocks, block = r % s.blocks;
    const int64_t within = at - r * run;
    const int64_t n = std::min(run - within, end - at);
    const int64_t g = (row * s.blocks + block) * s.global * inner + s.offset * inner + within;
    fn(g, at, n);
    at += n;
  }
}

ParamFill global_fill(ParamFill whole) {
  // Stand-ins by parameter, made on first use (a fill is called from one thread at a time).
  auto standins = std::make_shared<std::map<const Parameter*, Parameter>>();
  return [whole = std::move(whole), standins](const Parameter& p, int64_t begin, int64_t count,
                                              const Tensor& out) {
    if (p.slice.whole()) return whole(p, begin, count, out);
    auto it = standins->find(&p);
    if (it == standins->end()) {
      Parameter g;
      g.name = p.name;
      g.decay = p.decay;
      g.value =
          Tensor::released(p.global_shape(), p.value.dtype(), MemCategory::kOther, Device::cpu());
      it = standins->emplace(&p, std::move(g)).first;
    }
    const Parameter& g = it->second;
    for_each_global_run(p, begin, count, [&](int64_t gb, int64_t lb, int64_t n) {
      whole(g, gb, n, out.flat_slice(lb - begin, n));
    });
  };
}

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
    p.slice = specs[i].slice;
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
