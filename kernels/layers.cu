// Layer kernels: embedding, LayerNorm, RMSNorm, rotary embeddings,
// cross-entropy and the chunked head + cross-entropy (linear_cross_entropy).
//
// Every gradient that sums over rows is deterministic (the same bits every
// run, no floating-point atomics):
// - embedding_backward sorts the rows by id (CUB's stable radix sort), then
//   one block per distinct id adds that id's rows in their original order into
//   an fp32 accumulator that starts from dweight's value. That is the CPU's
//   order of additions exactly, so fp32 results match lib/ops bitwise.
// - layernorm_backward gives each of a fixed number of warps a fixed set of
//   rows; each warp sums its rows' dweight/dbias terms into its own fp32
//   scratch row, and add_column_partials adds the scratch rows in order.
//   rms_norm_backward does the same.
// - cross_entropy_forward writes each row's loss term (fp64, as the CPU sums
//   them) to scratch, and one block sums them in a fixed order.
//   linear_cross_entropy_forward runs the same row kernel on each chunk's
//   logits (rows offset into the same scratch) and the same final sum; its
//   backward turns each chunk's recomputed logits into dlogits with the
//   cross-entropy backward kernel in its overwriting form, and the GEMMs
//   accumulate dh and dweight chunk after chunk (cuBLASLt's fixed algorithm
//   per shape: the same bits every run).
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>
#include <string>

#include "kernels/common.cuh"
#include "kernels/kernels.h"

