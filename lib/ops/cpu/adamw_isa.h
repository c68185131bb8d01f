// The CPU AdamW kernels, one per instruction set, and the switches that tests
// and benchmarks use to force one. Internal to lib/ops: the trainer sets only
// the thread count (ops::set_adamw_threads in lib/ops/adamw.h).
//
// Every kernel gives the bits of the scalar reference, ops::adamw_update(float*
// ...), applied to the fp32 gradients: the same fp32 operations in the same
// order, no FMA (the files are built with -ffp-contract=off, and IEEE divide
// and sqrt are correctly rounded in SIMD too), and the 16-bit conversions of
// convert_to_f32 / convert_f32_to (bf16 by integer round to nearest even, f16
// by F16C's vcvtps2ph / vcvtph2ps, which dtype.cc uses too). NaNs included
// while each element has at most one NaN source (a NaN or inf gradient, say);
// where two different NaNs meet in one addition or multiplication, x86 keeps
// the first operand's, and the compiler may order commutative operands either
// way, so only that the result is a NaN is certain.
#pragma once

#include <cstdint>
#include <string_view>

#include "lib/ops/adamw.h"
#include "lib/tensor/dtype.h"

namespace fd::ops::cpu {

// The per-call constants of one AdamW step, computed as the reference computes
// them (lib/ops/adamw.cc defines adamw_scalars; the reference uses it too).
struct AdamWScalars {
  float decay;            // 1 - lr * weight_decay, in double, rounded once
  float step_size;        // lr / (1 - beta1^step), in double, rounded once
  float bc2_sqrt;         // sqrt(1 - beta2^step), in double, rounded once
  float beta1;            // first-moment decay
  float beta2;            // second-moment decay
  float eps;              // added to sqrt(v) / bc2_sqrt
  float one_minus_beta1;  // 1 - beta1, in fp32
  float one_minus_beta2;  // 1 - beta2, in fp32
};
AdamWScalars adamw_scalars(const AdamWStep& s);  // FD_CHECKs s.step >= 1

// One call's arrays, each at element 0 of its tensor; a kernel updates the
// elements [begin, end) of all of them and touches nothing else.
struct AdamWArrays {
  float* param;         // fp32 master weights, updated in place
  float* m;             // fp32 first moment, updated in place
  float* v;             // fp32 second moment, updated in place
  const void* grad;     // gradients of grad_dtype (kF32, kBF16 or kF16)
  DType grad_dtype;     //
  float grad_scale;     // the fp32 gradient is grad * grad_scale; no multiply when 1
  void* compute;        // nullptr, or a copy of param in compute_dtype to rewrite
  DType compute_dtype;  // kF32, kBF16 or kF16 (rounded to nearest even)
};

// The scalar path (adamw.cc): gradients converted a chunk at a time into a stack
// buffer, then the reference itself, then convert_f32_to for the copy.
void adamw_scalar(const AdamWArrays& a, const AdamWStep& s, int64_t begin, int64_t end);
// 8 lanes (AVX2 + F16C; adamw_avx2.cc) and 16 lanes (AVX-512 F/BW/VL; adamw_avx512.cc).
// Callable only where adamw_isa_supported says so.
void adamw_avx2(const AdamWArrays& a, const AdamWScalars& k, int64_t begin, int64_t end);
void adamw_avx512(const AdamWArrays& a, const AdamWScalars& k, int64_t begin, int64_t end);

enum class AdamWIsa { kScalar, kAvx2, kAvx512 };
inline constexpr AdamWIsa kAdamWIsas[] = {AdamWIsa::kScalar, AdamWIsa::kAvx2, AdamWIsa::kAvx512};
std::string_view adamw_isa_name(AdamWIsa isa);  // "scalar", "avx2", "avx512"
bool adamw_isa_supported(AdamWIsa isa);         // this CPU (and OS) can run it
AdamWIsa adamw_best_isa();                      // the widest supported one
// The one adamw_update uses: adamw_best_isa() unless set_adamw_isa chose another.
AdamWIsa adamw_isa();
void set_adamw_isa(AdamWIsa isa);  // FD_CHECKs that it is supported; not for concurrent use

// The smallest part a thread is given (elements; default kAdamWMinPart): a call
// of n elements uses min(threads, n / min_part) parts, at least 1. Waking a
// worker costs tens of microseconds, what 128 Ki elements take in cache
// (adamw_bench --n 262144). Tests lower it to split small arrays. Not for
// concurrent use with adamw_update.
inline constexpr int64_t kAdamWMinPart = int64_t(1) << 17;
void set_adamw_min_part(int64_t elements);
// The boundaries of part k of [begin, end) split into `parts`: multiples of 64
// (absolute element indices), except begin and end themselves.
int64_t adamw_part_bound(int64_t begin, int64_t end, int parts, int k);

}  // namespace fd::ops::cpu
