// QuantizedWeight: Quantized4bit's storage in accounted tensors.
#include "lib/quant/quantized_weight.h"

#include <cstring>
#include <span>

#include "lib/base/check.h"

namespace fd::quant {

namespace {

Tensor make(int64_t n, DType dtype, MemCategory category, Device device) {
  return Tensor::empty(Shape{n}, dtype, category, device);
}

// Copies `bytes` bytes into a CPU tensor (nothing on meta).
void fill(const Tensor& t, const void* src, size_t bytes) {
  FD_CHECK(t.nbytes() == bytes, "QuantizedWeight: {} bytes into a tensor of {}", bytes, t.nbytes());
  if (t.is_meta() || bytes == 0) return;
  std::memcpy(t.raw(), src, bytes);
}

template <typename T>
std::vector<T> read(const Tensor& t) {
  std::vector<T> v(size_t(t.numel()));
  if (!v.empty()) std::memcpy(v.data(), t.raw(), t.nbytes());
  return v;
}

int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    FD_CHECK(d >= 0, "QuantizedWeight: negative dimension {}", d);
    n *= d;
  }
  return n;
}

}  // namespace

int64_t QuantizedWeight::numel() const { return product(shape_); }

QuantizedWeight QuantizedWeight::from(const Quantized4bit& q, Device device, MemCategory category) {
  FD_CHECK(!device.is_cuda(), "QuantizedWeight on {}: GPU storage comes with the CUDA kernels",
           device.str());
  check_block_size(q.block_size);
  QuantizedWeight w;
  w.type_ = q.type;
  w.block_size_ = q.block_size;
  w.shape_ = q.shape;
  const int64_t n = w.numel(), blocks = w.num_blocks();
  FD_CHECK(int64_t(q.packed.size()) == (n + 1) / 2,
           "QuantizedWeight: {} packed bytes for {} values", q.packed.size(), n);
  w.packed_ = make((n + 1) / 2, DType::kU8, category, device);
  fill(w.packed_, q.packed.data(), q.packed.size());
  if (!q.nested) {
    FD_CHECK(int64_t(q.absmax.size()) == blocks, "QuantizedWeight: {} absmax for {} blocks",
             q.absmax.size(), blocks);
    w.absmax_ = make(blocks, DType::kF32, category, device);
    fill(w.absmax_, q.absmax.data(), q.absmax.size() * sizeof(float));
    return w;
  }
  const NestedAbsmax& nq = *q.nested;
  FD_CHECK(q.absmax.empty(), "QuantizedWeight: both plain and nested absmax");
  FD_CHECK(int64_t(nq.codes.size()) == blocks, "QuantizedWeight: {} nested codes for {} blocks",
           nq.codes.size(), blocks);
  const int64_t groups = (blocks + NestedAbsmax::kBlockSize - 1) / NestedAbsmax::kBlockSize;
  FD_CHECK(int64_t(nq.absmax.size()) == groups, "QuantizedWeight: {} nested absmax for {} codes",
           nq.absmax.size(), blocks);
  w.nested_codes_ = make(blocks, DType::kU8, category, device);
  fill(w.nested_codes_, nq.codes.data(), nq.codes.size());
  w.nested_absmax_ = make(groups, DType::kF32, category, device);
  fill(w.nested_absmax_, nq.absmax.data(), nq.absmax.size() * sizeof(float));
  w.nested_offset_ = make(1, DType::kF32, category, device);
  fill(w.nested_offset_, &nq.offset, sizeof(float));
  w.nested_map_ = nq.map;
  return w;
}

QuantizedWeight QuantizedWeight::empty(std::vector<int64_t> shape, const QuantOptions& options,
                                       Device device, MemCategory category) {
  check_block_size(options.block_size);
  Quantized4bit layout;
  layout.type = options.type;
  layout.block_size = options.block_size;
  layout.shape = std::move(shape);
  const int64_t n = product(layout.shape), blocks = layout.num_blocks();
  // Zero codes and statistics (the sizes are what matter); on meta nothing is written.
  layout.packed.assign(size_t((n + 1) / 2), 0);
  if (options.double_quant) {
    NestedAbsmax nq;
    nq.codes.assign(size_t(blocks), 0);
    nq.absmax.assign(size_t((blocks + NestedAbsmax::kBlockSize - 1) / NestedAbsmax::kBlockSize),
                     0.0f);
    nq.map = dynamic_map();
    layout.nested = std::move(nq);
  } else {
    layout.absmax.assign(size_t(blocks), 0.0f);
  }
  return from(layout, device, category);
}

Quantized4bit QuantizedWeight::to_quantized4bit() const {
  FD_CHECK(defined(), "QuantizedWeight: undefined");
  FD_CHECK(!is_meta() && !is_cuda(), "QuantizedWeight on {}: its values are not on the CPU",
           packed_.device().str());
  Quantized4bit q;
  q.type = type_;
  q.block_size = block_size_;
  q.shape = shape_;
  q.packed = read<uint8_t>(packed_);
  if (!double_quant()) {
    q.absmax = read<float>(absmax_);
    return q;
  }
  NestedAbsmax nq;
  nq.codes = read<uint8_t>(nested_codes_);
  nq.absmax = read<float>(nested_absmax_);
  std::memcpy(&nq.offset, nested_offset_.raw(), sizeof(float));
  nq.map = nested_map_;
  q.nested = std::move(nq);
  return q;
}

int64_t QuantizedWeight::storage_bytes() const {
  int64_t bytes = 0;
  for (const Tensor* t : {&packed_, &absmax_, &nested_codes_, &nested_absmax_, &nested_offset_}) {
    if (t->defined()) bytes += int64_t(t->nbytes());
  }
  return bytes;
}

void QuantizedWeight::block_absmax(float* out) const {
  FD_CHECK(!is_meta() && !is_cuda(), "QuantizedWeight::block_absmax on {}", packed_.device().str());
  if (!double_quant()) {
    std::memcpy(out, absmax_.raw(), absmax_.nbytes());
    return;
  }
  float offset;
  std::memcpy(&offset, nested_offset_.raw(), sizeof(float));
  decode_nested_absmax(
      std::span<const uint8_t>(nested_codes_.data<uint8_t>(), size_t(nested_codes_.numel())),
      std::span<const float>(nested_absmax_.data<float>(), size_t(nested_absmax_.numel())), offset,
      nested_map_, out);
}

}  // namespace fd::quant
