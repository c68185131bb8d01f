// Includes: section fragments, base recipes, where errors inside them point.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tests/config/test_util.h"

namespace fd::config {
namespace {

TEST_F(ConfigTest, ErrorsInsideAFragmentPointIntoTheFragment) {
  EXPECT_EQ(errors_of("fragment_error.yaml"),
            (Lines{"tests/config/data/fragments/bad_model.yaml:3:1: model.n_layr: unknown key; "
                   "did you mean 'n_layer'?",
                   "tests/config/data/fragments/bad_model.yaml:4:10: model.d_model: expected an "
                   "integer, got 'wide'"}));
}

TEST_F(ConfigTest, MissingFragment) {
  EXPECT_EQ(errors_of("missing_fragment.yaml"),
            (Lines{"tests/config/data/missing_fragment.yaml:1:8: model: included file "
                   "'fragments/no_such_model.yaml' not found (looked in tests/config/data, the "
                   "directories above it and " +
                   std::string(FD_SOURCE_DIR) + ")"}));
}

TEST_F(ConfigTest, IncludeCycleIsAnError) {
  EXPECT_EQ(errors_of("cycle_a.yaml"),
            (Lines{"tests/config/data/cycle_b.yaml:1:10: include: include cycle: "
                   "tests/config/data/cycle_a.yaml -> tests/config/data/cycle_b.yaml -> "
                   "tests/config/data/cycle_a.yaml"}));
}

TEST_F(ConfigTest, BaseRecipesMergeUnderTheRecipe) {
  LoadResult r = try_load_recipe(fixture("child.yaml"));
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  const Recipe& x = r.recipe;
  EXPECT_EQ(x.model.n_layer, 3);    // child wins
  EXPECT_EQ(x.model.d_model, 64);   // from base, merged key by key
  EXPECT_EQ(x.data.seq_len, 32);    // from base
  EXPECT_EQ(x.optimizer.lr, 6e-4);  // the child's optimizer fragment over the base's map
  EXPECT_EQ(x.optimizer.weight_decay, 0.1);
  EXPECT_EQ(x.steps, 20);
  EXPECT_EQ(x.where("steps"), "tests/config/data/child.yaml:5:8");
  EXPECT_EQ(x.where("model.d_model"), "tests/config/data/base.yaml:4:12");
  EXPECT_EQ(x.where("data.train"), "tests/config/data/base.yaml:6:10");
}

TEST_F(ConfigTest, FragmentsCanIncludeFragments) {
  LoadResult r = try_parse_recipe(
      "model: tests/config/data/fragments/wide_nano.yaml\n"
      "data: {train: tests/config/data/tiny.txt}\n"
      "steps: 1\n",
      "inline.yaml");
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  EXPECT_EQ(r.recipe.model.n_layer, 4);    // gpt-nano
  EXPECT_EQ(r.recipe.model.d_model, 256);  // wide_nano over it
}

TEST_F(ConfigTest, ASectionMapCanIncludeAFragmentUnderIt) {
  LoadResult r = try_parse_recipe(
      "model: {include: configs/models/gpt-m.yaml, n_layer: 2}\n"
      "data: {train: tests/config/data/tiny.txt}\n"
      "steps: 1\n",
      "inline.yaml");
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  EXPECT_EQ(r.recipe.model.n_layer, 2);    // the recipe wins
  EXPECT_EQ(r.recipe.model.d_model, 512);  // from gpt-m
  EXPECT_EQ(r.recipe.where("model.d_model"), "configs/models/gpt-m.yaml:5:10");
}

TEST_F(ConfigTest, ASectionStringThatIsNotAFileIsATypeError) {
  LoadResult r = try_parse_recipe(
      "data: {train: tests/config/data/tiny.txt}\nactivation_checkpointing: all\nsteps: 1\n",
      "inline.yaml");
  EXPECT_EQ(r.errors, (Lines{"inline.yaml:2:27: activation_checkpointing: expected a map of "
                             "activation_checkpointing keys (or the path of a .yaml fragment), "
                             "got 'all'"}));
}

TEST_F(ConfigTest, ShippedFragmentsLoad) {
  struct Model {
    const char* file;
    int n_layer, n_head, d_model, vocab_size, max_seq_len;
  };
  const Model models[] = {
      {"configs/models/gpt-nano.yaml", 4, 4, 128, 256, 256},
      {"configs/models/gpt-small-s.yaml", 4, 4, 256, 256, 256},
      {"configs/models/gpt-m.yaml", 6, 8, 512, 256, 256},
      {"configs/models/gpt2-124m.yaml", 12, 12, 768, 50257, 1024},
  };
  for (const Model& m : models) {
    LoadResult r = try_load_recipe(fixture("valid.yaml"), {fmt::format("model={}", m.file)});
    ASSERT_TRUE(r.ok()) << m.file << ": " << ::testing::PrintToString(r.errors);
    EXPECT_EQ(r.recipe.model.n_layer, m.n_layer) << m.file;
    EXPECT_EQ(r.recipe.model.n_head, m.n_head) << m.file;
    EXPECT_EQ(r.recipe.model.d_model, m.d_model) << m.file;
    EXPECT_EQ(r.recipe.model.vocab_size, m.vocab_size) << m.file;
    EXPECT_EQ(r.recipe.model.max_seq_len, m.max_seq_len) << m.file;
  }
  LoadResult r = try_load_recipe(fixture("valid.yaml"), {"optimizer=configs/optim/adamw.yaml"});
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  EXPECT_EQ(r.recipe.optimizer.lr, 6e-4);
  EXPECT_EQ(r.recipe.optimizer.betas, (std::array<double, 2>{0.9, 0.95}));
  EXPECT_EQ(r.recipe.optimizer.weight_decay, 0.1);
  EXPECT_EQ(r.recipe.optimizer.grad_clip, 1.0);
}

// Every file under configs/ loads as the section its directory names.
TEST_F(ConfigTest, EveryShippedFragmentIsValid) {
  const std::pair<const char*, const char*> dirs[] = {
      {"configs/models", "model"}, {"configs/optim", "optimizer"}, {"configs/zero", "zero"}};
  int count = 0;
  for (const auto& [dir, section] : dirs) {
    if (!std::filesystem::exists(dir)) continue;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      std::string override = fmt::format("{}={}", section, entry.path().string());
      LoadResult r = try_load_recipe(fixture("valid.yaml"), {override});
      EXPECT_TRUE(r.ok()) << override << ": " << ::testing::PrintToString(r.errors);
      ++count;
    }
  }
  EXPECT_GE(count, 5);
}

}  // namespace
}  // namespace fd::config
