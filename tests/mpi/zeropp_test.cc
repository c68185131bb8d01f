// ZeRO++ and node-aware collectives in training (issue 40), under mpirun -n 2 and -n 4, the
// world's hosts given to a copy of it (at -n 4: two hosts of two ranks; at -n 2: two hosts of
// one rank, and one host of two):
//   - hpZ alone (zero.hierarchical_partition) gives plain ZeRO-3's weights bit for bit: the
//     backward gathers the same 16-bit values from inside the host;
//   - dist.hierarchical gives the flat run's weights to fp32 rounding (<= 1e-5 relative; the
//     sums are grouped by host), at every ZeRO stage;
//   - qwZ, qgZ (int8, int4) and all of ZeRO++ together, fp32 and bf16, full training and LoRA
//     (the frozen base gathered as codes, kept in secondary partitions): the losses follow the
//     plain run's (final loss within 1%), the weights stay close (within 10-15%: AdamW);
//   - the estimate at the same world and hosts (`--nodes`) counts what the run measures: the
//     network bytes per step, in all and across hosts, the parameters' memory with hpZ's
//     secondary partitions, the communication buffers (ZeRO++'s staging held from the start);
//     summary.json's own model-state and frozen-base estimates equal the measured memory;
//   - with qwZ the end-of-run digest and the weights exports see are the exact ones (a
//     checkpoint's), not their codes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>

#include "lib/config/load.h"
#include "lib/engine/estimate.h"
#include "lib/engine/trainer.h"
#include "lib/nn/decoder.h"
#include "tests/mpi/mpi_test_main.h"
#include "tests/mpi/train_run.h"

namespace fd {
namespace {

dist::Communicator* g_comm = nullptr;

const char* kRecipe = R"(
model: {n_layer: 2, n_head: 2, d_model: 32, vocab_size: 256, max_seq_len: 32}
data:
  format: text
  train: [/usr/share/games/fortunes/fortunes]
  val_fraction: 0.1
  seq_len: 32
batch: {micro: 2, accumulation: 2}
optimizer: {lr: 3.0e-3, betas: [0.9, 0.95], weight_decay: 0.1, grad_clip: 1.0}
schedule: {name: cosine, warmup_steps: 3, min_lr: 3.0e-4}
zero: {stage: 3}
steps: 16
seed: 11
logging: {every: 100, eval_batches: 1, sample_tokens: 0}
checkpoint: {at_end: false}
)";

config::Recipe recipe(std::vector<std::string> overrides) {
  config::LoadResult r = config::try_parse_recipe(kRecipe, "zeropp_test.yaml", overrides);
  EXPECT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  return r.recipe;
}

// The world's copy on `hosts` hosts of consecutive ranks.
std::unique_ptr<dist::Communicator> on_hosts(int hosts) {
  std::unique_ptr<dist::Communicator> c = g_comm->split(dist::SplitPlan::whole(g_comm->size()));
  std::vector<int> nodes;
  for (int r = 0; r < c->size(); ++r) nodes.push_back(r / (c->size() / hosts));
  c->set_nodes(nodes, {"hostA", "hostB", "hostC", "hostD"});
  return c;
}

using Result = mpi_testing::TrainResult;
Result train(const config::Recipe& r, dist::Communicator& comm, const std::string& name,
             std::shared_ptr<HostLink> offload_link = nullptr) {
  return mpi_testing::train_run(r, comm, name, std::move(offload_link));
}

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d += (double(a[i]) - double(b[i])) * (double(a[i]) - double(b[i]));
    n += double(b[i]) * double(b[i]);
  }
  return std::sqrt(d / n);
}

std::vector<int> host_counts() {
  const int n = g_comm->size();
  return n == 4 ? std::vector<int>{2} : std::vector<int>{2, 1};
}

TEST(ZeroPlusPlus, HierarchicalPartitionAloneIsPlainZeroThreeBitForBit) {
  for (int hosts : host_counts()) {
    auto comm = on_hosts(hosts);
    for (const char* precision : {"fp32", "bf16"}) {
      Result plain = train(recipe({std::string("precision=") + precision}), *comm, "plain");
      Result hpz =
          train(recipe({std::string("precision=") + precision, "zero.hierarchical_partition=true"}),
                *comm, "hpz");
      ASSERT_EQ(plain.weights.size(), hpz.weights.size());
      EXPECT_TRUE(plain.weights == hpz.weights) << precision << " hosts " << hosts;
      EXPECT_EQ(plain.summary["weights_sha256"], hpz.summary["weights_sha256"]);
      // Backward gathers stay inside the host: fewer bytes across.
      if (hosts == 2 && comm->size() == 4) {
        EXPECT_LT(hpz.summary["network"]["inter_node_bytes_per_step"].get<int64_t>(),
                  plain.summary["network"]["inter_node_bytes_per_step"].get<int64_t>());
      }
    }
  }
}

