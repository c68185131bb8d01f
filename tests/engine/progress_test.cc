// format_duration and the Progress line's on/off rule.
#include "lib/engine/progress.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <limits>

namespace fd::engine {
namespace {

TEST(FormatDuration, SecondsMinutesHours) {
  EXPECT_EQ(format_duration(0), "0s");
  EXPECT_EQ(format_duration(0.4), "0s");
  EXPECT_EQ(format_duration(42), "42s");
  EXPECT_EQ(format_duration(59.4), "59s");
  EXPECT_EQ(format_duration(59.5), "1m00s");  // rounded to whole seconds first
  EXPECT_EQ(format_duration(60), "1m00s");
  EXPECT_EQ(format_duration(185), "3m05s");
  EXPECT_EQ(format_duration(3599), "59m59s");
  EXPECT_EQ(format_duration(3600), "1h00m");
  EXPECT_EQ(format_duration(3720), "1h02m");
  EXPECT_EQ(format_duration(3 * 3600 + 59 * 60 + 59), "3h59m");  // hours drop the seconds
  EXPECT_EQ(format_duration(100 * 3600 + 5 * 60), "100h05m");
}

TEST(FormatDuration, UnknownForNegativeOrNonFinite) {
  EXPECT_EQ(format_duration(-1), "?");
  EXPECT_EQ(format_duration(std::numeric_limits<double>::quiet_NaN()), "?");
  EXPECT_EQ(format_duration(std::numeric_limits<double>::infinity()), "?");
}

TEST(Progress, OnlyOnATerminal) {
  EXPECT_FALSE(Progress(false, 10).enabled());
  EXPECT_EQ(Progress(true, 10).enabled(), isatty(fileno(stderr)) != 0);
}

TEST(Progress, WritesNothingWhenStderrIsNotATerminal) {
  ::testing::internal::CaptureStderr();  // stderr becomes a file
  {
    Progress p(true, 10);
    EXPECT_FALSE(p.enabled());
    p.update(3, 2.5, 1000, 12);
    p.finish();
  }
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

}  // namespace
}  // namespace fd::engine
