#include "lib/ops/tp_regions.h"

#include "lib/autograd/tape.h"
#include "lib/ops/collective_op_util.h"
#include "lib/ops/elementwise.h"
#include "lib/ops/reduce.h"

namespace fd::ops {
namespace {

// x (B, T, C) of a sequence op: its three dims.
struct Bsc {
  int64_t B, T, C;
};
Bsc dims_of(const Variable& x, const char* op) {
  FD_CHECK(x.shape().ndim() == 3, "{}: x must be (B, T, C), got {}", op, x.shape().str());
  return {x.shape()[0], x.shape()[1], x.shape()[2]};
}

// One all_gather of this rank's (B, Ts, C) slice over the S ranks of `group`, the ranks'
// slices unpacked in rank order into `out` (B, S*Ts, C). Scratch: the received rank-major
// (S, B, Ts, C) buffer, freed on return.
void gather_sequence(const Tensor& local, const Tensor& out, dist::Communicator& group) {
  const int S = group.size();
  const int64_t B = local.shape()[0], Ts = local.shape()[1], C = local.shape()[2];
  Tensor packed = scratch_like(local, Shape{S, B, Ts, C});
  group.all_gather(local.comm_data(), packed.comm_data(), B * Ts * C, local.dtype());
  unpack_rank_major(packed, out, S, B, Ts * C);
}

// `full` (B, S*Ts, C) packed rank-major, one reduce_scatter kSum over the S ranks of `group`
// into `out` (B, Ts, C): positions [r*Ts, (r+1)*Ts) summed over the ranks, on rank r.
// Scratch: the packed (S, B, Ts, C) buffer, freed on return. `behind`
// (gather_from_sequence_region's backward): the region's deferred weight gradients
// (weight_grads_behind) are computed while the sum runs; a forward never takes them.
void reduce_scatter_sequence(const Tensor& full, const Tensor& out, dist::Communicator& group,
                             bool behind = false) {
  const int S = group.size();
  const int64_t B = out.shape()[0], Ts = out.shape()[1], C = out.shape()[2];
  Tensor packed = scratch_like(full, Shape{S, B, Ts, C});
  pack_rank_major(full, packed, S, B, Ts * C);
  const dist::WorkPtr sum =
      group.reduce_scatter_async(packed.comm_data(), out.comm_data(), B * Ts * C, full.dtype());
  if (behind && autograd::deferring()) autograd::run_deferred();
  sum->wait();
}

}  // namespace

namespace {
Variable copy_to_tp(const Variable& x, dist::Communicator& group, bool overlap) {
  check_collective_operand(x, "copy_to_tp_region");
  const bool rec = autograd::should_record({&x});
  Variable y = Variable::op_output(x.value(), rec);
  if (rec) {
    auto ys = y.slot();
    auto xs = x.slot();
    dist::Communicator* comm = &group;
    autograd::current_tape().record(
        {"copy_to_tp_region", {ys}, [ys, xs, comm, overlap] {
           const bool behind = overlap && autograd::deferring();
           if (!xs->requires_grad) {
             if (behind) autograd::run_deferred();
             return;
           }
           const Tensor& dy = ys->ensure_grad();
           if (!behind) {
             comm->all_reduce(dy.comm_data(), dy.numel(), dy.dtype(), dist::ReduceOp::kSum);
           } else {  // the weight gradients while the sum runs
             const dist::WorkPtr sum = comm->all_reduce_async(dy.comm_data(), dy.numel(),
                                                              dy.dtype(), dist::ReduceOp::kSum);
             autograd::run_deferred();
             sum->wait();
           }
           add_into(*xs, dy);
         }});
  }
  return y;
}
}  // namespace

Variable copy_to_tp_region(const Variable& x, dist::Communicator& group) {
  return copy_to_tp(x, group, false);
}

Variable copy_to_tp_region_overlapped(const Variable& x, dist::Communicator& group) {
  return copy_to_tp(x, group, true);
}

Variable weight_grads_behind(const Variable& x) {
  const bool rec = autograd::should_record({&x});
  Variable y = Variable::op_output(x.value(), rec);
  if (rec) {
    auto ys = y.slot();
    auto xs = x.slot();
    autograd::current_tape().record({"weight_grads_behind", {ys}, [ys, xs] {
                                       autograd::begin_deferring();
                                       if (!xs->requires_grad) return;
                                       // Handed over where xs has none: the tape drops ys's next.
                                       pass_grad(*xs, ys->ensure_grad());
                                     }});
  }
  return y;
}

Variable reduce_from_tp_region(const Variable& x, dist::Communicator& group) {
  check_collective_operand(x, "reduce_from_tp_region");
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
  check_collective_operand(x, "gather_from_sequence_region");
  const Bsc d = dims_of(x, "gather_from_sequence_region");
  const int S = group.size();
  Tensor out = scratch_like(x.value(), Shape{d.B, d.T * S, d.C});
  gather_sequence(x.value(), out, group);
  return exchange_output("gather_from_sequence_region", x, out, group,
                         [](const Tensor& full, const Tensor& into, dist::Communicator& g) {
                           reduce_scatter_sequence(full, into, g, /*behind=*/true);
                         });
}

Variable reduce_scatter_to_sequence_region(const Variable& x, dist::Communicator& group) {
  check_collective_operand(x, "reduce_scatter_to_sequence_region");
  const Bsc d = dims_of(x, "reduce_scatter_to_sequence_region");
  const int S = group.size();
  FD_CHECK(d.T % S == 0,
           "reduce_scatter_to_sequence_region: a sequence of {} positions does not split over "
           "{} ranks; make the sequence length a multiple of the tensor-parallel size",
           d.T, S);
  Tensor out = scratch_like(x.value(), Shape{d.B, d.T / S, d.C});
  reduce_scatter_sequence(x.value(), out, group);
  const bool rec = autograd::should_record({&x});
  Variable y = Variable::op_output(out, rec);
  if (rec) {
    auto ys = y.slot();
    auto xs = x.slot();
    dist::Communicator* comm = &group;
    const Shape full_shape = x.shape();
    autograd::current_tape().record(
        {"reduce_scatter_to_sequence_region", {ys}, [ys, xs, comm, full_shape] {
           if (!xs->requires_grad) return;
           const Tensor& dy = ys->ensure_grad();
           Tensor full = scratch_like(dy, full_shape);
           gather_sequence(dy, full, *comm);
           add_into(*xs, full);
         }});
  }
  return y;
}

}  // namespace fd::ops
