// The pieces of a training step that the trainer runs on real data and the
// estimate (estimate.h) runs on the counting device: one code path, so what
// the estimate counts is what training allocates.
//
//   Batch b = make_batch(assembly, Device::cpu());
//   for (int m = 0; m < accumulation; ++m)
//     loss += train_micro_batch(model, engine, engine, b, m, dropout_seed, grad_seed);
//   engine.step(lr, scale);
//   eval_batch(model, engine, b);
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "lib/autograd/tape.h"
#include "lib/engine/assemble.h"
#include "lib/nn/decoder.h"
#include "lib/nn/segment_runner.h"
#include "lib/tensor/tensor.h"
#include "lib/zero/zero_engine.h"

namespace fd::engine {

// One micro-batch's token ids and next-token targets: (micro, seq_len) i32,
// MemCategory::kOther, reused every micro-batch.
struct Batch {
  Tensor tokens;
  Tensor targets;
  Tensor doc_starts;  // packed rows only (data::BatchSource::packed()), else undefined
  // Preference pairs only (a.objective), else undefined / null: each position's role and the
  // micro-batch's pairs (data::BatchBuffers), shared by copies of the batch.
  Tensor roles;
  struct Pairs {
    std::vector<int64_t> examples;  // capacity micro * seq_len / 2
    int32_t count = 0;
  };
  std::shared_ptr<Pairs> pairs;
};

// The batch buffers of `a` on `device` (real runs assemble batches on the
// host; ops copy them to the GPU when the model is there), with doc_starts
// when the rows are packed (a.packed).
Batch make_batch(const Assembly& a, Device device);
// The host buffers of `b` for a data::BatchSource.
data::BatchBuffers batch_buffers(const Batch& b);
// What `b`'s loss is a mean over: its positions with a target (not -1), or with preference
// pairs its pairs.
int64_t count_targets(const Batch& b);

// One micro-batch of training: the engine's micro-batch hooks around the
// forward (its segments run through `runner`: the ZeRO engine itself, or a
// runner wrapping it) and the backward seeded with `grad_seed`; adapter
// dropout masks come from `dropout_seed`. `between` (may be empty) runs after
// the forward and before the backward, with the tape and the loss. Returns
// the loss.
double train_micro_batch(
    nn::Decoder& model, zero::ZeroEngine& engine, nn::SegmentRunner& runner, const Batch& batch,
    int micro, uint64_t dropout_seed, float grad_seed,
    const std::function<void(const autograd::Tape&, const autograd::Variable&)>& between = {});

// An evaluation batch: the forward without gradients. Returns the loss.
double eval_batch(const nn::Decoder& model, zero::ZeroEngine& engine, const Batch& batch);

}  // namespace fd::engine
