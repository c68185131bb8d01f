// Loading recipes: values, locations, and one message per problem.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>

#include "lib/base/error.h"
#include "tests/config/test_util.h"

namespace fd::config {
namespace {

TEST_F(ConfigTest, ValidRecipeLoadsWithFragmentsAndGlobs) {
  LoadResult r = try_load_recipe(fixture("valid.yaml"));
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  const Recipe& x = r.recipe;
  // model: from configs/models/gpt-nano.yaml, found in an ancestor directory.
  EXPECT_EQ(x.model.n_layer, 4);
  EXPECT_EQ(x.model.d_model, 128);
  EXPECT_EQ(x.model.max_seq_len, 256);
  // data: the glob expanded and sorted.
  EXPECT_EQ(x.data.format, DataFormat::kText);
  EXPECT_EQ(x.data.train, (std::vector<std::string>{"tests/config/data/shards/train_000.txt",
                                                    "tests/config/data/shards/train_001.txt"}));
  EXPECT_EQ(x.data.val, std::vector<std::string>{"tests/config/data/shards/val.txt"});
  EXPECT_EQ(x.data.seq_len, 64);
  EXPECT_EQ(x.batch.micro, 4);
  EXPECT_EQ(x.batch.accumulation, 2);
  // optimizer: from configs/optim/adamw.yaml.
  EXPECT_EQ(x.optimizer.lr, 6e-4);
  EXPECT_EQ(x.optimizer.betas[0], 0.9);
  EXPECT_EQ(x.optimizer.betas[1], 0.95);
  EXPECT_EQ(x.optimizer.weight_decay, 0.1);
  EXPECT_EQ(x.schedule.name, ScheduleName::kCosine);
  EXPECT_EQ(x.schedule.min_lr, 6e-5);
  EXPECT_EQ(x.logging.sample_prompt, "To be: \"or\" not\n");
  EXPECT_EQ(x.steps, 100);
  EXPECT_FALSE(x.lora.has_value());
  // Defaults.
  EXPECT_EQ(x.zero.stage, 0);
  EXPECT_EQ(x.dist.timeout_s, 600.0);
  EXPECT_EQ(x.seed, 1337);
  // Locations.
  EXPECT_EQ(x.where("optimizer.lr"), "configs/optim/adamw.yaml:3:5");
  EXPECT_EQ(x.where("optimizer"), "tests/config/data/valid.yaml:13:1");
  EXPECT_EQ(x.where("data.train"), "tests/config/data/valid.yaml:7:10");
  EXPECT_EQ(x.where("data.train[1]"), "tests/config/data/valid.yaml:7:10");
  EXPECT_EQ(x.where("data.train[7]"), "tests/config/data/valid.yaml:7:10");
  EXPECT_EQ(x.where("data.val[0]"), "tests/config/data/valid.yaml:8:9");
  EXPECT_EQ(x.where("batch.global"), "<default>");
  EXPECT_EQ(x.where("no.such.key"), "<default>");
}

TEST_F(ConfigTest, UnknownKeySuggestsTheNearest) {
  EXPECT_EQ(errors_of("unknown_key.yaml"),
            (Lines{"tests/config/data/unknown_key.yaml:4:3: optimizer.lrr: unknown key; "
                   "did you mean 'lr'?"}));
  LoadResult r = try_parse_recipe("optimiser: {lr: 1}\nstepz: 3\nzzzzzzzz: 1\n", "inline.yaml");
  EXPECT_EQ(r.errors, (Lines{"inline.yaml:1:1: optimiser: unknown key; did you mean 'optimizer'?",
                             "inline.yaml:2:1: stepz: unknown key; did you mean 'steps'?",
                             "inline.yaml:3:1: zzzzzzzz: unknown key",
                             "inline.yaml: data.train: required key is missing",
                             "inline.yaml: steps: required key is missing"}));
}

TEST_F(ConfigTest, WrongType) {
  EXPECT_EQ(errors_of("wrong_type.yaml"),
            (Lines{"tests/config/data/wrong_type.yaml:4:7: optimizer.lr: expected a "
                   "number, got 'fast'"}));
  LoadResult r = try_parse_recipe(
      "data: {train: tests/config/data/tiny.txt}\n"
      "model: {n_layer: 2.5}\n"
      "zero: {overlap_comm: maybe}\n"
      "optimizer: {betas: 0.9}\n"
      "schedule: {name: cosin}\n"
      "logging: [1, 2]\n"
      "steps: 10\n",
      "inline.yaml");
  EXPECT_EQ(
      r.errors,
      (Lines{"inline.yaml:2:18: model.n_layer: expected an integer, got '2.5'",
             "inline.yaml:4:20: optimizer.betas: expected a list of two numbers [beta1, beta2], "
             "got '0.9'",
             "inline.yaml:5:18: schedule.name: expected one of constant, cosine, got 'cosin'; did "
             "you mean 'cosine'?",
             "inline.yaml:3:22: zero.overlap_comm: expected true or false, got 'maybe'",
             "inline.yaml:6:10: logging: expected a map of logging keys (or the path of a .yaml "
             "fragment), got a list"}));
}

TEST_F(ConfigTest, OutOfRange) {
  EXPECT_EQ(errors_of("out_of_range.yaml"),
            (Lines{"tests/config/data/out_of_range.yaml:4:10: batch.micro: must be >= 1, got 0"}));
  LoadResult r = try_parse_recipe(
      "data: {train: tests/config/data/tiny.txt, val_fraction: 0.6}\n"
      "lora: {r: 4, dropout: 1.0}\n"
      "zero: {stage: 4}\n"
      "steps: 0\n",
      "inline.yaml");
  EXPECT_EQ(r.errors, (Lines{"inline.yaml:1:57: data.val_fraction: must be in [0, 0.5], got 0.6",
                             "inline.yaml:3:15: zero.stage: must be in [0, 3], got 4",
                             "inline.yaml:2:23: lora.dropout: must be in [0, 1), got 1.0",
                             "inline.yaml:4:8: steps: must be >= 1, got 0"}));
}

// A number too large for its type is out of range, not of the wrong type; a
// range the key has is checked against it first.
TEST_F(ConfigTest, NumbersBeyondTheirTypeAreOutOfRange) {
  LoadResult r = try_parse_recipe(
      "data: {train: tests/config/data/tiny.txt}\n"
      "optimizer: {lr: 1e400, eps: 1e-400, weight_decay: -1e400}\n"
      "zero: {stage: 99999999999999999999}\n"
      "batch: {micro: 99999999999999999999}\n"
      "activation_checkpointing: {layers: [99999999999999999999]}\n"
      "seed: 99999999999999999999\n"
      "steps: -99999999999999999999\n",
      "inline.yaml");
  EXPECT_EQ(r.errors,
            (Lines{"inline.yaml:4:16: batch.micro: 99999999999999999999 is out of range for an "
                   "integer (at most 2147483647)",
                   "inline.yaml:2:17: optimizer.lr: 1e400 is out of range for a number (at most "
                   "1.8e308 in magnitude)",
                   "inline.yaml:2:29: optimizer.eps: 1e-400 is out of range for a number (the "
                   "smallest magnitude above 0 is 4.9e-324)",
                   "inline.yaml:2:51: optimizer.weight_decay: must be >= 0, got -1e400",
                   "inline.yaml:3:15: zero.stage: must be in [0, 3], got 99999999999999999999",
                   "inline.yaml:5:37: activation_checkpointing.layers: block "
                   "99999999999999999999 does not exist (model.n_layer = 4, so blocks are 0..3)",
                   "inline.yaml:6:7: seed: 99999999999999999999 is out of range for an integer "
                   "(at most 9223372036854775807)",
                   "inline.yaml:7:8: steps: must be >= 1, got -99999999999999999999"}));
  // The largest values that fit are accepted.
  r = try_parse_recipe(
      "data: {train: tests/config/data/tiny.txt}\n"
      "optimizer: {lr: 1.7e308}\n"
      "seed: 9223372036854775807\n"
      "steps: 1\n",
      "inline.yaml");
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  EXPECT_EQ(r.recipe.seed, INT64_MAX);
  EXPECT_EQ(r.recipe.optimizer.lr, 1.7e308);
}

TEST_F(ConfigTest, MissingRequiredKeys) {
  EXPECT_EQ(errors_of("missing_steps.yaml"),
            (Lines{"tests/config/data/missing_steps.yaml: steps: required key is missing"}));
  LoadResult r = try_parse_recipe(
      "data: {train: tests/config/data/tiny.txt}\nlora: {alpha: 2}\n"
      "steps: 1\n",
      "inline.yaml");
  EXPECT_EQ(r.errors, (Lines{"inline.yaml:2:1: lora.r: required key is missing"}));
}

TEST_F(ConfigTest, YamlSyntaxErrorHasItsLocation) {
  EXPECT_EQ(errors_of("syntax_error.yaml"),
            (Lines{"tests/config/data/syntax_error.yaml:4:10: YAML syntax error: end of "
                   "sequence flow not found"}));
}

TEST_F(ConfigTest, TabIndentationIsNamedWithWhereToFixIt) {
  // yaml-cpp says "illegal map value" or "illegal tab when looking for indentation".
  EXPECT_EQ(
      try_parse_recipe("data:\n\ttrain: tests/config/data/tiny.txt\nsteps: 1\n", "t.yaml").errors,
      (Lines{"t.yaml:2:1: YAML forbids tabs for indentation; indent this line with spaces"}));
  EXPECT_EQ(try_parse_recipe("data:\n  train: tests/config/data/tiny.txt\n \tseq_len: 8\n"
                             "steps: 1\n",
                             "t.yaml")
                .errors,
            (Lines{"t.yaml:3:2: YAML forbids tabs for indentation; indent this line with spaces"}));
  EXPECT_EQ(
      try_parse_recipe("data:\n  train:\n\t- tests/config/data/tiny.txt\nsteps: 1\n", "t.yaml")
          .errors,
      (Lines{"t.yaml:3:1: YAML forbids tabs for indentation; indent this line with spaces"}));
  // A tab after the indentation is only white space.
  EXPECT_TRUE(
      try_parse_recipe("data:\n  train:\ttests/config/data/tiny.txt\nsteps:\t1\n", "t.yaml").ok());
}

TEST_F(ConfigTest, MissingRecipeFile) {
  EXPECT_EQ(errors_of("no_such_recipe.yaml"),
            (Lines{"tests/config/data/no_such_recipe.yaml: recipe file not found"}));
}

TEST_F(ConfigTest, DuplicateKeyIsAnError) {
  LoadResult r = try_parse_recipe("steps: 1\ndata: {train: tests/config/data/tiny.txt}\nsteps: 2\n",
                                  "inline.yaml");
  EXPECT_EQ(r.errors,
            (Lines{"inline.yaml:3:1: steps: duplicate key (first set at inline.yaml:1:1)"}));
}

TEST_F(ConfigTest, TopLevelMustBeAMap) {
  LoadResult r = try_parse_recipe("- a\n- b\n", "inline.yaml");
  EXPECT_EQ(r.errors, (Lines{"inline.yaml:1:1: expected a map of recipe keys, got a list"}));
}

TEST_F(ConfigTest, DataFilesThatDoNotExist) {
  const std::string cwd = FD_SOURCE_DIR;
  EXPECT_EQ(errors_of("missing_data.yaml"),
            (Lines{"tests/config/data/missing_data.yaml:4:7: data.train: no file matches "
                   "'tests/config/data/nope_*.txt'; check the path (relative paths are resolved "
                   "from " +
                       cwd + ")",
                   "tests/config/data/missing_data.yaml:5:8: data.val: no file matches "
                   "'tests/config/data/missing.txt'; check the path (relative paths are resolved "
                   "from " +
                       cwd + ")"}));
}

// A path to something that is not a regular file says what it is.
TEST_F(ConfigTest, DataPathsThatAreNotRegularFiles) {
  LoadResult r = try_parse_recipe("data: {train: tests/config/data}\nsteps: 1\n", "inline.yaml");
  EXPECT_EQ(r.errors, (Lines{"inline.yaml:1:15: data.train: 'tests/config/data' is a "
                             "directory, not a regular file; name the files in it (e.g. "
                             "'tests/config/data/*')"}));
  r = try_parse_recipe("data: {train: /dev/zero}\nsteps: 1\n", "inline.yaml");
  EXPECT_EQ(r.errors, (Lines{"inline.yaml:1:15: data.train: '/dev/zero' is a character device, "
                             "not a regular file; name text or token files"}));
  const std::string fifo = ::testing::TempDir() + "fd_config_fifo";
  std::filesystem::remove(fifo);
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  r = try_parse_recipe(fmt::format("data: {{train: tests/config/data/tiny.txt, val: {}}}\n"
                                   "steps: 1\n",
                                   fifo),
                       "inline.yaml");
  EXPECT_EQ(r.errors, (Lines{fmt::format("inline.yaml:1:48: data.val: '{}' is a FIFO, not a "
                                         "regular file; name text or token files",
                                         fifo)}));
  std::filesystem::remove(fifo);
  // A glob that matches only directories.
  r = try_parse_recipe("data: {train: 'tests/config/data/sh*'}\nsteps: 1\n", "inline.yaml");
  EXPECT_EQ(r.errors,
            (Lines{"inline.yaml:1:15: data.train: 'tests/config/data/sh*' matches no regular file "
                   "('tests/config/data/shards' is a directory); name text or token files"}));
}

TEST_F(ConfigTest, GlobsAreSortedPerPatternAndDeduplicated) {
  LoadResult r = try_parse_recipe(
      "data:\n"
      "  train: [tests/config/data/shards/train_001.txt,\n"
      "          tests/config/data/shards/train_*.txt]\n"
      "steps: 1\n",
      "inline.yaml");
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  EXPECT_EQ(r.recipe.data.train,
            (std::vector<std::string>{"tests/config/data/shards/train_001.txt",
                                      "tests/config/data/shards/train_000.txt"}));
  EXPECT_EQ(r.recipe.where("data.train[0]"), "inline.yaml:2:11");
  EXPECT_EQ(r.recipe.where("data.train[1]"), "inline.yaml:3:11");
}

TEST_F(ConfigTest, SeqLenLongerThanTheModelContext) {
  EXPECT_EQ(errors_of("seq_too_long.yaml"),
            (Lines{"tests/config/data/seq_too_long.yaml:5:12: data.seq_len: 512 is longer "
                   "than the model's context (model.max_seq_len = 256)"}));
  // With seq_len left at its default, the error points at max_seq_len.
  LoadResult r = try_parse_recipe(
      "model: {max_seq_len: 64}\ndata: {train: tests/config/data/tiny.txt}\nsteps: 1\n",
      "inline.yaml");
  EXPECT_EQ(r.errors, (Lines{"inline.yaml:1:22: model.max_seq_len: 64 is shorter than "
                             "data.seq_len (128 by default); set data.seq_len"}));
}

TEST_F(ConfigTest, CrossFieldRules) {
  LoadResult r = try_parse_recipe(
      "model: {d_model: 130, n_layer: 2}\n"
      "data: {train: tests/config/data/tiny.txt}\n"
      "batch: {micro: 4, accumulation: 2, global: 12}\n"
      "optimizer: {lr: 1.0e-4}\n"
      "schedule: {name: cosine, min_lr: 1.0e-3}\n"
      "activation_checkpointing: {layers: [0, 2]}\n"
      "steps: 1\n",
      "inline.yaml");
  EXPECT_EQ(
      r.errors,
      (Lines{"inline.yaml:6:40: activation_checkpointing.layers: block 2 does not exist "
             "(model.n_layer = 2, so blocks are 0..1)",
             "inline.yaml:1:18: model.d_model: model.d_model (130) must be divisible by "
             "model.n_head (4)",
             "inline.yaml:3:44: batch.global: 12 is not a multiple of batch.micro * "
             "batch.accumulation (4 * 2 = 8)",
             "inline.yaml:5:34: schedule.min_lr: 0.001 is above optimizer.lr (0.0001); cosine "
             "decays from lr down to min_lr"}));
}

// A warmup longer than the run is valid (a run may be extended on resume)
// but is most likely a mistake: a warning, not an error.
TEST_F(ConfigTest, WarmupLongerThanTheRunIsAWarning) {
  const std::string yaml =
      "data: {train: tests/config/data/tiny.txt}\nschedule: {warmup_steps: 500}\nsteps: 100\n";
  LoadResult r = try_parse_recipe(yaml, "inline.yaml");
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  EXPECT_EQ(r.recipe.schedule.warmup_steps, 500);
  EXPECT_EQ(r.warnings, (Lines{"inline.yaml:2:26: schedule.warmup_steps: 500 is more than steps "
                               "(100): the learning rate never reaches its peak"}));
  // At warmup_steps == steps the last step runs at the peak.
  r = try_parse_recipe(yaml, "inline.yaml", {"steps=500"});
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  EXPECT_TRUE(r.warnings.empty()) << ::testing::PrintToString(r.warnings);
  r = try_parse_recipe(yaml, "inline.yaml", {"steps=20"});
  EXPECT_EQ(r.warnings, (Lines{"inline.yaml:2:26: schedule.warmup_steps: 500 is more than steps "
                               "(20): the learning rate never reaches its peak"}));
  // No warning about a value that is itself an error.
  r = try_parse_recipe(yaml, "inline.yaml", {"steps=0"});
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(r.warnings.empty()) << ::testing::PrintToString(r.warnings);
  EXPECT_TRUE(try_load_recipe(fixture("valid.yaml")).warnings.empty());
}

TEST_F(ConfigTest, SeveralErrorsAreReportedAtOnce) {
  const std::string f = "tests/config/data/many_errors.yaml";
  EXPECT_EQ(
      errors_of("many_errors.yaml"),
      (Lines{f + ":6:3: data.formt: unknown key; did you mean 'format'?",
             f + ":8:7: optimizer.lr: must be > 0, got -1",
             f + ":9:16: optimizer.betas: must be in [0, 1), got 1.5",
             f + ":11:9: schedule.name: expected one of constant, cosine, got 'linear'",
             f + ":12:10: threads: must be in [1, 1024], got 0",
             f + ": steps: required key is missing",
             f + ":2:11: model.n_head: model.d_model (128) must be divisible by model.n_head (3)",
             f + ":3:15: model.vocab_size: data.format text needs vocab_size >= 256 (one token "
                 "per byte), got 100"}));
}

TEST_F(ConfigTest, LoadRecipeThrowsOneUsageErrorWithAllLines) {
  try {
    load_recipe(fixture("many_errors.yaml"));
    FAIL() << "expected an fd::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_EQ(e.exit_code(), 2);
    std::string joined;
    for (const auto& line : errors_of("many_errors.yaml")) {
      joined += (joined.empty() ? "" : "\n") + line;
    }
    EXPECT_EQ(e.what(), joined);
  }
}

TEST_F(ConfigTest, InitFromMustNameAnExistingFile) {
  EXPECT_EQ(errors_of("valid.yaml", {"model.init_from=base.safetensors"}),
            (Lines{"override 'model.init_from=base.safetensors': model.init_from: no such file "
                   "or directory 'base.safetensors'; give a Hugging Face model directory "
                   "(config.json + model.safetensors), an fdtrain export (fdtrain ckpt export) or "
                   "a Hugging Face GPT-2 model.safetensors"}));
}

// A Hugging Face directory decides the model section (its config.json), and
// the recipe states every value it runs with afterwards.
TEST_F(ConfigTest, InitFromADirectoryTakesTheModelFromItsConfig) {
  const std::string dir = std::string(FD_SOURCE_DIR) + "/tests/golden/llama/qwen3";
  LoadResult r = try_load_recipe(fixture("valid.yaml"),
                                 {"model={init_from: " + dir + "}", "data.seq_len=32", "data.format=tokens", "logging.sample_prompt=\"\"",
                                  "lora={r: 2}"});
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  const ModelOptions& m = r.recipe.model;
  EXPECT_EQ(m.arch, Arch::kQwen3);
  EXPECT_EQ(m.n_layer, 2);
  EXPECT_EQ(m.d_model, 32);
  EXPECT_EQ(m.head_dim, 16);
  EXPECT_EQ(m.n_kv_head, 2);
  EXPECT_EQ(m.d_ff, 64);
  EXPECT_EQ(m.vocab_size, 89);
  EXPECT_TRUE(m.qk_norm);
  EXPECT_TRUE(m.tie_embeddings);
  EXPECT_EQ(m.init_from, dir);
  EXPECT_EQ(r.recipe.lora->targets, (std::vector<std::string>{"q_proj", "v_proj"}));
  // The same values set explicitly agree; a different one is refused with both.
  EXPECT_TRUE(try_load_recipe(fixture("valid.yaml"),
                              {"model={init_from: " + dir + ", arch: qwen3, n_layer: 2, d_ff: 64}",
                               "data.seq_len=32", "data.format=tokens", "logging.sample_prompt=\"\""})
                  .ok());
  const std::vector<std::string> e = errors_of(
      "valid.yaml", {"model={init_from: " + dir + ", d_ff: 128}", "data.seq_len=32", "data.format=tokens", "logging.sample_prompt=\"\""});
  ASSERT_EQ(e.size(), 1u);
  EXPECT_NE(e[0].find("model.d_ff: is 128 but " + dir + "/config.json says 64; leave it out"),
            std::string::npos)
      << e[0];
}

TEST_F(ConfigTest, EveryFeatureTogetherLoads) {
  // every_feature.yaml turns on every feature at once (each was refused as
  // "not supported yet" while it was being built; device: cuda last).
  LoadResult r = try_load_recipe(fixture("every_feature.yaml"));
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  const Recipe& x = r.recipe;
  EXPECT_EQ(x.model.init_from, "tests/golden/gpt_tiny.safetensors");
  EXPECT_EQ(x.precision, Precision::kBf16);
  EXPECT_EQ(x.zero.stage, 2);
  EXPECT_EQ(x.parallel.pipeline, 2);
  EXPECT_EQ(x.parallel.schedule, PipelineSchedule::kGPipe);
  EXPECT_EQ(x.parallel.partition_blocks, (std::vector<int>{1, 3}));
  ASSERT_TRUE(x.lora.has_value());
  EXPECT_EQ(x.lora->r, 8);
  EXPECT_EQ(x.lora->alpha, 8.0);  // defaults to r
  EXPECT_EQ(x.lora->targets, (std::vector<std::string>{"c_attn", "mlp.c_proj"}));
  EXPECT_TRUE(x.lora->layers.empty());                                     // all
  EXPECT_EQ(x.activation_checkpointing.layers, (std::vector<int>{0, 2}));  // every 2 of 4
  EXPECT_EQ(x.checkpoint.every, 100);
  EXPECT_EQ(x.device, DeviceName::kCuda);
}

TEST_F(ConfigTest, DeviceCudaValidatesEverywhere) {
  // Recipes are portable: device: cuda loads on any build; the trainer checks
  // for the CUDA backend and a GPU when it starts.
  EXPECT_TRUE(errors_of("valid.yaml", {"device=cuda"}).empty());
  EXPECT_TRUE(errors_of("valid.yaml", {"precision=fp32", "zero.stage=0", "lora=null",
                                       "activation_checkpointing.layers=none", "checkpoint.every=0",
                                       "device=cpu", "model.init_from="})
                  .empty());
  std::vector<std::string> errors = errors_of("valid.yaml", {"device=tpu"});
  ASSERT_EQ(errors.size(), 1u) << ::testing::PrintToString(errors);
  EXPECT_NE(errors[0].find("device"), std::string::npos) << errors[0];
}

TEST_F(ConfigTest, InvalidLoraReportsEachError) {
  EXPECT_EQ(errors_of("valid.yaml", {"lora={r: 0, targets: [c_atn], layers: [9]}"}),
            (Lines{"override 'lora={r: 0, targets: [c_atn], layers: [9]}': lora.r: must "
                   "be >= 1, got 0",
                   "override 'lora={r: 0, targets: [c_atn], layers: [9]}': lora.targets: "
                   "a gpt2 model has no layer 'c_atn'; expected one of c_attn, c_proj, "
                   "attn.c_proj, c_fc, mlp.c_proj, all-linear; did you mean 'c_attn'?",
                   "override 'lora={r: 0, targets: [c_atn], layers: [9]}': lora.layers: "
                   "block 9 does not exist (model.n_layer = 4, so blocks are 0..3)"}));
}

TEST_F(ConfigTest, GlobalBatchMustFitTheWorldSize) {
  Recipe r = load_recipe(fixture("valid.yaml"), {"batch.global=16"});
  EXPECT_EQ(global_batch(r, 2), 16);
  EXPECT_NO_THROW(check_world_size(r, 2));  // 4 * 2 * 2
  try {
    check_world_size(r, 4);
    FAIL() << "expected an fd::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_STREQ(e.what(),
                 "override 'batch.global=16': batch.global: 16 sequences per step do not fit 4 "
                 "rank(s): batch.micro * batch.accumulation * ranks = 4 * 2 * 4 = 32; set "
                 "batch.accumulation to 1");
  }
  Recipe d = load_recipe(fixture("valid.yaml"));
  EXPECT_EQ(global_batch(d, 3), 4 * 2 * 3);
  EXPECT_NO_THROW(check_world_size(d, 3));
}

// The Llama family: arch picks the family, the shape keys are Hugging Face's
// fields under fdtrain's names, and the family's defaults are filled in.
TEST_F(ConfigTest, LlamaFamilyModelLoadsWithItsDefaults) {
  LoadResult r = try_load_recipe(
      fixture("valid.yaml"), {"model={arch: qwen3, n_layer: 2, n_head: 4, n_kv_head: 2, "
                              "head_dim: 16, d_model: 32, d_ff: 64, vocab_size: 256, "
                              "max_seq_len: 128}",
                              "data.seq_len=64", "lora={r: 4}"});
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  const ModelOptions& m = r.recipe.model;
  EXPECT_EQ(m.arch, Arch::kQwen3);
  EXPECT_EQ(m.n_kv_head, 2);
  EXPECT_EQ(m.head_dim, 16);
  EXPECT_EQ(m.d_ff, 64);
  EXPECT_EQ(m.norm_eps, 1e-6);
  EXPECT_EQ(m.rope_theta, 1e6);
  EXPECT_TRUE(m.qk_norm);
  EXPECT_FALSE(m.attention_bias);
  EXPECT_FALSE(m.tie_embeddings);
  EXPECT_EQ(r.recipe.lora->targets, (std::vector<std::string>{"q_proj", "v_proj"}));

  LoadResult l = try_load_recipe(fixture("valid.yaml"),
                                 {"model={arch: llama, n_layer: 2, n_head: 4, d_model: 32, "
                                  "d_ff: 88, vocab_size: 256, max_seq_len: 128}",
                                  "data.seq_len=64"});
  ASSERT_TRUE(l.ok()) << ::testing::PrintToString(l.errors);
  EXPECT_EQ(l.recipe.model.n_kv_head, 4);  // n_head
  EXPECT_EQ(l.recipe.model.head_dim, 8);   // d_model / n_head
  EXPECT_EQ(l.recipe.model.norm_eps, 1e-5);
  EXPECT_EQ(l.recipe.model.rope_theta, 10000.0);
  EXPECT_EQ(l.recipe.model.rope_scaling, RopeScalingName::kNone);
}

TEST_F(ConfigTest, LlamaFamilyMistakesAreReportedWithTheKey) {
  const std::string o = "override 'model={arch: llama, n_layer: 2, n_head: 6, n_kv_head: 4, "
                        "d_model: 30, vocab_size: 256, max_seq_len: 128}': ";
  EXPECT_EQ(errors_of("valid.yaml", {"model={arch: llama, n_layer: 2, n_head: 6, n_kv_head: 4, "
                                     "d_model: 30, vocab_size: 256, max_seq_len: 128}",
                                     "data.seq_len=64"}),
            (Lines{o + "model.d_ff: required for model.arch llama: the MLP's inner width "
                       "(intermediate_size in a Hugging Face config.json)",
                   o + "model.n_kv_head: 4 does not divide model.n_head (6); each key/value "
                       "head serves the same number of query heads",
                   o + "model.d_model: head_dim is 5 (d_model / n_head unless model.head_dim is "
                       "set); RoPE rotates pairs, so it must be even and >= 2"}));
  // gpt2 has no Llama-family keys; qwen2 always has q/k/v biases; llama3 scaling needs its context.
  EXPECT_EQ(errors_of("valid.yaml", {"model.n_kv_head=2"}),
            (Lines{"override 'model.n_kv_head=2': model.n_kv_head: is a setting of the Llama "
                   "family (model.arch llama, mistral, qwen2, qwen3); a gpt2 model's shape is "
                   "n_layer, n_head, d_model, vocab_size and max_seq_len (MLP 4 x d_model, "
                   "LayerNorm, tied head)"}));
  EXPECT_NE(::testing::PrintToString(errors_of(
                "valid.yaml", {"model={arch: qwen2, d_ff: 64, attention_bias: false}",
                               "data.seq_len=64"}))
                .find("qwen2 models always have q/k/v biases"),
            std::string::npos);
  EXPECT_NE(::testing::PrintToString(errors_of(
                "valid.yaml", {"model={arch: llama, d_ff: 64, rope_scaling: llama3}",
                               "data.seq_len=64"}))
                .find("llama3 RoPE scaling needs the context"),
            std::string::npos);
  // LoRA targets by family, with the reason for the head and the embedding.
  EXPECT_NE(::testing::PrintToString(errors_of(
                "valid.yaml", {"model={arch: llama, d_ff: 64}", "data.seq_len=64",
                               "lora={r: 4, targets: [c_attn]}"}))
                .find("a llama model has no layer 'c_attn'; expected one of q_proj, k_proj, "
                      "v_proj, o_proj, gate_proj, up_proj, down_proj, all-linear"),
            std::string::npos);
  EXPECT_NE(::testing::PrintToString(errors_of(
                "valid.yaml", {"model={arch: llama, d_ff: 64}", "data.seq_len=64",
                               "lora={r: 4, targets: [lm_head]}"}))
                .find("lm_head cannot get adapters"),
            std::string::npos);
}

}  // namespace
}  // namespace fd::config
