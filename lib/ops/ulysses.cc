#include "lib/ops/ulysses.h"

#include "lib/autograd/tape.h"
#include "lib/ops/collective_op_util.h"

namespace fd::ops {
namespace {

// The (B, L, W) dims of a Ulysses operand, checked.
struct Blw {
  int64_t B, L, W;
};
Blw dims_of(const Variable& x, const char* op) {
  FD_CHECK(x.shape().ndim() == 3, "{}: the input must be (B, T, C), got {}", op, x.shape().str());
  return {x.shape()[0], x.shape()[1], x.shape()[2]};
}

// One all_to_all over `group` from `in` to `out` (the same numel n, in's dtype): `in`, seen as
// (in_outer, S, run), is packed rank-major so that block r goes to rank r; the S received blocks
// (S, n/S), block i from rank i, are unpacked into `out` seen as (out_outer, S, run').
// Scratch: the packed and the received buffers (n each), the packed one freed after the
// exchange, the received one on return.
void exchange(const Tensor& in, int64_t in_outer, const Tensor& out, int64_t out_outer,
              dist::Communicator& group) {
  const int S = group.size();
  const int64_t n = in.numel(), block = n / S;
  Tensor packed = scratch_like(in, Shape{S, block});
  if (n > 0) pack_rank_major(in, packed, S, in_outer, block / in_outer);
  Tensor recv = scratch_like(in, Shape{S, block});
  group.all_to_all(packed.comm_data(), recv.comm_data(), block, in.dtype());
  packed = Tensor();
  if (n > 0) unpack_rank_major(recv, out, S, out_outer, block / out_outer);
}

// x (B, Ts, S*Hs*D) -> out (B, S*Ts, Hs*D): block r of x's heads to rank r; rank i's
// positions into the sequence's block i.
void sequence_to_heads_into(const Tensor& x, const Tensor& out, dist::Communicator& group) {
  const int64_t B = x.shape()[0], Ts = x.shape()[1];
  exchange(x, B * Ts, out, B, group);
}

// y (B, S*Ts, Hs*D) -> out (B, Ts, S*Hs*D): positions block r to rank r; rank i's heads into
// head block i.
void heads_to_sequence_into(const Tensor& y, const Tensor& out, dist::Communicator& group) {
  const int64_t B = out.shape()[0], Ts = out.shape()[1];
  exchange(y, B, out, B * Ts, group);
}

void check_heads(int heads, int64_t width, int S, const char* op) {
  FD_CHECK(heads >= 1 && width % heads == 0,
           "{}: {} heads do not divide the {} columns of the input", op, heads, width);
  FD_CHECK(heads % S == 0,
           "{}: {} heads do not split over the {} ranks of the sequence-parallel group; make "
           "the head count (and the key/value head count) a multiple of the sequence-parallel "
           "size",
           op, heads, S);
}

}  // namespace

Variable sequence_to_heads(const Variable& x, int heads, dist::Communicator& group) {
  check_collective_operand(x, "sequence_to_heads");
  const Blw d = dims_of(x, "sequence_to_heads");
  const int S = group.size();
  check_heads(heads, d.W, S, "sequence_to_heads");
  Tensor out = scratch_like(x.value(), Shape{d.B, d.L * S, d.W / S});
  sequence_to_heads_into(x.value(), out, group);
  return exchange_output("sequence_to_heads", x, out, group, heads_to_sequence_into);
}

Variable heads_to_sequence(const Variable& y, int heads, dist::Communicator& group) {
  check_collective_operand(y, "heads_to_sequence");
  const Blw d = dims_of(y, "heads_to_sequence");
  const int S = group.size();
  check_heads(heads, d.W * S, S, "heads_to_sequence");
  FD_CHECK(d.L % S == 0,
           "heads_to_sequence: a sequence of {} positions does not split over {} ranks; make the "
           "sequence length a multiple of the sequence-parallel size",
           d.L, S);
  Tensor out = scratch_like(y.value(), Shape{d.B, d.L / S, d.W * S});
  heads_to_sequence_into(y.value(), out, group);
  return exchange_output("heads_to_sequence", y, out, group, sequence_to_heads_into);
}

}  // namespace fd::ops
