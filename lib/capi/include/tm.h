/* tm.h: tensors, autograd, ops and AdamW of fdtrain, for C (C11).
 *
 * A tm_tensor is a handle to a typed, shaped, row-major tensor on the CPU
 * together with its place in the autograd graph. Ops record themselves on the
 * calling thread's tape when an input requires grad; tm_backward(loss) runs
 * the tape backward from loss and clears it. Gradients accumulate (+=) into
 * the leaves that require grad until tm_zero_grad.
 *
 * Ownership. Every tm_tensor* returned by a function of this library is a
 * new handle owned by the caller, who must release it with tm_free exactly
 * once. Freeing a handle never invalidates data that something else still
 * needs: intermediate results keep what backward needs alive on the tape, and
 * a parameter's data lives in its optimizer while the optimizer lives. Input
 * pointers are borrowed for the duration of the call unless a function says
 * otherwise. A tm_adamw* is owned by the caller and freed with tm_adamw_free.
 *
 * Errors. No function aborts on a mistake a caller can make (NULL pointers,
 * mismatched shapes or dtypes, out-of-range targets, calling out of order):
 * it returns TM_ERR_* or NULL and sets a message for this thread, read with
 * tm_last_error() (the same message as fd_last_error() in fd.h). Success does
 * not clear the message.
 *
 * Threads. Handles may be used from one thread at a time; the tape and the
 * last error are per thread.
 */
#ifndef FDTRAIN_TM_H_
#define FDTRAIN_TM_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define TM_API __attribute__((visibility("default")))
#else
#define TM_API
#endif

typedef enum tm_status {
  TM_OK = 0,
  TM_ERR_ARG = 1,      /* a bad argument: NULL, shape, dtype, count, rank */
  TM_ERR_STATE = 2,    /* called out of order (before fd_init, after wrapping, ...) */
  TM_ERR_RUNTIME = 3,  /* the library could not complete the call */
} tm_status;

typedef enum tm_dtype {
  TM_F32 = 0,
  TM_BF16 = 1, /* storage format: ops compute in fp32, round to nearest even */
  TM_F16 = 2,
  TM_I32 = 3,  /* integer data only (cross-entropy targets); no ops */
} tm_dtype;

#define TM_MAX_DIMS 8

typedef struct tm_tensor tm_tensor;
typedef struct tm_adamw tm_adamw;

/* The last error message of the calling thread ("" if none). The pointer stays
 * valid until this thread's next failing call into the library. */
TM_API const char* tm_last_error(void);

/* ---- Tensors ---- */

/* A new zero-filled tensor of shape dims[0..ndim) (0 <= ndim <= TM_MAX_DIMS,
 * each dim >= 0). requires_grad (float dtypes only) makes it a leaf whose
 * gradient backward accumulates. NULL on error. Caller frees with tm_free. */
TM_API tm_tensor* tm_create(const int64_t* dims, int ndim, tm_dtype dtype, int requires_grad);

/* Releases the handle t (NULL is ignored). The data lives on while the tape
 * or an optimizer still holds it. */
TM_API void tm_free(tm_tensor* t);

TM_API int tm_ndim(const tm_tensor* t);          /* -1 if t is NULL */
TM_API int64_t tm_dim(const tm_tensor* t, int i); /* -1 if t is NULL or i out of range */
TM_API int64_t tm_numel(const tm_tensor* t);      /* -1 if t is NULL */
TM_API tm_dtype tm_get_dtype(const tm_tensor* t); /* TM_F32 if t is NULL */

/* Copies count values (count must equal tm_numel(t)) from src into t,
 * converting fp32 to t's float dtype (round to nearest even). t must be a
 * float tensor. Do not overwrite a tensor an op has saved for backward. */
TM_API tm_status tm_write_f32(tm_tensor* t, const float* src, size_t count);
/* Copies t's count (= tm_numel(t)) values into dst as fp32. t: float dtype. */
TM_API tm_status tm_read_f32(const tm_tensor* t, float* dst, size_t count);
/* The same for TM_I32 tensors. */
TM_API tm_status tm_write_i32(tm_tensor* t, const int32_t* src, size_t count);
TM_API tm_status tm_read_i32(const tm_tensor* t, int32_t* dst, size_t count);

/* Copies t's accumulated gradient (count = tm_numel(t)) into dst as fp32;
 * zeros if t requires grad but backward has not reached it yet. */
TM_API tm_status tm_read_grad_f32(const tm_tensor* t, float* dst, size_t count);

/* Sets t's gradient to zero (t must require grad). */
TM_API tm_status tm_zero_grad(tm_tensor* t);

/* ---- Ops: each returns a new tensor (caller frees), NULL on error ---- */

/* a (..., K) @ b (K, N) + bias (N) -> (..., N) with a's dtype. bias may be NULL. */
TM_API tm_tensor* tm_matmul(const tm_tensor* a, const tm_tensor* b, const tm_tensor* bias);
/* a + b, same shape; a's dtype. */
TM_API tm_tensor* tm_add(const tm_tensor* a, const tm_tensor* b);
/* GELU, tanh approximation (GPT-2); same shape and dtype. */
TM_API tm_tensor* tm_gelu(const tm_tensor* x);
/* LayerNorm over the last dim C of x (..., C): weight (C), bias (C) or NULL. */
TM_API tm_tensor* tm_layernorm(const tm_tensor* x, const tm_tensor* weight, const tm_tensor* bias,
                               float eps);
/* Mean cross-entropy of logits (..., V) against targets, a TM_I32 tensor of
 * logits' row count elements, each in [0, V) or -1 (ignored). A 0-d f32 loss. */
TM_API tm_tensor* tm_cross_entropy(const tm_tensor* logits, const tm_tensor* targets);

/* Reads a 0-d (or one-element) float tensor, e.g. a loss. NaN on error. */
TM_API float tm_item(const tm_tensor* t);

/* Backpropagates from loss (which must require grad; seeded with 1 in every
 * element) through every op recorded on this thread's tape, then clears the
 * tape. Leaf gradients accumulate. */
TM_API tm_status tm_backward(tm_tensor* loss);

/* ---- AdamW (torch.optim.AdamW semantics, decoupled weight decay) ---- */

/* An optimizer over params[0..count): float tensors that require grad, all of
 * one dtype, each given once. The optimizer takes over the parameters' data:
 * their values are moved into one flat buffer it owns, and each handle is
 * rebound to its view there (the handles stay valid and owned by the caller;
 * freeing one does not free the data). Weight decay applies to every
 * parameter. bf16/f16 parameters are updated from fp32 copies. A parameter
 * may belong to one optimizer only. NULL on error; free with tm_adamw_free. */
TM_API tm_adamw* tm_adamw_create(tm_tensor* const* params, size_t count, float lr, float beta1,
                                 float beta2, float eps, float weight_decay);
/* One update from the parameters' accumulated gradients (which it leaves in
 * place: call tm_adamw_zero_grad before the next backward). */
TM_API tm_status tm_adamw_step(tm_adamw* opt);
/* Zeros the gradients of every parameter of opt. */
TM_API tm_status tm_adamw_zero_grad(tm_adamw* opt);
/* Sets the learning rate used by the following steps. */
TM_API tm_status tm_adamw_set_lr(tm_adamw* opt, float lr);
/* Frees opt (NULL is ignored), and with it a ZeRO wrapper of opt (fd.h)
 * still alive, which must not be used afterwards. Parameter handles stay
 * valid with their current values: each keeps its own data alive. */
TM_API void tm_adamw_free(tm_adamw* opt);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FDTRAIN_TM_H_ */
