// Cross-entropy over rows of logits, and the chunked head + cross-entropy
// (linear_cross_entropy: cuBLASLt logits per chunk into an fp32 scratch, the
// same row kernels on them).
//
// Deterministic: cross_entropy_forward writes each row's loss term (fp64, as
// the CPU sums them) to scratch, and one block sums them in a fixed order.
// linear_cross_entropy_forward runs the same row kernel on each chunk's
// logits (rows offset into the same scratch) and the same final sum (the _kept
// pair: one chunk, logits in the operands' dtype, kept for the backward, which
// turns them into dlogits in place: no second logits GEMM); its
// backward turns each chunk's recomputed logits into dlogits with the
// cross-entropy backward kernel in its overwriting form, and the GEMMs
// accumulate dh and dweight chunk after chunk (cuBLASLt's fixed algorithm per
// shape: the same bits every run). The row reductions keep their lane-by-lane
// order; the gradient pass moves 16 bytes per access where rows are 16-byte
// aligned (kernels/vec_plan.h).
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/common.cuh"
#include "kernels/kernels.h"

namespace fd::kernels {
namespace {

// ---------------------------------------------------------- cross-entropy --

constexpr int kCeBlock = 512;
constexpr int kCeFinalBlock = 1024;

__device__ __forceinline__ bool valid_target(int32_t t, int64_t V) { return t >= 0 && t < V; }

// Rows of V logits `ld` elements apart (ld >= V: the chunked head pads rows,
// kernels.h head_stride).
// One block per row: lse = max + log(sum exp(x - max)) (two passes, as the
// CPU), and the row's loss term lse - x[target] in fp64. Ignored rows get
// lse 0 and term 0. A target outside [0, V) gets a NaN term, so the loss
// shows the bad batch instead of reading out of bounds.
template <DT kL>
__global__ void cross_entropy_rows_kernel(const void* logits, int64_t ld, const int32_t* targets,
                                          int64_t rows, int64_t V, int ignore_index, float* lse,
                                          double* term) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int32_t t = targets[r];
    if (t == ignore_index) {  // the same branch for the whole block
      if (threadIdx.x == 0) {
        lse[r] = 0.0f;
        term[r] = 0.0;
      }
      continue;
    }
    const int64_t base = r * ld;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
      m = fmaxf(m, load_elem<kL>(logits, base + j));
    }
    m = block_max(m);
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
      s += expf(load_elem<kL>(logits, base + j) - m);
    }
    s = block_sum(s);
    if (threadIdx.x == 0) {
      const float l = m + logf(s);
      lse[r] = l;
      term[r] =
          valid_target(t, V) ? double(l) - double(load_elem<kL>(logits, base + t)) : double(NAN);
    }
  }
}

// One block: count the non-ignored rows and sum their terms, each thread over
// a fixed stride of rows, then a fixed tree; loss = sum / count (0 if none).
__global__ void cross_entropy_loss_kernel(const int32_t* targets, const double* term, int64_t rows,
                                          int ignore_index, float* loss, int32_t* count) {
  double s = 0.0;
  long long k = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    if (targets[r] != ignore_index) {
      s += term[r];
      ++k;
    }
  }
  s = block_sum(s);
  k = block_sum(k);
  if (threadIdx.x == 0) {
    *count = static_cast<int32_t>(k);
    *loss = k > 0 ? static_cast<float>(s / double(k)) : 0.0f;
  }
}

