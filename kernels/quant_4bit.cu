// The 4-bit base of QLoRA on the GPU (issue 37): decoding the per-block absmax and dequantizing
// packed NF4/FP4 codes, bit for bit as lib/quant computes them on the CPU (docs/QUANTIZATION.md).
//
// The one design fact: lib/quant models bitsandbytes' fast-math kernels with explicit IEEE
// operations plus a software flush of subnormals (tables.h's flush_subnormal / mul_ftz), compiled
// without FMA contraction. These kernels are built without --use_fast_math and with nvcc's default
// -fmad=true, so every product and sum is written as __fmul_rn / __fadd_rn (never contracted) and
// the flush is the same comparison as the CPU's: the GPU gives the CPU's bits, not the hardware's
// mul.ftz (whose rounding of tiny results is its own).
//
// The code tables (16 values) and the nested 8-bit map (256 values) are passed by value as kernel
// parameters: kernels/ includes nothing from lib/, and a parameter block needs no global state.
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>
#include <cstring>

#include "kernels/common.cuh"
#include "kernels/kernels.h"

namespace fd::kernels {
namespace {

struct CodeTable {
  float v[16];
};
struct NestedMap {
  float v[256];
};

// tables.h's flush_subnormal: a subnormal becomes a zero of the same sign.
__device__ __forceinline__ float flush_subnormal(float x) {
  return (x != 0.0f && fabsf(x) < FLT_MIN) ? copysignf(0.0f, x) : x;
}

// tables.h's mul_ftz: operands and the IEEE-rounded product flushed.
__device__ __forceinline__ float mul_ftz(float a, float b) {
  return flush_subnormal(__fmul_rn(flush_subnormal(a), flush_subnormal(b)));
}

// decode_nested_absmax (lib/quant/quantize.cc): mul_ftz(map[code], nested[i / 256]) + offset,
// the sum IEEE (torch's `absmax += offset`, not flushed).
__global__ void decode_nested_absmax_kernel(const uint8_t* codes, int64_t n,
                                            const float* nested_absmax, const float* offset,
                                            NestedMap map, float* out) {
  const float off = *offset;
  for (int64_t i = grid_start(); i < n; i += grid_step()) {
    out[i] = __fadd_rn(mul_ftz(map.v[codes[i]], nested_absmax[i / kNestedBlock]), off);
  }
}

// Element begin + j of the packed codes into out[j]: code_value * absmax, flushed
// (dequantize_range). Two codes per byte, the earlier element in the high nibble; the block of
// element e is e >> block_shift (block sizes are powers of two).
template <DT kOut>
__global__ void dequantize_4bit_kernel(const uint8_t* packed, const float* absmax, int block_shift,
                                       CodeTable table, int64_t begin, int64_t count, void* out) {
  // The table in shared memory, written with constant indices: indexing the parameter by code
  // would make each thread copy it to local memory first.
  __shared__ float values[16];
  if (threadIdx.x == 0) {
#pragma unroll
    for (int c = 0; c < 16; ++c) values[c] = table.v[c];
  }
  __syncthreads();
  for (int64_t j = grid_start(); j < count; j += grid_step()) {
    const int64_t e = begin + j;
    const uint8_t byte = packed[e >> 1];
    const int code = (e & 1) ? (byte & 0xF) : (byte >> 4);
    store_elem<kOut>(out, j, mul_ftz(values[code], absmax[e >> block_shift]));
  }
}

}  // namespace

void decode_nested_absmax(const uint8_t* codes, int64_t n, const float* nested_absmax,
                          const float* offset, const float* map_host, float* out) {
  constexpr const char* kWhat = "decode_nested_absmax";
  require(n >= 0, kWhat, "negative count");
  if (n == 0) return;
  require_ptr(codes, kWhat, "codes");
  require_ptr(nested_absmax, kWhat, "nested_absmax");
  require_ptr(offset, kWhat, "offset");
  require_ptr(map_host, kWhat, "map");
  require_ptr(out, kWhat, "out");
  NestedMap map;
  std::memcpy(map.v, map_host, sizeof map.v);
  decode_nested_absmax_kernel<<<grid_for(n), kBlock, 0, stream()>>>(codes, n, nested_absmax, offset,
                                                                    map, out);
  check_launch(kWhat);
}

void dequantize_4bit(const uint8_t* packed, const float* absmax, int64_t block_size,
                     const float* code_values_host, int64_t begin, int64_t count, void* out,
                     DT out_dt) {
  constexpr const char* kWhat = "dequantize_4bit";
  require(begin >= 0 && count >= 0, kWhat, "negative range");
  require(block_size > 0 && (block_size & (block_size - 1)) == 0, kWhat,
          "the block size must be a power of two (bitsandbytes' 32 ... 4096)");
  int block_shift = 0;
  while ((int64_t(1) << block_shift) < block_size) ++block_shift;
  if (count == 0) return;
  require_float(out_dt, kWhat);
  require_ptr(packed, kWhat, "packed");
  require_ptr(absmax, kWhat, "absmax");
  require_ptr(code_values_host, kWhat, "code values");
  require_ptr(out, kWhat, "out");
  CodeTable table;
  std::memcpy(table.v, code_values_host, sizeof table.v);
  dispatch_dt(out_dt, [&]<DT kOut>() {
    dequantize_4bit_kernel<kOut><<<grid_for(count), kBlock, 0, stream()>>>(
        packed, absmax, block_shift, table, begin, count, out);
  });
  check_launch(kWhat);
}

}  // namespace fd::kernels
