// Pipeline parallelism under mpirun -n 2 and -n 4 (docs/PIPELINE.md): a run
// of P stages x D replicas ends with the weights_sha256 and loss of the same
// run without a pipeline at world D, bit for bit:
//   -n 2: P = 2 x D = 1 against world 1;
//   -n 4: P = 4 x D = 1 against world 1, and P = 2 x D = 2 against world 2;
// for GPT-2 (tied head: its embedding gradient handed from the last stage to
// the first, the updated matrix back) and a Llama (untied), fp32, bf16 and fp16,
// both schedules, ZeRO stages 0-2, with and without activation checkpointing,
// 4 micro-batches per step. At -n 4 also T=2 x P=2 (tensor parallelism inside
// the stages) and S=2 x P=2 (Ulysses) against the one-rank run to 1e-5, and
// their estimate per rank.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "lib/config/load.h"
#include "lib/engine/estimate.h"
#include "lib/engine/trainer.h"
#include "tests/mpi/mpi_test_main.h"

namespace fd {
namespace {

dist::Communicator* g_comm = nullptr;

const char* kRecipe = R"(
model: {n_layer: 4, n_head: 2, d_model: 32, vocab_size: 256, max_seq_len: 32}
data:
  format: text
  train: [/usr/share/games/fortunes/fortunes]
  val_fraction: 0.1
  seq_len: 32
batch: {micro: 2, accumulation: 4}
optimizer: {lr: 3.0e-3, betas: [0.9, 0.95], weight_decay: 0.1, grad_clip: 1.0}
schedule: {name: cosine, warmup_steps: 3, min_lr: 3.0e-4}
steps: 10
seed: 5
logging: {every: 100, eval_batches: 1, sample_tokens: 0}
checkpoint: {at_end: false}
)";

const char* kLlama =
    "model={arch: llama, n_layer: 4, n_head: 4, n_kv_head: 1, d_model: 32, d_ff: 48, "
    "vocab_size: 256, max_seq_len: 32, rope_theta: 500000}";

config::Recipe recipe(const std::vector<std::string>& overrides) {
  config::LoadResult r = config::try_parse_recipe(kRecipe, "pipeline_test.yaml", overrides);
  EXPECT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  return r.recipe;
}

struct Run {  // what a run ended with
  std::string sha;
  double loss = 0.0, eval_loss = 0.0;
  nlohmann::json summary;
};

// Trains `r` on `comm` in a run directory of this process's own.
Run train(const config::Recipe& r, dist::Communicator& comm, const std::string& name) {
  engine::TrainOptions o;
  o.run_dir = (std::filesystem::temp_directory_path() /
               ("fd_pipeline_test_" + name + "_" + std::to_string(::getpid())))
                  .string();
  o.overwrite = true;
  o.progress = false;
  o.print_sample = false;
  Run out;
  {
    engine::Trainer t(r, o, comm);
    const nlohmann::json s = t.run();
    out.sha = s["weights_sha256"];
    out.loss = s["final_loss"];
    out.eval_loss = s["eval_loss"];
    out.summary = s;
  }
  std::error_code ec;
  std::filesystem::remove_all(o.run_dir, ec);
  return out;
}

struct Case {
  std::string name;
  std::vector<std::string> overrides;
};

std::vector<Case> cases() {
  return {
      {"gpt2 fp32 1f1b zero1", {"zero.stage=1"}},
      {"gpt2 bf16 1f1b zero2 ckpt",
       {"precision=bf16", "zero.stage=2", "activation_checkpointing.layers=all"}},
      {"gpt2 fp32 gpipe zero0", {"parallel.schedule=gpipe", "zero.stage=0"}},
      // fp16: the loss scale, its overflow checks and skipped steps agree on every stage.
      {"gpt2 fp16 1f1b zero2",
       {"precision=fp16", "zero.stage=2",
        "loss_scale={initial_scale_power: 24, loss_scale_window: 3}"}},
      {"llama bf16 1f1b zero2", {kLlama, "precision=bf16", "zero.stage=2"}},
      // LoRA: the frozen base (the tied embedding among it) split with its stages.
      {"gpt2 bf16 lora 1f1b zero1",
       {"precision=bf16", "zero.stage=1",
        "lora={r: 4, alpha: 8, dropout: 0.1, targets: [c_attn, c_fc]}",
        "activation_checkpointing.layers=all"}},
      {"llama fp32 gpipe zero1 uniform",
       {kLlama, "parallel.schedule=gpipe", "zero.stage=1", "parallel.partition=uniform"}},
      // QLoRA: each stage holds its blocks' base in their 4-bit form.
      {"llama bf16 qlora 1f1b zero2 ckpt",
       {kLlama, "precision=bf16", "zero.stage=2", "lora={r: 4, alpha: 8, targets: [all-linear]}",
        "model.quantize={type: nf4, block_size: 64, double_quant: true}",
        "activation_checkpointing.layers=all"}},
  };
}

// The pipelined run of every case against the same case without a pipeline
// on the replicas' world: `reference` is a communicator of D ranks.
void expect_same_as_unpipelined(int stages, dist::Communicator& reference) {
  for (const Case& c : cases()) {
    std::vector<std::string> o = c.overrides;
    const Run plain = train(recipe(o), reference, "plain");
    o.push_back("parallel.pipeline=" + std::to_string(stages));
    const Run piped = train(recipe(o), *g_comm, "piped");
    if (g_comm->rank() == 0)
      std::printf("%s: P=%d x D=%d %s, loss %.6f; unpipelined %s, loss %.6f\n", c.name.c_str(),
                  stages, g_comm->size() / stages, piped.sha.substr(0, 16).c_str(), piped.loss,
                  plain.sha.substr(0, 16).c_str(), plain.loss);
    EXPECT_EQ(piped.sha, plain.sha) << c.name << " P=" << stages;
    EXPECT_EQ(piped.loss, plain.loss) << c.name;
    EXPECT_EQ(piped.eval_loss, plain.eval_loss) << c.name;
  }
}

TEST(Pipeline, EveryRankAStageIsTheSingleRankRunBitwise) {
  std::unique_ptr<dist::Communicator> alone = g_comm->split(dist::SplitPlan::each(g_comm->size()));
  expect_same_as_unpipelined(g_comm->size(), *alone);
}

TEST(Pipeline, TwoStagesOfTwoReplicasAreTheTwoRankRunBitwise) {
  if (g_comm->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  std::unique_ptr<dist::Communicator> pair = g_comm->split(dist::SplitPlan::by(4, [](int r) {
    return dist::SplitKey{r / 2, r};
  }));
  expect_same_as_unpipelined(2, *pair);
}

// fdtrain estimate's per-stage figures are what each stage's ranks measure:
// parameters, gradients, master weights and optimizer state (the stage's
// segments, the last stage's copy of a tied embedding included),
// activations (the micro-batches its schedule holds at once), communication
// buffers (see below), and the bytes each stage sends its neighbours per step.
TEST(Pipeline, TheEstimateIsWhatEachStageMeasures) {
  const int P = 2;
  for (const char* schedule : {"1f1b", "gpipe", "1f1b qlora"}) {
    std::vector<std::string> o = {
        "precision=bf16", "zero.stage=1", "parallel.pipeline=" + std::to_string(P),
        std::string("parallel.schedule=") +
            std::string(schedule).substr(0, std::string(schedule).find(' '))};
    if (std::string(schedule).ends_with("qlora")) {  // the 4-bit base split with its stages
      o.push_back(kLlama);
      o.push_back("lora={r: 4, alpha: 8, targets: [all-linear]}");
      o.push_back("model.quantize={type: fp4, block_size: 128, double_quant: false}");
    }
    const config::Recipe r = recipe(o);
    const fd::Run run = train(r, *g_comm, "estimate");
    const engine::Estimate e = engine::estimate(r, g_comm->size());
    ASSERT_EQ(int(e.pipeline.per_stage.size()), P);
    const nlohmann::json& per_rank = run.summary["memory_per_rank"];
    const int D = g_comm->size() / P;
    for (int rank = 0; rank < g_comm->size(); ++rank) {
      const engine::StageEstimate& st = e.pipeline.per_stage[size_t(rank / D)];
      const nlohmann::json& m = per_rank[size_t(rank)];
      SCOPED_TRACE(std::string(schedule) + " rank " + std::to_string(rank));
      EXPECT_EQ(m["params"].get<int64_t>(), st.model_states.params);
      EXPECT_EQ(m["grads"].get<int64_t>(), st.model_states.grads);
      EXPECT_EQ(m["master"].get<int64_t>(), st.model_states.master);
      EXPECT_EQ(m["optimizer"].get<int64_t>(), st.model_states.optimizer);
      EXPECT_EQ(m["activations"].get<int64_t>(), st.activations);
      // Communication buffers, with two replicas per stage MPI's fp32 staging
      // of the bf16 reductions included (kept from setup on: keep_staging).
      EXPECT_EQ(m["comm"].get<int64_t>(), st.comm_buffers);
      EXPECT_EQ(m["quantized"].get<int64_t>(), st.quantized);
      EXPECT_EQ(m["frozen"].get<int64_t>(), st.frozen);
    }
    const nlohmann::json& pl = run.summary["pipeline"];
    for (int s = 0; s < P; ++s)
      EXPECT_EQ(pl["p2p_bytes_per_step"][size_t(s)].get<int64_t>(),
                e.pipeline.per_stage[size_t(s)].p2p_bytes_per_step)
          << schedule << " stage " << s;
    if (g_comm->rank() == 0)
      std::printf("%s P=%d: first stage activations %lld, last %lld (measured = estimate)\n",
                  schedule, P, (long long)e.pipeline.per_stage[0].activations,
                  (long long)e.pipeline.per_stage[size_t(P - 1)].activations);
  }
}

// Stages whose ranks split their work (T=2 x P=2 or S=2 x P=2 at -n 4, `layout` the overrides
// beyond parallel.pipeline=2, `kind` its summary.json block): the loss of every case is the
// unpipelined one-rank run's to fp32 rounding (the sums over the tp or sp ranks run in another
// order), and each rank measures what the estimate's stage says: model states, activations,
// communication buffers (tp rank 1's slices are tp rank 0's size: 256 rows split evenly; every
// sp rank holds the same), and the bytes over the tp or sp group per step.
void expect_split_stages_match(const std::vector<Case>& split_cases,
                               const std::vector<std::string>& layout, const std::string& kind) {
  const int P = 2, per_stage = g_comm->size() / P;
  std::unique_ptr<dist::Communicator> alone = g_comm->split(dist::SplitPlan::each(g_comm->size()));
  for (const Case& c : split_cases) {
    std::vector<std::string> o = c.overrides;
    std::vector<std::string> plain_o;
    for (const std::string& v : o)
      if (v != "parallel.sequence_parallel=true") plain_o.push_back(v);
    const fd::Run plain = train(recipe(plain_o), *alone, "split_plain");
    o.push_back("parallel.pipeline=" + std::to_string(P));
    for (const std::string& v : layout) o.push_back(v);
    const config::Recipe r = recipe(o);
    const fd::Run piped = train(r, *g_comm, "split_piped");
    SCOPED_TRACE(c.name + " " + kind);
    const double rel = std::abs(piped.loss - plain.loss) / std::abs(plain.loss);
    const double eval_rel = std::abs(piped.eval_loss - plain.eval_loss) / std::abs(plain.eval_loss);
    if (g_comm->rank() == 0)
      std::printf("%s: %s x P=%d loss %.7f, one rank %.7f (relative %.3g, eval %.3g)\n",
                  c.name.c_str(), layout[0].c_str(), P, piped.loss, plain.loss, rel, eval_rel);
    EXPECT_LE(rel, 1e-5);
    EXPECT_LE(eval_rel, 1e-5);
    EXPECT_EQ(piped.summary[kind]["size"].get<int>(), 2);
    EXPECT_EQ(piped.summary["pipeline"]["stages"].get<int>(), P);
    const engine::Estimate e = engine::estimate(r, g_comm->size());
    ASSERT_EQ(int(e.pipeline.per_stage.size()), P);
    const nlohmann::json& per_rank = piped.summary["memory_per_rank"];
    for (int rank = 0; rank < g_comm->size(); ++rank) {
      const engine::StageEstimate& st = e.pipeline.per_stage[size_t(rank / per_stage)];
      const nlohmann::json& m = per_rank[size_t(rank)];
      SCOPED_TRACE("rank " + std::to_string(rank));
      EXPECT_EQ(m["params"].get<int64_t>(), st.model_states.params);
      EXPECT_EQ(m["grads"].get<int64_t>(), st.model_states.grads);
      EXPECT_EQ(m["master"].get<int64_t>(), st.model_states.master);
      EXPECT_EQ(m["optimizer"].get<int64_t>(), st.model_states.optimizer);
      EXPECT_EQ(m["activations"].get<int64_t>(), st.activations);
      EXPECT_EQ(m["comm"].get<int64_t>(), st.comm_buffers);
    }
    const nlohmann::json& pl = piped.summary["pipeline"];
    for (int s = 0; s < P; ++s)
      EXPECT_EQ(pl["p2p_bytes_per_step"][size_t(s)].get<int64_t>(),
                e.pipeline.per_stage[size_t(s)].p2p_bytes_per_step)
          << " stage " << s;
    const engine::StageEstimate& recipe_stage = e.stages[size_t(e.recipe_stage)];
    EXPECT_EQ(piped.summary[kind]["bytes_per_step"].get<int64_t>(),
              kind == "tensor_parallel" ? recipe_stage.tp_bytes_per_step
                                        : recipe_stage.sp_bytes_per_step);
  }
}

TEST(Pipeline, TensorParallelStagesAreTheOneRankRunAndTheirEstimate) {
  if (g_comm->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  expect_split_stages_match(
      {
          {"gpt2 fp32 1f1b zero1", {"zero.stage=1"}},
          {"gpt2 fp32 gpipe zero2 sp",
           {"parallel.schedule=gpipe", "zero.stage=2", "parallel.sequence_parallel=true"}},
          {"llama fp32 1f1b zero0 ckpt",
           {kLlama, "zero.stage=0", "activation_checkpointing.layers=all"}},
      },
      {"parallel.tensor=2"}, "tensor_parallel");
}

// Ulysses inside the stages (S=2 x P=2 at -n 4): each sp rank's slice of the hidden state
// crosses to the same sp rank of the next stage; the Llama's one kv head is gathered whole.
TEST(Pipeline, UlyssesStagesAreTheOneRankRunAndTheirEstimate) {
  if (g_comm->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  expect_split_stages_match(
      {
          {"gpt2 fp32 1f1b zero1", {"zero.stage=1"}},
          {"llama fp32 gpipe zero2 ckpt",
           {kLlama, "parallel.schedule=gpipe", "zero.stage=2",
            "activation_checkpointing.layers=all"}},
      },
      {"parallel.sequence=2"}, "sequence_parallel");
}

}  // namespace
}  // namespace fd

int main(int argc, char** argv) {
  return fd::dist::testing::run_mpi_tests(argc, argv, &fd::g_comm);
}
