// to_yaml(): the resolved recipe reads back as an equal Recipe.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "tests/config/test_util.h"

namespace fd::config {
namespace {

// to_yaml -> load again: equal, and printing again gives the same text.
void expect_round_trip(const Recipe& recipe) {
  const std::string text = to_yaml(recipe);
  LoadResult again = try_parse_recipe(text, "resolved.yaml");
  ASSERT_TRUE(again.ok()) << ::testing::PrintToString(again.errors) << "\n" << text;
  EXPECT_TRUE(again.recipe == recipe) << text;
  EXPECT_EQ(to_yaml(again.recipe), text);
}

TEST_F(ConfigTest, ToYamlRoundTrips) {
  Recipe r = load_recipe(fixture("valid.yaml"), {"optimizer.lr=0.30000000000000004"});
  EXPECT_EQ(r.optimizer.lr, 0.1 + 0.2);
  expect_round_trip(r);
  expect_round_trip(load_recipe(fixture("child.yaml")));
}

TEST_F(ConfigTest, ToYamlRoundTripsEveryFieldAndOddStrings) {
  Recipe r = load_recipe(
      fixture("every_feature.yaml"),
      {"precision=fp16", "lora={r: 3, alpha: 0.1, dropout: 1e-3, targets: [c_proj], layers: [2]}",
       "logging.sample_prompt=\"yes\\n\\t\\\"quoted\\\" # not a comment: {x} \\u00e9\"",
       "model.init_from='tests/golden/gpt_tiny.safetensors'", "loss_scale={loss_scale: 1e30, consecutive_hysteresis: true}",
       "dist.timeout_s=0.5", "seed=0", "data.val_fraction=0", "optimizer.eps=1e-300"});
  EXPECT_EQ(r.logging.sample_prompt, "yes\n\t\"quoted\" # not a comment: {x} \xc3\xa9");
  EXPECT_EQ(r.model.init_from, "tests/golden/gpt_tiny.safetensors");
  EXPECT_EQ(r.loss_scale.loss_scale, 1e30);
  expect_round_trip(r);
}

TEST_F(ConfigTest, ToYamlFileLoadsAgain) {
  Recipe r = load_recipe(fixture("valid.yaml"));
  const std::string path = ::testing::TempDir() + "fdtrain_resolved_recipe.yaml";
  {
    std::ofstream out(path);
    out << to_yaml(r);
  }
  Recipe again = load_recipe(path);
  std::remove(path.c_str());
  EXPECT_TRUE(again == r);
  EXPECT_EQ(again.where("steps").rfind(path + ":", 0), 0u) << again.where("steps");
}

TEST_F(ConfigTest, ToYamlShowsTheResolvedValues) {
  const std::string text = to_yaml(load_recipe(fixture("valid.yaml")));
  EXPECT_NE(text.find("  train:\n    - tests/config/data/shards/train_000.txt\n"
                      "    - tests/config/data/shards/train_001.txt\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("  lr: 0.0006\n  betas: [0.9, 0.95]\n  eps: 1e-08\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("lora: null\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  sample_prompt: \"To be: \\\"or\\\" not\\n\"\n"), std::string::npos)
      << text;
}

}  // namespace
}  // namespace fd::config