namespace fd::kernels {
namespace {

constexpr int kWarp = 32;
constexpr int kRowWarps = 8;  // rows handled at once by a LayerNorm block: one per warp

void require_ptr(const void* p, const char* what, const char* name) {
  if (p == nullptr) throw Error(std::string(what) + ": " + name + " is null");
}

// Blocks for a loop over `items` with one block (or warp group) each, capped;
// the kernels stride over the rest.
unsigned capped_grid(int64_t items) {
  constexpr int64_t kMax = int64_t(1) << 20;
  if (items < 1) return 1;
  return static_cast<unsigned>(items < kMax ? items : kMax);
}

// -------------------------------------------------------------- embedding --

// Copies rows bit for bit: Word is the element's storage type.
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
// columns and add the run's rows in order. blockIdx.y splits the columns.
__global__ void embedding_backward_kernel(const void* dout, DT dt, const uint32_t* sorted_ids,
                                          const int32_t* sorted_rows, void* dweight, DT dw_dt,
                                          int64_t rows, int64_t C, int64_t V) {
  for (int64_t i = blockIdx.x; i < rows; i += gridDim.x) {
    const uint32_t id = sorted_ids[i];
    if (i > 0 && sorted_ids[i - 1] == id) continue;  // another block owns this id
    if (int64_t(id) >= V) continue;                  // invalid id: write nothing
    const int64_t w_base = int64_t(id) * C;
    const int64_t stride = int64_t(gridDim.y) * blockDim.x;
    for (int64_t c = int64_t(blockIdx.y) * blockDim.x + threadIdx.x; c < C; c += stride) {
      float acc = load_as_float(dweight, dw_dt, w_base + c);
      for (int64_t j = i; j < rows && sorted_ids[j] == id; ++j) {
        acc += load_as_float(dout, dt, int64_t(sorted_rows[j]) * C + c);
      }
      store_from_float(dweight, dw_dt, w_base + c, acc);
    }
  }
}

// -------------------------------------------------------------- layernorm --

// One warp per row: fp32 mean, then the biased variance around it (two
// passes, as lib/ops/layernorm.cc), then the normalised output.
__global__ void layernorm_forward_kernel(const void* x, DT x_dt, const void* weight,
                                         const void* bias, DT w_dt, void* out, DT out_dt,
                                         float* mean, float* rstd, int64_t rows, int64_t C,
                                         float eps) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const float inv_c = 1.0f / float(C);
  const int64_t step = int64_t(gridDim.x) * kRowWarps;
  for (int64_t r = int64_t(blockIdx.x) * kRowWarps + warp; r < rows; r += step) {
    const int64_t base = r * C;
    float s = 0.0f;
    for (int64_t c = lane; c < C; c += kWarp) s += load_as_float(x, x_dt, base + c);
    const float mu = warp_sum(s) * inv_c;
    float v = 0.0f;
    for (int64_t c = lane; c < C; c += kWarp) {
      const float d = load_as_float(x, x_dt, base + c) - mu;
      v += d * d;
    }
    const float var = warp_sum(v) * inv_c;
    const float rs = 1.0f / sqrtf(var + eps);
    for (int64_t c = lane; c < C; c += kWarp) {
      const float b = bias != nullptr ? load_as_float(bias, w_dt, c) : 0.0f;
      const float y = (load_as_float(x, x_dt, base + c) - mu) * rs * load_as_float(weight, w_dt, c);
      store_from_float(out, out_dt, base + c, y + b);
    }
    if (lane == 0) {
      if (mean != nullptr) mean[r] = mu;
      if (rstd != nullptr) rstd[r] = rs;
    }
  }
}

// llm.c's backward: with n = (x - mean) * rstd and dn = dy * w,
// dx += rstd * (dn - mean(dn) - n * mean(dn * n)), dw += dy * n, db += dy.
// Warp g of `groups` takes rows g, g + groups, ...; its dw/db terms go to row
// g of dw_part/db_part (zeroed by the caller; either may be null), and dx may
// be null.
__global__ void layernorm_backward_kernel(const void* x, DT x_dt, const void* weight, DT w_dt,
                                          const float* mean, const float* rstd, const void* dout,
                                          DT dout_dt, void* dx, DT dx_dt, float* dw_part,
                                          float* db_part, int64_t rows, int64_t C, int64_t groups) {
  const int lane = threadIdx.x % kWarp;
  const int64_t g = int64_t(blockIdx.x) * kRowWarps + threadIdx.x / kWarp;
  if (g >= groups) return;  // whole warps only; the kernel has no block barrier
  float* dw_row = dw_part != nullptr ? dw_part + g * C : nullptr;
  float* db_row = db_part != nullptr ? db_part + g * C : nullptr;
  for (int64_t r = g; r < rows; r += groups) {
    const int64_t base = r * C;
    const float mu = mean[r];
    const float rs = rstd[r];
    float dn_mean = 0.0f, dnn_mean = 0.0f;
    if (dx != nullptr) {
      float s1 = 0.0f, s2 = 0.0f;
      for (int64_t c = lane; c < C; c += kWarp) {
        const float n = (load_as_float(x, x_dt, base + c) - mu) * rs;
        const float dn = load_as_float(dout, dout_dt, base + c) * load_as_float(weight, w_dt, c);
        s1 += dn;
        s2 += dn * n;
      }
      dn_mean = warp_sum(s1) / float(C);
      dnn_mean = warp_sum(s2) / float(C);
    }
    for (int64_t c = lane; c < C; c += kWarp) {
      const float n = (load_as_float(x, x_dt, base + c) - mu) * rs;
      const float dy = load_as_float(dout, dout_dt, base + c);
      if (dw_row != nullptr) dw_row[c] += dy * n;
      if (db_row != nullptr) db_row[c] += dy;
      if (dx != nullptr) {
        const float dn = dy * load_as_float(weight, w_dt, c);
        const float d = load_as_float(dx, dx_dt, base + c);
        store_from_float(dx, dx_dt, base + c, d + (dn - dn_mean - n * dnn_mean) * rs);
      }
    }
  }
}

// ---------------------------------------------------------------- rmsnorm --

// One warp per row, as layernorm_forward_kernel: rstd from the fp32 mean of
// squares, then weight * (x * rstd rounded to x's dtype), as lib/ops/cpu/rms_norm.cc.
__global__ void rms_norm_forward_kernel(const void* x, DT x_dt, const void* weight, DT w_dt,
                                        void* out, DT out_dt, float* rstd, int64_t rows, int64_t C,
                                        float eps) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const float inv_c = 1.0f / float(C);
  const int64_t step = int64_t(gridDim.x) * kRowWarps;
  for (int64_t r = int64_t(blockIdx.x) * kRowWarps + warp; r < rows; r += step) {
    const int64_t base = r * C;
    float s = 0.0f;
    for (int64_t c = lane; c < C; c += kWarp) {
      const float v = load_as_float(x, x_dt, base + c);
      s += v * v;
    }
    const float rs = 1.0f / sqrtf(warp_sum(s) * inv_c + eps);
    for (int64_t c = lane; c < C; c += kWarp) {
      const float n = round_through(x_dt, load_as_float(x, x_dt, base + c) * rs);
      store_from_float(out, out_dt, base + c, load_as_float(weight, w_dt, c) * n);
    }
    if (lane == 0 && rstd != nullptr) rstd[r] = rs;
  }
}

