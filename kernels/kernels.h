// fdtrain's CUDA kernels: the GPU side of every op in lib/ops, plus the
// runtime pieces lib/ needs (device selection, a caching allocator, copies,
// streams and events, cuBLASLt GEMM).
//
// This header is plain C++ (no CUDA types), so lib/ compiles with g++ and
// includes it only from its cuda/ sibling files (compiled in CUDA builds). kernels/ includes
// nothing from lib/: pointers are device pointers, element types are DT
// values (the same numbering as fd::DType), sizes are element counts.
//
// Every kernel runs on the current compute stream (compute_stream()) and is
// asynchronous unless its comment says it synchronises. Every launcher checks
// its preconditions and the launch, and reports a failure by throwing
// kernels::Error with the function name and CUDA's message.
//
// Semantics follow lib/ops (the CPU backend): the same formulas, 16-bit values
// loaded into fp32, computed in fp32 and stored with round-to-nearest-even;
// "accumulate" means dst += value (the autograd convention for gradients).
// Results agree with the CPU to rounding (nvcc and g++ fuse multiply-adds
// differently), and are the same bits from run to run: no reduction's order
// depends on timing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace fd::kernels {

// Element types, numbered as fd::DType.
enum class DT : uint8_t { kF32 = 0, kBF16 = 1, kF16 = 2, kI32 = 3 };

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ---------------------------------------------------------------- runtime --

// Number of visible CUDA devices; 0 when there is no driver or no device
// (never throws).
int device_count();
// Why device_count() is 0 (the driver's message), or "" when devices exist.
std::string no_device_reason();
// Makes `ordinal` the process's device and creates the compute stream on it
// (gemm() creates its cuBLASLt handle on first use). Call once per process
// before anything else below; other threads calling in use the same device.
void init_device(int ordinal);
// The device init_device chose (-1 before).
int current_device();
// "NVIDIA H200 (sm_90, 139.8 GiB)" for logs and summary.json.
std::string device_name();
// Total and free memory of the current device in bytes.
void device_memory(size_t* total, size_t* free);

// "cuBLASLt 130100 (libcublasLt.so.13)": loads cuBLASLt if no GEMM has yet
// (kernels/cublaslt_lazy.cc); needs no device. Throws Error when it cannot be loaded.
std::string blas_library();

// The compute stream every kernel runs on (an opaque cudaStream_t).
void* compute_stream();
// Blocks until all work queued on the compute stream has finished.
void synchronize();

// Events order work between the compute stream and a communication stream.
void* event_create();         // an opaque cudaEvent_t (timing disabled)
void* timing_event_create();  // an event that records a time (for event_elapsed_ms)
// Milliseconds between two recorded timing events; waits for `stop`.
float event_elapsed_ms(void* start, void* stop);
void event_destroy(void* event);
void event_record(void* event, void* stream);  // stream: opaque cudaStream_t
void stream_wait_event(void* stream, void* event);
bool event_query(void* event);  // true when the work before the record is done
void event_synchronize(void* event);
void* stream_create();  // a non-blocking stream (for communication)
void stream_destroy(void* stream);
void stream_synchronize(void* stream);

// ------------------------------------------------------------- allocation --

// The caching device allocator: blocks are rounded up (512 B granularity
// below 1 MiB, 2 MiB above), freed blocks are kept per size and reused, so a
// training step that allocates the same sizes every step makes no cudaMalloc
// calls after the first. Blocks freed while kernels still use them are safe
// because every kernel runs on the one compute stream; memory handed to
// another stream must be synchronised with events by the caller.
// On out-of-memory the cache is emptied and cudaMalloc retried once; then
// throws Error with the requested size and the device's free memory.
void* device_alloc(size_t bytes);
void device_free(void* p, size_t bytes);
// Number of cudaMalloc calls so far (monotonic), bytes held in the cache.
size_t device_system_allocations();
size_t device_cached_bytes();
// Returns every cached block to the driver.
void device_empty_cache();

// ------------------------------------------------------------------ copies --

