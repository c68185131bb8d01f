// Learning-rate schedules: constant and linear-warmup + cosine decay.
#pragma once

#include <cstdint>

namespace fd::optim {

enum class ScheduleKind { kConstant, kCosine };

struct ScheduleOptions {
  ScheduleKind kind = ScheduleKind::kConstant;
  float peak_lr = 3e-4f;     // lr after warmup
  int64_t warmup_steps = 0;  // linear ramp: step s < warmup uses peak * (s + 1) / warmup
  int64_t total_steps = 1;   // cosine reaches min_lr at this step
  float min_lr = 0.0f;       // cosine floor
};

// The learning rate for 0-based `step`.
float lr_at(const ScheduleOptions& s, int64_t step);

}  // namespace fd::optim
