// The backends behind lib/ops. Internal to lib/ops.
//
// Each op's public function (<op>.cc) checks shapes, allocates its outputs,
// records its tape node and hands the arithmetic to the backend of its main
// input's device, through the entry points below, declared once per backend:
//   cpu/<op>.cc   the CPU (BLAS, vectorised loops over fp32; F32In/F32Out);
//   cuda/<op>.cc  the GPU, through kernels/ (CUDA builds; cuda_stub.cc, whose
//                 entry points throw, otherwise). CMake picks the files.
//
// Meta tensors (lib/tensor/device.h) run through the CPU backend, which keeps
// one source of truth for what an op allocates: every CPU entry point makes
// its allocations (scratch, F32In/F32Out copies, gradients through
// ensure_grad) at the same moments for meta tensors as for CPU ones, and skips
// only the arithmetic (`if (meta) return;` and the like after the
// allocations). Data it would read to validate (ids, targets) is not read on
// meta. F32In/F32Out allocate their copies on meta and fail (FD_CHECK) when
// asked for a pointer there, so an entry point that forgets to skip its
// arithmetic fails loudly. tests/ops/meta_test.cc holds every op to this:
// equal accountant peaks and currents on the CPU and on meta.
//
// Backward entry points take gradient slots (null or !requires_grad: not
// wanted) and call ensure_grad() where their allocation order needs it.
// Tensors another backend cannot read are the caller's mistake: the CUDA
// backend checks that operands live on the GPU (integer ids and targets may
// come from the host, checked there and copied).
#pragma once

#include <cstdint>

#include "lib/autograd/variable.h"
#include "lib/ops/adamw.h"
#include "lib/ops/matmul.h"
#include "lib/tensor/tensor.h"

namespace fd::dist {
class Communicator;
}  // namespace fd::dist