// Asynchronous on the compute stream. Host memory may be pageable; the
// host->device direction returns once the source can be reused, the
// device->host one (copy_to_host) synchronises.
void copy_to_device(void* dst, const void* host_src, size_t bytes);
void copy_to_host(void* host_dst, const void* src, size_t bytes);
void copy_device(void* dst, const void* src, size_t bytes);
void memset_zero(void* dst, size_t bytes);

// Page-locked ("pinned") host memory, which the GPU's copy engines read and
// write by DMA, so copies to and from it run asynchronously and at full PCIe
// bandwidth (ZeRO-Offload's transfer buffers). Throws Error with the size
// and CUDA's message when the system cannot lock that much; host_free(nullptr)
// is a no-op.
void* host_alloc(size_t bytes);
void host_free(void* p);
// Copies `bytes` between any two of device and pinned host memory on `stream`
// (opaque cudaStream_t; nullptr: the compute stream) without waiting: the
// caller orders it with events (event_record / event_synchronize).
void copy_async(void* dst, const void* src, size_t bytes, void* stream);

// ----------------------------------------------------- elementwise & casts --

// dst[i] = factor * src[i] converted to dst_dt, for i < n. Any float dtypes;
// src == dst allowed when the dtypes are equal (in-place scale).
void cast(const void* src, DT src_dt, void* dst, DT dst_dt, int64_t n, float factor = 1.0f);
// cast() on `stream` (opaque cudaStream_t; nullptr: the compute stream) instead
// of the compute stream: a communication stream's fp32 staging of 16-bit sums,
// ordered with the compute stream by the caller's events.
void cast_on(void* stream, const void* src, DT src_dt, void* dst, DT dst_dt, int64_t n);
// dst[i] = value.
void fill(void* dst, DT dt, int64_t n, float value);
// dst[i] += factor * src[i] (gradient accumulation; add/scale backward).
void accumulate(void* dst, DT dst_dt, const void* src, DT src_dt, int64_t n, float factor = 1.0f);
// out[i] = a[i] + b[i] (residual add), out in out_dt.
void add(const void* a, DT a_dt, const void* b, DT b_dt, void* out, DT out_dt, int64_t n);

// GELU, tanh approximation (lib/ops/gelu.h). x and out share dt.
void gelu_forward(const void* x, void* out, DT dt, int64_t n);
// dx = dx_prior + dy * gelu'(x); dx may have another dtype than x/dy, and
// dx_prior is in dx's (null: 0 + ..., no zero fill; dx itself: += in place).
void gelu_backward(const void* x, const void* dy, DT dt, const void* dx_prior, void* dx, DT dx_dt,
                   int64_t n);

// SwiGLU (lib/ops/swiglu.h): out = gate * sigmoid(gate) * up, each array in its own dtype.
void swiglu_forward(const void* gate, DT g_dt, const void* up, DT u_dt, void* out, DT out_dt,
                    int64_t n);
// dgate = dgate_prior + dy * up * silu'(gate); dup = dup_prior + dy * silu(gate).
// Either gradient may be null; each prior as gelu_backward's dx_prior.
void swiglu_backward(const void* gate, DT g_dt, const void* up, DT u_dt, const void* dy, DT dy_dt,
                     const void* dgate_prior, void* dgate, DT dg_dt, const void* dup_prior,
                     void* dup, DT du_dt, int64_t n);

// Dropout with the counter-based mask of lib/ops/dropout.h: element i is kept
// when uniform01(hash_words(seed, stream, i)) >= p (lib/base/rng.h), bitwise the
// same mask as the CPU. out = x * keep / (1 - p).
void dropout_forward(const void* x, void* out, DT dt, int64_t n, float p, uint64_t seed,
                     uint64_t stream);
// dx = dx_prior + dy * keep / (1 - p) (dx_prior as gelu_backward's).
void dropout_backward(const void* dy, DT dt, const void* dx_prior, void* dx, DT dx_dt, int64_t n,
                      float p, uint64_t seed, uint64_t stream);

