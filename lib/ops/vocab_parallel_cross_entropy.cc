#include "lib/ops/vocab_parallel_cross_entropy.h"

#include <algorithm>

#include "lib/autograd/tape.h"
#include "lib/ops/backend.h"

namespace fd::ops {

Variable vocab_parallel_cross_entropy(const Variable& h, const Variable& weight_shard,
                                      const Tensor& targets, int64_t vocab_begin,
                                      int64_t vocab_size, dist::Communicator& group,
                                      int ignore_index, int64_t chunk_rows, bool reduce_dh) {
  const int64_t C = h.shape().cols();
  const int64_t rows = h.shape().rows();
  FD_CHECK(h.shape().ndim() >= 1 && weight_shard.shape().ndim() == 2 &&
               weight_shard.shape()[1] == C && weight_shard.shape()[0] >= 1 &&
               targets.dtype() == DType::kI32 && targets.numel() == rows && chunk_rows > 0,
           "vocab_parallel_cross_entropy: h {}, weight_shard {}, targets {} ({}), chunk_rows {}",
           h.shape().str(), weight_shard.shape().str(), targets.shape().str(),
           dtype_name(targets.dtype()), chunk_rows);
  const int64_t v_local = weight_shard.shape()[0];
  FD_CHECK(vocab_begin >= 0 && vocab_begin + v_local <= vocab_size,
           "vocab_parallel_cross_entropy: rows [{}, {}) of a vocabulary of {}", vocab_begin,
           vocab_begin + v_local, vocab_size);
  FD_CHECK(!h.value().is_cuda() && !weight_shard.value().is_cuda(),
           "vocab_parallel_cross_entropy: runs on the CPU only");
  const VocabShard shard{vocab_begin, vocab_size, &group, reduce_dh};
  Tensor lse = Tensor::empty(Shape{rows});
  const bool rec = autograd::should_record({&h, &weight_shard});
  LinearCrossEntropySaved saved;
  Tensor loss = cpu::vocab_parallel_cross_entropy_forward(
      h.value(), weight_shard.value(), targets, ignore_index, chunk_rows, shard, lse, rec, &saved);
  Variable y = Variable::op_output(loss, rec);
  if (rec) {
    auto ys = y.slot();
    auto hs = h.slot();
    auto ws = weight_shard.slot();
    autograd::current_tape().record(
        {"vocab_parallel_cross_entropy", {ys}, [ys, hs, ws, saved, shard] {
           cpu::vocab_parallel_cross_entropy_backward(saved, shard, ys->grad, hs.get(), ws.get());
         }});
  }
  return y;
}

Variable vocab_parallel_token_logps(const Variable& h, const Variable& weight_shard,
                                    const Tensor& targets, int64_t vocab_begin, int64_t vocab_size,
                                    dist::Communicator& group, int ignore_index, int64_t chunk_rows,
                                    bool reduce_dh) {
  const int64_t v_local = weight_shard.shape().ndim() == 2 ? weight_shard.shape()[0] : 0;
  FD_CHECK(vocab_begin >= 0 && vocab_begin + v_local <= vocab_size,
           "vocab_parallel_token_logps: rows [{}, {}) of a vocabulary of {}", vocab_begin,
           vocab_begin + v_local, vocab_size);
  return token_logps(h, weight_shard, targets, ignore_index, chunk_rows,
                     VocabShard{vocab_begin, vocab_size, &group, reduce_dh},
                     "vocab_parallel_token_logps");
}

VocabRange vocab_shard_range(int64_t vocab_size, int rank, int size) {
  FD_CHECK(size >= 1 && rank >= 0 && rank < size && vocab_size >= size,
           "vocab_shard_range: rank {} of {} over a vocabulary of {}", rank, size, vocab_size);
  const int64_t base = vocab_size / size, extra = vocab_size % size;
  return {rank * base + std::min<int64_t>(rank, extra), base + (rank < extra ? 1 : 0)};
}

}  // namespace fd::ops
