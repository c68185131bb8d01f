// Embedding: the lookup (rows copied bit for bit) and its backward, a
// deterministic scatter-add: embedding_backward sorts the rows by id (CUB's
// stable radix sort), then one block per distinct id adds that id's rows in
// their original order into an fp32 accumulator that starts from dweight's
// value. That is the CPU's order of additions exactly, so fp32 results match
// lib/ops bitwise. Both move 16 bytes per access where every row starts
// 16-byte aligned (kernels/vec_plan.h).
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>

#include "kernels/common.cuh"
#include "kernels/kernels.h"

namespace fd::kernels {
namespace {

// -------------------------------------------------------------- embedding --

// Copies rows bit for bit, C Words each: Word is the element's storage type,
// or uint4 (16 bytes of elements) when every row starts 16-byte aligned.
template <typename Word>
__global__ void embedding_forward_kernel(const Word* weight, const int32_t* ids, Word* out,
                                         int64_t rows, int64_t C) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const Word* src = weight + int64_t(ids[r]) * C;
    Word* dst = out + r * C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dst[c] = src[c];
  }
}

__global__ void iota_kernel(int32_t* p, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_step()) p[i] = static_cast<int32_t>(i);
}

// ids and rows sorted by id (rows ascending within an id). The block at the
// first position of each run of equal ids owns that id: its threads take
// steps of columns (split: kW columns at once when every row starts 16-byte
// aligned, then the tail one at a time) and add the run's rows in order, so
// each element's additions are in row order either way. blockIdx.y splits the
// column steps.
template <DT kDy, DT kDw>
__global__ void embedding_backward_kernel(const void* dout, const uint32_t* sorted_ids,
                                          const int32_t* sorted_rows, void* dweight, int64_t rows,
                                          int64_t C, int64_t V, VecSplit split) {
  for (int64_t i = blockIdx.x; i < rows; i += gridDim.x) {
    const uint32_t id = sorted_ids[i];
    if (i > 0 && sorted_ids[i - 1] == id) continue;  // another block owns this id
    if (int64_t(id) >= V) continue;                  // invalid id: write nothing
    const int64_t w_base = int64_t(id) * C;
    auto elems = [=]<int kN>(int64_t c) {
      float acc[kN];
      load_floats<kDw>(dweight, w_base + c, acc);
      for (int64_t j = i; j < rows && sorted_ids[j] == id; ++j) {
        float d[kN];
        load_floats<kDy>(dout, int64_t(sorted_rows[j]) * C + c, d);
#pragma unroll
        for (int k = 0; k < kN; ++k) acc[k] += d[k];
      }
      store_floats<kDw>(dweight, w_base + c, acc);
    };
    for_each_step<vec_width_of<kDy, kDw>()>(C, split,
                                            int64_t(blockIdx.y) * blockDim.x + threadIdx.x,
                                            int64_t(gridDim.y) * blockDim.x, elems);
  }
}

}  // namespace

void embedding_forward(const void* weight, DT dt, const int32_t* ids, void* out, int64_t rows,
                       int64_t C) {
  constexpr const char* kWhat = "embedding_forward";
  require(rows >= 0 && C >= 0, kWhat, "negative size");
  if (rows == 0 || C == 0) return;
  require_float(dt, kWhat);
  require_ptr(weight, kWhat, "weight");
  require_ptr(ids, kWhat, "ids");
  require_ptr(out, kWhat, "out");
  const unsigned grid = capped_grid(rows);
  if (all_vec_aligned(weight, out) && C * int64_t(dt_size(dt)) % kVecBytes == 0) {
    const int64_t words = C * int64_t(dt_size(dt)) / kVecBytes;
    embedding_forward_kernel<<<grid, kBlock, 0, stream()>>>(static_cast<const uint4*>(weight), ids,
                                                            static_cast<uint4*>(out), rows, words);
  } else if (dt == DT::kF32) {
    embedding_forward_kernel<<<grid, kBlock, 0, stream()>>>(
        static_cast<const uint32_t*>(weight), ids, static_cast<uint32_t*>(out), rows, C);
  } else {
    embedding_forward_kernel<<<grid, kBlock, 0, stream()>>>(
        static_cast<const uint16_t*>(weight), ids, static_cast<uint16_t*>(out), rows, C);
  }
  check_launch(kWhat);
}

void embedding_backward(const void* dout, DT dt, const int32_t* ids, void* dweight, DT dw_dt,
                        int64_t rows, int64_t C, int64_t V) {
  constexpr const char* kWhat = "embedding_backward";
  require(rows >= 0 && C >= 0 && V >= 0, kWhat, "negative size");
  if (rows == 0 || C == 0) return;
  require(rows <= INT_MAX, kWhat, "more than 2^31 - 1 rows");
  require(V > 0, kWhat, "empty vocabulary");
  require_float(dt, kWhat);
  require_float(dw_dt, kWhat);
  require_ptr(dout, kWhat, "dout");
  require_ptr(ids, kWhat, "ids");
  require_ptr(dweight, kWhat, "dweight");
  const int n = static_cast<int>(rows);
  cudaStream_t s = stream();

  // Stable sort of (id, row) by id. Ids are non-negative, so their bits sort
  // the same as uint32; all 32 bits are sorted so that even an invalid id
  // cannot split another id's run (which would race on its dweight row).
  const auto* keys_in = reinterpret_cast<const uint32_t*>(ids);
  DeviceScratch keys_out(size_t(rows) * sizeof(uint32_t));
  DeviceScratch rows_in(size_t(rows) * sizeof(int32_t));
  DeviceScratch rows_out(size_t(rows) * sizeof(int32_t));
  iota_kernel<<<grid_for(rows), kBlock, 0, s>>>(rows_in.as<int32_t>(), rows);
  check_launch(kWhat);
  size_t temp_bytes = 0;
  check_cuda(
      cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_out.as<uint32_t>(),
                                      rows_in.as<int32_t>(), rows_out.as<int32_t>(), n, 0, 32, s),
      kWhat);
  DeviceScratch temp(temp_bytes > 0 ? temp_bytes : 1);
  check_cuda(
      cub::DeviceRadixSort::SortPairs(temp.as<void>(), temp_bytes, keys_in, keys_out.as<uint32_t>(),
                                      rows_in.as<int32_t>(), rows_out.as<int32_t>(), n, 0, 32, s),
      kWhat);

  constexpr int kThreads = 256;
  dispatch_dt(dt, dw_dt, [&]<DT kDy, DT kDw>() {
    const VecSplit split =
        vec_split_rows(C, C, vec_width_of<kDy, kDw>(), all_vec_aligned(dout, dweight));
    int64_t col_blocks = (vec_items(split, C) + kThreads - 1) / kThreads;
    if (col_blocks > 65535) col_blocks = 65535;  // gridDim.y limit; the kernel strides
    const dim3 grid(capped_grid(rows), static_cast<unsigned>(col_blocks));
    embedding_backward_kernel<kDy, kDw><<<grid, kThreads, 0, s>>>(
        dout, keys_out.as<uint32_t>(), rows_out.as<int32_t>(), dweight, rows, C, V, split);
  });
  check_launch(kWhat);
}

}  // namespace fd::kernels