// ---------------------------------------------------------------- layers --

// out[r, :] = weight[ids[r], :] for r < rows; weight (V, C). Ids are checked on
// the host by the caller.
void embedding_forward(const void* weight, DT dt, const int32_t* ids, void* out, int64_t rows,
                       int64_t C);
// dweight[ids[r], :] += dout[r, :], deterministic (the same bits every run:
// no floating-point atomics in an order that varies).
void embedding_backward(const void* dout, DT dt, const int32_t* ids, void* dweight, DT dw_dt,
                        int64_t rows, int64_t C, int64_t V);

// LayerNorm over the last dim (lib/ops/layernorm.h); bias may be null.
// mean and rstd: rows fp32 values each, written for backward.
void layernorm_forward(const void* x, DT x_dt, const void* weight, const void* bias, DT w_dt,
                       void* out, DT out_dt, float* mean, float* rstd, int64_t rows, int64_t C,
                       float eps);
// The residual add and the LayerNorm after it in one pass: sum = x + residual
// (x, residual and sum in x_dt, rounded as the add kernel), then
// layernorm_forward over sum: the same bits as the two, with one pass less.
void add_layernorm_forward(const void* x, const void* residual, void* sum, DT x_dt,
                           const void* weight, const void* bias, DT w_dt, void* out, DT out_dt,
                           float* mean, float* rstd, int64_t rows, int64_t C, float eps);
// dx = dx_prior + ... (dx_prior null: 0 + ...; dx_prior == dx: += in place;
// else another gradient, in dx_dt, read and not written); dweight += ...;
// dbias += ... (dx, dweight, dbias may be null to skip). Weight gradients are
// reduced over rows in fp32 in a fixed order (deterministic).
void layernorm_backward(const void* x, DT x_dt, const void* weight, DT w_dt, const float* mean,
                        const float* rstd, const void* dout, DT dout_dt, const void* dx_prior,
                        void* dx, DT dx_dt, void* dweight, void* dbias, DT dw_dt, int64_t rows,
                        int64_t C);

// RMSNorm (lib/ops/rms_norm.h) over rows of C consecutive elements:
// out = weight * round_to(x_dt, x * rstd), rstd = 1 / sqrt(mean(x^2) + eps),
// written to rstd[r] (rows fp32 values) for backward.
void rms_norm_forward(const void* x, DT x_dt, const void* weight, DT w_dt, void* out, DT out_dt,
                      float* rstd, int64_t rows, int64_t C, float eps);
// The residual add and the RMSNorm after it in one pass, as add_layernorm_forward.
void add_rms_norm_forward(const void* x, const void* residual, void* sum, DT x_dt,
                          const void* weight, DT w_dt, void* out, DT out_dt, float* rstd,
                          int64_t rows, int64_t C, float eps);
// dx = dx_prior + rstd * (dn - n * mean(dn * n)) with n = x * rstd,
// dn = dy * weight (dx_prior as layernorm_backward's); dweight += dy *
// round_to(x_dt, n), reduced over rows as layernorm_backward (deterministic).
// dx or dweight may be null to skip.
void rms_norm_backward(const void* x, DT x_dt, const void* weight, DT w_dt, const float* rstd,
                       const void* dout, DT dout_dt, const void* dx_prior, void* dx, DT dx_dt,
                       void* dweight, DT dw_dt, int64_t rows, int64_t C);

// Rotary embeddings with rotate_half pairing (lib/ops/rope.h) on x viewed as
// (B, T, C), C a multiple of the head size D (even); cos, sin: fp32 (P >= T, D),
// position t uses row t, or row pos[b*T + t] when pos (device, (B, T) i32) is given.
// out = the rotation of x (overwritten).
void rope_forward(const void* x, DT x_dt, const float* cos, const float* sin, const int32_t* pos,
                  void* out, DT out_dt, int64_t B, int64_t T, int64_t C, int64_t D);
