// ulysses: DeepSpeed-Ulysses' sequence-parallel exchange around attention (arXiv 2309.14509) as
// autograd ops over a sequence-parallel group of S ranks. Outside attention each rank holds
// T/S positions of every sequence with all heads; attention needs whole sequences, so before
// it one all-to-all gives each rank the whole sequence for H/S of the heads, and after it the
// reverse all-to-all gives the positions back:
//
//   q, k, v (B, T/S, H*D) --sequence_to_heads--> (B, T, H/S*D) --causal_attention (H/S heads)
//   --> (B, T, H/S*D) --heads_to_sequence--> (B, T/S, H*D)
//
// Attention itself runs unchanged on the rank's heads (attention.h): a head's scores need only
// its own q, k, v over the whole sequence. With GQA each of k and v is exchanged with
// heads = the key/value head count; rank r then holds query heads [r*H/S, (r+1)*H/S) and
// key/value heads [r*Hkv/S, (r+1)*Hkv/S), which are the ones those query heads use (a key/value
// head serves a contiguous group of query heads) when S divides Hkv.
//
// Bytes (the ring model of lib/dist/communicator.h, per rank, E the element size): each op is
// one all_to_all of numel(x) = B*(T/S)*H*D elements per rank forward and one of the same size
// backward; (S-1)/S of it crosses the wire, (S-1)/S * B*(T/S)*H*D*E bytes. Attention with
// Ulysses thus costs 4 all-to-alls per layer forward (q, k and v in, the output out) and 4
// backward; with GQA the k and v ones are Hkv/H of the size. With q, k and v fused into one
// tensor their three exchanges would be one all-to-all of the same bytes, 3 + 1 tensors' worth
// in 2 all-to-alls per layer forward; these ops exchange one tensor at a time (a packed qkv's
// columns, [q | k | v] each by head, are not in the per-rank head-block order they need). Per
// link the traffic stays constant as S grows with T, unlike an all-gather of k and v.
//
// Contract, as tp_regions.h's: collective over `group` (every rank calls it with the same
// shapes, dtype and heads, in the same order as its other collectives on `group`, and runs the
// backward, or none does; the same requires_grad on every rank). `group` outlives the backward
// (the tape node keeps a pointer to it). f32, bf16 or f16, exchanged in its own dtype as raw
// bits (no arithmetic: every value arrives exactly). CPU and meta only (a CUDA operand is an
// FD_CHECK failure); on meta every buffer is allocated as on the CPU and the all-to-all is
// issued with null buffers, so a CountingCommunicator counts its bytes. Backward adds (+=) into
// the input's gradient (received straight into it when it has none yet). heads_to_sequence
// undoes sequence_to_heads bit for bit, forward and backward. On a group of one each op is the
// identity bit for bit, through a copy (the output never shares the input's storage).
//
// Scratch (kActivations), forward and backward alike (N = numel(x)): the packed send buffer
// and the received buffer, N each, alive together during the exchange; the packed one is freed
// after it, the received one once unpacked into the output (in backward into the input's
// gradient; when that gradient already holds a value or is in another dtype, into one more N
// buffer first, then added into it). (With B = 1 the sequence-side packing is the identity; the
// copy is still made.)
#pragma once

#include "lib/autograd/variable.h"
#include "lib/dist/communicator.h"

namespace fd::ops {

using autograd::Variable;

// x (B, T/S, heads*D): this rank's slice of the sequence (rank r holds positions
// [r*T/S, (r+1)*T/S)) with all `heads` heads of width D, head h in columns [h*D, (h+1)*D).
// Returns (B, T, (heads/S)*D): the whole sequence for this rank's heads
// [r*heads/S, (r+1)*heads/S), in order. heads >= 1 dividing x's last dim, S dividing heads
// (FD_CHECK). Forward: x packed rank-major by heads, one all_to_all, unpacked along the
// sequence; backward: heads_to_sequence's exchange of the output's gradient.
Variable sequence_to_heads(const Variable& x, int heads, dist::Communicator& group);

// The inverse: y (B, T, (heads/S)*D), the whole sequence for this rank's heads, `heads` the
// total head count over the group, T divisible by S (FD_CHECK). Returns (B, T/S, heads*D):
// positions [r*T/S, (r+1)*T/S) with every head. Forward: y packed rank-major by position, one
// all_to_all, unpacked by heads; backward: sequence_to_heads's exchange of the gradient.
Variable heads_to_sequence(const Variable& y, int heads, dist::Communicator& group);

}  // namespace fd::ops
