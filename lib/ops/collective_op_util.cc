#include "lib/ops/collective_op_util.h"

#include <cstring>

#include "lib/base/check.h"
#include "lib/ops/reduce.h"

namespace fd::ops {

void check_collective_operand(const autograd::Variable& x, const char* op) {
  FD_CHECK(x.defined(), "{}: undefined input", op);
  const DType dt = x.dtype();
  FD_CHECK(dt == DType::kF32 || dt == DType::kBF16 || dt == DType::kF16,
           "{}: a float tensor (f32, bf16, f16) is required, got {}", op, dtype_name(dt));
  FD_CHECK(!x.value().is_cuda(), "{}: runs on the CPU (and meta) only", op);
}

Tensor scratch_like(const Tensor& like, const Shape& shape) {
  return Tensor::empty(shape, like.dtype(), MemCategory::kActivations, like.device());
}

void add_into(autograd::GradSlot& slot, const Tensor& g) {
  bool first = false;
  const Tensor& dst = slot.grad_to_write(&first);
  if (first)
    dst.copy_from(g);
  else
    add_(dst, g);
}

namespace {

// Copies run `(o, r)` of the (outer, S, run) side to run `(r, o)` of the (S, outer, run)
// side (to_packed), or back.
void move_blocks(const Tensor& from, const Tensor& to, int S, int64_t outer, int64_t run,
                 bool to_packed) {
  if (from.is_meta() || to.is_meta()) return;
  const int64_t n = outer * S * run;
  FD_CHECK(from.numel() == n && to.numel() == n && from.dtype() == to.dtype(),
           "rank-major blocks: {} and {} elements for (outer {}, S {}, run {})", from.numel(),
           to.numel(), outer, S, run);
  const size_t bytes = size_t(run) * dtype_size(from.dtype());
  const char* src = static_cast<const char*>(from.raw());
  char* dst = static_cast<char*>(to.raw());
  for (int r = 0; r < S; ++r) {
    for (int64_t o = 0; o < outer; ++o) {
      const size_t full_at = (size_t(o) * size_t(S) + size_t(r)) * bytes;
      const size_t packed_at = (size_t(r) * size_t(outer) + size_t(o)) * bytes;
      if (to_packed)
        std::memcpy(dst + packed_at, src + full_at, bytes);
      else
        std::memcpy(dst + full_at, src + packed_at, bytes);
    }
  }
}

}  // namespace

void pack_rank_major(const Tensor& full, const Tensor& packed, int S, int64_t outer, int64_t run) {
  move_blocks(full, packed, S, outer, run, /*to_packed=*/true);
}

void unpack_rank_major(const Tensor& packed, const Tensor& full, int S, int64_t outer,
                       int64_t run) {
  move_blocks(packed, full, S, outer, run, /*to_packed=*/false);
}

}  // namespace fd::ops