// dx = dx_prior + the transposed rotation of dout (dx_prior as gelu_backward's).
void rope_backward(const void* dout, DT dout_dt, const float* cos, const float* sin,
                   const int32_t* pos, const void* dx_prior, void* dx, DT dx_dt, int64_t B,
                   int64_t T, int64_t C, int64_t D);

// Fused causal attention (lib/ops/attention.h) over q, k and v given as base
// pointers and row strides: head h of row (b, t) of q is the hs elements from
// q + (b * T + t) * ld_q + h * hs, likewise k and v (with ld_k, ld_v), and
// query head h reads key/value head h / (n_head / n_kv_head). GPT-2's packed
// qkv (B, T, 3C) is q = qkv, k = qkv + C, v = qkv + 2C, every stride 3C,
// n_kv_head = n_head. out and dout are (B, T, n_head * hs), contiguous.
struct AttentionShape {
  int64_t B, T;
  int64_t n_head, n_kv_head;  // n_head a multiple of n_kv_head
  int64_t hs;                 // head size, at most 128
  int64_t ld_q, ld_k, ld_v;   // row strides of q, k, v and of dq, dk, dv
  // Packed rows: device (B, T) i32, query t of row b sees keys [starts[b*T + t], t]
  // (lib/ops/attention.h's doc_starts); null: [0, t].
  const int32_t* starts = nullptr;
};
// Two implementations. bf16 and f16 calls whose shapes fit (head size a multiple of 8 up
// to 128, row strides multiples of 8 elements, q, k, v, out and dout 16-byte aligned:
// attention_on_tensor_cores) run on tensor cores (kernels/attention_mma.cu, mma.sync,
// FlashAttention-2 style, P and dS rounded to dt before their products); the rest, and
// every call while set_attention_kernels(kSimt), on CUDA cores in fp32 (kernels/attention.cu),
// kept for comparison. Both are deterministic.
enum class AttentionKernels : uint8_t { kTensorCores, kSimt };
// Process-wide; kTensorCores until set (the device check and GpuOpBench time both).
void set_attention_kernels(AttentionKernels which);
AttentionKernels attention_kernels();
// The tensor-core backward splits each KV head's group of query heads over several blocks
// when too few blocks would run otherwise (MQA at batch 1: kernels/flash_layout.h's
// head_splits). 0, the default, lets it choose; n > 0 asks for n parts wherever n divides the
// group (1 part elsewhere): the parity test runs each grouped case both ways. Process-wide.
void set_attention_backward_splits(int splits);
// Whether a call with dtype dt, shape a and these operand pointers takes the tensor-core kernels.
bool attention_on_tensor_cores(DT dt, const AttentionShape& a, const void* q, const void* k,
                               const void* v, const void* out);
// The attention calls this process has made, by direction and by the kernels that ran them
// (process-wide counters, never reset): what a run's summary.json reports as `gpu` and the
// device check reads, so that a silent fall-back to the SIMT kernels is seen.
struct AttentionLaunches {
  int64_t forward_tensor_cores = 0, forward_simt = 0;
  int64_t backward_tensor_cores = 0, backward_simt = 0;
};
AttentionLaunches attention_launches();

// lse: B * n_head * T fp32, the logsumexp of each score row (natural log,
// scores scaled by 1/sqrt(hs)). q, k, v and out in dt.
void attention_forward(const void* q, const void* k, const void* v, void* out, float* lse, DT dt,
                       const AttentionShape& a);
// A gradient a kernel writes: out = prior + term. prior null: 0 + term (out's
// old contents unread: no zero fill before); prior == out: += in place; else
// another gradient in out's layout (a borrowed one), read and not written.
// out null: not wanted (not written).
struct GradOut {
  void* out = nullptr;
  const void* prior = nullptr;
};

// dq, dk, dv (in grad_dt) = their priors + the gradients of out given dout;
// out and lse from the forward. dk, dv sum over each group's query heads.
void attention_backward(const void* q, const void* k, const void* v, const void* out,
                        const float* lse, const void* dout, DT dt, GradOut dq, GradOut dk,
                        GradOut dv, DT grad_dt, const AttentionShape& a);

