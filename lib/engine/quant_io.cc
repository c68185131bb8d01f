#include "lib/engine/quant_io.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "lib/base/error.h"

namespace fd::engine {
namespace {

// Bit for bit: -0.0 is not 0.0 here, since a file written back must hold the same bytes.
template <size_t N>
bool same_bits(const std::array<float, N>& a, const std::array<float, N>& b) {
  return std::memcmp(a.data(), b.data(), N * sizeof(float)) == 0;
}

// The first entry where `got` and `want` differ, for the message.
template <size_t N>
std::string first_difference(const std::array<float, N>& got, const std::array<float, N>& want) {
  for (size_t i = 0; i < N; ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0)
      return fmt::format("entry {} is {} where bitsandbytes' is {}", i, got[i], want[i]);
  return "";
}

constexpr const char* kFix =
    "fdtrain dequantizes with bitsandbytes' own tables; re-save the model with "
    "bitsandbytes (transformers load_in_4bit) or start from its unquantized weights";

}  // namespace

quant::Quantized4bit to_quantized4bit(const ckpt::Bnb4bitWeight& w, const std::string& where) {
  quant::Quantized4bit q;
  if (w.quant_type == "nf4")
    q.type = quant::QuantType::kNF4;
  else if (w.quant_type == "fp4")
    q.type = quant::QuantType::kFP4;
  else
    usage_error("{}: quant type \"{}\"; bitsandbytes' 4-bit types are nf4 and fp4; {}", where,
                w.quant_type, kFix);
  if (std::find(quant::kBlockSizes.begin(), quant::kBlockSizes.end(), w.block_size) ==
      quant::kBlockSizes.end())
    usage_error("{}: block size {}; bitsandbytes' 4-bit block sizes are {}; {}", where,
                w.block_size, fmt::join(quant::kBlockSizes, ", "), kFix);
  if (w.nested &&
      (w.nested->block_size != quant::NestedAbsmax::kBlockSize || w.nested->dtype != "float32"))
    usage_error(
        "{}: nested block size {} of {}; bitsandbytes' double quantization uses {} of "
        "float32; {}",
        where, w.nested->block_size, w.nested->dtype, quant::NestedAbsmax::kBlockSize, kFix);
  ckpt::check_bnb4bit_weight(w, where);  // the sizes against the shape, the dtype, the offset
  if (!same_bits(w.quant_map, quant::quant_map(q.type)))
    usage_error("{}: quant_map is not bitsandbytes' {} table ({}); {}", where, w.quant_type,
                first_difference(w.quant_map, quant::quant_map(q.type)), kFix);
  q.block_size = w.block_size;
  q.shape = w.shape;
  q.packed = w.packed;
  if (w.nested) {
    const ckpt::Bnb4bitNested& n = *w.nested;
    if (!same_bits(n.map, quant::dynamic_map()))
      usage_error("{}: nested_quant_map is not bitsandbytes' signed dynamic map ({}); {}", where,
                  first_difference(n.map, quant::dynamic_map()), kFix);
    quant::NestedAbsmax nested;
    nested.codes = w.absmax_codes;
    nested.absmax = n.absmax;
    nested.offset = n.offset;
    nested.map = n.map;
    q.nested = std::move(nested);
  } else {
    q.absmax = w.absmax;
  }
  return q;
}

ckpt::Bnb4bitWeight to_bnb4bit(const quant::Quantized4bit& q, std::string dtype) {
  ckpt::Bnb4bitWeight w;
  w.quant_type = std::string(quant::quant_type_name(q.type));
  w.block_size = q.block_size;
  w.shape = q.shape;
  w.dtype = std::move(dtype);
  w.packed = q.packed;
  w.absmax = q.absmax;
  w.quant_map = quant::quant_map(q.type);
  if (q.nested) {
    w.absmax_codes = q.nested->codes;
    ckpt::Bnb4bitNested n;
    n.absmax = q.nested->absmax;
    n.offset = q.nested->offset;
    n.map = q.nested->map;
    w.nested = std::move(n);
  }
  return w;
}

}  // namespace fd::engine