// With n = x * rstd and dn = dy * w: dx += rstd * (dn - n * mean(dn * n)),
// dw += dy * round_to(x_dt, n). Rows are split over `groups` warps and dw
// goes through per-warp scratch rows, as layernorm_backward_kernel.
__global__ void rms_norm_backward_kernel(const void* x, DT x_dt, const void* weight, DT w_dt,
                                         const float* rstd, const void* dout, DT dout_dt, void* dx,
                                         DT dx_dt, float* dw_part, int64_t rows, int64_t C,
                                         int64_t groups) {
  const int lane = threadIdx.x % kWarp;
  const int64_t g = int64_t(blockIdx.x) * kRowWarps + threadIdx.x / kWarp;
  if (g >= groups) return;  // whole warps only; the kernel has no block barrier
  const float inv_c = 1.0f / float(C);
  float* dw_row = dw_part != nullptr ? dw_part + g * C : nullptr;
  for (int64_t r = g; r < rows; r += groups) {
    const int64_t base = r * C;
    const float rs = rstd[r];
    float dnn_mean = 0.0f;
    if (dx != nullptr) {
      float s = 0.0f;
      for (int64_t c = lane; c < C; c += kWarp) {
        const float dn = load_as_float(dout, dout_dt, base + c) * load_as_float(weight, w_dt, c);
        s += dn * (load_as_float(x, x_dt, base + c) * rs);
      }
      dnn_mean = warp_sum(s) * inv_c;
    }
    for (int64_t c = lane; c < C; c += kWarp) {
      const float n = load_as_float(x, x_dt, base + c) * rs;
      const float dy = load_as_float(dout, dout_dt, base + c);
      if (dw_row != nullptr) dw_row[c] += dy * round_through(x_dt, n);
      if (dx != nullptr) {
        const float dn = dy * load_as_float(weight, w_dt, c);
        const float d = load_as_float(dx, dx_dt, base + c);
        store_from_float(dx, dx_dt, base + c, d + (dn - n * dnn_mean) * rs);
      }
    }
  }
}

// ------------------------------------------------------------------- rope --