// Fused log-softmax + NLL over rows of V logits (lib/ops/cross_entropy.h).
// Writes lse[r] for every row, *count = number of targets != ignore_index, and
// *loss = sum over those rows of (lse - logit[target]) / max(count, 1) (0 when
// count is 0). loss, count: device scalars.
void cross_entropy_forward(const void* logits, DT dt, const int32_t* targets, int64_t rows,
                           int64_t V, int ignore_index, float* lse, float* loss, int32_t* count);
// dlogits[r, :] += (*dloss / count) * (softmax(logits[r]) - onehot(target)) for
// rows whose target is not ignored. dloss, count: device scalars. fresh:
// dlogits holds no gradient yet and is written whole (= instead of +=, ignored
// rows 0), with no zero fill before.
void cross_entropy_backward(const void* logits, DT dt, const int32_t* targets, const float* lse,
                            const float* dloss, const int32_t* count, int64_t rows, int64_t V,
                            int ignore_index, void* dlogits, DT dl_dt, bool fresh);

// The row stride of the chunked head's logits and dlogits scratch: V rounded up to a
// multiple of 128 elements (GPT-2's 50,257 -> 50,304), so that every row starts 512 B
// (fp32) or 256 B (16-bit) aligned, as cuBLASLt's tensor-core kernels and vector loads
// want. The padding columns are never computed, read or written: the vocabulary itself
// (the weights, the loss, checkpoints, exports) is not padded.
constexpr int64_t head_stride(int64_t V) { return (V + 127) / 128 * 128; }

// The head GEMM and cross-entropy, chunked over rows (lib/ops/linear_cross_entropy.h):
// h (rows, C) and weight (V, C) share dt. For each chunk of chunk_rows rows, logits =
// h_chunk weight^T (gemm, fp32 into `scratch`: min(chunk_rows, rows) rows of
// head_stride(V) floats, V of them used), then the row pass of cross_entropy_forward; at
// the end the same fixed-order loss pass. With `kept` (llm.c's head: one chunk,
// chunk_rows >= rows, while recording) the logits of every row go into `kept` instead, in
// dt (rows x head_stride(V); fp32 accumulation rounded once to dt), for the backward; the
// scratch is then unused (may be null).
// Writes lse, *loss and *count as cross_entropy_forward (lse 0 for ignored rows).
void linear_cross_entropy_forward(const void* h, const void* weight, DT dt, const int32_t* targets,
                                  int64_t rows, int64_t C, int64_t V, int64_t chunk_rows,
                                  int ignore_index, float* scratch, void* kept, float* lse,
                                  float* loss, int32_t* count);
// Recomputes each chunk's logits into `scratch`, turns them into dlogits =
// (*dloss / *count) (softmax - onehot) (0 for ignored rows, and for every row when
// count is 0), in place for f32 and into `scratch16` (the same shape and stride in dt) for 16-bit
// operands, then dh_chunk += dlogits weight and dweight += dlogits^T h_chunk (gemm,
// fp32 accumulation). With `kept` (the forward's) there is no logits GEMM: one pass turns
// the kept logits into dlogits in place, then the two GEMMs over every row (dweight's at
// full K); scratch and scratch16 are unused. dh or dweight may be null to skip; each is dt
// or f32. dh_fresh: dh holds no gradient yet, and each chunk's GEMM overwrites its rows
// (beta 0: no zero fill before).
void linear_cross_entropy_backward(const void* h, const void* weight, DT dt, const int32_t* targets,
                                   const float* lse, const float* dloss, const int32_t* count,
                                   int64_t rows, int64_t C, int64_t V, int64_t chunk_rows,
                                   int ignore_index, float* scratch, void* scratch16, void* kept,
                                   void* dh, DT dh_dt, bool dh_fresh, void* dweight, DT dw_dt);

// Column sums for the bias gradient: dbias[j] += sum over i < M of dy[i, j].
void bias_grad(const void* dy, DT dy_dt, int64_t M, int64_t N, void* dbias, DT db_dt);

