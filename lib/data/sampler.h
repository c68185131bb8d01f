// Sampler: the sequences of every training step and evaluation batch.
//
// Counter-based: the start of each sequence is a hash of its coordinates via
// fd::hash_words, never of how many batches were drawn before, so a resumed
// run sees exactly the batches an uninterrupted run would have. Starts are
// uniform over [0, N - seq_len - 1] of the split.
//
// Training contract: the data of a step is a pure function of (seed, step,
// global sample index g), independent of world size, micro-batch size and
// accumulation. Row b of micro-batch m on rank r has
//   g = (m * world_size + r) * batch + b,
// so every split of a global batch G = batch * world_size * accumulation
// draws samples 0 .. G - 1 of the step, each once, and sample g starts at
// hash(seed, train stream, step, g). A run resumed at another world size or
// accumulation with the same global batch therefore sees the same sequences;
// only the order in which they are summed differs.
//
// Validation: row b of evaluation batch i on rank r is validation sample
// g = r * batch + b of batch i, hashed with (seed, i) on a separate stream, so
// it never depends on how far training has got. Accumulation plays no part:
// an evaluation of K batches covers samples 0 .. world_size * batch - 1 of
// batches 0 .. K - 1, so it is the same whenever world_size * batch is (world
// 2 with micro 4 and world 4 with micro 2), but not across a change that keeps
// the global batch by accumulation (world 1, micro 4, accumulation 2 evaluates
// only samples 0 .. 3 of each batch).
//
// Outputs go to caller-provided row-major (batch, seq_len) int32 buffers;
// nothing is allocated per call. The sampler is immutable and thread-safe.
#pragma once

#include <cstdint>

#include "lib/data/batch_source.h"
#include "lib/data/token_dataset.h"

namespace fd::data {

class Sampler : public BatchSource {
 public:
  // `dataset` must outlive the sampler.
  Sampler(const TokenDataset& dataset, uint64_t seed) : dataset_(dataset), seed_(seed) {}

  // BatchSource: windows of the stream, every position a target, never packed.
  bool packed() const override { return false; }
  void train_batch(const MicroBatch& m, int seq_len, const BatchBuffers& out) const override {
    sample_train(m.step, m.micro, m.rank, m.world, m.batch, seq_len, out.tokens, out.targets);
  }
  int64_t train_targets(int64_t, int64_t global_batch, int seq_len) const override {
    return global_batch * seq_len;
  }
  bool has_val() const override { return dataset_.has_val(); }
  void val_batch(int64_t batch_index, int rank, int world, int batch, int seq_len,
                 const BatchBuffers& out) const override {
    sample_val(batch_index, rank, world, batch, seq_len, out.tokens, out.targets);
  }

  // Fills tokens[b * seq_len + t] = train[start_b + t] and the next-token
  // targets[b * seq_len + t] = train[start_b + t + 1] for b < batch.
  // start_b = train_start(step, (micro_index * world_size + rank) * batch + b).
  // Requires 0 <= rank < world_size, micro_index >= 0 and
  // train().size() >= seq_len + 1.
  void sample_train(int64_t step, int micro_index, int rank, int world_size, int batch, int seq_len,
                    int32_t* tokens, int32_t* targets) const;

  // The same for evaluation batch `batch_index` of the validation split, with
  // start_b = val_start(batch_index, rank * batch + b). Requires
  // dataset.has_val().
  void sample_val(int64_t batch_index, int rank, int world_size, int batch, int seq_len,
                  int32_t* tokens, int32_t* targets) const;

  // The start offset of training sample `global_index` of `step` / of
  // validation sequence `global_index` of evaluation batch `batch_index`
  // (exposed for tests and for logging which data a step saw).
  int64_t train_start(int64_t step, int64_t global_index, int seq_len) const;
  int64_t val_start(int64_t batch_index, int64_t global_index, int seq_len) const;

 private:
  const TokenDataset& dataset_;
  uint64_t seed_;
};

}  // namespace fd::data