namespace fd::ops {

struct MatmulDims {
  int64_t M, K, N;  // op(a) is (M, K), op(b) is (K, N)
};

struct AttentionDims {
  int64_t B, T;
  int64_t C;          // q's and out's width: n_head * hs
  int64_t n_head;     // query heads
  int64_t hs;         // head size
  int64_t n_kv_head;  // key/value heads; divides n_head (the packed qkv: n_head)
  // Packed batches (lib/ops/attention.h): (B, T) on the host; query (b, i) sees keys
  // [starts[b * T + i], i]. Null: every key up to i.
  const int32_t* starts = nullptr;
};

// What cross-entropy's forward leaves for its backward.
struct CrossEntropySaved {
  Tensor logits;       // (..., V) as given
  Tensor targets;      // i32, a copy on the backend's device (when recording)
  Tensor lse;          // fp32 logsumexp per row
  Tensor count;        // CUDA: i32 device scalar, the rows whose target counts
  int64_t host_count;  // CPU: the same count; meta: every row (targets are not read)
  int ignore_index;
};

// What linear_cross_entropy's forward leaves for its backward.
struct LinearCrossEntropySaved {
  Tensor h;            // (..., C) as given
  Tensor weight;       // (V, C) as given
  Tensor targets;      // i32, a copy on the backend's device (when recording)
  Tensor lse;          // fp32 logsumexp per row (0 for ignored rows)
  Tensor count;        // CUDA: i32 device scalar, the rows whose target counts
  int64_t host_count;  // CPU: the same count; meta: every row (targets are not read)
  int ignore_index;
  int64_t chunk_rows;
  // One chunk over every row while recording, kept for the backward, which then needs no
  // second logits GEMM. CPU: the forward's logits turned in place into softmax - onehot
  // (fp32, rows x V, zero rows where the target is ignored). CUDA: the logits in the
  // operands' dtype (rows x kernels::head_stride(V)), which the backward turns into dlogits
  // in place. Undefined otherwise (the backward recomputes each chunk's logits).
  Tensor dlogits = Tensor();
};

// Where a head's weight rows sit in the full vocabulary: the vocabulary-parallel
// cross-entropy's shard (lib/ops/vocab_parallel_cross_entropy.h). The default is the
// whole head, one process (linear_cross_entropy).
struct VocabShard {
  int64_t begin = 0;  // the full vocabulary's id of the weight's first row
  int64_t vocab = 0;  // the full vocabulary V (when `group` is set)
  // The ranks holding the other rows, which reduce each row's statistics and dh with
  // this one; null: the weight is the whole head and nothing is communicated.
  dist::Communicator* group = nullptr;
  // Whether dh's per-rank partials are all-reduced over `group` (false: each rank keeps its
  // own partial, for a caller whose next backward sums them: sequence parallelism's gather).
  bool reduce_dh = true;
};

// linear_token_logps and vocab_parallel_token_logps, one op over a whole head (the default
// shard) or a shard: checks the shapes and the device, runs the CPU entry points below and
// records the backward (the shard's group, if any, must outlive it). `op` names it in messages.
autograd::Variable token_logps(const autograd::Variable& h, const autograd::Variable& weight,
                               const Tensor& targets, int ignore_index, int64_t chunk_rows,
                               const VocabShard& shard, const char* op);

// The entry points every backend defines, with the same contracts as the
// public ops (which say what each computes and saves).
#define FD_OPS_BACKEND_ENTRY_POINTS                                                                \
  /* out = a + b; out = x * factor; dst += src * factor. */                                        \
  void add(const Tensor& a, const Tensor& b, const Tensor& out);                                   \
  void scale(const Tensor& x, float factor, const Tensor& out);                                    \
  void accumulate(const Tensor& dst, const Tensor& src, float factor);                             \
  void gelu_forward(const Tensor& x, const Tensor& out);                                           \
  void gelu_backward(const Tensor& x, const Tensor& dy, autograd::GradSlot* dx);                   \
  void dropout_forward(const Tensor& x, const Tensor& out, float p, uint64_t seed,                 \
                       uint64_t stream);                                                           \
  void dropout_backward(const Tensor& dy, autograd::GradSlot* dx, float p, uint64_t seed,          \
                        uint64_t stream);                                                          \
  /* Returns the ids as this backend read them (on the GPU: a device copy of host ids). */         \
  Tensor embedding_forward(const Tensor& weight, const Tensor& ids, const Tensor& out);            \
  void embedding_backward(const Tensor& dy, const Tensor& ids, const Tensor& dweight);             \
  void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,     \
                         const Tensor& out, const Tensor& mean, const Tensor& rstd);               \
  void layernorm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean,               \
                          const Tensor& rstd, const Tensor& dy, autograd::GradSlot* dx,            \
                          autograd::GradSlot* dweight, autograd::GradSlot* dbias);                 \
  void matmul_forward(const Tensor& a, const Tensor& b, const Tensor& bias, MatmulOptions o,       \
                      MatmulDims d, const Tensor& out);                                            \
  void matmul_backward(const Tensor& a, const Tensor& b, const Tensor& dy, MatmulOptions o,        \
                       MatmulDims d, autograd::GradSlot* da, autograd::GradSlot* db,               \
                       autograd::GradSlot* dbias);                                                 \
  void attention_forward(const Tensor& qkv, AttentionDims d, const Tensor& out,                    \
                         const Tensor& lse);                                                       \
  /* out: the forward's output (the GPU's backward needs it; the CPU's does not). */               \
  void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse,                 \
                          const Tensor& dy, AttentionDims d, autograd::GradSlot* dqkv);            \
  /* The same over separate q (B, T, C), k and v (B, T, n_kv_head * hs), one dtype. */             \
  void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, AttentionDims d,       \
                         const Tensor& out, const Tensor& lse);                                    \
  void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,    \
                          const Tensor& lse, const Tensor& dy, AttentionDims d,                    \
                          autograd::GradSlot* dq, autograd::GradSlot* dk, autograd::GradSlot* dv); \
  /* Returns the 0-d f32 loss and fills `saved` (targets copied only when `record`). */            \
  Tensor cross_entropy_forward(const Tensor& logits, const Tensor& targets, int ignore_index,      \
                               const Tensor& lse, bool record, CrossEntropySaved* saved);          \
  void cross_entropy_backward(const CrossEntropySaved& saved, const Tensor& dloss,                 \
                              autograd::GradSlot* dlogits);                                        \
  double sum_of_squares(const Tensor& t);                                                          \
  void scale_(const Tensor& t, float factor);                                                      \
  bool all_finite(const Tensor& t);                                                                \
  void add_(const Tensor& acc, const Tensor& x);                                                   \
  void adamw_update(const Tensor& param, const Tensor& grad, float grad_scale, const Tensor& m,    \
                    const Tensor& v, const Tensor& compute, int64_t offset, int64_t n,             \
                    const AdamWStep& s);                                                           \
  /* The Llama ops (issue 18). rms_norm: C = weight.numel(), rows = x.numel() / C. */              \
  void rms_norm_forward(const Tensor& x, const Tensor& weight, float eps, const Tensor& out,       \
                        const Tensor& rstd);                                                       \
  void rms_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& rstd,                \
                         const Tensor& dy, autograd::GradSlot* dx, autograd::GradSlot* dweight);   \
  void swiglu_forward(const Tensor& gate, const Tensor& up, const Tensor& out);                    \
  void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dy,                     \
                       autograd::GradSlot* dgate, autograd::GradSlot* dup);                        \
  /* cos, sin: fp32 (P, D) tables on x's device; x: (B, T, ...), a multiple of D per (b, t); */    \
  /* positions: empty (row t) or i32 (B, T) on the host, checked by the op. */                     \
  void rope_forward(const Tensor& x, const Tensor& cos, const Tensor& sin,                         \
                    const Tensor& positions, const Tensor& out);                                   \
  void rope_backward(const Tensor& dy, const Tensor& cos, const Tensor& sin,                       \
                     const Tensor& positions, autograd::GradSlot* dx);                             \
  /* Returns the 0-d f32 loss and fills `saved` (targets copied only when `record`). */            \
  Tensor linear_cross_entropy_forward(                                                             \
      const Tensor& h, const Tensor& weight, const Tensor& targets, int ignore_index,              \
      int64_t chunk_rows, const Tensor& lse, bool record, LinearCrossEntropySaved* saved);         \
  void linear_cross_entropy_backward(const LinearCrossEntropySaved& saved, const Tensor& dloss,    \
                                     autograd::GradSlot* dh, autograd::GradSlot* dweight);

