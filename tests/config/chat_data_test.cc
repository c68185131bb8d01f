// Chat data keys: data.template_vars (a map of the template's variables, YAML values as
// JSON, set in the file or by overrides, printed and read back the same) and
// data.packing_order (best_fit by default, first_come to keep the old rows; only with
// packing).
#include <gtest/gtest.h>

#include <string>

#include "tests/config/test_util.h"

namespace fd::config {
namespace {

const std::string kRecipe =
    "data:\n"
    "  format: chat\n"
    "  train: tests/config/data/shards/train_000.txt\n"
    "  tokenizer: recipes/tokenizers/chatml-bytes\n"
    "  seq_len: 64\n"
    "steps: 1\n";

LoadResult load_with(const std::string& extra, const std::vector<std::string>& overrides = {}) {
  std::string text = kRecipe;
  text.insert(text.find("steps:"), extra);
  return try_parse_recipe(text, "c.yaml", overrides);
}

TEST_F(ConfigTest, TemplateVarsAreJsonAndRoundTrip) {
  LoadResult r = load_with(
      "  template_vars:\n"
      "    enable_thinking: false\n"
      "    date_string: \"26 Jul 2024\"\n"
      "    depth: 3\n"
      "    temperature: 0.5\n"
      "    quoted: \"true\"\n"
      "    nothing: null\n"
      "    tools_list: [a, {b: 1}]\n");
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  EXPECT_EQ(r.recipe.data.template_vars,
            R"({"enable_thinking":false,"date_string":"26 Jul 2024","depth":3,"temperature":0.5,)"
            R"("quoted":"true","nothing":null,"tools_list":["a",{"b":1}]})");
  const std::string text = to_yaml(r.recipe);
  LoadResult again = try_parse_recipe(text, "resolved.yaml");
  ASSERT_TRUE(again.ok()) << ::testing::PrintToString(again.errors) << "\n" << text;
  EXPECT_TRUE(again.recipe == r.recipe) << text;
  // Overrides: one variable, or the whole map; {} is none.
  LoadResult o = load_with("", {"data.template_vars.enable_thinking=false"});
  ASSERT_TRUE(o.ok()) << ::testing::PrintToString(o.errors);
  EXPECT_EQ(o.recipe.data.template_vars, R"({"enable_thinking":false})");
  LoadResult m = load_with("", {"data.template_vars={enable_thinking: true, x: y}"});
  ASSERT_TRUE(m.ok()) << ::testing::PrintToString(m.errors);
  EXPECT_EQ(m.recipe.data.template_vars, R"({"enable_thinking":true,"x":"y"})");
  LoadResult none = load_with("  template_vars: {}\n");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none.recipe.data.template_vars, "");
  EXPECT_TRUE(try_parse_recipe(to_yaml(none.recipe), "r.yaml").recipe == none.recipe);
}

TEST_F(ConfigTest, TemplateVarsMustBeAMapOfChatData) {
  LoadResult r = load_with("  template_vars: enable_thinking\n");
  ASSERT_EQ(r.errors.size(), 1u) << ::testing::PrintToString(r.errors);
  EXPECT_NE(r.errors[0].find("c.yaml:6:18: data.template_vars: expected a map of template "
                             "variables"),
            std::string::npos)
      << r.errors[0];
  LoadResult text = load_with("  template_vars: {a: 1}\n", {"data.format=text"});
  ASSERT_EQ(text.errors.size(), 1u) << ::testing::PrintToString(text.errors);
  EXPECT_NE(text.errors[0].find("data.template_vars: applies to data.format chat, instruct and "
                                "preference; data.format is text"),
            std::string::npos)
      << text.errors[0];
}

TEST_F(ConfigTest, PackingOrderDefaultsToBestFitAndNeedsPacking) {
  LoadResult r = load_with("  packing: true\n");
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  EXPECT_EQ(r.recipe.data.packing_order, PackingOrderName::kBestFit);
  LoadResult first = load_with("  packing: true\n  packing_order: first_come\n");
  ASSERT_TRUE(first.ok()) << ::testing::PrintToString(first.errors);
  EXPECT_EQ(first.recipe.data.packing_order, PackingOrderName::kFirstCome);
  EXPECT_TRUE(try_parse_recipe(to_yaml(first.recipe), "r.yaml").recipe == first.recipe);
  LoadResult unpacked = load_with("  packing_order: first_come\n");
  ASSERT_EQ(unpacked.errors.size(), 1u) << ::testing::PrintToString(unpacked.errors);
  EXPECT_NE(unpacked.errors[0].find("data.packing_order: applies to packed rows; set "
                                    "data.packing: true"),
            std::string::npos)
      << unpacked.errors[0];
  LoadResult typo = load_with("  packing: true\n  packing_order: bestfit\n");
  ASSERT_EQ(typo.errors.size(), 1u);
  EXPECT_NE(typo.errors[0].find("did you mean 'best_fit'?"), std::string::npos) << typo.errors[0];
}

}  // namespace
}  // namespace fd::config