// dlogits[r, j] += factor * exp(x[j] - lse[r]), then -= factor at the target
// (two roundings in fp32, as the CPU), factor = *dloss / *count.
// kOverwrite (linear_cross_entropy): dlogits = that value instead of +=, and
// rows that get no gradient (ignored, or every row when count is 0) are
// written 0. Each element is read and then written by one thread, so dlogits
// may be the logits themselves (in place) when both are f32. Logits in kL,
// dlogits in kD; each row's V columns go in steps of `split` (packs when the
// row stride ld keeps every row 16-byte aligned).
template <DT kL, DT kD, bool kOverwrite>
__global__ void cross_entropy_backward_kernel(const void* logits, int64_t ld,
                                              const int32_t* targets, const float* lse,
                                              const float* dloss, const int32_t* count,
                                              int64_t rows, int64_t V, int ignore_index,
                                              void* dlogits, VecSplit split) {
  constexpr int kW = vec_width_of<kL, kD>();
  const int32_t n = *count;
  if (!kOverwrite && n <= 0) return;
  const float factor = n > 0 ? *dloss / float(n) : 0.0f;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int32_t t = targets[r];
    const int64_t base = r * ld;
    if (t == ignore_index || n <= 0) {  // the same branch for the whole block
      if constexpr (kOverwrite) {
        auto zeros = [=]<int kN>(int64_t j) {
          float d[kN];
#pragma unroll
          for (int k = 0; k < kN; ++k) d[k] = 0.0f;
          store_floats<kD>(dlogits, base + j, d);
        };
        for_each_step<kW>(V, split, threadIdx.x, blockDim.x, zeros);
      }
      continue;
    }
    const float l = lse[r];
    auto elems = [=]<int kN>(int64_t j) {
      float x[kN], d[kN];
      load_floats<kL>(logits, base + j, x);
      if constexpr (kOverwrite) {
#pragma unroll
        for (int k = 0; k < kN; ++k) d[k] = 0.0f;
      } else {
        load_floats<kD>(dlogits, base + j, d);
      }
#pragma unroll
      for (int k = 0; k < kN; ++k) {
        d[k] += factor * expf(x[k] - l);
        if (j + k == t) d[k] -= factor;
      }
      store_floats<kD>(dlogits, base + j, d);
    };
    for_each_step<kW>(V, split, threadIdx.x, blockDim.x, elems);
  }
}

}  // namespace

void cross_entropy_forward(const void* logits, DT dt, const int32_t* targets, int64_t rows,
                           int64_t V, int ignore_index, float* lse, float* loss, int32_t* count) {
  constexpr const char* kWhat = "cross_entropy_forward";
  require(rows >= 0 && V >= 0, kWhat, "negative size");
  require(rows <= INT_MAX, kWhat, "more than 2^31 - 1 rows (count is int32)");
  require_ptr(loss, kWhat, "loss");
  require_ptr(count, kWhat, "count");
  cudaStream_t s = stream();
  if (rows == 0) {  // no targets: loss 0, count 0, as the CPU
    check_cuda(cudaMemsetAsync(loss, 0, sizeof(float), s), kWhat);
    check_cuda(cudaMemsetAsync(count, 0, sizeof(int32_t), s), kWhat);
    return;
  }
  require(V > 0, kWhat, "rows of zero length");
  require_float(dt, kWhat);
  require_ptr(logits, kWhat, "logits");
  require_ptr(targets, kWhat, "targets");
  require_ptr(lse, kWhat, "lse");
  DeviceScratch term(size_t(rows) * sizeof(double));
  dispatch_dt(dt, [&]<DT kL>() {
    cross_entropy_rows_kernel<kL><<<capped_grid(rows), kCeBlock, 0, s>>>(
        logits, V, targets, rows, V, ignore_index, lse, term.as<double>());
  });
  check_launch(kWhat);
  cross_entropy_loss_kernel<<<1, kCeFinalBlock, 0, s>>>(targets, term.as<double>(), rows,
                                                        ignore_index, loss, count);
  check_launch(kWhat);
}

