// What the autograd ops around collectives (tp_regions.cc, ulysses.cc) share. Internal to
// lib/ops.
//
// Rank-major blocks: a collective that moves one block per rank (all_gather, reduce_scatter,
// all_to_all) wants rank r's block contiguous. A row-major tensor seen as (outer, S, run), S
// blocks of `run` contiguous elements inside each of `outer` rows, has the rank-major form
// (S, outer, run): block r of every row, one after another. Sharding dim 1 of (B, S*Ts, C)
// over S ranks is (outer, run) = (B, Ts*C); sharding the heads of (B, Ts, S*Hs*D) is
// (B*Ts, Hs*D). With outer = 1 both forms are the same bytes (the copy is still made).
#pragma once

#include "lib/autograd/tape.h"
#include "lib/autograd/variable.h"
#include "lib/dist/communicator.h"
#include "lib/ops/reduce.h"
#include "lib/tensor/tensor.h"

namespace fd::ops {

// x is defined, f32, bf16 or f16, and not on a GPU (CPU or meta); else an FD_CHECK failure
// naming `op`.
void check_collective_operand(const autograd::Variable& x, const char* op);

// An uninitialised kActivations buffer of `shape` in like's dtype, where `like` lives (meta
// stays meta).
Tensor scratch_like(const Tensor& like, const Shape& shape);

// Adds `g` into the slot's gradient: a copy when the slot has none yet (bit for bit), else
// add_ (fp32 arithmetic, stored in the gradient's dtype).
void add_into(autograd::GradSlot& slot, const Tensor& g);

// Adds what `produce(out)` writes into `out` into the slot's gradient. `out` has the
// gradient's shape and like's dtype and device: the gradient itself when the slot has none yet
// and it is in like's dtype (no scratch, no copy), else a kActivations scratch then copied into
// a new gradient or added (add_) into the one there.
template <typename Produce>
void produce_into_grad(autograd::GradSlot& slot, const Tensor& like, Produce&& produce) {
  bool first = false;
  const Tensor& grad = slot.grad_to_write(&first);
  if (first && grad.dtype() == like.dtype()) {
    produce(grad);
    return;
  }
  Tensor out = scratch_like(like, grad.shape());
  produce(out);
  if (first)
    grad.copy_from(out);
  else
    add_(grad, out);
}

// The output of an exchange over `group`: `out`, already computed from x's value, as a
// Variable whose tape node (named `name`, recorded when x wants a gradient) adds
// backward(dout, dx, group), writing into dx (produce_into_grad, in dout's dtype), to x's
// gradient. `group` outlives the backward.
template <typename Backward>
autograd::Variable exchange_output(const char* name, const autograd::Variable& x, const Tensor& out,
                                   dist::Communicator& group, Backward backward) {
  const bool rec = autograd::should_record({&x});
  autograd::Variable y = autograd::Variable::op_output(out, rec);
  if (rec) {
    auto ys = y.slot();
    auto xs = x.slot();
    dist::Communicator* comm = &group;
    autograd::current_tape().record(
        {name, {ys}, [ys, xs, comm, backward] {
           if (!xs->requires_grad) return;
           const Tensor& dy = ys->ensure_grad();
           produce_into_grad(*xs, dy, [&](const Tensor& dx) { backward(dy, dx, *comm); });
         }});
  }
  return y;
}

// full (outer, S, run) -> packed (S, outer, run), and back; both row-major, in one dtype, of
// outer * S * run elements. Nothing to copy on meta.
void pack_rank_major(const Tensor& full, const Tensor& packed, int S, int64_t outer, int64_t run);
void unpack_rank_major(const Tensor& packed, const Tensor& full, int S, int64_t outer, int64_t run);

}  // namespace fd::ops
