// QuantizedWeight: Quantized4bit's storage in accounted tensors.
#include "lib/quant/quantized_weight.h"

#include <algorithm>
#include <cstring>
#include <span>

#include "lib/base/check.h"
#include "lib/quant/backend.h"
#include "lib/tensor/dtype.h"

namespace fd::quant {

namespace {

Tensor make(int64_t n, DType dtype, MemCategory category, Device device) {
  return Tensor::empty(Shape{n}, dtype, category, device);
}

// t's elements (a CPU or GPU tensor) on the host.
template <typename T>
std::vector<T> read(const Tensor& t) {
  const Tensor host = t.is_cuda() ? t.to_device(Device::cpu(), MemCategory::kOther) : t;
  std::vector<T> v(size_t(host.numel()));
  if (!v.empty()) std::memcpy(v.data(), host.raw(), host.nbytes());
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

EncodedLayout encoded_layout(int64_t numel, const QuantOptions& options) {
  check_block_size(options.block_size);
  FD_CHECK(numel >= 0, "encoded_layout of {} values", numel);
  auto align4 = [](int64_t n) { return (n + 3) / 4 * 4; };
  const int64_t blocks = (numel + options.block_size - 1) / options.block_size;
  EncodedLayout l;
  int64_t at = align4((numel + 1) / 2);
  if (!options.double_quant) {
    l.absmax = at;
    l.bytes = at + 4 * blocks;
    return l;
  }
  const int64_t groups = (blocks + NestedAbsmax::kBlockSize - 1) / NestedAbsmax::kBlockSize;
  l.nested_codes = at;
  at = align4(at + blocks);
  l.nested_absmax = at;
  l.nested_offset = at + 4 * groups;
  l.bytes = l.nested_offset + 4;
  return l;
}

void encode(const Quantized4bit& q, std::span<uint8_t> out) {
  const EncodedLayout l = encoded_layout(
      q.numel(), {.type = q.type, .block_size = q.block_size, .double_quant = q.nested.has_value()});
  FD_CHECK(int64_t(out.size()) == l.bytes, "encode: {} bytes for a layout of {}", out.size(),
           l.bytes);
  const int64_t n = q.numel(), blocks = q.num_blocks();
  FD_CHECK(int64_t(q.packed.size()) == (n + 1) / 2, "encode: {} packed bytes for {} values",
           q.packed.size(), n);
  std::fill(out.begin(), out.end(), uint8_t{0});
  auto put = [&](int64_t at, const void* src, size_t bytes) {
    if (bytes > 0) std::memcpy(out.data() + at, src, bytes);
  };
  put(l.packed, q.packed.data(), q.packed.size());
  if (!q.nested) {
    FD_CHECK(int64_t(q.absmax.size()) == blocks, "encode: {} absmax for {} blocks",
             q.absmax.size(), blocks);
    put(l.absmax, q.absmax.data(), q.absmax.size() * sizeof(float));
    return;
  }
  const NestedAbsmax& nq = *q.nested;
  FD_CHECK(q.absmax.empty(), "encode: both plain and nested absmax");
  FD_CHECK(nq.map == dynamic_map(), "encode: a nested map other than bitsandbytes' dynamic map");
  FD_CHECK(int64_t(nq.codes.size()) == blocks, "encode: {} nested codes for {} blocks",
           nq.codes.size(), blocks);
  FD_CHECK(int64_t(nq.absmax.size()) ==
               (blocks + NestedAbsmax::kBlockSize - 1) / NestedAbsmax::kBlockSize,
           "encode: {} nested absmax for {} codes", nq.absmax.size(), blocks);
  put(l.nested_codes, nq.codes.data(), nq.codes.size());
  put(l.nested_absmax, nq.absmax.data(), nq.absmax.size() * sizeof(float));
  put(l.nested_offset, &nq.offset, sizeof(float));
}

QuantizedWeight QuantizedWeight::view(const std::shared_ptr<Storage>& storage, size_t byte_offset,
                                      std::vector<int64_t> shape, const QuantOptions& options) {
  FD_CHECK(byte_offset % 4 == 0, "QuantizedWeight::view at byte {} (not a multiple of 4)",
           byte_offset);
  QuantizedWeight w;
  w.type_ = options.type;
  w.block_size_ = options.block_size;
  w.shape_ = std::move(shape);
  const int64_t n = w.numel(), blocks = w.num_blocks();
  const EncodedLayout l = encoded_layout(n, options);
  FD_CHECK(byte_offset + size_t(l.bytes) <= storage->bytes(),
           "QuantizedWeight::view: bytes [{}, {}) of a storage of {}", byte_offset,
           byte_offset + size_t(l.bytes), storage->bytes());
  auto at = [&](int64_t off, int64_t count, DType dtype) {
    return Tensor::view_of(storage, (byte_offset + size_t(off)) / dtype_size(dtype), Shape{count},
                           dtype);
  };
  w.packed_ = at(l.packed, (n + 1) / 2, DType::kU8);
  if (!options.double_quant) {
    w.absmax_ = at(l.absmax, blocks, DType::kF32);
    return w;
  }
  w.nested_codes_ = at(l.nested_codes, blocks, DType::kU8);
  w.nested_absmax_ = at(l.nested_absmax,
                        (blocks + NestedAbsmax::kBlockSize - 1) / NestedAbsmax::kBlockSize,
                        DType::kF32);
  w.nested_offset_ = at(l.nested_offset, 1, DType::kF32);
  w.nested_map_ = dynamic_map();
  return w;
}

QuantizedWeight QuantizedWeight::from(const Quantized4bit& q, Device device, MemCategory category) {
  const QuantOptions options{
      .type = q.type, .block_size = q.block_size, .double_quant = q.nested.has_value()};
  const EncodedLayout l = encoded_layout(q.numel(), options);
  // One buffer holds the encoded form; the tensors are views of it.
  Tensor bytes = make(l.bytes, DType::kU8, category, device);
  if (bytes.is_cuda()) {
    // Encoded on the host (a staging copy, not the weight's category), then copied over.
    Tensor host = make(l.bytes, DType::kU8, MemCategory::kOther, Device::cpu());
    encode(q, std::span<uint8_t>(host.data<uint8_t>(), size_t(l.bytes)));
    bytes.copy_from(host);
  } else if (!bytes.is_meta()) {
    encode(q, std::span<uint8_t>(bytes.data<uint8_t>(), size_t(l.bytes)));
  } else if (q.nested) {
    FD_CHECK(q.nested->map == dynamic_map(), "QuantizedWeight: a nested map other than "
                                             "bitsandbytes' dynamic map");
  }
  return view(bytes.storage(), bytes.offset(), q.shape, options);
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
  FD_CHECK(!is_meta(), "QuantizedWeight on {}: its values are not on the CPU nor a GPU",
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
  nq.offset = read<float>(nested_offset_).at(0);
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

void QuantizedWeight::block_absmax(const Tensor& out) const {
  FD_CHECK(defined() && !is_meta(), "QuantizedWeight::block_absmax on {}",
           defined() ? packed_.device().str() : "an undefined weight");
  FD_CHECK(out.dtype() == DType::kF32 && out.numel() == num_blocks() &&
               out.is_cuda() == is_cuda() && !out.is_meta(),
           "QuantizedWeight::block_absmax into {} {} on {}: {} f32 on {} needed", out.shape().str(),
           dtype_name(out.dtype()), out.device().str(), num_blocks(), packed_.device().str());
  if (is_cuda()) return cuda::block_absmax(*this, out);
  block_absmax(out.data<float>());
}

void dequantize_range(const QuantizedWeight& w, const Tensor& absmax, int64_t begin, int64_t count,
                      const Tensor& out) {
  FD_CHECK(w.defined() && !w.is_meta(), "dequantize_range of a weight without values");
  FD_CHECK(out.dtype() == DType::kF32 || out.dtype() == DType::kBF16 || out.dtype() == DType::kF16,
           "dequantize_range into {}: a float dtype is needed", dtype_name(out.dtype()));
  FD_CHECK(out.numel() >= count, "dequantize_range: {} values into {}", count, out.numel());
  if (w.is_cuda()) return cuda::dequantize_range(w, absmax, begin, count, out);
  FD_CHECK(!absmax.is_cuda() && !out.is_cuda() && !absmax.is_meta() && !out.is_meta(),
           "dequantize_range of a CPU weight: absmax on {}, out on {}", absmax.device().str(),
           out.device().str());
  FD_CHECK(absmax.dtype() == DType::kF32, "dequantize_range: absmax in {}",
           dtype_name(absmax.dtype()));
  const std::span<const float> a(absmax.data<float>(), size_t(absmax.numel()));
  if (out.dtype() == DType::kF32) {
    dequantize_range(w.type(), w.block_size(), w.packed().data<uint8_t>(), w.numel(), a, begin,
                     count, out.data<float>());
    return;
  }
  std::vector<float> v(static_cast<size_t>(count));
  dequantize_range(w.type(), w.block_size(), w.packed().data<uint8_t>(), w.numel(), a, begin, count,
                   v.data());
  convert_f32_to(out.dtype(), v.data(), out.raw(), v.size());
}

}  // namespace fd::quant
