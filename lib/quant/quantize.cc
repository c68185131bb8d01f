// Blockwise 4-bit quantization (see quantize.h). Built with -ffp-contract=off: each float32
// product and sum is rounded on its own, as the GPU kernel computes them one by one.
#include "lib/quant/quantize.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "lib/base/check.h"
#include "lib/base/error.h"

namespace fd::quant {

void check_block_size(int64_t block_size) {
  if (std::find(kBlockSizes.begin(), kBlockSizes.end(), block_size) == kBlockSizes.end()) {
    usage_error(
        "4-bit quantization: block size {} is not supported; bitsandbytes' 4-bit kernels take "
        "{} (64 is its default)",
        block_size, fmt::join(kBlockSizes, ", "));
  }
}

int64_t Quantized4bit::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t Quantized4bit::storage_bytes() const {
  int64_t bytes = int64_t(packed.size()) + int64_t(absmax.size() * sizeof(float));
  if (nested) {
    bytes += int64_t(nested->codes.size()) + int64_t(nested->absmax.size() * sizeof(float)) +
             int64_t(sizeof(float));
  }
  return bytes;
}

float mean_f32(std::span<const float> values) {
  FD_CHECK(!values.empty(), "mean of no values");
  // The sum as an unevaluated pair hi + lo (Knuth's TwoSum per addition): exact up to the
  // rounding of lo, which is far below a float32 ulp of the mean.
  double hi = 0.0, lo = 0.0;
  for (float f : values) {
    const double x = f;
    const double s = hi + x;
    const double bp = s - hi;
    lo += (hi - (s - bp)) + (x - bp);
    hi = s;
  }
  const double n = double(values.size());
  const double q = hi / n;
  const double q2 = (std::fma(-q, n, hi) + lo) / n;  // the mean is q + q2
  // Round q + q2 to float32 once. float(q) is right unless q sits exactly on the midpoint
  // between two floats (a double), where q2's sign decides.
  const float f = float(q);
  if (double(f) == q || q2 == 0.0) return f;
  const float g = q > double(f) ? std::nextafter(f, INFINITY) : std::nextafter(f, -INFINITY);
  if ((double(f) + double(g)) / 2.0 != q) return f;
  const float lo_f = std::min(f, g), hi_f = std::max(f, g);
  return q2 > 0.0 ? hi_f : lo_f;
}

NestedAbsmax double_quantize(std::span<const float> absmax) {
  NestedAbsmax nq;
  nq.map = dynamic_map();
  if (absmax.empty()) return nq;  // an empty weight: no blocks, offset 0
  nq.offset = mean_f32(absmax);
  const int64_t n = int64_t(absmax.size());
  const int64_t bs = NestedAbsmax::kBlockSize;
  nq.codes.resize(size_t(n));
  nq.absmax.resize(size_t((n + bs - 1) / bs));
  std::vector<float> centred(absmax.size());
  // `_absmax - offset` is a torch subtraction: IEEE, nothing flushed.
  for (int64_t i = 0; i < n; ++i) centred[i] = absmax[i] - nq.offset;
  for (int64_t b = 0; b * bs < n; ++b) {
    const int64_t begin = b * bs, end = std::min(n, begin + bs);
    float amax = 0.0f;
    for (int64_t i = begin; i < end; ++i)
      amax = std::max(amax, std::fabs(flush_subnormal(centred[i])));
    nq.absmax[b] = amax;
    const float inv = 1.0f / amax;  // inf when every value is 0: x becomes NaN, code 0
    for (int64_t i = begin; i < end; ++i) {
      nq.codes[i] = quantize_dynamic(nq.map, mul_ftz(centred[i], inv));
    }
  }
  return nq;
}

Quantized4bit quantize(std::span<const float> values, std::vector<int64_t> shape,
                       const QuantOptions& options, std::string_view name) {
  check_block_size(options.block_size);
  Quantized4bit q;
  q.type = options.type;
  q.block_size = options.block_size;
  q.shape = std::move(shape);
  const int64_t n = q.numel();
  FD_CHECK(n == int64_t(values.size()), "{}: {} values for shape of {} elements", name,
           values.size(), n);
  const int64_t cols = q.shape.empty() ? 1 : std::max<int64_t>(1, q.shape.back());
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(values[i])) {
      usage_error(
          "cannot quantize {} to 4 bits: element {} (row {}, column {} of shape [{}]) is {}; "
          "only finite weights can be quantized (the weights are corrupt or the run diverged)",
          name, i, i / cols, i % cols, fmt::join(q.shape, ", "), values[i]);
    }
  }
  q.packed.assign(size_t((n + 1) / 2), 0);
  std::vector<float> absmax(size_t(q.num_blocks()));
  const int64_t bs = q.block_size;
  for (int64_t b = 0; b * bs < n; ++b) {
    const int64_t begin = b * bs, end = std::min(n, begin + bs);
    // fmaxf(fabsf(x)) under -ftz: subnormals count as 0; the loader's padding zeros never raise
    // the maximum.
    float amax = 0.0f;
    for (int64_t i = begin; i < end; ++i)
      amax = std::max(amax, std::fabs(flush_subnormal(values[i])));
    absmax[b] = amax;
    const float inv = 1.0f / amax;  // bitsandbytes: the GPU's approximate reciprocal (docs)
    for (int64_t i = begin; i < end; ++i) {
      const uint8_t code = quantize_4bit_value(q.type, mul_ftz(values[i], inv));
      q.packed[i >> 1] |= (i & 1) ? code : uint8_t(code << 4);
    }
    if (end == n && (n & 1)) {  // the padding zero's code fills the last low nibble
      q.packed[n >> 1] |= quantize_4bit_value(q.type, mul_ftz(0.0f, inv));
    }
  }
  if (options.double_quant) {
    q.nested = double_quantize(absmax);
  } else {
    q.absmax = std::move(absmax);
  }
  return q;
}