TEST(ZeroPlusPlus, HierarchicalCollectivesGiveTheFlatWeightsToRounding) {
  for (int hosts : host_counts()) {
    auto comm = on_hosts(hosts);
    for (int stage = 0; stage <= 3; ++stage) {
      const std::string st = "zero.stage=" + std::to_string(stage);
      Result flat = train(recipe({st}), *comm, "flat");
      Result hier = train(recipe({st, "dist.hierarchical=true"}), *comm, "hier");
      const double d = rel_diff(hier.weights, flat.weights);
      if (g_comm->rank() == 0)
        std::printf("hosts %d stage %d: hierarchical vs flat weights, relative %.3g\n", hosts,
                    stage, d);
      EXPECT_LE(d, 1e-5) << "stage " << stage;
      EXPECT_LE(hier.summary["network"]["inter_node_bytes_per_step"].get<int64_t>(),
                flat.summary["network"]["inter_node_bytes_per_step"].get<int64_t>());
    }
  }
}

TEST(ZeroPlusPlus, QuantizedRunsFollowThePlainRun) {
  struct Case {
    std::vector<std::string> set;
    double weights;  // bound on the weights' relative distance from the plain run's
  };
  // AdamW turns a gradient's small rounding into a step of about lr wherever the true gradient
  // is tiny against its block's largest (the code rounds it to 0 or one step), so the weights
  // drift a few percent from the plain run's in 16 steps at lr 3e-3 (measured 2-6%) while the
  // loss does not (measured within 0.4%); a wrong chunk, block or scale would break both.
  const std::vector<Case> cases = {
      {{"zero.quantized_weights=true"}, 0.1},
      {{"zero.quantized_gradients=int8"}, 0.1},
      {{"zero.quantized_gradients=int4"}, 0.15},
      {{"zero.quantized_weights=true", "zero.hierarchical_partition=true",
        "zero.quantized_gradients=int4", "dist.hierarchical=true"},
       0.15},
  };
  for (int hosts : host_counts()) {
    auto comm = on_hosts(hosts);
    for (const char* precision : {"fp32", "bf16"}) {
      const std::string p = std::string("precision=") + precision;
      Result plain = train(recipe({p}), *comm, "plain");
      const double plain_loss = plain.summary["final_loss"];
      for (const Case& c : cases) {
        std::vector<std::string> set = c.set;
        set.push_back(p);
        Result q = train(recipe(set), *comm, "q");
        const double loss = q.summary["final_loss"];
        const double d = rel_diff(q.weights, plain.weights);
        std::string what;
        for (const std::string& s : set) what += s + " ";
        if (g_comm->rank() == 0)
          std::printf("hosts %d %s: final loss %.5f vs %.5f, weights %.3g relative\n", hosts,
                      what.c_str(), loss, plain_loss, d);
        EXPECT_NEAR(loss, plain_loss, 0.01 * plain_loss) << what;
        EXPECT_LE(d, c.weights) << what;
        EXPECT_GT(d, 0.0) << what << " (the codes must round something)";
      }
    }
  }
}

TEST(ZeroPlusPlus, LoraBaseGatheredAsCodesAndKeptInSecondaryPartitions) {
  for (int hosts : host_counts()) {
    auto comm = on_hosts(hosts);
    const std::vector<std::string> lora = {"lora.r=4", "lora.alpha=8",
                                           "lora.targets=[c_attn, c_fc]", "precision=bf16"};
    Result plain = train(recipe(lora), *comm, "lora_plain");
    std::vector<std::string> hpz = lora;
    hpz.push_back("zero.hierarchical_partition=true");
    Result h = train(recipe(hpz), *comm, "lora_hpz");
    EXPECT_TRUE(h.weights == plain.weights) << "hpZ alone, hosts " << hosts;
    std::vector<std::string> all = hpz;
    all.push_back("zero.quantized_weights=true");
    all.push_back("zero.quantized_gradients=int8");
    Result q = train(recipe(all), *comm, "lora_q");
    const double plain_loss = plain.summary["final_loss"];
    EXPECT_NEAR(q.summary["final_loss"].get<double>(), plain_loss, 0.02 * plain_loss);
    EXPECT_GT(rel_diff(q.weights, plain.weights), 0.0);
  }
}

