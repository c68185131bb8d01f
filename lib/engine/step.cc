#include "lib/engine/step.h"

namespace fd::engine {

Batch make_batch(const Assembly& a, Device device) {
  const Shape shape{a.micro, a.seq_len};
  Batch b;
  b.tokens = Tensor::empty(shape, DType::kI32, MemCategory::kOther, device);
  b.targets = Tensor::empty(shape, DType::kI32, MemCategory::kOther, device);
  if (a.packed) b.doc_starts = Tensor::empty(shape, DType::kI32, MemCategory::kOther, device);
  if (a.objective) {
    b.roles = Tensor::empty(shape, DType::kI32, MemCategory::kOther, device);
    b.pairs = std::make_shared<Batch::Pairs>();
    b.pairs->examples.resize(size_t(a.micro) * size_t(a.seq_len) / 2 + 1);
  }
  return b;
}

data::BatchBuffers batch_buffers(const Batch& b) {
  data::BatchBuffers out{b.tokens.i32(), b.targets.i32(),
                         b.doc_starts.defined() ? b.doc_starts.i32() : nullptr};
  if (b.pairs) {
    out.roles = b.roles.i32();
    out.pair_examples = b.pairs->examples.data();
    out.pair_count = &b.pairs->count;
  }
  return out;
}

int64_t count_targets(const Batch& b) {
  if (b.pairs) return b.targets.is_meta() ? b.targets.shape()[0] : b.pairs->count;
  if (b.targets.is_meta()) return b.targets.numel();
  const int32_t* t = b.targets.data<int32_t>();
  int64_t n = 0;
  for (int64_t i = 0; i < b.targets.numel(); ++i) n += t[i] != -1;
  return n;
}

double train_micro_batch(
    nn::Decoder& model, zero::ZeroEngine& engine, nn::SegmentRunner& runner, const Batch& batch,
    int micro, uint64_t dropout_seed, float grad_seed,
    const std::function<void(const autograd::Tape&, const autograd::Variable&)>& between) {
  engine.begin_micro_batch(micro);
  model.set_dropout_seed(dropout_seed);
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  autograd::Variable loss = model.loss(batch.tokens, batch.targets, &runner, batch.doc_starts);
  const double value = loss.value().to_vector()[0];
  if (between) between(tape, loss);
  tape.backward(loss, grad_seed);
  engine.end_micro_batch(micro);
  return value;
}

double eval_batch(const nn::Decoder& model, zero::ZeroEngine& engine, const Batch& batch) {
  autograd::NoGradGuard no_grad;
  return model.loss(batch.tokens, batch.targets, &engine, batch.doc_starts).value().to_vector()[0];
}

}  // namespace fd::engine
