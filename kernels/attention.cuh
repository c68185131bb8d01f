// What the two attention implementations share: the problem geometry, and the
// tensor-core kernels' launchers (kernels/attention_mma.cu) that the public
// entry points (kernels/attention.cu) call when a call fits them.
#pragma once

#include <cstdint>

#include "kernels/kernels.h"

namespace fd::kernels {

// Problem geometry, shared by the kernels. Head h of row (b, t) of q starts
// at element (b * T + t) * ldq + h * hs (k, v likewise); out and dout are
// contiguous, row stride C.
struct Geometry {
  int T, C, n_head, n_kv_head, group, hs;  // C = n_head * hs, group = n_head / n_kv_head
  int64_t ldq, ldk, ldv;                   // row strides of q, k, v (and dq, dk, dv)
  float scale;                             // 1 / sqrt(hs)
  float scale_log2;                        // scale * log2(e): scores in base-2 units
  const int32_t* starts;                   // packed rows: (B, T) first key of each query; or null

  // Whether query r of batch row b sees key c (causal, and inside r's document).
  __device__ bool visible(int b, int r, int c) const {
    return c <= r && (starts == nullptr || c >= starts[int64_t(b) * T + r]);
  }
  // The first key any query of [r0, ...) in batch row b sees (starts never decrease).
  __device__ int first_key(int b, int r0) const {
    return starts == nullptr || r0 >= T ? 0 : starts[int64_t(b) * T + r0];
  }

  // Element offset of head h of row (b, 0) in an operand of row stride ld.
  __device__ int64_t head(int b, int h, int64_t ld) const {
    return int64_t(b) * T * ld + int64_t(h) * hs;
  }
};

// The tensor-core (mma.sync, sm_80+) kernels for 16-bit q, k, v, after the
// public entry points have checked the arguments and computed D (the row sums
// of dO * O, B * n_head * T floats, for backward). Same contracts as
// attention_forward / attention_backward (kernels.h). Defined in attention_mma.cu.
void attention_forward_mma(const void* q, const void* k, const void* v, void* out, float* lse,
                           DT dt, int64_t B, const Geometry& g);
void attention_backward_mma(const void* q, const void* k, const void* v, const void* dout,
                            const float* lse, const float* D, DT dt, GradOut dq, GradOut dk,
                            GradOut dv, DT grad_dt, int64_t B, const Geometry& g);

}  // namespace fd::kernels