TEST(ZeroPlusPlus, FullModelGathersAreOfTheExactWeightsNotTheirCodes) {
  // One step at a learning rate too small to move any weight but those initialised to zero
  // (which move by about 1e-30): the weights with_full_model hands out (what the end-of-run
  // digest, exports and samples read) must be the plain run's to 1e-20; int8 codes of them
  // would be off by up to 0.4% of each block's largest (1e-4 here).
  auto comm = on_hosts(host_counts()[0]);
  const std::vector<std::string> set = {"steps=1", "optimizer.lr=1.0e-30", "schedule.min_lr=0"};
  Result plain = train(recipe(set), *comm, "digest_plain");
  std::vector<std::string> q = set;
  q.push_back("zero.quantized_weights=true");
  q.push_back("zero.hierarchical_partition=true");
  Result codes = train(recipe(q), *comm, "digest_qwz");
  ASSERT_EQ(codes.weights.size(), plain.weights.size());
  double worst = 0;
  for (size_t i = 0; i < plain.weights.size(); ++i)
    worst = std::max(worst, std::fabs(double(codes.weights[i]) - double(plain.weights[i])));
  EXPECT_LE(worst, 1e-20);
}

TEST(ZeroPlusPlus, TheEstimateCountsWhatTheRunMeasures) {
  const std::vector<std::vector<std::string>> cases = {
      {},
      {"dist.hierarchical=true"},
      {"zero.hierarchical_partition=true"},
      {"zero.quantized_weights=true", "precision=bf16"},
      {"zero.quantized_gradients=int4", "precision=bf16"},
      {"zero.quantized_weights=true", "zero.hierarchical_partition=true",
       "zero.quantized_gradients=int8", "dist.hierarchical=true"},
      {"zero.hierarchical_partition=true", "lora.r=4", "lora.alpha=8", "lora.targets=[c_attn]"},
  };
  for (int hosts : host_counts()) {
    for (const std::vector<std::string>& set : cases) {
      // A communicator of the run's own: MPI keeps a 16-bit run's staging on the communicator
      // its ZeRO engine reduces on, for good (as in a real run, one per process).
      auto comm = on_hosts(hosts);
      const config::Recipe r = recipe(set);
      Result res = train(r, *comm, "est");
      const engine::Estimate e = engine::estimate(r, comm->size(), hosts);
      const engine::StageEstimate& s = e.stages[3];
      std::string what = "hosts " + std::to_string(hosts) + ": ";
      for (const std::string& x : set) what += x + " ";
      const nlohmann::json& net = res.summary["network"];
      EXPECT_EQ(net["bytes_per_step"].get<int64_t>(), s.network_bytes_per_step) << what;
      EXPECT_EQ(net["inter_node_bytes_per_step"].get<int64_t>(), s.inter_node_bytes_per_step)
          << what;
      EXPECT_EQ(res.summary["comm_bytes_per_step"].get<int64_t>(), s.comm_bytes_per_step) << what;
      const nlohmann::json& mem = res.summary["memory"];
      EXPECT_EQ(mem["params"].get<int64_t>(), s.model_states.params) << what;
      EXPECT_EQ(mem["frozen"].get<int64_t>(), s.frozen) << what;
      EXPECT_EQ(mem["comm"].get<int64_t>(), s.comm_buffers) << what;
      // summary.json's own accounts of what the run should hold (hpZ's partitions included).
      EXPECT_EQ(res.summary["model_state_bytes_estimate"]["params"].get<int64_t>(),
                mem["params"].get<int64_t>())
          << what;
      EXPECT_EQ(res.summary["frozen_bytes_estimate"].get<int64_t>(), mem["frozen"].get<int64_t>())
          << what;
      if (r.zero.hierarchical_partition) {
        EXPECT_GT(s.hpz_secondary, 0) << what;
      } else {
        EXPECT_EQ(s.hpz_secondary, 0) << what;
      }
    }
  }
}

}  // namespace
}  // namespace fd

int main(int argc, char** argv) {
  return fd::dist::testing::run_mpi_tests(argc, argv, &fd::g_comm);
}