// One thread per (i, i + D/2) pair of a head vector, over the (B, T, C) view.
// Forward (kTranspose false), with h = D/2 and i < h:
//   y[i] = x[i] c[i] - x[i+h] s[i],   y[i+h] = x[i+h] c[i+h] + x[i] s[i+h];
// the transpose (backward) pairs each sin with the other half's position:
//   y[i] = x[i] c[i] + x[i+h] s[i+h], y[i+h] = x[i+h] c[i+h] - x[i] s[i].
// kAccumulate adds into y (gradients) instead of overwriting it.
// pos: null (row bt uses table row t) or each (b, t)'s table row (packed rows).
template <bool kTranspose, bool kAccumulate>
__global__ void rope_kernel(const void* x, DT x_dt, const float* cos, const float* sin,
                            const int32_t* pos, void* y, DT y_dt, int64_t B, int64_t T, int64_t C,
                            int64_t D) {
  const int64_t h = D / 2;
  const int64_t pairs_per_row = C / 2;  // (C / D) heads of h pairs
  const int64_t n = B * T * pairs_per_row;
  for (int64_t p = grid_start(); p < n; p += grid_step()) {
    const int64_t bt = p / pairs_per_row;
    const int64_t q = p % pairs_per_row;
    const int64_t i = q % h;
    const int64_t lo_at = bt * C + (q / h) * D + i;
    const int64_t hi_at = lo_at + h;
    const int64_t row = pos != nullptr ? int64_t(pos[bt]) : bt % T;
    const float* c = cos + row * D;
    const float* s = sin + row * D;
    const float xl = load_as_float(x, x_dt, lo_at);
    const float xh = load_as_float(x, x_dt, hi_at);
    float lo, hi;
    if constexpr (kTranspose) {
      lo = xl * c[i] + xh * s[i + h];
      hi = xh * c[i + h] - xl * s[i];
    } else {
      lo = xl * c[i] - xh * s[i];
      hi = xh * c[i + h] + xl * s[i + h];
    }
    if constexpr (kAccumulate) {
      lo += load_as_float(y, y_dt, lo_at);
      hi += load_as_float(y, y_dt, hi_at);
    }
    store_from_float(y, y_dt, lo_at, lo);
    store_from_float(y, y_dt, hi_at, hi);
  }
}

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
__global__ void cross_entropy_rows_kernel(const void* logits, DT dt, int64_t ld,
                                          const int32_t* targets, int64_t rows, int64_t V,
                                          int ignore_index, float* lse, double* term) {
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
      m = fmaxf(m, load_as_float(logits, dt, base + j));
    }
    m = block_max(m);
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
      s += expf(load_as_float(logits, dt, base + j) - m);
    }
    s = block_sum(s);
    if (threadIdx.x == 0) {
      const float l = m + logf(s);
      lse[r] = l;
      term[r] = valid_target(t, V) ? double(l) - double(load_as_float(logits, dt, base + t))
                                   : double(NAN);
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
// may be the logits themselves (in place) when both are f32.
template <bool kOverwrite>
__global__ void cross_entropy_backward_kernel(const void* logits, DT dt, int64_t ld,
                                              const int32_t* targets, const float* lse,
                                              const float* dloss, const int32_t* count,
                                              int64_t rows, int64_t V, int ignore_index,
                                              void* dlogits, DT dl_dt) {
  const int32_t n = *count;
  if (!kOverwrite && n <= 0) return;
  const float factor = n > 0 ? *dloss / float(n) : 0.0f;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int32_t t = targets[r];
    const int64_t base = r * ld;
    if (t == ignore_index || n <= 0) {  // the same branch for the whole block
      if constexpr (kOverwrite) {
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
          store_from_float(dlogits, dl_dt, base + j, 0.0f);
        }
      }
      continue;
    }
    const float l = lse[r];
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
      float d = kOverwrite ? 0.0f : load_as_float(dlogits, dl_dt, base + j);
      d += factor * expf(load_as_float(logits, dt, base + j) - l);
      if (j == t) d -= factor;
      store_from_float(dlogits, dl_dt, base + j, d);
    }
  }
}

}  // namespace

// ---------------------------------------------------------------- launchers --

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
  if (dt == DT::kF32) {
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
  int64_t col_blocks = (C + kThreads - 1) / kThreads;
  if (col_blocks > 65535) col_blocks = 65535;  // gridDim.y limit; the kernel strides
  const dim3 grid(capped_grid(rows), static_cast<unsigned>(col_blocks));
  embedding_backward_kernel<<<grid, kThreads, 0, s>>>(
      dout, dt, keys_out.as<uint32_t>(), rows_out.as<int32_t>(), dweight, dw_dt, rows, C, V);
  check_launch(kWhat);
}

void layernorm_forward(const void* x, DT x_dt, const void* weight, const void* bias, DT w_dt,
                       void* out, DT out_dt, float* mean, float* rstd, int64_t rows, int64_t C,
                       float eps) {
  constexpr const char* kWhat = "layernorm_forward";
  require(rows >= 0 && C >= 0, kWhat, "negative size");
  if (rows == 0) return;
  require(C > 0, kWhat, "rows of zero length");
  require_float(x_dt, kWhat);
  require_float(w_dt, kWhat);
  require_float(out_dt, kWhat);
  require_ptr(x, kWhat, "x");
  require_ptr(weight, kWhat, "weight");
  require_ptr(out, kWhat, "out");
  const unsigned grid = capped_grid((rows + kRowWarps - 1) / kRowWarps);
  layernorm_forward_kernel<<<grid, kRowWarps * kWarp, 0, stream()>>>(
      x, x_dt, weight, bias, w_dt, out, out_dt, mean, rstd, rows, C, eps);
  check_launch(kWhat);
}

