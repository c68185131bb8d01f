// lib/data (namespace fd::data): what a run trains on. Token files and token streams, and
// fine-tuning records rendered through a chat template (lib/jinja) and encoded by a tokenizer
// (lib/text), all reach the trainer through this interface.
//
// BatchSource: where a run's batches come from. Three kinds: windows of a token
// stream (sampler.h: pre-training, every position a target), rows of
// fine-tuning examples (example_dataset.h: targets only on the answers, rows
// padded or packed with several examples) and rows of preference pairs
// (preference_dataset.h: a pair's chosen and rejected sequences side by side).
//
// Both keep sampler.h's training contract: the data of a step is a pure
// function of (seed, step, global sample index g), with row b of micro-batch m
// on rank r being g = (m * world + r) * batch + b, whatever the world size,
// micro-batch size and accumulation. The loss of a step is the mean over all
// its target positions (train_targets()), so the gradient does not depend on
// how the step's rows are split over micro-batches and ranks. A source of pairs()
// counts pairs instead: its loss is a mean over the step's pairs.
#pragma once

#include <cstdint>

namespace fd::data {

// A micro-batch's (batch, seq_len) row-major i32 buffers.
struct BatchBuffers {
  int32_t* tokens;
  int32_t* targets;     // next token, or -1 where there is no loss
  int32_t* doc_starts;  // packed sources only (may be null otherwise): where each token's
                        // example starts in its row (ops::causal_attention)
  // Pair sources only (each may be null, and is ignored by other sources):
  // (batch, seq_len): -1 where targets is -1, else 4 * p + kind, p the pair's index in
  // this micro-batch (0 .. *pair_count - 1) and kind 0 the chosen completion, 1 the
  // rejected completion, 2 the chosen prompt (PreferenceDatasetOptions::prompt_targets).
  int32_t* roles = nullptr;
  int64_t* pair_examples = nullptr;  // capacity batch * seq_len / 2: pair p's index in its split
  int32_t* pair_count = nullptr;     // pairs in this micro-batch
};

// Which training micro-batch: rows g = (micro * world + rank) * batch + b, b < batch, of
// the step's global_batch() = batch * world * accumulation samples.
struct MicroBatch {
  int64_t step = 0;
  int micro = 0, rank = 0, world = 1, batch = 1, accumulation = 1;
  int64_t global_batch() const { return int64_t(batch) * world * accumulation; }
};

class BatchSource {
 public:
  virtual ~BatchSource() = default;

  // Rows hold several examples: doc_starts is filled, and attention and positions must
  // follow it (nn::Decoder::loss's doc_starts).
  virtual bool packed() const = 0;
  // The loss unit is a preference pair (BatchBuffers' roles), not a target position.
  virtual bool pairs() const { return false; }

  // Micro-batch `micro` of training step `step` on `rank` of `world`.
  virtual void train_batch(const MicroBatch& m, int seq_len, const BatchBuffers& out) const = 0;
  // Target positions (targets != -1) of step `step` over its samples 0 .. global_batch - 1
  // (pairs() sources: the pairs in them): what the step's summed loss is divided by.
  virtual int64_t train_targets(int64_t step, int64_t global_batch, int seq_len) const = 0;

  virtual bool has_val() const = 0;
  // Evaluation batch `batch_index` on `rank` (requires has_val()).
  virtual void val_batch(int64_t batch_index, int rank, int world, int batch, int seq_len,
                         const BatchBuffers& out) const = 0;
};

}  // namespace fd::data
