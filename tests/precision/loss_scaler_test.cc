// DynamicLossScaler against DeepSpeed's algorithm: hand-checked short
// sequences, and long random overflow patterns compared step by step with an
// independent re-implementation written here from the text of
// shared/REFERENCE.md ("DeepSpeed dynamic loss scaler, exact semantics").
#include "lib/precision/loss_scaler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "lib/base/error.h"

namespace fd::precision {
namespace {

// REFERENCE.md, transcribed literally. Deliberately not sharing code or
// structure with lib/precision: a flat record and one free function.
struct RefScaler {
  double scale;
  long iter = 0;
  long last_overflow_iter = -1;
  int hysteresis_left;
  // configuration
  int hysteresis;
  long window;
  bool consecutive;
  double min_scale;
  bool stopped = false;  // "stop the run"
};

RefScaler ref_make(int power, long window, int hysteresis, bool consecutive, double min_scale) {
  RefScaler r;
  r.scale = std::pow(2.0, power);
  r.hysteresis_left = hysteresis;
  r.hysteresis = hysteresis;
  r.window = window;
  r.consecutive = consecutive;
  r.min_scale = min_scale;
  return r;
}

void ref_step(RefScaler& r, bool overflow) {
  if (overflow) {
    if (r.hysteresis == 1 || r.hysteresis_left == 1) {
      if (r.scale == r.min_scale) {
        r.stopped = true;
        return;
      }
      r.scale = std::max(r.scale / 2, r.min_scale);
    } else {
      r.hysteresis_left -= 1;
    }
    r.last_overflow_iter = r.iter;
  } else {
    if (r.consecutive) r.hysteresis_left = r.hysteresis;
    long stable = r.iter - r.last_overflow_iter - 1;
    if (stable > 0 && stable % r.window == 0) {
      r.scale *= 2;
      if (!r.consecutive) r.hysteresis_left = r.hysteresis;
    }
  }
  r.iter += 1;
}

LossScalerOptions opts(int power, int64_t window, int hysteresis, bool consecutive = false,
                       double min_scale = 1) {
  LossScalerOptions o;
  o.initial_scale_power = power;
  o.loss_scale_window = window;
  o.hysteresis = hysteresis;
  o.consecutive_hysteresis = consecutive;
  o.min_loss_scale = min_scale;
  return o;
}

// Drives `s` with `pattern` ('x' = overflow, '.' = clean) and returns scale_after of each step.
std::vector<double> drive(DynamicLossScaler& s, const char* pattern) {
  std::vector<double> out;
  for (const char* c = pattern; *c; ++c) {
    UpdateResult r = s.update(*c == 'x');
    EXPECT_EQ(r.skipped, *c == 'x');
    EXPECT_FALSE(r.fatal);
    out.push_back(r.scale_after);
  }
  return out;
}

TEST(LossScaler, DefaultsAreDeepSpeeds) {
  LossScalerOptions o;
  EXPECT_EQ(o.loss_scale, 0);
  EXPECT_EQ(o.initial_scale_power, 16);
  EXPECT_EQ(o.loss_scale_window, 1000);
  EXPECT_EQ(o.hysteresis, 2);
  EXPECT_FALSE(o.consecutive_hysteresis);
  EXPECT_EQ(o.min_loss_scale, 1);
  DynamicLossScaler s;
  EXPECT_TRUE(s.is_dynamic());
  EXPECT_EQ(s.scale(), 65536.0);
  LossScalerState st = s.state();
  EXPECT_EQ(st.scale, 65536.0);
  EXPECT_EQ(st.iter, 0);
  EXPECT_EQ(st.last_overflow_iter, -1);
  EXPECT_EQ(st.hysteresis_left, 2);
}

// Window 3, hysteresis 2, scale 16. The first overflow spends hysteresis, the
// second halves. After an overflow at iter k, the clean updates at k+1..k+3
// have stable = 0, 1, 2; the 4th (stable = 3) doubles and refills hysteresis.
TEST(LossScaler, HandCheckedWindow3Hysteresis2) {
  DynamicLossScaler s(opts(4, 3, 2));
  //                                   x  x  .  .  .  .   .   .   .   x   x   x  .
  std::vector<double> expect = {16, 8, 8, 8, 8, 16, 16, 16, 32, 32, 16, 8, 8};
  EXPECT_EQ(drive(s, "xx.......xxx."), expect);
  LossScalerState st = s.state();
  EXPECT_EQ(st.iter, 13);
  EXPECT_EQ(st.last_overflow_iter, 11);
  EXPECT_EQ(st.hysteresis_left, 1);  // not refilled until the next doubling
}

// From the start (last_overflow_iter = -1): doublings at iter 3, 6, 9 (window 3).
TEST(LossScaler, CleanRunDoublesEveryWindowWithoutUpperBound) {
  DynamicLossScaler s(opts(0, 3, 2));
  std::vector<double> expect = {1, 1, 1, 2, 2, 2, 4, 4, 4, 8};
  EXPECT_EQ(drive(s, ".........."), expect);
  DynamicLossScaler big(opts(120, 1, 2));
  for (int i = 0; i < 7; ++i) big.update(false);  // iter 0: stable 0; then x2 every step
  EXPECT_EQ(big.scale(), std::ldexp(1.0, 126));
}

TEST(LossScaler, UpdateReportsScaleBeforeAndAfter) {
  DynamicLossScaler s(opts(5, 2, 1));
  UpdateResult r = s.update(true);
  EXPECT_TRUE(r.skipped);
  EXPECT_FALSE(r.fatal);
  EXPECT_EQ(r.scale_before, 32);
  EXPECT_EQ(r.scale_after, 16);
  r = s.update(false);
  EXPECT_FALSE(r.skipped);
  EXPECT_EQ(r.scale_before, 16);
  EXPECT_EQ(r.scale_after, 16);
}

// Hysteresis 2, overflows alternating with clean steps: without consecutive
// hysteresis the second overflow halves; with it, every clean step refills
// hysteresis and the scale never moves.
TEST(LossScaler, ConsecutiveHysteresis) {
  DynamicLossScaler off(opts(4, 100, 2, false));
  EXPECT_EQ(drive(off, "x.x.x."), (std::vector<double>{16, 16, 8, 8, 4, 4}));
  DynamicLossScaler on(opts(4, 100, 2, true));
  EXPECT_EQ(drive(on, "x.x.x."), (std::vector<double>{16, 16, 16, 16, 16, 16}));
  EXPECT_EQ(drive(on, "xx"), (std::vector<double>{16, 8}));
}

TEST(LossScaler, Hysteresis3SpendsTwoOverflowsFirst) {
  DynamicLossScaler s(opts(6, 100, 3));
  EXPECT_EQ(drive(s, "xxxx"), (std::vector<double>{64, 64, 32, 16}));
}

TEST(LossScaler, OverflowAtMinimumIsFatalAndLeavesStateUnchanged) {
  DynamicLossScaler s(opts(2, 10, 1));
  EXPECT_EQ(drive(s, "xx"), (std::vector<double>{2, 1}));
  LossScalerState before = s.state();
  UpdateResult r = s.update(true);
  EXPECT_TRUE(r.fatal);
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(r.scale_before, 1);
  EXPECT_EQ(r.scale_after, 1);
  EXPECT_EQ(std::string(DynamicLossScaler::kFatalMessage), "loss scale already at minimum");
  LossScalerState after = s.state();
  EXPECT_EQ(after.scale, before.scale);
  EXPECT_EQ(after.iter, before.iter);
  EXPECT_EQ(after.last_overflow_iter, before.last_overflow_iter);
}

// A minimum that is not a power of two is reached through max(scale / 2, min).
TEST(LossScaler, NonPowerOfTwoMinimumIsClamped) {
  DynamicLossScaler s(opts(3, 10, 1, false, 3.0));
  EXPECT_EQ(drive(s, "xx"), (std::vector<double>{4, 3}));
  EXPECT_TRUE(s.update(true).fatal);
}

// With hysteresis left, an overflow at the minimum only spends hysteresis.
TEST(LossScaler, HysteresisIsSpentBeforeTheMinimumCheck) {
  DynamicLossScaler s(opts(0, 10, 2));
  EXPECT_EQ(drive(s, "x"), (std::vector<double>{1}));
  EXPECT_TRUE(s.update(true).fatal);
}

TEST(LossScaler, StaticScaleNeverChangesAndOverflowStillSkips) {
  LossScalerOptions o;
  o.loss_scale = 128;
  o.loss_scale_window = 2;
  o.hysteresis = 1;
  o.min_loss_scale = 128;
  DynamicLossScaler s(o);
  EXPECT_FALSE(s.is_dynamic());
  EXPECT_EQ(s.scale(), 128);
  for (int i = 0; i < 50; ++i) {
    bool overflow = i % 3 == 0;
    UpdateResult r = s.update(overflow);
    EXPECT_EQ(r.skipped, overflow);
    EXPECT_FALSE(r.fatal);
    EXPECT_EQ(r.scale_before, 128);
    EXPECT_EQ(r.scale_after, 128);
  }
  EXPECT_EQ(s.state().iter, 50);
}

struct RandomCase {
  int hysteresis;
  bool consecutive;
  double p_overflow;
  double min_scale;
};

// 5000 iterations of random overflow patterns (window 10) for every hysteresis
// 1..3, consecutive on/off and several overflow rates: every step's skipped,
// fatal, scale and state match the reference; runs that reach the minimum end
// at the same iteration with fatal.
TEST(LossScaler, RandomPatternsMatchReference) {
  std::mt19937_64 rng(2024);
  int fatal_runs = 0, full_runs = 0;
  int64_t doublings = 0, halvings = 0;
  for (int hysteresis : {1, 2, 3}) {
    for (bool consecutive : {false, true}) {
      for (double p : {0.01, 0.05, 0.1, 0.2, 0.4}) {
        for (double min_scale : {1.0, 1024.0}) {
          DynamicLossScaler s(opts(16, 10, hysteresis, consecutive, min_scale));
          RefScaler ref = ref_make(16, 10, hysteresis, consecutive, min_scale);
          std::bernoulli_distribution flip(p);
          bool ended = false;
          for (int i = 0; i < 5000 && !ended; ++i) {
            bool overflow = flip(rng);
            double before = ref.scale;
            ref_step(ref, overflow);
            UpdateResult r = s.update(overflow);
            ASSERT_EQ(r.fatal, ref.stopped) << "iter " << i;
            ASSERT_EQ(r.skipped, overflow);
            ASSERT_EQ(r.scale_before, before) << "iter " << i;
            ASSERT_EQ(r.scale_after, ref.scale) << "iter " << i;
            LossScalerState st = s.state();
            ASSERT_EQ(st.scale, ref.scale);
            ASSERT_EQ(st.iter, ref.iter);
            ASSERT_EQ(st.last_overflow_iter, ref.last_overflow_iter);
            ASSERT_EQ(st.hysteresis_left, ref.hysteresis_left) << "iter " << i;
            doublings += r.scale_after > r.scale_before;
            halvings += r.scale_after < r.scale_before;
            ended = ref.stopped;
          }
          (ended ? fatal_runs : full_runs) += 1;
        }
      }
    }
  }
  std::printf(
      "random patterns: %d runs ended at the minimum, %d ran 5000 steps; %lld "
      "doublings, %lld halvings\n",
      fatal_runs, full_runs, (long long)doublings, (long long)halvings);
  // The patterns exercise both endings and both directions.
  EXPECT_GT(fatal_runs, 5);
  EXPECT_GT(full_runs, 5);
  EXPECT_GT(doublings, 1000);
  EXPECT_GT(halvings, 1000);
}

TEST(LossScaler, StateRoundTripContinuesIdentically) {
  std::mt19937 rng(7);
  std::bernoulli_distribution flip(0.15);
  LossScalerOptions o = opts(12, 10, 2);
  DynamicLossScaler a(o);
  for (int i = 0; i < 500; ++i) a.update(flip(rng));
  DynamicLossScaler b(o);
  b.set_state(a.state());
  for (int i = 0; i < 2000; ++i) {
    bool overflow = flip(rng);
    UpdateResult ra = a.update(overflow), rb = b.update(overflow);
    ASSERT_EQ(ra.scale_after, rb.scale_after) << i;
    ASSERT_EQ(ra.fatal, rb.fatal) << i;
    if (ra.fatal) break;
  }
  EXPECT_EQ(a.state().hysteresis_left, b.state().hysteresis_left);
  EXPECT_EQ(a.state().last_overflow_iter, b.state().last_overflow_iter);
}

TEST(LossScaler, BadStateIsRejected) {
  DynamicLossScaler s(opts(16, 10, 2));
  auto bad = [&](LossScalerState st) {
    EXPECT_THROW(s.set_state(st), Error)
        << st.scale << " " << st.iter << " " << st.last_overflow_iter << " " << st.hysteresis_left;
  };
  bad({0, 5, -1, 2});
  bad({std::numeric_limits<double>::infinity(), 5, -1, 2});
  bad({8, -1, -1, 2});
  bad({8, 5, 5, 2});
  bad({8, 5, -2, 2});
  bad({8, 5, 3, 0});
  bad({8, 5, 3, 3});
  EXPECT_NO_THROW(s.set_state({8, 5, 4, 1}));
  EXPECT_EQ(s.scale(), 8);
  LossScalerOptions st;
  st.loss_scale = 4;
  DynamicLossScaler fixed(st);
  EXPECT_THROW(fixed.set_state({8, 5, -1, 2}), Error);
  EXPECT_NO_THROW(fixed.set_state({4, 5, -1, 2}));
}

TEST(LossScaler, BadOptionsAreRejected) {
  auto bad = [](LossScalerOptions o) { EXPECT_THROW(DynamicLossScaler{o}, Error); };
  LossScalerOptions o;
  o.loss_scale = -1;
  bad(o);
  o = {};
  o.loss_scale_window = 0;
  bad(o);
  o = {};
  o.hysteresis = 0;
  bad(o);
  o = {};
  o.min_loss_scale = 0;
  bad(o);
  o = {};
  o.initial_scale_power = 200;
  bad(o);
}

TEST(ClipFactor, UnscalesAndClipsInOnePass) {
  const double scale = 1024;
  // True norm 2 > max_norm 1: clip = (2 + 1e-6) / 1.
  EXPECT_DOUBLE_EQ(clip_factor(2048, scale, 1.0), 1.0 / ((2.0 + 1e-6) * 1024));
  // The clipped gradients have norm just under max_norm.
  EXPECT_NEAR(2048 * clip_factor(2048, scale, 1.0), 1.0, 1e-6);
  EXPECT_LT(2048 * clip_factor(2048, scale, 1.0), 1.0);
  // True norm 0.5 < max_norm 1: only unscaling.
  EXPECT_DOUBLE_EQ(clip_factor(512, scale, 1.0), 1.0 / 1024);
  // max_norm <= 0 disables clipping.
  EXPECT_DOUBLE_EQ(clip_factor(1e9, scale, 0.0), 1.0 / 1024);
  EXPECT_DOUBLE_EQ(clip_factor(1e9, scale, -1.0), 1.0 / 1024);
  // With scale 1 it is torch.nn.utils.clip_grad_norm_'s max_norm / (norm + 1e-6).
  EXPECT_DOUBLE_EQ(clip_factor(3.0, 1.0, 0.5), 1.0 / ((3.0 + 1e-6) / 0.5));
  EXPECT_NEAR(clip_factor(3.0, 1.0, 0.5), 0.5 / (3.0 + 1e-6), 1e-16);
  // Non-finite norms give 0 / NaN; such steps are overflows and skipped.
  EXPECT_EQ(clip_factor(std::numeric_limits<double>::infinity(), scale, 1.0), 0.0);
  EXPECT_TRUE(std::isnan(clip_factor(std::nan(""), scale, 1.0)));
}

}  // namespace
}  // namespace fd::precision