void layernorm_backward(const void* x, DT x_dt, const void* weight, DT w_dt, const float* mean,
                        const float* rstd, const void* dout, DT dout_dt, void* dx, DT dx_dt,
                        void* dweight, void* dbias, DT dw_dt, int64_t rows, int64_t C) {
  constexpr const char* kWhat = "layernorm_backward";
  require(rows >= 0 && C >= 0, kWhat, "negative size");
  if (rows == 0 || C == 0) return;
  if (dx == nullptr && dweight == nullptr && dbias == nullptr) return;
  require_float(x_dt, kWhat);
  require_float(w_dt, kWhat);
  require_float(dout_dt, kWhat);
  if (dx != nullptr) require_float(dx_dt, kWhat);
  if (dweight != nullptr || dbias != nullptr) require_float(dw_dt, kWhat);
  require_ptr(x, kWhat, "x");
  require_ptr(weight, kWhat, "weight");
  require_ptr(mean, kWhat, "mean");
  require_ptr(rstd, kWhat, "rstd");
  require_ptr(dout, kWhat, "dout");

  // A fixed number of warps (a function of rows only): enough to fill an H200
  // at rows in the thousands, and few scratch rows for the second pass.
  constexpr int64_t kMaxGroups = 1024;
  const int64_t groups = rows < kMaxGroups ? rows : kMaxGroups;
  const size_t part_bytes = size_t(groups) * size_t(C) * sizeof(float);
  cudaStream_t s = stream();
  DeviceScratch dw_part(dweight != nullptr ? part_bytes : 0);
  DeviceScratch db_part(dbias != nullptr ? part_bytes : 0);
  if (dweight != nullptr) check_cuda(cudaMemsetAsync(dw_part.as<void>(), 0, part_bytes, s), kWhat);
  if (dbias != nullptr) check_cuda(cudaMemsetAsync(db_part.as<void>(), 0, part_bytes, s), kWhat);

  const unsigned grid = static_cast<unsigned>((groups + kRowWarps - 1) / kRowWarps);
  layernorm_backward_kernel<<<grid, kRowWarps * kWarp, 0, s>>>(
      x, x_dt, weight, w_dt, mean, rstd, dout, dout_dt, dx, dx_dt, dw_part.as<float>(),
      db_part.as<float>(), rows, C, groups);
  check_launch(kWhat);
  if (dweight != nullptr)
    add_column_partials(dw_part.as<float>(), groups, C, dweight, dw_dt, kWhat);
  if (dbias != nullptr) add_column_partials(db_part.as<float>(), groups, C, dbias, dw_dt, kWhat);
}

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
  cross_entropy_rows_kernel<<<capped_grid(rows), kCeBlock, 0, s>>>(
      logits, dt, V, targets, rows, V, ignore_index, lse, term.as<double>());
  check_launch(kWhat);
  cross_entropy_loss_kernel<<<1, kCeFinalBlock, 0, s>>>(targets, term.as<double>(), rows,
                                                        ignore_index, loss, count);
  check_launch(kWhat);
}

void cross_entropy_backward(const void* logits, DT dt, const int32_t* targets, const float* lse,
                            const float* dloss, const int32_t* count, int64_t rows, int64_t V,
                            int ignore_index, void* dlogits, DT dl_dt) {
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
  cross_entropy_backward_kernel<false><<<capped_grid(rows), kCeBlock, 0, stream()>>>(
      logits, dt, V, targets, lse, dloss, count, rows, V, ignore_index, dlogits, dl_dt);
  check_launch(kWhat);
}

void rms_norm_forward(const void* x, DT x_dt, const void* weight, DT w_dt, void* out, DT out_dt,
                      float* rstd, int64_t rows, int64_t C, float eps) {
  constexpr const char* kWhat = "rms_norm_forward";
  require(rows >= 0 && C >= 0, kWhat, "negative size");
  if (rows == 0) return;
  require(C > 0, kWhat, "rows of zero length");
  require_float(x_dt, kWhat);
  require_float(w_dt, kWhat);
  require_float(out_dt, kWhat);
  require_ptr(x, kWhat, "x");
  require_ptr(weight, kWhat, "weight");
  require_ptr(out, kWhat, "out");
  const unsigned grid = capped_grid((rows + kRowWarps - 1) / kRowWarps);
  rms_norm_forward_kernel<<<grid, kRowWarps * kWarp, 0, stream()>>>(x, x_dt, weight, w_dt, out,
                                                                    out_dt, rstd, rows, C, eps);
  check_launch(kWhat);
}

