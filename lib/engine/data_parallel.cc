#include "lib/engine/data_parallel.h"

namespace fd::engine {

double DataParallel::train(int micro_batches, const MicroFns& fns, Batch& batch, PhaseClock& clock,
                           Phases& ph) {
  nn::SegmentRunner& runner = fns.runner != nullptr ? *fns.runner : *engine_;
  double loss_sum = 0.0;
  for (int micro = 0; micro < micro_batches; ++micro) {
    const int64_t targets = fns.load(micro, batch);
    clock.lap(ph.data, ph.comm_wait);
    const double loss =
        train_micro_batch(*model_, *engine_, runner, batch, micro, fns.dropout_seed(micro),
                          fns.grad_seed(micro, targets),
                          [&](const autograd::Tape& tape, const autograd::Variable& loss_var) {
                            if (fns.forwarded) fns.forwarded(micro, tape, loss_var);
                            clock.lap(ph.forward, ph.comm_wait);
                          });
    loss_sum += loss * double(targets);
    clock.lap(ph.backward, ph.comm_wait);
  }
  return loss_sum;
}

double DataParallel::eval(const Batch& batch) { return eval_batch(*model_, *engine_, batch); }

void DataParallel::with_full_parameters(const std::function<void()>& fn) {
  engine_->with_full_parameters(fn);
}

}  // namespace fd::engine