// ------------------------------------------------------------- 4-bit base --
// QLoRA's frozen base in 4 bits (lib/quant, docs/QUANTIZATION.md): the same float32
// operations, flush of subnormals included, as lib/quant on the CPU, so the results are the
// CPU's bits. Tables come from the host (lib/quant's) and are passed by value.

// Codes per nested absmax value with double quantization (bitsandbytes' nested blocksize).
constexpr int64_t kNestedBlock = 256;

// out[i] = mul_ftz(map[codes[i]], nested_absmax[i / kNestedBlock]) + *offset for i < n, the
// sum IEEE (lib/quant's decode_nested_absmax). codes, nested_absmax, offset (one float) and out
// on the device; map_host: 256 floats in host memory.
void decode_nested_absmax(const uint8_t* codes, int64_t n, const float* nested_absmax,
                          const float* offset, const float* map_host, float* out);
// out[j] = mul_ftz(code_values[code(e)], absmax[e / block_size]) for e = begin + j, j < count,
// rounded to out_dt (f32 as is; bf16/f16 to nearest even): lib/quant's dequantize_range.
// packed: two codes per byte, the earlier element in the high nibble; absmax: one fp32 per
// block (decoded); block_size a power of two; code_values_host: 16 floats in host memory
// (quant::code_values).
void dequantize_4bit(const uint8_t* packed, const float* absmax, int64_t block_size,
                     const float* code_values_host, int64_t begin, int64_t count, void* out,
                     DT out_dt);

// ------------------------------------------------------------------ GEMM --

// Whether fp32 GEMMs (gemm(), and the classifier's inside
// linear_cross_entropy_*) run on TF32 tensor cores: process-wide, off (exact
// fp32) until set; fdtrain sets it from the recipe's `tf32` (default true).
void set_tf32(bool allow);
bool tf32_allowed();

// C (m x n) = alpha * op(A) op(B) + beta * C, row-major like lib/ops/gemm.h,
// through cuBLASLt. A and B share ab_dt; C is ab_dt or kF32. bias (n values,
// ab_dt, or null) is added to every row, fused into the epilogue where
// cuBLASLt allows (then beta must be 0). fp32 inputs use tf32 tensor cores
// when set_tf32(true), exact fp32 otherwise; 16-bit inputs accumulate in
// fp32. Workspace comes from the caching allocator.
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* A,
          int64_t lda, const void* B, int64_t ldb, DT ab_dt, float beta, void* C, int64_t ldc,
          DT c_dt, const void* bias = nullptr);

// ------------------------------------------------------- optimizer & norms --

// One AdamW step over n fp32 values (lib/ops/adamw.h, same formula; bias
// corrections computed on the host in double and passed in):
//   g = grad[i] * grad_scale (grad in grad_dt: the unscale and clip factor);
//   p *= 1 - lr*wd; m = m + (1-b1)*(g - m) (torch's lerp); v = b2*v + (1-b2)*g*g;
//   p -= step_size * m / (sqrt(v) / bc2_sqrt + eps)
// where step_size = lr / (1 - b1^t) and bc2_sqrt = sqrt(1 - b2^t).
// When out16 is not null, out16[i] = p converted to out_dt (the 16-bit
// working copy of the parameters).
struct AdamWArgs {
  float lr, beta1, beta2, eps, weight_decay;
  float step_size;  // lr / (1 - beta1^step)
  float bc2_sqrt;   // sqrt(1 - beta2^step)
  float grad_scale;
};
void adamw(float* param, const void* grad, DT grad_dt, float* m, float* v, int64_t n,
           const AdamWArgs& args, void* out16 = nullptr, DT out_dt = DT::kBF16);

// Sum of x[i]^2 accumulated in double; synchronises and returns the value.
double sum_of_squares(const void* x, DT dt, int64_t n);
// False if any of x[i] is inf or NaN; synchronises.
bool all_finite(const void* x, DT dt, int64_t n);

}  // namespace fd::kernels