void cross_entropy_backward(const void* logits, DT dt, const int32_t* targets, const float* lse,
                            const float* dloss, const int32_t* count, int64_t rows, int64_t V,
                            int ignore_index, void* dlogits, DT dl_dt, bool fresh) {
  constexpr const char* kWhat = "cross_entropy_backward";
  require(rows >= 0 && V >= 0, kWhat, "negative size");
  if (rows == 0 || V == 0) return;
  require_float(dt, kWhat);
  require_float(dl_dt, kWhat);
  require_ptr(logits, kWhat, "logits");
  require_ptr(targets, kWhat, "targets");
  require_ptr(lse, kWhat, "lse");
  require_ptr(dloss, kWhat, "dloss");
  require_ptr(count, kWhat, "count");
  require_ptr(dlogits, kWhat, "dlogits");
  dispatch_dt(dt, dl_dt, [&]<DT kL, DT kD>() {
    const VecSplit split =
        vec_split_rows(V, V, vec_width_of<kL, kD>(), all_vec_aligned(logits, dlogits));
    // A fresh gradient is written whole (ignored rows 0): no zero fill before.
    auto kernel = fresh ? cross_entropy_backward_kernel<kL, kD, true>
                        : cross_entropy_backward_kernel<kL, kD, false>;
    kernel<<<capped_grid(rows), kCeBlock, 0, stream()>>>(logits, V, targets, lse, dloss, count,
                                                         rows, V, ignore_index, dlogits, split);
  });
  check_launch(kWhat);
}

void linear_cross_entropy_forward(const void* h, const void* weight, DT dt, const int32_t* targets,
                                  int64_t rows, int64_t C, int64_t V, int64_t chunk_rows,
                                  int ignore_index, float* scratch, void* kept, float* lse,
                                  float* loss, int32_t* count) {
  constexpr const char* kWhat = "linear_cross_entropy_forward";
  require(rows >= 0 && C >= 0 && V >= 0, kWhat, "negative size");
  require(chunk_rows > 0, kWhat, "chunk_rows must be positive");
  require(rows <= INT_MAX, kWhat, "more than 2^31 - 1 rows (count is int32)");
  require_ptr(loss, kWhat, "loss");
  require_ptr(count, kWhat, "count");
  cudaStream_t s = stream();
  if (rows == 0) {  // no targets: loss 0, count 0, as the CPU
    check_cuda(cudaMemsetAsync(loss, 0, sizeof(float), s), kWhat);
    check_cuda(cudaMemsetAsync(count, 0, sizeof(int32_t), s), kWhat);
    return;
  }
  require(V > 0, kWhat, "an empty vocabulary");
  require_float(dt, kWhat);
  require_ptr(h, kWhat, "h");
  require_ptr(weight, kWhat, "weight");
  require_ptr(targets, kWhat, "targets");
  require_ptr(kept != nullptr ? kept : scratch, kWhat, kept != nullptr ? "kept" : "scratch");
  require_ptr(lse, kWhat, "lse");
  require(kept == nullptr || chunk_rows >= rows, kWhat, "kept logits need one chunk");
  const size_t row_bytes = size_t(C) * dt_size(dt);
  const int64_t ld = head_stride(V);  // the scratch's padded rows
  DeviceScratch term(size_t(rows) * sizeof(double));
  for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    const int64_t n = chunk_rows < rows - r0 ? chunk_rows : rows - r0;
    const void* h_chunk = static_cast<const char*>(h) + size_t(r0) * row_bytes;
    // logits (n, V) = h_chunk (n, C) @ weight^T (C, V), rows ld apart: fp32 into the scratch,
    // or in dt into `kept`
    const DT logits_dt = kept != nullptr ? dt : DT::kF32;
    void* logits = kept != nullptr ? kept : static_cast<void*>(scratch);
    gemm(false, true, n, V, C, 1.0f, h_chunk, C, weight, C, dt, 0.0f, logits, ld, logits_dt);
    dispatch_dt(logits_dt, [&]<DT kL>() {
      cross_entropy_rows_kernel<kL><<<capped_grid(n), kCeBlock, 0, s>>>(
          logits, ld, targets + r0, n, V, ignore_index, lse + r0, term.as<double>() + r0);
    });
    check_launch(kWhat);
  }
  cross_entropy_loss_kernel<<<1, kCeFinalBlock, 0, s>>>(targets, term.as<double>(), rows,
                                                        ignore_index, loss, count);
  check_launch(kWhat);
}