Quantized4bit quantize(const Tensor& weight, const QuantOptions& options, std::string_view name) {
  FD_CHECK(weight.defined() && !weight.is_cuda() && !weight.is_meta(),
           "quantize {}: a CPU tensor is needed", name);
  std::vector<int64_t> shape;
  for (int i = 0; i < weight.shape().ndim(); ++i) shape.push_back(weight.shape()[i]);
  const int64_t n = weight.numel();
  switch (weight.dtype()) {
    case DType::kF32:
      return quantize(std::span<const float>(weight.data<float>(), size_t(n)), std::move(shape),
                      options, name);
    case DType::kBF16:
    case DType::kF16: {
      std::vector<float> v(static_cast<size_t>(n));
      const uint16_t* p = weight.data<uint16_t>();
      const bool bf16 = weight.dtype() == DType::kBF16;
      for (int64_t i = 0; i < n; ++i) v[i] = bf16 ? bf16_to_f32(p[i]) : f16_to_f32(p[i]);
      return quantize(v, std::move(shape), options, name);
    }
    default:
      FD_CHECK(false, "quantize {}: a float tensor is needed, not {}", name,
               dtype_name(weight.dtype()));
  }
  return {};
}

std::vector<float> block_absmax(const Quantized4bit& q) {
  if (!q.nested) {
    FD_CHECK(int64_t(q.absmax.size()) == q.num_blocks(), "absmax: {} values for {} blocks",
             q.absmax.size(), q.num_blocks());
    return q.absmax;
  }
  const NestedAbsmax& nq = *q.nested;
  FD_CHECK(int64_t(nq.codes.size()) == q.num_blocks(), "nested absmax: {} codes for {} blocks",
           nq.codes.size(), q.num_blocks());
  std::vector<float> out(nq.codes.size());
  decode_nested_absmax(nq.codes, nq.absmax, nq.offset, nq.map, out.data());
  return out;
}

void decode_nested_absmax(std::span<const uint8_t> codes, std::span<const float> nested_absmax,
                          float offset, const std::array<float, 256>& map, float* out) {
  const size_t n = codes.size();
  FD_CHECK(nested_absmax.size() == (n + NestedAbsmax::kBlockSize - 1) / NestedAbsmax::kBlockSize,
           "nested absmax: {} values for {} codes", nested_absmax.size(), n);
  for (size_t i = 0; i < n; ++i) {
    // dequantize_blockwise (code[q] * absmax, flushed), then torch's `absmax += offset`.
    out[i] = mul_ftz(map[codes[i]], nested_absmax[i / NestedAbsmax::kBlockSize]) + offset;
  }
}

void dequantize_range(const Quantized4bit& q, std::span<const float> absmax, int64_t begin,
                      int64_t count, float* out) {
  FD_CHECK(int64_t(q.packed.size()) == (q.numel() + 1) / 2, "{} packed bytes for {} elements",
           q.packed.size(), q.numel());
  dequantize_range(q.type, q.block_size, q.packed.data(), q.numel(), absmax, begin, count, out);
}

void dequantize_range(QuantType type, int64_t block_size, const uint8_t* packed, int64_t numel,
                      std::span<const float> absmax, int64_t begin, int64_t count, float* out) {
  const int64_t end = begin + count;
  FD_CHECK(begin >= 0 && end <= numel, "dequantize_range [{}, {}) of {}", begin, end, numel);
  FD_CHECK(int64_t(absmax.size()) == (numel + block_size - 1) / block_size,
           "{} absmax for {} blocks", absmax.size(), (numel + block_size - 1) / block_size);
  const std::array<float, 16>& values = code_values(type);
  const int64_t bs = block_size;
  int64_t i = begin;
  while (i < end) {
    const int64_t b = i / bs;
    const int64_t block_end = std::min(end, (b + 1) * bs);
    // The 16 values this block can take: lut[code] * absmax (mul.ftz in the kernel).
    float table[16];
    for (int c = 0; c < 16; ++c) table[c] = mul_ftz(values[c], absmax[b]);
    float* o = out + (i - begin);
    if (i & 1) {
      *o++ = table[packed[i >> 1] & 0xF];
      ++i;
    }
    for (; i + 1 < block_end; i += 2) {
      const uint8_t byte = packed[i >> 1];
      *o++ = table[byte >> 4];
      *o++ = table[byte & 0xF];
    }
    if (i < block_end) {
      *o = table[packed[i >> 1] >> 4];
      ++i;
    }
  }
}

std::vector<float> dequantize(const Quantized4bit& q) {
  std::vector<float> out(size_t(q.numel()));
  dequantize_range(q, block_absmax(q), 0, q.numel(), out.data());
  return out;
}

Tensor dequantize(const Quantized4bit& q, DType dtype) {
  FD_CHECK(dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16,
           "dequantize to {}: a float dtype is needed", dtype_name(dtype));
  return Tensor::from_vector(dequantize(q), Shape(std::span<const int64_t>(q.shape)), dtype);
}

}  // namespace fd::quant
