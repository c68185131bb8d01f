// tp_regions: Megatron-LM's tensor-parallel region operators (arXiv 1909.08053, section 3) and
// their sequence-parallel pair (arXiv 2205.05198, section 4.2.2) as autograd ops over a
// tensor-parallel group. They are the only communication a column-parallel / row-parallel
// linear pair needs: in Megatron's MLP, Y = g(GeLU(f(X) A_i) B_i) with A split by columns and B
// by rows over the T ranks of `group`.
//
// Contract, for every op, on every rank of `group` (collective: every rank calls it with the
// same shapes and dtype, in the same order as its other collectives on `group`, and runs the
// backward, or none does; x has the same requires_grad on every rank, since the backward's
// collective runs only when x wants a gradient). `group` outlives the backward (the tape node
// keeps a pointer to it). x: f32, bf16 or f16, communicated in its own dtype (the
// communicator supports all three; a 16-bit sum follows the communicator's sum16() mode:
// fp32 staging by default, see lib/dist/communicator.h). CPU and meta only (a CUDA operand is
// an FD_CHECK failure); on meta every buffer is allocated as on the CPU and the collectives are
// issued with null buffers, so a CountingCommunicator counts their bytes. Backward adds (+=)
// into x's gradient. On a group of one, each op is the identity in both directions, bit for
// bit. E below is x's element size; bytes are the ring model's (communicator.h), per rank.
#pragma once

#include "lib/autograd/variable.h"
#include "lib/dist/communicator.h"

namespace fd::ops {

using autograd::Variable;

// Megatron's f, before a column-parallel linear: forward the identity (the output shares x's
// storage: a view, no copy); backward one all_reduce kSum of the output's gradient (numel(x)
// elements, in place in that gradient; 2(T-1)/T * numel*E bytes) added into x's gradient.
// x: any shape, the same on every rank (replicated).
Variable copy_to_tp_region(const Variable& x, dist::Communicator& group);
// The same, overlapped (Megatron's asynchronous all-reduce, for the f before a region's
// column-parallel linears): when its backward finds weight gradients deferred
// (weight_grads_behind below), the all-reduce is started asynchronously, those gradients are
// computed while it runs, and the sum is waited for before it is added into x's gradient. The
// same values as copy_to_tp_region (the weight gradients are the same products, computed later).
Variable copy_to_tp_region_overlapped(const Variable& x, dist::Communicator& group);

// The identity (a view of x, forward and backward), marking the end of a tensor-parallel
// region's column-parallel linears: its backward, which runs before theirs, starts deferring
// the weight gradients (autograd::begin_deferring; ops::matmul defers a leaf right-hand side's
// gradient), so that the region's f (copy_to_tp_region_overlapped) computes them while its
// all-reduce runs, or with sequence parallelism gather_from_sequence_region's backward while
// its reduce-scatter runs. x: the output of the last of those linears (its gradient arrives after
// every later op's backward). Whatever f does not take is done when the backward ends.
Variable weight_grads_behind(const Variable& x);

// Megatron's g, after a row-parallel linear: forward one all_reduce kSum of x (numel(x)
// elements, on a copy; 2(T-1)/T * numel*E bytes), the same values on every rank; backward the
// identity (the output's gradient added into x's). x: any shape, each rank's partial sum.
Variable reduce_from_tp_region(const Variable& x, dist::Communicator& group);

// Sequence parallelism's gather, before a tensor-parallel region: x (B, T/S, C) is this rank's
// slice of the sequence (rank r holds positions [r*T/S, (r+1)*T/S)); the output (B, T, C) the
// whole sequence, the ranks' slices in rank order, the same on every rank. Forward: one
// all_gather of B*T/S*C elements per rank ((S-1)/S * B*T*C*E bytes), received rank-major
// (S, B, T/S, C) and unpacked into (B, T, C) by a copy. Backward: the output's gradient
// packed rank-major (a copy), one reduce_scatter kSum ((S-1)/S * B*T*C*E bytes), rank r's
// block summed over the ranks and added into x's gradient (received straight into it when it
// has no gradient yet); weight gradients deferred by weight_grads_behind are computed while the
// reduce-scatter runs. Scratch (kActivations): forward the packed (B, T, C) buffer, freed on
// return; backward the packed gradient, and a (B, T/S, C) buffer when x's gradient already
// holds a value.
Variable gather_from_sequence_region(const Variable& x, dist::Communicator& group);

// Sequence parallelism's reduce-scatter, after a tensor-parallel region (in place of g's
// all-reduce): x (B, T, C), each rank's partial sum of the whole sequence, T divisible by the
// group's size S (FD_CHECK); the output (B, T/S, C) rank r's slice of positions
// [r*T/S, (r+1)*T/S) summed over the ranks. Forward: x packed rank-major (S, B, T/S, C) (a
// copy), one reduce_scatter kSum ((S-1)/S * B*T*C*E bytes). Backward: one all_gather of the
// output's gradient (the same bytes), unpacked and added into x's gradient. Scratch
// (kActivations): forward the packed (B, T, C) buffer; backward the gathered and the unpacked
// (B, T, C) buffers, both live while the one is unpacked into the other. (With B = 1 the
// packing is the identity; the copy is still made.) Followed by gather_from_sequence_region it
// equals reduce_from_tp_region forward (the same bytes on the wire: an all-reduce is a
// reduce-scatter and an all-gather); backward the pair all-reduces, where g passes the
// gradient through.
Variable reduce_scatter_to_sequence_region(const Variable& x, dist::Communicator& group);

}  // namespace fd::ops
