// data.format preference: its one key (data.max_length, bounded by data.seq_len), the keys of
// example data it refuses with a reason, and a round trip through to_yaml().
#include <gtest/gtest.h>

#include <string>

#include "tests/config/test_util.h"

namespace fd::config {
namespace {

const std::string kRecipe =
    "data:\n"
    "  format: preference\n"
    "  train: tests/config/data/shards/train_000.txt\n"
    "  tokenizer: recipes/tokenizers/chatml-bytes\n"
    "  seq_len: 64\n"
    "objective: {name: dpo}\n"
    "steps: 1\n";

// The errors of kRecipe with `extra` lines added to its data section.
Lines errors_with(const std::string& extra, const std::vector<std::string>& overrides = {}) {
  std::string text = kRecipe;
  text.insert(text.find("objective:"), extra);
  LoadResult r = try_parse_recipe(text, "p.yaml", overrides);
  return r.errors;
}

TEST_F(ConfigTest, PreferenceLoadsAndRoundTrips) {
  LoadResult r =
      try_parse_recipe(kRecipe + "", "p.yaml", {"data.max_length=33", "data.packing=true"});
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  EXPECT_EQ(r.recipe.data.format, DataFormat::kPreference);
  EXPECT_EQ(r.recipe.data.max_length, 33);
  EXPECT_TRUE(r.recipe.data.examples());
  const std::string text = to_yaml(r.recipe);
  LoadResult again = try_parse_recipe(text, "resolved.yaml");
  ASSERT_TRUE(again.ok()) << ::testing::PrintToString(again.errors) << "\n" << text;
  EXPECT_TRUE(again.recipe == r.recipe) << text;
}

TEST_F(ConfigTest, PreferenceMaxLengthMustLetAPairFitARow) {
  EXPECT_EQ(errors_with("  max_length: 34\n"),
            (Lines{"p.yaml:6:15: data.max_length: 34 is too long for data.seq_len 64: a pair's "
                   "chosen and rejected sequences share one row of data.seq_len positions (33 "
                   "each at most); raise data.seq_len or lower data.max_length (at most "
                   "data.seq_len / 2 + 1 = 33)"}));
  EXPECT_EQ(errors_with("  max_length: 1\n").size(), 1u);
  EXPECT_NE(errors_with("  max_length: 1\n")[0].find("data.max_length: must be >= 2"),
            std::string::npos);
  EXPECT_TRUE(errors_with("  max_length: 33\n").empty());
}

TEST_F(ConfigTest, PreferenceRefusesKeysItHasNoUseFor) {
  const auto one_error = [](const Lines& e, const std::string& what) {
    ASSERT_EQ(e.size(), 1u) << ::testing::PrintToString(e);
    EXPECT_NE(e[0].find(what), std::string::npos) << e[0];
  };
  one_error(errors_with("  truncation: right\n"),
            "data.truncation: does not apply to data.format preference");
  one_error(errors_with("  train_on_prompt: true\n"),
            "data.train_on_prompt: does not apply to data.format preference");
  one_error(errors_with("  messages_field: msgs\n"),
            "data.messages_field: applies to data.format chat");
  one_error(errors_with("", {"data.format=chat", "objective=null", "data.max_length=8"}),
            "data.max_length: applies to data.format preference; data.format is chat");
  one_error(errors_with("", {"data.tokenizer="}),
            "data.format preference needs the model's tokenizer");
  EXPECT_TRUE(errors_with("  chat_template: chatml\n  on_bad_record: skip\n").empty());
}

}  // namespace
}  // namespace fd::config
