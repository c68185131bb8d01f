#include "lib/precision/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "lib/base/error.h"

namespace fd::precision {

DynamicLossScaler::DynamicLossScaler(const LossScalerOptions& options) : options_(options) {
  const LossScalerOptions& o = options_;
  if (!(o.loss_scale >= 0) || !std::isfinite(o.loss_scale))
    usage_error("loss scaler: loss_scale must be 0 (dynamic) or a finite value > 0, got {}",
                o.loss_scale);
  if (o.initial_scale_power < -126 || o.initial_scale_power > 127)
    usage_error("loss scaler: initial_scale_power must be in [-126, 127], got {}",
                o.initial_scale_power);
  if (o.loss_scale_window < 1)
    usage_error("loss scaler: loss_scale_window must be >= 1, got {}", o.loss_scale_window);
  if (o.hysteresis < 1) usage_error("loss scaler: hysteresis must be >= 1, got {}", o.hysteresis);
  if (!(o.min_loss_scale > 0) || !std::isfinite(o.min_loss_scale))
    usage_error("loss scaler: min_loss_scale must be a finite value > 0, got {}", o.min_loss_scale);
  state_.scale = is_dynamic() ? std::ldexp(1.0, o.initial_scale_power) : o.loss_scale;
  state_.iter = 0;
  state_.last_overflow_iter = -1;
  state_.hysteresis_left = o.hysteresis;
}

UpdateResult DynamicLossScaler::update(bool overflow) {
  const LossScalerOptions& o = options_;
  UpdateResult r;
  r.skipped = overflow;
  r.scale_before = state_.scale;
  if (!is_dynamic()) {
    if (overflow) state_.last_overflow_iter = state_.iter;
    ++state_.iter;
    r.scale_after = state_.scale;
    return r;
  }
  if (overflow) {
    if (o.hysteresis == 1 || state_.hysteresis_left == 1) {
      if (state_.scale == o.min_loss_scale) {
        // The run ends here; the state stays as it was for the caller's report.
        r.fatal = true;
        r.scale_after = state_.scale;
        return r;
      }
      state_.scale = std::max(state_.scale / 2, o.min_loss_scale);
    } else {
      state_.hysteresis_left -= 1;
    }
    state_.last_overflow_iter = state_.iter;
  } else {
    if (o.consecutive_hysteresis) state_.hysteresis_left = o.hysteresis;
    const int64_t stable = state_.iter - state_.last_overflow_iter - 1;
    if (stable > 0 && stable % o.loss_scale_window == 0) {
      state_.scale *= 2;
      if (!o.consecutive_hysteresis) state_.hysteresis_left = o.hysteresis;
    }
  }
  ++state_.iter;
  r.scale_after = state_.scale;
  return r;
}

void DynamicLossScaler::set_state(const LossScalerState& s) {
  if (!(s.scale > 0) || !std::isfinite(s.scale))
    usage_error("loss scaler state: scale must be a finite value > 0, got {}", s.scale);
  if (s.iter < 0) usage_error("loss scaler state: iter must be >= 0, got {}", s.iter);
  if (s.last_overflow_iter < -1 || s.last_overflow_iter >= s.iter)
    usage_error("loss scaler state: last_overflow_iter must be in [-1, iter = {}), got {}", s.iter,
                s.last_overflow_iter);
  if (s.hysteresis_left < 1 || s.hysteresis_left > options_.hysteresis)
    usage_error("loss scaler state: hysteresis_left must be in [1, hysteresis = {}], got {}",
                options_.hysteresis, s.hysteresis_left);
  if (!is_dynamic() && s.scale != options_.loss_scale)
    usage_error(
        "loss scaler state: the checkpoint's scale {} differs from the static loss_scale {}; "
        "set loss_scale to {} or 0 (dynamic)",
        s.scale, options_.loss_scale, s.scale);
  state_ = s;
}

double clip_factor(double scaled_norm, double scale, double max_norm) {
  if (max_norm <= 0) return 1.0 / scale;
  const double clip = std::max(((scaled_norm / scale) + 1e-6) / max_norm, 1.0);
  return 1.0 / (clip * scale);
}

}  // namespace fd::precision