void rms_norm_backward(const void* x, DT x_dt, const void* weight, DT w_dt, const float* rstd,
                       const void* dout, DT dout_dt, void* dx, DT dx_dt, void* dweight, DT dw_dt,
                       int64_t rows, int64_t C) {
  constexpr const char* kWhat = "rms_norm_backward";
  require(rows >= 0 && C >= 0, kWhat, "negative size");
  if (rows == 0 || C == 0) return;
  if (dx == nullptr && dweight == nullptr) return;
  require_float(x_dt, kWhat);
  require_float(w_dt, kWhat);
  require_float(dout_dt, kWhat);
  if (dx != nullptr) require_float(dx_dt, kWhat);
  if (dweight != nullptr) require_float(dw_dt, kWhat);
  require_ptr(x, kWhat, "x");
  require_ptr(weight, kWhat, "weight");
  require_ptr(rstd, kWhat, "rstd");
  require_ptr(dout, kWhat, "dout");

  // As layernorm_backward: a fixed number of warps, a function of rows only.
  constexpr int64_t kMaxGroups = 1024;
  const int64_t groups = rows < kMaxGroups ? rows : kMaxGroups;
  const size_t part_bytes = size_t(groups) * size_t(C) * sizeof(float);
  cudaStream_t s = stream();
  DeviceScratch dw_part(dweight != nullptr ? part_bytes : 0);
  if (dweight != nullptr) check_cuda(cudaMemsetAsync(dw_part.as<void>(), 0, part_bytes, s), kWhat);
  const unsigned grid = static_cast<unsigned>((groups + kRowWarps - 1) / kRowWarps);
  rms_norm_backward_kernel<<<grid, kRowWarps * kWarp, 0, s>>>(
      x, x_dt, weight, w_dt, rstd, dout, dout_dt, dx, dx_dt,
      dweight != nullptr ? dw_part.as<float>() : nullptr, rows, C, groups);
  check_launch(kWhat);
  if (dweight != nullptr)
    add_column_partials(dw_part.as<float>(), groups, C, dweight, dw_dt, kWhat);
}

namespace {

// The number of rotated pairs, after checking the sizes; the arguments too when
// there is work.
int64_t rope_pairs(const void* x, DT x_dt, const float* cos, const float* sin, const void* y,
                   DT y_dt, int64_t B, int64_t T, int64_t C, int64_t D, const char* what) {
  require(B >= 0 && T >= 0 && C >= 0 && D > 0, what, "negative size or an empty head");
  require(D % 2 == 0 && C % D == 0, what, "C must be a multiple of an even head size D");
  const int64_t pairs = B * T * (C / 2);
  if (pairs == 0) return 0;
  require_float(x_dt, what);
  require_float(y_dt, what);
  require_ptr(x, what, "x");
  require_ptr(cos, what, "cos");
  require_ptr(sin, what, "sin");
  require_ptr(y, what, "out");
  return pairs;
}

}  // namespace

void rope_forward(const void* x, DT x_dt, const float* cos, const float* sin, const int32_t* pos,
                  void* out, DT out_dt, int64_t B, int64_t T, int64_t C, int64_t D) {
  constexpr const char* kWhat = "rope_forward";
  const int64_t pairs = rope_pairs(x, x_dt, cos, sin, out, out_dt, B, T, C, D, kWhat);
  if (pairs == 0) return;
  rope_kernel<false, false>
      <<<grid_for(pairs), kBlock, 0, stream()>>>(x, x_dt, cos, sin, pos, out, out_dt, B, T, C, D);
  check_launch(kWhat);
}

