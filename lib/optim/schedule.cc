#include "lib/optim/schedule.h"

#include <algorithm>
#include <cmath>

namespace fd::optim {

float lr_at(const ScheduleOptions& s, int64_t step) {
  if (step < s.warmup_steps) return s.peak_lr * float(step + 1) / float(s.warmup_steps);
  if (s.kind == ScheduleKind::kConstant) return s.peak_lr;
  int64_t span = std::max<int64_t>(1, s.total_steps - s.warmup_steps);
  double ratio = std::clamp(double(step - s.warmup_steps) / double(span), 0.0, 1.0);
  double coeff = 0.5 * (1.0 + std::cos(M_PI * ratio));
  return float(s.min_lr + coeff * (s.peak_lr - s.min_lr));
}

}  // namespace fd::optim
