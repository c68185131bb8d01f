// diff_recipes(): field by field on resolved recipes; shape changes refused,
// everything else a warning, with the same "key: saved -> now" lines the
// resume messages quote.
#include "lib/config/diff.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lib/config/load.h"

namespace fd::config {
namespace {

Recipe parse(const std::vector<std::string>& overrides = {}) {
  LoadResult r = try_parse_recipe(R"(
model: {n_layer: 2, n_head: 2, d_model: 16, vocab_size: 256, max_seq_len: 32}
data: {train: [/usr/share/games/fortunes/fortunes], seq_len: 16}
steps: 10
)",
                                  "diff_test.yaml", overrides);
  EXPECT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  return r.recipe;
}

TEST(DiffRecipes, SameRecipeNoDifference) {
  RecipeDiff d = diff_recipes(parse(), parse());
  EXPECT_TRUE(d.refused.empty());
  EXPECT_TRUE(d.warnings.empty());
}

TEST(DiffRecipes, ModelDimensionsAreRefusedTheRestWarned) {
  Recipe now = parse({"model.n_layer=3", "optimizer.lr=1e-3", "steps=20"});
  now.model.init_from = "/tmp/base.safetensors";  // its identity is checked by digest instead
  RecipeDiff d = diff_recipes(parse({"optimizer.lr=6e-4"}), now);
  EXPECT_EQ(d.refused, (std::vector<std::string>{"model.n_layer: 2 -> 3"}));
  EXPECT_EQ(d.warnings,
            (std::vector<std::string>{"model.init_from: \"\" -> /tmp/base.safetensors",
                                      "optimizer.lr: 0.0006 -> 0.001", "steps: 10 -> 20"}));
}

TEST(DiffRecipes, AddingLoraIsRefusedItsAlphaIsNot) {
  const std::string lora = "lora={r: 4, alpha: 8, targets: [c_attn]}";
  RecipeDiff d = diff_recipes(parse(), parse({lora}));
  ASSERT_FALSE(d.refused.empty());
  EXPECT_EQ(d.refused.front(), "lora: null -> (absent)");
  EXPECT_NE(std::find(d.refused.begin(), d.refused.end(), "lora.r: (absent) -> 4"),
            d.refused.end());
  d = diff_recipes(parse({lora}), parse({"lora={r: 4, alpha: 16, targets: [c_attn]}"}));
  EXPECT_TRUE(d.refused.empty());
  EXPECT_EQ(d.warnings, (std::vector<std::string>{"lora.alpha: 8.0 -> 16.0"}));
  d = diff_recipes(parse({lora}), parse({"lora={r: 4, alpha: 8, targets: [c_attn, c_fc]}"}));
  EXPECT_EQ(d.refused, (std::vector<std::string>{"lora.targets: [c_attn] -> [c_attn, c_fc]"}));
}

TEST(DiffRecipes, ListsCompareAsTheirItemsJoined) {
  RecipeDiff d = diff_recipes(
      parse(), parse({"data.train=[/usr/share/games/fortunes/fortunes, "
                      "/usr/share/games/fortunes/riddles]"}));
  ASSERT_EQ(d.warnings.size(), 1u);
  EXPECT_EQ(d.warnings[0],
            "data.train: /usr/share/games/fortunes/fortunes -> "
            "/usr/share/games/fortunes/fortunes, /usr/share/games/fortunes/riddles");
}

// Every field to_yaml() writes is one recipe_fields() entry, in the same order.
TEST(RecipeFields, ToYamlWritesEveryFieldOnce) {
  const Recipe r = parse({"lora={r: 4, targets: [c_attn]}"});
  const std::string y = to_yaml(r);
  size_t at = 0;
  for (const RecipeField& f : recipe_fields(r)) {
    const std::string key = f.path.substr(f.path.rfind('.') == std::string::npos ? 0 : f.path.rfind('.') + 1);
    const size_t next = y.find(key + ":", at);
    ASSERT_NE(next, std::string::npos) << f.path << " missing or out of order in\n" << y;
    at = next;
  }
}

}  // namespace
}  // namespace fd::config