void rope_backward(const void* dout, DT dout_dt, const float* cos, const float* sin,
                   const int32_t* pos, void* dx, DT dx_dt, int64_t B, int64_t T, int64_t C,
                   int64_t D) {
  constexpr const char* kWhat = "rope_backward";
  const int64_t pairs = rope_pairs(dout, dout_dt, cos, sin, dx, dx_dt, B, T, C, D, kWhat);
  if (pairs == 0) return;
  rope_kernel<true, true><<<grid_for(pairs), kBlock, 0, stream()>>>(dout, dout_dt, cos, sin, pos,
                                                                    dx, dx_dt, B, T, C, D);
  check_launch(kWhat);
}

void linear_cross_entropy_forward(const void* h, const void* weight, DT dt, const int32_t* targets,
                                  int64_t rows, int64_t C, int64_t V, int64_t chunk_rows,
                                  int ignore_index, float* scratch, float* lse, float* loss,
                                  int32_t* count) {
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
  require_ptr(scratch, kWhat, "scratch");
  require_ptr(lse, kWhat, "lse");
  const size_t row_bytes = size_t(C) * dt_size(dt);
  const int64_t ld = head_stride(V);  // the scratch's padded rows
  DeviceScratch term(size_t(rows) * sizeof(double));
  for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    const int64_t n = chunk_rows < rows - r0 ? chunk_rows : rows - r0;
    const void* h_chunk = static_cast<const char*>(h) + size_t(r0) * row_bytes;
    // logits (n, V) = h_chunk (n, C) @ weight^T (C, V), fp32, rows ld apart
    gemm(false, true, n, V, C, 1.0f, h_chunk, C, weight, C, dt, 0.0f, scratch, ld, DT::kF32);
    cross_entropy_rows_kernel<<<capped_grid(n), kCeBlock, 0, s>>>(
        scratch, DT::kF32, ld, targets + r0, n, V, ignore_index, lse + r0,
        term.as<double>() + r0);
    check_launch(kWhat);
  }
  cross_entropy_loss_kernel<<<1, kCeFinalBlock, 0, s>>>(targets, term.as<double>(), rows,
                                                        ignore_index, loss, count);
  check_launch(kWhat);
}

void linear_cross_entropy_backward(const void* h, const void* weight, DT dt, const int32_t* targets,
                                   const float* lse, const float* dloss, const int32_t* count,
                                   int64_t rows, int64_t C, int64_t V, int64_t chunk_rows,
                                   int ignore_index, float* scratch, void* scratch16, void* dh,
                                   DT dh_dt, void* dweight, DT dw_dt) {
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
  require_ptr(scratch, kWhat, "scratch");
  require(dt == DT::kF32 || scratch16 != nullptr, kWhat, "16-bit operands need scratch16");
  const size_t row_bytes = size_t(C) * dt_size(dt);
  const size_t dh_row_bytes = size_t(C) * dt_size(dh_dt);
  void* dlogits = dt == DT::kF32 ? static_cast<void*>(scratch) : scratch16;
  const int64_t ld = head_stride(V);  // both scratches' padded rows
  cudaStream_t s = stream();
  for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    const int64_t n = chunk_rows < rows - r0 ? chunk_rows : rows - r0;
    const void* h_chunk = static_cast<const char*>(h) + size_t(r0) * row_bytes;
    gemm(false, true, n, V, C, 1.0f, h_chunk, C, weight, C, dt, 0.0f, scratch, ld, DT::kF32);
    cross_entropy_backward_kernel<true><<<capped_grid(n), kCeBlock, 0, s>>>(
        scratch, DT::kF32, ld, targets + r0, lse + r0, dloss, count, n, V, ignore_index, dlogits,
        dt);
    check_launch(kWhat);
    // dh_chunk (n, C) += dlogits (n, V) @ weight (V, C)
    if (dh != nullptr) {
      void* dh_chunk = static_cast<char*>(dh) + size_t(r0) * dh_row_bytes;
      gemm(false, false, n, C, V, 1.0f, dlogits, ld, weight, C, dt, 1.0f, dh_chunk, C, dh_dt);
    }
    // dweight (V, C) += dlogits^T (V, n) @ h_chunk (n, C)
    if (dweight != nullptr) {
      gemm(true, false, V, C, n, 1.0f, dlogits, ld, h_chunk, C, dt, 1.0f, dweight, C, dw_dt);
    }
  }
}

}  // namespace fd::kernels
