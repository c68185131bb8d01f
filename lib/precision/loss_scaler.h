// DynamicLossScaler: DeepSpeed's fp16 loss scaler, same keys, same semantics
// (deepspeed/runtime/fp16/loss_scaler.py, v0.19.5, as shared/REFERENCE.md states it).
//
// The loss is multiplied by scale() before backward; the gradients are then
// checked for Inf/NaN (the caller agrees the flag across ranks with an
// all-reduce MAX) and update(overflow) is called once per optimizer step.
//
// The algorithm, exactly. State starts at
//   scale = 2^initial_scale_power, iter = 0, last_overflow_iter = -1,
//   hysteresis_left = hysteresis.
// update(overflow):
//   if overflow:
//     if hysteresis == 1 or hysteresis_left == 1:
//       if scale == min_loss_scale: fatal ("loss scale already at minimum");
//                                   the state is left unchanged
//       else: scale = max(scale / 2, min_loss_scale)
//     else: hysteresis_left -= 1            (the scale stays)
//     last_overflow_iter = iter             (the step is skipped either way)
//   else:
//     if consecutive_hysteresis: hysteresis_left = hysteresis
//     stable = iter - last_overflow_iter - 1
//     if stable > 0 and stable % loss_scale_window == 0:
//       scale *= 2
//       if not consecutive_hysteresis: hysteresis_left = hysteresis
//   iter += 1
// There is no upper bound on the scale. So with window W the scale first
// doubles on the (W+1)-th clean update after an overflow (or after the start),
// then every W clean updates.
//
// Static scale (loss_scale > 0): scale() is always loss_scale; an overflow
// still skips the step but never changes the scale and is never fatal.
//
// Not thread-safe; one scaler per rank, driven with the same agreed flags on
// every rank, so every rank holds the same state.
#pragma once

#include <cstdint>

namespace fd::precision {

struct LossScalerOptions {
  double loss_scale = 0;             // 0: dynamic; > 0: this static scale, never changed
  int initial_scale_power = 16;      // dynamic: the scale starts at 2^initial_scale_power
  int64_t loss_scale_window = 1000;  // clean steps between doublings (>= 1)
  int hysteresis = 2;                // the first hysteresis - 1 overflows keep the scale (>= 1)
  // Refill hysteresis on every clean step, not only when the scale doubles.
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1;  // the scale never goes below this (> 0)
};

// The scaler's whole mutable state: what a checkpoint saves and restores.
struct LossScalerState {
  double scale = 0;
  int64_t iter = 0;                 // update() calls so far
  int64_t last_overflow_iter = -1;  // iter of the last overflow, -1 if none
  int hysteresis_left = 0;
};

struct UpdateResult {
  bool skipped = false;  // true on overflow: the caller must not apply this step
  double scale_before = 0;
  double scale_after = 0;
  bool fatal = false;  // overflow with the scale already at min_loss_scale: end the run
};

class DynamicLossScaler {
 public:
  // Message the caller reports when update() returns fatal.
  static constexpr const char* kFatalMessage = "loss scale already at minimum";

  // Throws fd::Error (kUsage) when an option is out of range (loss_scale < 0,
  // initial_scale_power outside [-126, 127], window < 1, hysteresis < 1,
  // min_loss_scale <= 0), naming the key.
  explicit DynamicLossScaler(const LossScalerOptions& options = {});

  bool is_dynamic() const { return options_.loss_scale == 0; }
  double scale() const { return state_.scale; }
  const LossScalerOptions& options() const { return options_; }

  // One optimizer step's outcome; see the algorithm above.
  UpdateResult update(bool overflow);

  LossScalerState state() const { return state_; }
  // Restores a saved state. Throws fd::Error (kUsage) if it cannot belong to
  // these options (scale <= 0, iter < 0, last_overflow_iter outside [-1, iter),
  // hysteresis_left outside [1, hysteresis], or a static scale that differs).
  void set_state(const LossScalerState& state);

 private:
  LossScalerOptions options_;
  LossScalerState state_;
};

// The multiplier for loss-scaled gradients that unscales and clips them in
// one pass (DeepSpeed's unscale_and_clip_grads): with `scaled_norm` the L2
// norm of the scaled gradients,
//   clip = max(((scaled_norm / scale) + 1e-6) / max_norm, 1)
//   factor = 1 / (clip * scale)
// max_norm <= 0 disables clipping: factor = 1 / scale. A non-finite norm gives
// a factor of 0 or NaN; such a step is an overflow and must be skipped.
double clip_factor(double scaled_norm, double scale, double max_norm);

}  // namespace fd::precision
