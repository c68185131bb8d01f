// lr_at: constant, linear warmup and cosine decay against their formulas.
#include "lib/optim/schedule.h"

#include <gtest/gtest.h>

#include <cmath>

namespace fd::optim {
namespace {

TEST(Schedule, ConstantWithoutWarmup) {
  ScheduleOptions s;
  s.kind = ScheduleKind::kConstant;
  s.peak_lr = 1e-3f;
  for (int64_t step : {0, 1, 7, 1000000}) EXPECT_EQ(lr_at(s, step), 1e-3f) << step;
}

TEST(Schedule, LinearWarmupThenConstant) {
  ScheduleOptions s;
  s.kind = ScheduleKind::kConstant;
  s.peak_lr = 8e-3f;
  s.warmup_steps = 4;
  // step s < warmup: peak * (s + 1) / warmup, so the last warmup step is already at peak.
  EXPECT_FLOAT_EQ(lr_at(s, 0), 2e-3f);
  EXPECT_FLOAT_EQ(lr_at(s, 1), 4e-3f);
  EXPECT_FLOAT_EQ(lr_at(s, 2), 6e-3f);
  EXPECT_FLOAT_EQ(lr_at(s, 3), 8e-3f);
  EXPECT_EQ(lr_at(s, 4), 8e-3f);
  EXPECT_EQ(lr_at(s, 500), 8e-3f);
}

TEST(Schedule, CosineEndpointsAndMidpoint) {
  ScheduleOptions s;
  s.kind = ScheduleKind::kCosine;
  s.peak_lr = 1e-3f;
  s.min_lr = 1e-4f;
  s.warmup_steps = 10;
  s.total_steps = 110;
  const double peak = s.peak_lr, lo = s.min_lr;
  EXPECT_FLOAT_EQ(lr_at(s, 0), 1e-4f);   // 1e-3 * 1/10
  EXPECT_FLOAT_EQ(lr_at(s, 9), 1e-3f);   // last warmup step
  EXPECT_FLOAT_EQ(lr_at(s, 10), 1e-3f);  // decay starts at peak
  EXPECT_FLOAT_EQ(lr_at(s, 60), float((peak + lo) / 2));
  EXPECT_FLOAT_EQ(lr_at(s, 110), 1e-4f);
  EXPECT_FLOAT_EQ(lr_at(s, 111), 1e-4f);  // floor after the end
  EXPECT_FLOAT_EQ(lr_at(s, 100000), 1e-4f);
  // Interior points against the formula in double.
  for (int64_t step : {11, 23, 35, 85, 109}) {
    const double ratio = double(step - 10) / 100.0;
    const double want = lo + 0.5 * (1 + std::cos(M_PI * ratio)) * (peak - lo);
    EXPECT_NEAR(lr_at(s, step), want, 1e-6 * peak) << step;
  }
  // Non-increasing after warmup.
  for (int64_t step = 10; step < 120; ++step) EXPECT_LE(lr_at(s, step + 1), lr_at(s, step)) << step;
}

TEST(Schedule, CosineWithoutWarmupStartsAtPeak) {
  ScheduleOptions s;
  s.kind = ScheduleKind::kCosine;
  s.peak_lr = 6e-4f;
  s.total_steps = 4;
  EXPECT_FLOAT_EQ(lr_at(s, 0), 6e-4f);
  EXPECT_FLOAT_EQ(lr_at(s, 2), 3e-4f);
  EXPECT_FLOAT_EQ(lr_at(s, 4) + 1.0f, 1.0f);  // min_lr = 0
  EXPECT_GE(lr_at(s, 4), 0.0f);
}

TEST(Schedule, CosineWithTotalNotAfterWarmupDoesNotDivideByZero) {
  ScheduleOptions s;
  s.kind = ScheduleKind::kCosine;
  s.peak_lr = 1.0f;
  s.min_lr = 0.25f;
  s.warmup_steps = 5;
  s.total_steps = 5;
  EXPECT_FLOAT_EQ(lr_at(s, 5), 1.0f);
  EXPECT_FLOAT_EQ(lr_at(s, 6), 0.25f);
  EXPECT_TRUE(std::isfinite(lr_at(s, 7)));
}

}  // namespace
}  // namespace fd::optim
