// The parallel section (pipeline parallelism): its keys, their overrides and
// printing, every value and combination that cannot run refused with what,
// where and what to do, and the world-size rules (world = stages x replicas;
// the global batch counts the data-parallel replicas only).
#include <gtest/gtest.h>

#include "lib/base/error.h"
#include "tests/config/test_util.h"

namespace fd::config {
namespace {

// A gpt2 model of 4 blocks (the default), a tiny text file.
constexpr const char* kBase = "data: {train: tests/config/data/tiny.txt}\nsteps: 1\n";

LoadResult parse(const std::string& extra, const std::vector<std::string>& overrides = {}) {
  return try_parse_recipe(std::string(kBase) + extra, "inline.yaml", overrides);
}

Lines errors(const std::string& extra, const std::vector<std::string>& overrides = {}) {
  return parse(extra, overrides).errors;
}

std::string usage_message(const Recipe& r, int world) {
  try {
    check_world_size(r, world);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    return e.what();
  }
  return "";
}

TEST_F(ConfigTest, ParallelDefaultsToNoPipeline) {
  LoadResult r = parse("");
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  const ParallelOptions& p = r.recipe.parallel;
  EXPECT_EQ(p.pipeline, 1);
  EXPECT_EQ(p.schedule, PipelineSchedule::k1F1B);
  EXPECT_EQ(p.partition, PartitionName::kParameters);
  EXPECT_TRUE(p.partition_blocks.empty());
  EXPECT_TRUE(r.warnings.empty()) << ::testing::PrintToString(r.warnings);
  EXPECT_NE(to_yaml(r.recipe).find("parallel:\n  pipeline: 1\n  schedule: 1f1b\n"
                                   "  partition: parameters\n"),
            std::string::npos)
      << to_yaml(r.recipe);
}

TEST_F(ConfigTest, ParallelLoadsPrintsAndReadsBack) {
  LoadResult r = parse(
      "parallel: {pipeline: 2, schedule: gpipe, partition: [1, 3]}\nbatch: {accumulation: 4}\n");
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  const ParallelOptions& p = r.recipe.parallel;
  EXPECT_EQ(p.pipeline, 2);
  EXPECT_EQ(p.schedule, PipelineSchedule::kGPipe);
  EXPECT_EQ(p.partition, PartitionName::kList);
  EXPECT_EQ(p.partition_blocks, (std::vector<int>{1, 3}));
  const std::string y = to_yaml(r.recipe);
  EXPECT_NE(y.find("parallel:\n  pipeline: 2\n  schedule: gpipe\n  partition: [1, 3]\n"),
            std::string::npos)
      << y;
  LoadResult again = try_parse_recipe(y, "resolved.yaml");
  ASSERT_TRUE(again.ok()) << ::testing::PrintToString(again.errors);
  EXPECT_EQ(again.recipe.parallel, p);
  EXPECT_EQ(to_yaml(again.recipe), y);
  // uniform, by name.
  LoadResult u = parse("parallel: {pipeline: 4, partition: uniform}\nbatch: {accumulation: 8}\n");
  ASSERT_TRUE(u.ok()) << ::testing::PrintToString(u.errors);
  EXPECT_EQ(u.recipe.parallel.partition, PartitionName::kUniform);
  EXPECT_NE(to_yaml(u.recipe).find("  partition: uniform\n"), std::string::npos);
  // The recipe says where each value came from.
  EXPECT_EQ(u.recipe.where("parallel.pipeline"), "inline.yaml:3:22");
}

TEST_F(ConfigTest, ParallelOverrides) {
  LoadResult r =
      parse("batch: {accumulation: 4}\n",
            {"parallel.pipeline=2", "parallel.schedule=gpipe", "parallel.partition=[3, 1]"});
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  EXPECT_EQ(r.recipe.parallel.pipeline, 2);
  EXPECT_EQ(r.recipe.parallel.schedule, PipelineSchedule::kGPipe);
  EXPECT_EQ(r.recipe.parallel.partition_blocks, (std::vector<int>{3, 1}));
  EXPECT_EQ(r.recipe.where("parallel.pipeline"), "override 'parallel.pipeline=2'");
  // A later override back to a name drops the list.
  LoadResult back = parse("parallel: {pipeline: 2, partition: [3, 1]}\nbatch: {accumulation: 4}\n",
                          {"parallel.partition=uniform"});
  ASSERT_TRUE(back.ok()) << ::testing::PrintToString(back.errors);
  EXPECT_EQ(back.recipe.parallel.partition, PartitionName::kUniform);
  EXPECT_TRUE(back.recipe.parallel.partition_blocks.empty());
  EXPECT_EQ(parse("", {"parallel.pipelin=2"}).errors,
            (Lines{"override 'parallel.pipelin=2': parallel.pipelin: unknown key; did you mean "
                   "'pipeline'?"}));
  EXPECT_EQ(parse("", {"parallel.pipeline.x=2"}).errors,
            (Lines{"override 'parallel.pipeline.x=2': parallel.pipeline.x: unknown key "
                   "(parallel.pipeline takes a value, not keys)"}));
  EXPECT_EQ(parse("", {"parallel.pipeline=0"}).errors,
            (Lines{"override 'parallel.pipeline=0': parallel.pipeline: must be >= 1, got 0"}));
}

TEST_F(ConfigTest, ParallelBadTypesAndNames) {
  EXPECT_EQ(errors("parallel: {pipelines: 2}\n"),
            (Lines{"inline.yaml:3:12: parallel.pipelines: unknown key; did you mean 'pipeline'?"}));
  EXPECT_EQ(errors("parallel: 2\n"),
            (Lines{"inline.yaml:3:11: parallel: expected a map of parallel keys (or the path of a "
                   ".yaml fragment), got '2'"}));
  EXPECT_EQ(errors("parallel: {pipeline: two}\n"),
            (Lines{"inline.yaml:3:22: parallel.pipeline: expected an integer, got 'two'"}));
  EXPECT_EQ(errors("parallel: {pipeline: 1.5}\n"),
            (Lines{"inline.yaml:3:22: parallel.pipeline: expected an integer, got '1.5'"}));
  EXPECT_EQ(errors("parallel: {pipeline: [2]}\n"),
            (Lines{"inline.yaml:3:22: parallel.pipeline: expected an integer, got a list"}));
  EXPECT_EQ(errors("parallel: {pipeline: 0}\n"),
            (Lines{"inline.yaml:3:22: parallel.pipeline: must be >= 1, got 0"}));
  EXPECT_EQ(errors("parallel: {pipeline: -2}\n"),
            (Lines{"inline.yaml:3:22: parallel.pipeline: must be >= 1, got -2"}));
  EXPECT_EQ(errors("parallel: {pipeline: 99999999999}\n"),
            (Lines{"inline.yaml:3:22: parallel.pipeline: must be <= 2147483647, got 99999999999"}));
  EXPECT_EQ(errors("parallel: {schedule: 1f1f}\n"),
            (Lines{"inline.yaml:3:22: parallel.schedule: expected one of 1f1b, gpipe, got "
                   "'1f1f'; did you mean '1f1b'?"}));
  EXPECT_EQ(errors("parallel: {schedule: interleaved}\n"),
            (Lines{"inline.yaml:3:22: parallel.schedule: expected one of 1f1b, gpipe, got "
                   "'interleaved'"}));
  EXPECT_EQ(errors("parallel: {partition: parameter}\n"),
            (Lines{"inline.yaml:3:23: parallel.partition: expected parameters, uniform or a list "
                   "of transformer blocks per stage ([3, 5]), got 'parameter'; did you mean "
                   "'parameters'?"}));
  EXPECT_EQ(errors("parallel: {partition: []}\n"),
            (Lines{"inline.yaml:3:23: parallel.partition: expected parameters, uniform or a list "
                   "of transformer blocks per stage ([3, 5]), got []"}));
  EXPECT_EQ(errors("parallel: {partition: {a: 1}}\n"),
            (Lines{"inline.yaml:3:23: parallel.partition: expected parameters, uniform or a list "
                   "of transformer blocks per stage ([3, 5]), got a map"}));
  EXPECT_EQ(errors("parallel: {pipeline: 2, partition: [2, x]}\nbatch: {accumulation: 2}\n"),
            (Lines{"inline.yaml:3:40: parallel.partition: stage 1: expected a number of "
                   "transformer blocks, got 'x'"}));
  EXPECT_EQ(errors("parallel: {pipeline: 2, partition: [2, [2]]}\nbatch: {accumulation: 2}\n"),
            (Lines{"inline.yaml:3:40: parallel.partition: stage 1: expected a number of "
                   "transformer blocks, got a list"}));
  EXPECT_EQ(errors("parallel: {pipeline: 2, partition: [2, 1.5]}\nbatch: {accumulation: 2}\n"),
            (Lines{"inline.yaml:3:40: parallel.partition: stage 1: expected a number of "
                   "transformer blocks, got '1.5'"}));
  EXPECT_EQ(errors("parallel: {pipeline: 2, partition: [2, 99999999999]}\n"
                   "batch: {accumulation: 2}\n"),
            (Lines{"inline.yaml:3:40: parallel.partition: stage 1: 99999999999 is out of range "
                   "for an integer (at most 2147483647)"}));
}

TEST_F(ConfigTest, ParallelEveryStageNeedsABlock) {
  // Zero (or negative) entries: a stage without a block.
  EXPECT_EQ(errors("parallel: {pipeline: 3, partition: [4, 0, -1]}\nbatch: {accumulation: 3}\n"),
            (Lines{"inline.yaml:3:40: parallel.partition: stage 1 gets 0 blocks; every stage "
                   "needs at least one transformer block (the embedding rides with the first "
                   "stage, the final norm, head and loss with the last)",
                   "inline.yaml:3:43: parallel.partition: stage 2 gets -1 blocks; every stage "
                   "needs at least one transformer block (the embedding rides with the first "
                   "stage, the final norm, head and loss with the last)"}));
  // More stages than blocks: one message, on the pipeline (not also on the list).
  EXPECT_EQ(errors("parallel: {pipeline: 5}\nbatch: {accumulation: 8}\n"),
            (Lines{"inline.yaml:3:22: parallel.pipeline: 5 stages but the model has 4 "
                   "transformer block(s) (model.n_layer); each stage needs at least one block "
                   "(the embedding rides with the first stage, the final norm, head and loss "
                   "with the last): set parallel.pipeline to at most 4"}));
  EXPECT_EQ(
      errors("parallel: {pipeline: 5, partition: [1, 1, 1, 1, 1]}\nbatch: {accumulation: 8}\n")
          .size(),
      1u);
  EXPECT_EQ(errors("batch: {accumulation: 8}\n", {"model.n_layer=2", "parallel.pipeline=3"}),
            (Lines{"override 'parallel.pipeline=3': parallel.pipeline: 3 stages but the model "
                   "has 2 transformer block(s) (model.n_layer); each stage needs at least one "
                   "block (the embedding rides with the first stage, the final norm, head and "
                   "loss with the last): set parallel.pipeline to at most 2"}));
  // As many stages as blocks is fine.
  EXPECT_TRUE(parse("parallel: {pipeline: 4}\nbatch: {accumulation: 8}\n").ok());
  // A bad n_layer is reported once, without a second message about the stages.
  EXPECT_EQ(errors("parallel: {pipeline: 5}\nbatch: {accumulation: 8}\n", {"model.n_layer=0"}),
            (Lines{"override 'model.n_layer=0': model.n_layer: must be >= 1, got 0"}));
}

TEST_F(ConfigTest, ParallelPartitionListMustFitTheStagesAndBlocks) {
  EXPECT_EQ(errors("parallel: {pipeline: 2, partition: [1, 1, 2]}\nbatch: {accumulation: 2}\n"),
            (Lines{"inline.yaml:3:36: parallel.partition: lists 3 stage(s) but "
                   "parallel.pipeline is 2; give one block count per stage"}));
  EXPECT_EQ(errors("parallel: {pipeline: 2, partition: [2, 3]}\nbatch: {accumulation: 2}\n"),
            (Lines{"inline.yaml:3:36: parallel.partition: the blocks per stage sum to 5 but the "
                   "model has 4 (model.n_layer); every transformer block belongs to exactly one "
                   "stage"}));
  EXPECT_EQ(errors("parallel: {pipeline: 2, partition: [1, 1]}\nbatch: {accumulation: 2}\n"),
            (Lines{"inline.yaml:3:36: parallel.partition: the blocks per stage sum to 2 but the "
                   "model has 4 (model.n_layer); every transformer block belongs to exactly one "
                   "stage"}));
  // Without a pipeline a list is still checked: one stage of all the blocks.
  EXPECT_TRUE(parse("parallel: {partition: [4]}\n").ok());
  EXPECT_EQ(errors("parallel: {partition: [2, 2]}\n"),
            (Lines{"inline.yaml:3:23: parallel.partition: lists 2 stage(s) but "
                   "parallel.pipeline is 1; give one block count per stage"}));
  // The overridden model decides the sum.
  EXPECT_TRUE(parse("parallel: {pipeline: 2, partition: [5, 3]}\nbatch: {accumulation: 2}\n",
                    {"model.n_layer=8"})
                  .ok());
}

// A Hugging Face directory's config.json decides n_layer: the pipeline is
// checked against it, not against the recipe's default.
TEST_F(ConfigTest, ParallelChecksTheLayersOfAModelDirectory) {
  const std::string dir = std::string(FD_SOURCE_DIR) + "/tests/golden/llama/qwen3";  // 2 blocks
  const std::vector<std::string> common = {"model={init_from: " + dir + "}", "data.seq_len=32",
                                           "data.format=tokens", "logging.sample_prompt=\"\"",
                                           "batch.accumulation=4"};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> o = common;
    o.insert(o.end(), more.begin(), more.end());
    return try_load_recipe(fixture("valid.yaml"), o);
  };
  EXPECT_TRUE(with({"parallel.pipeline=2"}).ok());
  EXPECT_TRUE(with({"parallel.pipeline=2", "parallel.partition=[1, 1]"}).ok());
  EXPECT_EQ(with({"parallel.pipeline=3"}).errors,
            (Lines{"override 'parallel.pipeline=3': parallel.pipeline: 3 stages but the model "
                   "has 2 transformer block(s) (model.n_layer); each stage needs at least one "
                   "block (the embedding rides with the first stage, the final norm, head and "
                   "loss with the last): set parallel.pipeline to at most 2"}));
  EXPECT_EQ(with({"parallel.pipeline=2", "parallel.partition=[2, 2]"}).errors,
            (Lines{"override 'parallel.partition=[2, 2]': parallel.partition: the blocks per "
                   "stage sum to 4 but the model has 2 (model.n_layer); every transformer block "
                   "belongs to exactly one stage"}));
}

TEST_F(ConfigTest, ParallelRefusesZero3AndParameterOffload) {
  const std::string why =
      "zero.stage: ZeRO stage 3 cannot be combined with a pipeline (parallel.pipeline is 2): "
      "stage 3 partitions every parameter across the data-parallel group and gathers each "
      "layer's parameters as it runs, which conflicts with the pipeline's per-stage ownership "
      "of its layers (DeepSpeed refuses it too); use zero.stage 0, 1 or 2";
  EXPECT_EQ(errors("parallel: {pipeline: 2}\nzero: {stage: 3}\nbatch: {accumulation: 2}\n"),
            (Lines{"inline.yaml:4:15: " + why + ", or parallel.pipeline: 1"}));
  EXPECT_EQ(errors("zero: {stage: 3}\nbatch: {accumulation: 2}\n", {"parallel.pipeline=2"}),
            (Lines{"inline.yaml:3:15: " + why + ", or parallel.pipeline: 1"}));
  // Parameter offload needs stage 3, so it is refused with it (the one message says so).
  EXPECT_EQ(errors("parallel: {pipeline: 2}\nbatch: {accumulation: 2}\n"
                   "zero: {stage: 3, offload_optimizer: {device: nvme, path: tests/config/data}, "
                   "offload_params: {device: nvme}}\n"),
            (Lines{"inline.yaml:5:15: " + why +
                   " without zero.offload_params (it needs stage 3), or parallel.pipeline: 1"}));
  // And at a lower stage, offload_params is refused for its own reason.
  EXPECT_EQ(errors("parallel: {pipeline: 2}\nbatch: {accumulation: 2}\n"
                   "zero: {stage: 2, offload_params: {device: nvme}}\n")
                .size(),
            1u);
  // Stages 0-2 and optimizer offload compose with a pipeline.
  for (int stage : {0, 1, 2})
    EXPECT_TRUE(parse("parallel: {pipeline: 2}\nbatch: {accumulation: 2}\n",
                      {"zero.stage=" + std::to_string(stage)})
                    .ok())
        << stage;
  EXPECT_TRUE(
      parse("parallel: {pipeline: 2}\nbatch: {accumulation: 2}\n"
            "zero: {stage: 2, offload_optimizer: {device: nvme, path: tests/config/data}}\n")
          .ok());
  // ZeRO-3 without a pipeline is as before.
  EXPECT_TRUE(parse("zero: {stage: 3}\n").ok());
}

TEST_F(ConfigTest, ParallelWarnsWhenTheMicroBatchesCannotFillThePipeline) {
  LoadResult r = parse("parallel: {pipeline: 4}\nbatch: {accumulation: 2}\n");
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  EXPECT_EQ(r.warnings,
            (Lines{"inline.yaml:4:23: batch.accumulation: 2 micro-batch(es) per step through 4 "
                   "pipeline stages: each stage idles 60% of the step ((P-1)/(M+P-1)); the "
                   "pipeline's micro-batches are batch.accumulation's, so raise it (>= 4 x "
                   "parallel.pipeline keeps the idle time under 20%)"}));
  EXPECT_TRUE(
      parse("parallel: {pipeline: 4}\nbatch: {accumulation: 4}\n").recipe.parallel.pipeline == 4);
  EXPECT_TRUE(parse("parallel: {pipeline: 4}\nbatch: {accumulation: 4}\n").warnings.empty());
}

TEST_F(ConfigTest, ParallelWorldMustBeStagesTimesReplicas) {
  LoadResult r = parse("parallel: {pipeline: 2}\nbatch: {micro: 4, accumulation: 2}\n");
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  EXPECT_EQ(data_parallel_size(r.recipe, 4), 2);
  EXPECT_EQ(data_parallel_size(r.recipe, 2), 1);
  // Only the D replicas read distinct data: micro * accumulation * D.
  EXPECT_EQ(global_batch(r.recipe, 4), 4 * 2 * 2);
  EXPECT_EQ(global_batch(r.recipe, 2), 4 * 2 * 1);
  EXPECT_EQ(usage_message(r.recipe, 4), "");
  EXPECT_EQ(usage_message(r.recipe, 2), "");
  EXPECT_EQ(usage_message(r.recipe, 3),
            "inline.yaml:3:22: parallel.pipeline: 2 pipeline stages do not divide the 3 rank(s) "
            "of this job (the ranks are stages x data-parallel replicas): start a multiple of 2 "
            "ranks (mpirun -n 4), or set parallel.pipeline to a divisor of 3");
  EXPECT_EQ(usage_message(r.recipe, 1),
            "inline.yaml:3:22: parallel.pipeline: 2 pipeline stages do not divide the 1 rank(s) "
            "of this job (the ranks are stages x data-parallel replicas): start a multiple of 2 "
            "ranks (mpirun -n 2), or set parallel.pipeline to a divisor of 1");
  // batch.global counts sequences over the replicas.
  LoadResult g = parse("parallel: {pipeline: 2}\nbatch: {micro: 4, accumulation: 2, global: 16}\n");
  ASSERT_TRUE(g.ok()) << ::testing::PrintToString(g.errors);
  EXPECT_EQ(global_batch(g.recipe, 4), 16);
  EXPECT_EQ(usage_message(g.recipe, 4), "");  // 4 * 2 * (4 / 2)
  EXPECT_EQ(usage_message(g.recipe, 8),
            "inline.yaml:4:44: batch.global: 16 sequences per step do not fit 8 rank(s) in 2 "
            "pipeline stages: only the data-parallel replicas read distinct data, so batch.micro "
            "* batch.accumulation * replicas (ranks / parallel.pipeline) = 4 * 2 * 4 = 32; set "
            "batch.accumulation to 1");
  // The stages are checked first: a world they do not divide says so, not something about batch.
  EXPECT_NE(usage_message(g.recipe, 5).find("parallel.pipeline: 2 pipeline stages do not divide"),
            std::string::npos);
  // Without a pipeline nothing changes: every rank is a replica.
  LoadResult one = parse("batch: {micro: 4, accumulation: 2}\n");
  EXPECT_EQ(data_parallel_size(one.recipe, 3), 3);
  EXPECT_EQ(global_batch(one.recipe, 3), 4 * 2 * 3);
  EXPECT_EQ(usage_message(one.recipe, 3), "");
}

}  // namespace
}  // namespace fd::config
