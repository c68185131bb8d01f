#include "lib/ops/tp_regions.h"

#include <cstring>
#include <memory>

#include "lib/autograd/tape.h"
#include "lib/ops/reduce.h"

namespace fd::ops {
namespace {

using autograd::GradSlot;

void check_operand(const Variable& x, const char* op) {
  FD_CHECK(x.defined(), "{}: undefined input", op);
  const DType dt = x.dtype();
  FD_CHECK(dt == DType::kF32 || dt == DType::kBF16 || dt == DType::kF16,
           "{}: a float tensor (f32, bf16, f16) is required, got {}", op, dtype_name(dt));
  FD_CHECK(!x.value().is_cuda(), "{}: runs on the CPU (and meta) only", op);
}

// x (B, T, C) of a sequence op: its three dims.
struct Bsc {
  int64_t B, T, C;
};
Bsc dims_of(const Variable& x, const char* op) {
  FD_CHECK(x.shape().ndim() == 3, "{}: x must be (B, T, C), got {}", op, x.shape().str());
  return {x.shape()[0], x.shape()[1], x.shape()[2]};
}

// A buffer shaped and typed like `like`, where `like` lives (meta stays meta).
Tensor scratch_like(const Tensor& like, const Shape& shape) {
  return Tensor::empty(shape, like.dtype(), MemCategory::kActivations, like.device());
}

// Adds `g` into the slot's gradient: a copy when the slot has none yet (bit for bit), else
// add_ (fp32 arithmetic, stored in the gradient's dtype).
void add_into(GradSlot& slot, const Tensor& g) {
  bool first = false;
  const Tensor& dst = slot.grad_to_write(&first);
  if (first)
    dst.copy_from(g);
  else
    add_(dst, g);
}

// Dim-1 sharding of a row-major (B, S*Ts, C) tensor into contiguous per-rank blocks: block r of
// the rank-major (S, B, Ts, C) layout holds positions [r*Ts, (r+1)*Ts) of every sequence. Each
// (b, r) run is Ts*C contiguous elements on both sides. Nothing to copy on meta.
void pack_rank_major(const Tensor& full, const Tensor& packed, int S, int64_t B, int64_t Ts,
                     int64_t C) {
  if (full.is_meta()) return;
  const size_t run = size_t(Ts * C) * dtype_size(full.dtype());
  const char* src = static_cast<const char*>(full.raw());
  char* dst = static_cast<char*>(packed.raw());
  for (int r = 0; r < S; ++r)
    for (int64_t b = 0; b < B; ++b)
      std::memcpy(dst + (size_t(r) * size_t(B) + size_t(b)) * run,
                  src + (size_t(b) * size_t(S) + size_t(r)) * run, run);
}
void unpack_rank_major(const Tensor& packed, const Tensor& full, int S, int64_t B, int64_t Ts,
                       int64_t C) {
  if (full.is_meta()) return;
  const size_t run = size_t(Ts * C) * dtype_size(full.dtype());
  const char* src = static_cast<const char*>(packed.raw());
  char* dst = static_cast<char*>(full.raw());
  for (int r = 0; r < S; ++r)
    for (int64_t b = 0; b < B; ++b)
      std::memcpy(dst + (size_t(b) * size_t(S) + size_t(r)) * run,
                  src + (size_t(r) * size_t(B) + size_t(b)) * run, run);
}

}  // namespace

Variable copy_to_tp_region(const Variable& x, dist::Communicator& group) {
  check_operand(x, "copy_to_tp_region");
  const bool rec = autograd::should_record({&x});
  Variable y = Variable::op_output(x.value(), rec);
  if (rec) {
    auto ys = y.slot();
    auto xs = x.slot();
    dist::Communicator* comm = &group;
    autograd::current_tape().record({"copy_to_tp_region", {ys}, [ys, xs, comm] {
                                       if (!xs->requires_grad) return;
                                       const Tensor& dy = ys->ensure_grad();
                                       comm->all_reduce(dy.comm_data(), dy.numel(), dy.dtype(),
                                                        dist::ReduceOp::kSum);
                                       add_into(*xs, dy);
                                     }});
  }
  return y;
}

Variable reduce_from_tp_region(const Variable& x, dist::Communicator& group) {
  check_operand(x, "reduce_from_tp_region");
  Tensor out = scratch_like(x.value(), x.shape());
  out.copy_from(x.value());
  group.all_reduce(out.comm_data(), out.numel(), out.dtype(), dist::ReduceOp::kSum);
  const bool rec = autograd::should_record({&x});
  Variable y = Variable::op_output(out, rec);
  if (rec) {
    auto ys = y.slot();
    auto xs = x.slot();
    autograd::current_tape().record({"reduce_from_tp_region", {ys}, [ys, xs] {
                                       if (xs->requires_grad) add_into(*xs, ys->ensure_grad());
                                     }});
  }
  return y;
}

Variable gather_from_sequence_region(const Variable& x, dist::Communicator& group) {
  check_operand(x, "gather_from_sequence_region");
  const Bsc d = dims_of(x, "gather_from_sequence_region");
  const int64_t B = d.B, Ts = d.T, C = d.C;
  const int S = group.size();
  const Shape full_shape{B, Ts * S, C};
  Tensor packed = scratch_like(x.value(), Shape{S, B, Ts, C});
  group.all_gather(x.value().comm_data(), packed.comm_data(), B * Ts * C, x.dtype());
  Tensor out = scratch_like(x.value(), full_shape);
  unpack_rank_major(packed, out, S, B, Ts, C);
  packed = Tensor();
  const bool rec = autograd::should_record({&x});
  Variable y = Variable::op_output(out, rec);
  if (rec) {
    auto ys = y.slot();
    auto xs = x.slot();
    dist::Communicator* comm = &group;
    autograd::current_tape().record(
        {"gather_from_sequence_region", {ys}, [ys, xs, comm, S, B, Ts, C] {
           if (!xs->requires_grad) return;
           const Tensor& dy = ys->ensure_grad();
           Tensor packed_dy = scratch_like(dy, Shape{S, B, Ts, C});
           pack_rank_major(dy, packed_dy, S, B, Ts, C);
           // Straight into x's gradient when it has none yet (in dy's dtype), else through a
           // buffer added into it.
           bool first = false;
           const Tensor& dx = xs->grad_to_write(&first);
           const bool direct = first && dx.dtype() == dy.dtype();
           Tensor recv = direct ? dx : scratch_like(dy, dx.shape());
           comm->reduce_scatter(packed_dy.comm_data(), recv.comm_data(), B * Ts * C, dy.dtype());
           if (direct) return;
           if (first)
             dx.copy_from(recv);
           else
             add_(dx, recv);
         }});
  }
  return y;
}

Variable reduce_scatter_to_sequence_region(const Variable& x, dist::Communicator& group) {
  check_operand(x, "reduce_scatter_to_sequence_region");
  const Bsc d = dims_of(x, "reduce_scatter_to_sequence_region");
  const int64_t B = d.B, T = d.T, C = d.C;
  const int S = group.size();
  FD_CHECK(T % S == 0,
           "reduce_scatter_to_sequence_region: a sequence of {} positions does not split over "
           "{} ranks; make the sequence length a multiple of the tensor-parallel size",
           T, S);
  const int64_t Ts = T / S;
  Tensor packed = scratch_like(x.value(), Shape{S, B, Ts, C});
  pack_rank_major(x.value(), packed, S, B, Ts, C);
  Tensor out = scratch_like(x.value(), Shape{B, Ts, C});
  group.reduce_scatter(packed.comm_data(), out.comm_data(), B * Ts * C, x.dtype());
  packed = Tensor();
  const bool rec = autograd::should_record({&x});
  Variable y = Variable::op_output(out, rec);
  if (rec) {
    auto ys = y.slot();
    auto xs = x.slot();
    dist::Communicator* comm = &group;
    autograd::current_tape().record(
        {"reduce_scatter_to_sequence_region", {ys}, [ys, xs, comm, S, B, Ts, C] {
           if (!xs->requires_grad) return;
           const Tensor& dy = ys->ensure_grad();
           Tensor gathered = scratch_like(dy, Shape{S, B, Ts, C});
           comm->all_gather(dy.comm_data(), gathered.comm_data(), B * Ts * C, dy.dtype());
           Tensor full = scratch_like(dy, Shape{B, Ts * S, C});
           unpack_rank_major(gathered, full, S, B, Ts, C);
           gathered = Tensor();
           add_into(*xs, full);
         }});
  }
  return y;
}

}  // namespace fd::ops
