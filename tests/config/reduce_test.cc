// zero.reduce_dtype (DeepSpeed's communication_data_type) and
// zero.reductions_in_flight: defaults, overrides, printing, and every bad
// value or combination refused with one message naming key, value and what
// is allowed.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tests/config/test_util.h"

namespace fd::config {
namespace {

constexpr const char* kBase = "data: {train: tests/config/data/tiny.txt}\nsteps: 1\n";

LoadResult parse(const std::string& extra, const std::vector<std::string>& overrides = {}) {
  return try_parse_recipe(std::string(kBase) + extra, "inline.yaml", overrides);
}

TEST_F(ConfigTest, ReduceDtypeDefaultsToFp32StagingAndTwoInFlight) {
  LoadResult r = parse("precision: bf16\n");
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  EXPECT_EQ(r.recipe.zero.reduce_dtype, Precision::kFp32);
  EXPECT_EQ(r.recipe.zero.reductions_in_flight, 2);
  const std::string y = to_yaml(r.recipe);
  EXPECT_NE(y.find("  reduce_dtype: fp32\n  reductions_in_flight: 2\n"), std::string::npos) << y;
}

TEST_F(ConfigTest, ReduceDtypeMatchingThePrecisionLoadsPrintsAndOverrides) {
  for (const char* p : {"bf16", "fp16"}) {
    LoadResult r =
        parse(fmt::format("precision: {}\nzero: {{stage: 2, reduce_dtype: {}, "
                          "reductions_in_flight: 4}}\n",
                          p, p));
    ASSERT_TRUE(r.ok()) << p << ::testing::PrintToString(r.errors);
    EXPECT_EQ(r.recipe.zero.reduce_dtype, r.recipe.precision);
    EXPECT_EQ(r.recipe.zero.reductions_in_flight, 4);
    LoadResult again = try_parse_recipe(to_yaml(r.recipe), "resolved.yaml");
    ASSERT_TRUE(again.ok()) << ::testing::PrintToString(again.errors);
    EXPECT_EQ(again.recipe.zero, r.recipe.zero);
  }
  LoadResult o = parse("precision: bf16\n", {"zero.reduce_dtype=bf16"});
  ASSERT_TRUE(o.ok()) << ::testing::PrintToString(o.errors);
  EXPECT_EQ(o.recipe.zero.reduce_dtype, Precision::kBf16);
  // fp32 is always allowed, whatever the precision (the gradients are reduced in fp32).
  for (const char* p : {"fp32", "bf16", "fp16"})
    EXPECT_TRUE(parse(fmt::format("precision: {}\nzero: {{reduce_dtype: fp32}}\n", p)).ok()) << p;
}

TEST_F(ConfigTest, ReduceDtypeBadValuesAndCombinations) {
  EXPECT_EQ(parse("precision: bf16\nzero: {reduce_dtype: bf8}\n").errors,
            (Lines{"inline.yaml:4:22: zero.reduce_dtype: expected one of fp32, bf16, fp16, got "
                   "'bf8'; did you mean 'bf16'?"}));
  EXPECT_EQ(parse("zero: {reduce_dtype: [bf16]}\n").errors,
            (Lines{"inline.yaml:3:22: zero.reduce_dtype: expected one of fp32, bf16, fp16, got "
                   "a list"}));
  EXPECT_EQ(parse("precision: fp16\nzero: {reduce_dtype: bf16}\n").errors,
            (Lines{"inline.yaml:4:22: zero.reduce_dtype: bf16 does not match precision (fp16): "
                   "gradients are reduced in fp32 (fp32 staging, the default) or in the 16-bit "
                   "dtype they are computed in; use fp32 or fp16"}));
  EXPECT_EQ(parse("zero: {reduce_dtype: fp16}\n").errors,
            (Lines{"inline.yaml:3:22: zero.reduce_dtype: fp16 does not match precision (fp32): "
                   "fp32 gradients are reduced in fp32; use fp32 (or set precision: fp16)"}));
  EXPECT_EQ(parse("precision: bf16\n", {"zero.reduce_dtype=fp8"}).errors,
            (Lines{"override 'zero.reduce_dtype=fp8': zero.reduce_dtype: expected one of fp32, "
                   "bf16, fp16, got 'fp8'; did you mean 'fp32'?"}));
  EXPECT_EQ(parse("zero: {reductions_in_flight: 0}\n").errors,
            (Lines{"inline.yaml:3:30: zero.reductions_in_flight: must be in [1, 64], got 0"}));
  EXPECT_EQ(parse("zero: {reductions_in_flight: many}\n").errors,
            (Lines{"inline.yaml:3:30: zero.reductions_in_flight: expected an integer, got "
                   "'many'"}));
  EXPECT_EQ(parse("zero: {overlap_comm: false, reductions_in_flight: 3}\n").errors,
            (Lines{"inline.yaml:3:51: zero.reductions_in_flight: is only used with "
                   "zero.overlap_comm: true (without overlap every reduction completes before "
                   "the next is launched); remove it"}));
}

}  // namespace
}  // namespace fd::config