namespace cpu {
FD_OPS_BACKEND_ENTRY_POINTS

// linear_token_logps and vocab_parallel_token_logps (CPU and meta only): each row's
// log-probability of its target into `logps` (R,) f32, 0 for ignored rows, for a weight holding
// rows [shard.begin, shard.begin + V_local) of the head (the default VocabShard: the whole head;
// with a group, the row statistics, and dh unless !shard.reduce_dh, all-reduced over it, as
// vocab_parallel_cross_entropy's); `lse` and `saved` as linear_cross_entropy's. The backward
// adds dh and dW for the per-row gradient `dlogps` (R,) f32.
void linear_token_logps_forward(const Tensor& h, const Tensor& weight, const Tensor& targets,
                                int ignore_index, int64_t chunk_rows, const VocabShard& shard,
                                const Tensor& lse, const Tensor& logps, bool record,
                                LinearCrossEntropySaved* saved);
void linear_token_logps_backward(const LinearCrossEntropySaved& saved, const VocabShard& shard,
                                 const Tensor& dlogps, autograd::GradSlot* dh,
                                 autograd::GradSlot* dweight);

// vocab_parallel_cross_entropy (CPU and meta only): linear_cross_entropy's entry points for a
// weight holding rows [shard.begin, shard.begin + V_local) of the head, the row statistics and
// dh all-reduced over shard.group (on meta the same collectives, with null buffers). `lse` and
// `saved` as linear_cross_entropy's (lse: the full vocabulary's logsumexp).
Tensor vocab_parallel_cross_entropy_forward(const Tensor& h, const Tensor& weight,
                                            const Tensor& targets, int ignore_index,
                                            int64_t chunk_rows, const VocabShard& shard,
                                            const Tensor& lse, bool record,
                                            LinearCrossEntropySaved* saved);
void vocab_parallel_cross_entropy_backward(const LinearCrossEntropySaved& saved,
                                           const VocabShard& shard, const Tensor& dloss,
                                           autograd::GradSlot* dh, autograd::GradSlot* dweight);
}  // namespace cpu

namespace cuda {
FD_OPS_BACKEND_ENTRY_POINTS

// The residual add fused with the norm after it (add_layernorm, add_rms_norm; x and y in one
// dtype): sum = x + y, then the norm's forward over sum, in one pass (the CPU runs add, then the
// norm: the same bits).
void add_layernorm_forward(const Tensor& x, const Tensor& y, const Tensor& weight,
                           const Tensor& bias, float eps, const Tensor& sum, const Tensor& out,
                           const Tensor& mean, const Tensor& rstd);
void add_rms_norm_forward(const Tensor& x, const Tensor& y, const Tensor& weight, float eps,
                          const Tensor& sum, const Tensor& out, const Tensor& rstd);
}  // namespace cuda

#undef FD_OPS_BACKEND_ENTRY_POINTS

}  // namespace fd::ops
