// ZeRO++ (zero.quantized_weights, zero.hierarchical_partition, zero.quantized_gradients) and
// dist.hierarchical: defaults, printing and reading back, and every combination they do not
// support refused with one message naming the key and what to do.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tests/config/test_util.h"

namespace fd::config {
namespace {

constexpr const char* kBase = "data: {train: tests/config/data/tiny.txt}\nsteps: 1\n";

LoadResult parse(const std::string& extra, const std::vector<std::string>& overrides = {}) {
  return try_parse_recipe(std::string(kBase) + extra, "inline.yaml", overrides);
}

bool mentions(const LoadResult& r, const std::string& what) {
  for (const std::string& e : r.errors)
    if (e.find(what) != std::string::npos) return true;
  return false;
}

TEST_F(ConfigTest, ZeroPlusPlusIsOffByDefaultAndPrinted) {
  LoadResult r = parse("");
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  EXPECT_FALSE(r.recipe.zero.quantized_weights);
  EXPECT_FALSE(r.recipe.zero.hierarchical_partition);
  EXPECT_EQ(r.recipe.zero.quantized_gradients, GradientCodes::kNone);
  EXPECT_FALSE(r.recipe.dist.hierarchical);
  const std::string y = to_yaml(r.recipe);
  EXPECT_NE(y.find("  quantized_weights: false\n  hierarchical_partition: false\n"
                   "  quantized_gradients: none\n"),
            std::string::npos)
      << y;
  EXPECT_NE(y.find("  hierarchical: false\n"), std::string::npos) << y;
}

TEST_F(ConfigTest, ZeroPlusPlusSwitchesLoadAndReadBack) {
  for (const char* codes : {"int8", "int4"}) {
    LoadResult r = parse(
        fmt::format("zero: {{stage: 3, quantized_weights: true, hierarchical_partition: true, "
                    "quantized_gradients: {}}}\ndist: {{hierarchical: true}}\n",
                    codes));
    ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
    EXPECT_TRUE(r.recipe.zero.quantized_weights);
    EXPECT_TRUE(r.recipe.zero.hierarchical_partition);
    EXPECT_EQ(to_string(r.recipe.zero.quantized_gradients), codes);
    EXPECT_TRUE(r.recipe.dist.hierarchical);
    LoadResult again = try_parse_recipe(to_yaml(r.recipe), "resolved.yaml");
    ASSERT_TRUE(again.ok()) << ::testing::PrintToString(again.errors);
    EXPECT_EQ(again.recipe.zero, r.recipe.zero);
    EXPECT_EQ(again.recipe.dist, r.recipe.dist);
  }
  // Each switch alone, and dist.hierarchical at any stage.
  EXPECT_TRUE(parse("zero: {stage: 3, quantized_weights: true}\n").ok());
  EXPECT_TRUE(parse("zero: {stage: 3}\n", {"zero.hierarchical_partition=true"}).ok());
  for (int stage = 0; stage <= 3; ++stage)
    EXPECT_TRUE(
        parse(fmt::format("zero: {{stage: {}}}\ndist: {{hierarchical: true}}\n", stage)).ok())
        << stage;
}

TEST_F(ConfigTest, ZeroPlusPlusNeedsStageThree) {
  for (const char* key :
       {"quantized_weights: true", "hierarchical_partition: true", "quantized_gradients: int4"}) {
    for (int stage : {0, 1, 2}) {
      LoadResult r = parse(fmt::format("zero: {{stage: {}, {}}}\n", stage, key));
      ASSERT_EQ(r.errors.size(), 1u) << key << ::testing::PrintToString(r.errors);
      EXPECT_TRUE(mentions(r, fmt::format("it needs zero.stage: 3 (zero.stage is {})", stage)))
          << r.errors[0];
      EXPECT_TRUE(mentions(r, "inline.yaml:3:")) << r.errors[0];
    }
  }
  // Named after the key, with its location, also from an override.
  LoadResult o = parse("zero: {stage: 2}\n", {"zero.quantized_weights=true"});
  ASSERT_EQ(o.errors.size(), 1u);
  EXPECT_NE(o.errors[0].find("zero.quantized_weights: is ZeRO++"), std::string::npos)
      << o.errors[0];
}

TEST_F(ConfigTest, ZeroPlusPlusBadValues) {
  EXPECT_EQ(parse("zero: {stage: 3, quantized_gradients: true}\n").errors,
            (Lines{"inline.yaml:3:39: zero.quantized_gradients: expected one of none, int8, "
                   "int4, got 'true'"}));
  EXPECT_EQ(parse("zero: {stage: 3, quantized_gradients: int2}\n").errors,
            (Lines{"inline.yaml:3:39: zero.quantized_gradients: expected one of none, int8, "
                   "int4, got 'int2'; did you mean 'int8'?"}));
  EXPECT_TRUE(mentions(parse("zero: {stage: 3, quantized_weights: 8}\n"),
                       "zero.quantized_weights: expected true or false, got '8'"));
  EXPECT_TRUE(mentions(parse("dist: {hierarchical: sometimes}\n"),
                       "dist.hierarchical: expected true or false, got 'sometimes'"));
}

TEST_F(ConfigTest, ZeroPlusPlusCombinationsItRefuses) {
  LoadResult r = parse(
      "zero: {stage: 3, hierarchical_partition: true, offload_optimizer: {device: nvme, path: "
      "/tmp}, offload_params: {device: nvme}}\n");
  ASSERT_EQ(r.errors.size(), 1u) << ::testing::PrintToString(r.errors);
  EXPECT_TRUE(mentions(r, "zero.hierarchical_partition: with zero.offload_params: hpZ keeps"));
  LoadResult d =
      parse("precision: bf16\nzero: {stage: 3, quantized_gradients: int8, reduce_dtype: bf16}\n");
  ASSERT_EQ(d.errors.size(), 1u) << ::testing::PrintToString(d.errors);
  EXPECT_TRUE(mentions(d,
                       "zero.reduce_dtype: bf16 with zero.quantized_gradients: the quantized "
                       "reduction sums its decoded codes in fp32"));
  EXPECT_TRUE(parse("precision: bf16\nzero: {stage: 3, quantized_gradients: int8}\n").ok());
}

TEST_F(ConfigTest, ZeroPlusPlusAndHierarchicalAreCpuOnly) {
  LoadResult r = parse(
      "device: cuda\nzero: {stage: 3, quantized_weights: true, quantized_gradients: int8}\n"
      "dist: {hierarchical: true}\n");
  EXPECT_EQ(r.errors.size(), 3u) << ::testing::PrintToString(r.errors);
  EXPECT_TRUE(mentions(r, "zero.quantized_weights: with device: cuda: ZeRO++ runs on the CPU"));
  EXPECT_TRUE(mentions(r, "zero.quantized_gradients: with device: cuda"));
  EXPECT_TRUE(mentions(r, "dist.hierarchical: with device: cuda: NCCL already runs"));
}

}  // namespace
}  // namespace fd::config