void linear_cross_entropy_backward(const void* h, const void* weight, DT dt, const int32_t* targets,
                                   const float* lse, const float* dloss, const int32_t* count,
                                   int64_t rows, int64_t C, int64_t V, int64_t chunk_rows,
                                   int ignore_index, float* scratch, void* scratch16, void* kept,
                                   void* dh, DT dh_dt, bool dh_fresh, void* dweight, DT dw_dt) {
  constexpr const char* kWhat = "linear_cross_entropy_backward";
  require(rows >= 0 && C >= 0 && V >= 0, kWhat, "negative size");
  require(chunk_rows > 0, kWhat, "chunk_rows must be positive");
  if (rows == 0 || C == 0 || V == 0 || (dh == nullptr && dweight == nullptr)) return;
  require_float(dt, kWhat);
  require_ptr(h, kWhat, "h");
  require_ptr(weight, kWhat, "weight");
  require_ptr(targets, kWhat, "targets");
  require_ptr(lse, kWhat, "lse");
  require_ptr(dloss, kWhat, "dloss");
  require_ptr(count, kWhat, "count");
  require(kept == nullptr || chunk_rows >= rows, kWhat, "kept logits need one chunk");
  if (kept == nullptr) {
    require_ptr(scratch, kWhat, "scratch");
    require(dt == DT::kF32 || scratch16 != nullptr, kWhat, "16-bit operands need scratch16");
  }
  const size_t row_bytes = size_t(C) * dt_size(dt);
  const size_t dh_row_bytes = size_t(C) * dt_size(dh_dt);
  // The logits (fp32 scratch, recomputed; or the forward's, kept in dt) and the dlogits (in
  // dt: in place where the two dtypes agree).
  const DT logits_dt = kept != nullptr ? dt : DT::kF32;
  void* logits = kept != nullptr ? kept : static_cast<void*>(scratch);
  void* dlogits = kept != nullptr || dt == DT::kF32 ? logits : scratch16;
  const int64_t ld = head_stride(V);  // every buffer's padded rows
  cudaStream_t s = stream();
  for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    const int64_t n = chunk_rows < rows - r0 ? chunk_rows : rows - r0;
    const void* h_chunk = static_cast<const char*>(h) + size_t(r0) * row_bytes;
    if (kept == nullptr) {
      gemm(false, true, n, V, C, 1.0f, h_chunk, C, weight, C, dt, 0.0f, logits, ld, DT::kF32);
    }
    dispatch_dt(logits_dt, dt, [&]<DT kL, DT kD>() {
      const VecSplit split =
          vec_split_rows(V, ld, vec_width_of<kL, kD>(), all_vec_aligned(logits, dlogits));
      cross_entropy_backward_kernel<kL, kD, true><<<capped_grid(n), kCeBlock, 0, s>>>(
          logits, ld, targets + r0, lse + r0, dloss, count, n, V, ignore_index, dlogits, split);
    });
    check_launch(kWhat);
    // dh_chunk (n, C) += dlogits (n, V) @ weight (V, C); = when dh is fresh (its rows once each)
    if (dh != nullptr) {
      void* dh_chunk = static_cast<char*>(dh) + size_t(r0) * dh_row_bytes;
      gemm(false, false, n, C, V, 1.0f, dlogits, ld, weight, C, dt, dh_fresh ? 0.0f : 1.0f,
           dh_chunk, C, dh_dt);
    }
    // dweight (V, C) += dlogits^T (V, n) @ h_chunk (n, C): K is every row with one chunk
    if (dweight != nullptr) {
      gemm(true, false, V, C, n, 1.0f, dlogits, ld, h_chunk, C, dt, 1.0f, dweight, C, dw_dt);
    }
  }
}

}  // namespace fd::kernels
