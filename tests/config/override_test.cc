// Command-line overrides: key.path=value and ~key.path, applied before validation.
#include <gtest/gtest.h>

#include "tests/config/test_util.h"

namespace fd::config {
namespace {

TEST_F(ConfigTest, OverrideSetsScalars) {
  LoadResult r = try_load_recipe(fixture("valid.yaml"), {"steps=5", "optimizer.lr=1e-3"});
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  EXPECT_EQ(r.recipe.steps, 5);
  EXPECT_EQ(r.recipe.optimizer.lr, 1e-3);
  EXPECT_EQ(r.recipe.optimizer.weight_decay, 0.1);  // the rest of the fragment stays
  EXPECT_EQ(r.recipe.where("optimizer.lr"), "override 'optimizer.lr=1e-3'");
}

TEST_F(ConfigTest, OverrideSetsFlowListsAndMaps) {
  LoadResult r = try_load_recipe(
      fixture("valid.yaml"),
      {"optimizer.betas=[0.8,0.99]", "lora={r: 4, targets: [c_fc, attn.c_proj], layers: [3, 1]}",
       "data.train=[tests/config/data/tiny.txt]"});
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  EXPECT_EQ(r.recipe.optimizer.betas, (std::array<double, 2>{0.8, 0.99}));
  ASSERT_TRUE(r.recipe.lora.has_value());
  EXPECT_EQ(r.recipe.lora->r, 4);
  EXPECT_EQ(r.recipe.lora->targets, (std::vector<std::string>{"c_fc", "attn.c_proj"}));
  EXPECT_EQ(r.recipe.lora->layers, (std::vector<int>{1, 3}));
  EXPECT_EQ(r.recipe.data.train, std::vector<std::string>{"tests/config/data/tiny.txt"});
}

TEST_F(ConfigTest, LaterOverridesWinAndNullTurnsLoraOff) {
  LoadResult r =
      try_load_recipe(fixture("valid.yaml"), {"lora.r=8", "steps=7", "lora=null", "steps=9"});
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  EXPECT_FALSE(r.recipe.lora.has_value());
  EXPECT_EQ(r.recipe.steps, 9);
}

TEST_F(ConfigTest, OverrideDeletesAKeySoTheDefaultApplies) {
  LoadResult r = try_load_recipe(fixture("valid.yaml"), {"~optimizer.lr", "~schedule"});
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  EXPECT_EQ(r.recipe.optimizer.lr, 3e-4);
  EXPECT_EQ(r.recipe.optimizer.weight_decay, 0.1);
  EXPECT_EQ(r.recipe.schedule.name, ScheduleName::kConstant);
  EXPECT_EQ(r.recipe.where("optimizer.lr"), "<default>");
  // Deleting a required key makes it missing.
  EXPECT_EQ(errors_of("valid.yaml", {"~steps"}),
            (Lines{"tests/config/data/valid.yaml: steps: required key is missing"}));
}

TEST_F(ConfigTest, OverrideOfAnUnknownKeyNamesTheOverride) {
  EXPECT_EQ(errors_of("valid.yaml", {"optimizer.lrr=1e-3", "~modle.n_layer", "stepz=3", "steps.x=1",
                                     "activation_checkpointing.layers.evry=2"}),
            (Lines{"override 'optimizer.lrr=1e-3': optimizer.lrr: unknown key; did you mean 'lr'?",
                   "override '~modle.n_layer': modle: unknown key; did you mean 'model'?",
                   "override 'stepz=3': stepz: unknown key; did you mean 'steps'?",
                   "override 'steps.x=1': steps.x: unknown key (steps takes a value, not keys)",
                   "override 'activation_checkpointing.layers.evry=2': "
                   "activation_checkpointing.layers.evry: unknown key; did you mean 'every'?"}));
}

TEST_F(ConfigTest, OverrideLocationInALaterValidationError) {
  EXPECT_EQ(errors_of("valid.yaml", {"batch.micro=0", "data.seq_len=512"}),
            (Lines{"override 'batch.micro=0': batch.micro: must be >= 1, got 0",
                   "override 'data.seq_len=512': data.seq_len: 512 is longer than the model's "
                   "context (model.max_seq_len = 256)"}));
}

TEST_F(ConfigTest, OverrideOfANumberBeyondItsTypeIsOutOfRange) {
  EXPECT_EQ(errors_of("valid.yaml", {"steps=99999999999999999999", "optimizer.lr=1e400"}),
            (Lines{"override 'optimizer.lr=1e400': optimizer.lr: 1e400 is out of range for a "
                   "number (at most 1.8e308 in magnitude)",
                   "override 'steps=99999999999999999999': steps: 99999999999999999999 is out of "
                   "range for an integer (at most 9223372036854775807)"}));
}

TEST_F(ConfigTest, ThreadsAreBounded) {
  EXPECT_EQ(errors_of("valid.yaml", {"threads=100000"}),
            (Lines{"override 'threads=100000': threads: must be in [1, 1024], got 100000"}));
  EXPECT_EQ(errors_of("valid.yaml", {"threads=0"}),
            (Lines{"override 'threads=0': threads: must be in [1, 1024], got 0"}));
  LoadResult r = try_load_recipe(fixture("valid.yaml"), {"threads=1024"});
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  EXPECT_EQ(r.recipe.threads, 1024);
}

TEST_F(ConfigTest, MalformedOverrides) {
  EXPECT_EQ(errors_of("valid.yaml", {"steps", "optimizer.betas=[0.9"}),
            (Lines{"override 'steps': expected key.path=value (to set a key) or ~key.path (to "
                   "delete it)",
                   "override 'optimizer.betas=[0.9': optimizer.betas: YAML syntax error: end of "
                   "sequence flow not found"}));
}

TEST_F(ConfigTest, OverrideCanNameAFragment) {
  LoadResult r = try_load_recipe(fixture("valid.yaml"), {"model=configs/models/gpt-m.yaml"});
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  EXPECT_EQ(r.recipe.model.n_layer, 6);
  EXPECT_EQ(r.recipe.where("model"), "override 'model=configs/models/gpt-m.yaml'");
  EXPECT_EQ(r.recipe.where("model.n_layer"), "configs/models/gpt-m.yaml:3:10");
}

}  // namespace
}  // namespace fd::config
