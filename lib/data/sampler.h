// Sampler: the sequences of every training step and evaluation batch.
//
// Counter-based: the start of each sequence is a hash of (seed, step,
// micro-batch index, global sequence index) via fd::hash_words, never of how
// many batches were drawn before, so a resumed run sees exactly the batches an
// uninterrupted run would have. Starts are uniform over [0, N - seq_len - 1]
// of the split; sequence b of rank r has global index r * batch + b, so ranks
// draw different sequences. Validation batches hash (seed, batch index) on a
// different stream, so they never depend on how far training has got.
//
// Outputs go to caller-provided row-major (batch, seq_len) int32 buffers;
// nothing is allocated per call. The sampler is immutable and thread-safe.
#pragma once

#include <cstdint>

#include "lib/data/token_dataset.h"

namespace fd::data {

class Sampler {
 public:
  // `dataset` must outlive the sampler.
  Sampler(const TokenDataset& dataset, uint64_t seed) : dataset_(dataset), seed_(seed) {}

  // Fills tokens[b * seq_len + t] = train[start_b + t] and the next-token
  // targets[b * seq_len + t] = train[start_b + t + 1] for b < batch.
  // Requires 0 <= rank < world_size and train().size() >= seq_len + 1.
  void sample_train(int64_t step, int micro_index, int rank, int world_size, int batch, int seq_len,
                    int32_t* tokens, int32_t* targets) const;

  // The same for evaluation batch `batch_index` of the validation split.
  // Requires dataset.has_val().
  void sample_val(int64_t batch_index, int rank, int world_size, int batch, int seq_len,
                  int32_t* tokens, int32_t* targets) const;

  // The start offset the sampler uses for one training / validation sequence
  // (exposed for tests and for logging which data a step saw).
  int64_t train_start(int64_t step, int micro_index, int64_t global_index, int seq_len) const;
  int64_t val_start(int64_t batch_index, int64_t global_index, int seq_len) const;

 private:
  const TokenDataset& dataset_;
  uint64_t seed_;
};

}  // namespace fd::data
