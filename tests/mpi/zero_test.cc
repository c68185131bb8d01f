// ZeRO under mpirun -n 2 and -n 4: the properties docs/ZERO.md promises.
//   - stage equivalence: stages 0-3 give bitwise identical weights after 20
//     steps (fp32), with and without gradient accumulation;
//   - world-size equivalence: world N with micro batch b matches world 1 with
//     micro batch N*b to ||w_N - w_1|| / ||w_1|| <= 1e-5;
//   - memory: measured peak model-state bytes per rank equal the estimate,
//     which for fp32 is 16P, 8P+8P/N, 4P+12P/N, 16P/N (P padded parameters);
//   - communication: 2P(N-1)/N*4 bytes per step for stages 0-2, 3P(N-1)/N*4
//     for stage 3;
//   - ZeRO-3 reads a model directory (model.init_from) straight into each
//     rank's shards: no full parameter buffer during setup, the same values;
//   - zero.reduce_dtype bf16/fp16 (16-bit sums, rank-ordered on MPI): stages
//     still bitwise identical; at world 2 the fp32-staged run's bits.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "lib/ckpt/hf_dir.h"
#include "lib/config/load.h"
#include "lib/dist/local_communicator.h"
#include "lib/engine/assemble.h"
#include "lib/engine/estimate.h"
#include "lib/engine/trainer.h"
#include "lib/engine/weights_io.h"
#include "lib/nn/config/hf_config.h"
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
batch: {micro: 2, accumulation: 1}
optimizer: {lr: 3.0e-3, betas: [0.9, 0.95], weight_decay: 0.1, grad_clip: 1.0}
schedule: {name: cosine, warmup_steps: 3, min_lr: 3.0e-4}
steps: 20
seed: 11
logging: {every: 100, eval_batches: 1, sample_tokens: 0}
checkpoint: {at_end: false}  # each rank has a run directory of its own (run_dir below)
)";

config::Recipe recipe(const std::vector<std::string>& overrides) {
  config::LoadResult r = config::try_parse_recipe(kRecipe, "zero_test.yaml", overrides);
  EXPECT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  return r.recipe;
}

using Result = mpi_testing::TrainResult;
Result train(const config::Recipe& r, dist::Communicator& comm, const std::string& name,
             std::shared_ptr<HostLink> offload_link = nullptr) {
  return mpi_testing::train_run(r, comm, name, std::move(offload_link));
}

// Every rank holds the same string.
void expect_same_on_all_ranks(const std::string& s) {
  uint64_t h = 1469598103934665603ULL;
  for (char c : s) h = (h ^ uint8_t(c)) * 1099511628211ULL;
  std::vector<uint64_t> all(static_cast<size_t>(g_comm->size()));
  g_comm->all_gather(&h, all.data(), 2, DType::kI32);
  for (uint64_t x : all) EXPECT_EQ(x, all[0]) << "differs between ranks: " << s;
}

struct EquivalenceCase {
  int accumulation;
  const char* precision;
  bool lora = false;  // only the adapters train (the base is frozen and, at stage 3, partitioned)
  const char* family = "gpt2";  // gpt2, or a Llama-family model (kLlamaModels)
  // zero.reduce_dtype: the precision sums 16-bit gradients natively (on MPI in
  // rank order, so the stages still agree bitwise); the checkpointed pass
  // then also keeps 4 reductions in flight, which must not change a bit.
  bool native_reduce = false;
  // model.quantize (QLoRA, with lora): the base's block linears in 4 bits, NF4 with double
  // quantization; stage 3 partitions and gathers them in that form.
  bool quantize = false;
};

// Llama-family models of the same size as the GPT-2 above: GQA, RoPE, SwiGLU;
// qwen3 adds per-head q/k norm and a tied head, llama an untied head.
const char* llama_model(const std::string& family) {
  if (family == "qwen3")
    return "model={arch: qwen3, n_layer: 2, n_head: 4, n_kv_head: 2, head_dim: 16, d_model: 32, "
           "d_ff: 48, vocab_size: 256, max_seq_len: 32, tie_embeddings: true}";
  return "model={arch: llama, n_layer: 2, n_head: 4, n_kv_head: 1, d_model: 32, d_ff: 48, "
         "vocab_size: 256, max_seq_len: 32, rope_theta: 500000}";
}

class Zero : public ::testing::TestWithParam<EquivalenceCase> {};

// Stages 0-3, each with and without activation checkpointing of every block:
// eight runs, one weights_sha256.
TEST_P(Zero, StagesAndCheckpointingGiveBitwiseIdenticalWeights) {
  const EquivalenceCase c = GetParam();
  std::string first;
  for (const char* ckpt : {"none", "all"}) {
    for (int stage = 0; stage <= 3; ++stage) {
      std::vector<std::string> o = {"zero.stage=" + std::to_string(stage),
                                    "batch.accumulation=" + std::to_string(c.accumulation),
                                    std::string("precision=") + c.precision,
                                    std::string("activation_checkpointing.layers=") + ckpt};
      if (c.native_reduce) {
        o.push_back(std::string("zero.reduce_dtype=") + c.precision);
        if (std::string(ckpt) == "all") o.push_back("zero.reductions_in_flight=4");
      }
      const std::string family = c.family;
      if (family != "gpt2") o.push_back(llama_model(family));
      if (c.lora)
        o.push_back(
            family == "gpt2"
                ? "lora={r: 4, alpha: 8, dropout: 0.1, targets: [c_attn, c_fc]}"
                : "lora={r: 4, alpha: 8, dropout: 0.1, targets: [q_proj, v_proj, down_proj]}");
      if (c.quantize) o.push_back("model.quantize={type: nf4, block_size: 64, double_quant: true}");
      config::Recipe r = recipe(o);
      Result res = train(r, *g_comm, "stages");
      std::string digest = res.summary["weights_sha256"];
      if (g_comm->rank() == 0)
        std::printf(
            "world %d, %s%s, accumulation %d, checkpointing %s, stage %d: weights_sha256 "
            "%s, loss %.6f\n",
            g_comm->size(),
            (std::string(c.family) + " " + c.precision +
             (c.native_reduce ? " (native reductions)" : ""))
                .c_str(),
            c.quantize ? " QLoRA"
            : c.lora   ? " LoRA"
                       : "",
            c.accumulation, ckpt, stage, digest.substr(0, 16).c_str(),
            res.summary["final_loss"].get<double>());
      EXPECT_EQ(res.summary["steps"], 20);
      expect_same_on_all_ranks(digest);
      if (first.empty()) {
        first = digest;
      } else {
        EXPECT_EQ(digest, first) << "stage " << stage << ", checkpointing " << ckpt;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, Zero,
                         ::testing::Values(EquivalenceCase{1, "fp32"}, EquivalenceCase{3, "fp32"},
                                           EquivalenceCase{1, "bf16"}, EquivalenceCase{2, "bf16"},
                                           EquivalenceCase{1, "fp16"},
                                           EquivalenceCase{1, "fp32", true},
                                           EquivalenceCase{2, "bf16", true},
                                           EquivalenceCase{1, "bf16", false, "qwen3"},
                                           EquivalenceCase{2, "fp32", false, "llama"},
                                           EquivalenceCase{1, "fp16", true, "llama"},
                                           EquivalenceCase{2, "bf16", false, "gpt2", true},
                                           EquivalenceCase{1, "fp16", false, "gpt2", true},
                                           EquivalenceCase{2, "bf16", true, "llama", false, true},
                                           EquivalenceCase{1, "fp32", true, "gpt2", false, true}));

// zero.reduce_dtype bf16 against fp32 staging, the same run otherwise: at
// world 2 each element's sum is one addition and one rounding either way, so
// the weights are the same bits; at world 4 the 16-bit partial sums round
// where fp32 does not, and the weights differ (the mode is in effect).
TEST(ZeroReduceDtype, NativeEqualsFp32StagingAtWorldTwoOnly) {
  std::string digest[2];
  for (int native = 0; native < 2; ++native) {
    std::vector<std::string> o = {"zero.stage=2", "batch.accumulation=2", "precision=bf16"};
    if (native) o.push_back("zero.reduce_dtype=bf16");
    digest[native] = train(recipe(o), *g_comm, "reduce_dtype").summary["weights_sha256"];
    expect_same_on_all_ranks(digest[native]);
  }
  if (g_comm->size() == 2) {
    EXPECT_EQ(digest[1], digest[0]);
  } else if (g_comm->size() >= 4) {
    EXPECT_NE(digest[1], digest[0]);
  }
}

// A directory every rank of this job names alike (rank 0's pid), made by rank 0.
std::string shared_dir(const std::string& name) {
  int64_t pid = ::getpid();
  std::vector<int64_t> pids(static_cast<size_t>(g_comm->size()));
  g_comm->all_gather(&pid, pids.data(), 2, DType::kI32);
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("fd_zero_test_" + name + "_" + std::to_string(pids[0])))
                              .string();
  if (g_comm->rank() == 0) std::filesystem::create_directories(dir);
  g_comm->barrier();
  return dir;
}

// ZeRO-Infinity's NVMe tier: the optimizer state in a file per rank (and at
// stage 3 the parameter partitions too), streamed through 1 MiB of buffers
// (several chunks per segment, chunk edges inside parameters), gives the
// weights of the in-memory optimizer bitwise, at every stage, with and without
// activation checkpointing, fp32 and bf16, and with LoRA; the files are gone
// when the runs end.
TEST(ZeroOffload, NvmeOptimizerStateGivesBitwiseIdenticalWeights) {
  const std::string dir = shared_dir("offload_state");
  struct Case {
    const char* precision;
    int accumulation;
    bool lora;
    bool quantize = false;  // QLoRA: the adapters' optimizer state offloaded over a 4-bit base
  };
  for (const Case& c : {Case{"fp32", 1, false}, Case{"bf16", 2, false}, Case{"bf16", 1, true},
                        Case{"bf16", 1, true, true}}) {
    std::string reference;
    for (const char* ckpt : {"none", "all"}) {
      for (int stage = 0; stage <= 4; ++stage) {  // 4: stage 3 with the parameters offloaded too
        if (stage == 4 && c.quantize) continue;   // a 4-bit base is not offloaded (refused)
        for (bool offload : {false, true}) {
          if (!offload && !reference.empty()) continue;  // one in-memory run per case
          // d_model 96: a block's ~110K elements take 3-4 chunks of the 1 MiB buffers.
          std::vector<std::string> o = {"zero.stage=" + std::to_string(std::min(stage, 3)),
                                        "batch.accumulation=" + std::to_string(c.accumulation),
                                        std::string("precision=") + c.precision,
                                        std::string("activation_checkpointing.layers=") + ckpt,
                                        "model.d_model=96"};
          if (c.lora) o.push_back("lora={r: 4, alpha: 8, targets: [c_attn, c_fc]}");
          if (c.quantize) o.push_back("model.quantize={type: nf4}");
          if (offload) {
            o.push_back("zero.offload_optimizer={device: nvme, path: " + dir + ", buffer_mib: 1}");
            if (stage == 4) o.push_back("zero.offload_params={device: nvme}");
          }
          Result res = train(recipe(o), *g_comm, "offload");
          const std::string digest = res.summary["weights_sha256"];
          if (g_comm->rank() == 0)
            std::printf("world %d %s%s stage %d checkpointing %s offload %s: %s\n", g_comm->size(),
                        c.precision,
                        c.quantize ? " QLoRA"
                        : c.lora   ? " LoRA"
                                   : "",
                        std::min(stage, 3), ckpt,
                        !offload     ? "none"
                        : stage == 4 ? "nvme, params too"
                                     : "nvme",
                        digest.substr(0, 16).c_str());
          expect_same_on_all_ranks(digest);
          if (reference.empty()) {
            reference = digest;
          } else {
            EXPECT_EQ(digest, reference) << c.precision << " stage " << stage << " " << ckpt;
          }
        }
      }
    }
  }
  g_comm->barrier();
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "state files left in " << dir;
  g_comm->barrier();
  if (g_comm->rank() == 0) std::filesystem::remove_all(dir);
}

// The GPU's host tier, its ordering exercised here: the optimizer reaches
// the parameters and gradients (CPU tensors standing in for the GPU's)
// through a link whose copies complete on a worker thread after a delay, as
// a GPU's transfer stream does. A gradient read before its download, a
// gather before an upload, or an upload overwritten too early changes the
// weights; every stage must give the in-memory run's bits.
TEST(ZeroOffload, ThroughAHostLinkGivesBitwiseIdenticalWeights) {
  const std::string dir = shared_dir("offload_link");
  struct Case {
    const char* precision;
    int accumulation;
    bool lora;
  };
  for (const Case& c : {Case{"fp32", 1, false}, Case{"bf16", 2, false}, Case{"bf16", 1, true}}) {
    std::string reference;
    for (int stage = -1; stage <= 3; ++stage) {  // -1: the in-memory reference (stage 0)
      std::vector<std::string> o = {"zero.stage=" + std::to_string(std::max(stage, 0)),
                                    "batch.accumulation=" + std::to_string(c.accumulation),
                                    std::string("precision=") + c.precision,
                                    "activation_checkpointing.layers=all", "model.d_model=96"};
      if (c.lora) o.push_back("lora={r: 4, alpha: 8, targets: [c_attn, c_fc]}");
      std::shared_ptr<HostLink> link;
      if (stage >= 0) {
        o.push_back("zero.offload_optimizer={device: nvme, path: " + dir + ", buffer_mib: 1}");
        link = make_thread_link(64, std::chrono::milliseconds(3));
      }
      Result res = train(recipe(o), *g_comm, "offload_link_run", link);
      const std::string digest = res.summary["weights_sha256"];
      if (g_comm->rank() == 0)
        std::printf("world %d %s%s stage %d %s: %s\n", g_comm->size(), c.precision,
                    c.lora ? " LoRA" : "", std::max(stage, 0),
                    stage < 0 ? "in memory" : "through a host link", digest.substr(0, 16).c_str());
      expect_same_on_all_ranks(digest);
      if (stage >= 0) {
        EXPECT_GT(res.summary["offload"]["optimizer_pinned_bytes"].get<int64_t>(), 0);
        EXPECT_EQ(digest, reference) << c.precision << " stage " << stage;
      } else {
        reference = digest;
      }
    }
  }
  g_comm->barrier();
  if (g_comm->rank() == 0) std::filesystem::remove_all(dir);
}

// A Hugging Face directory of a random Llama model (sharded: several
// model-0000N-of-0000M.safetensors and an index), written by rank 0 into a
// directory every rank names alike; returns its path.
std::string llama_hf_dir(const config::Recipe& r) {
  int64_t pid = ::getpid();
  std::vector<int64_t> pids(static_cast<size_t>(g_comm->size()));
  g_comm->all_gather(&pid, pids.data(), 2, DType::kI32);
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("fd_zero_test_hf_" + std::to_string(pids[0])))
          .string();
  if (g_comm->rank() == 0) {
    engine::Assembly a = engine::assemble(r, 1);
    std::unique_ptr<nn::Decoder> m = engine::build_model(a);
    m->init_weights(77);  // not the recipe's seed: the file, not the init, must decide
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const nn::Parameter* p : m->parameters()) tensors.emplace_back(p->name, p->value);
    std::filesystem::create_directories(dir);
    ckpt::write_hf_weights(dir, tensors, {{"format", "pt"}}, 24 * 1024);
    std::ofstream(std::filesystem::path(dir) / "config.json") << nn::hf_config_json(a.model);
  }
  g_comm->barrier();
  return dir;
}

// Every parameter (the frozen base, then the trainable ones) of `model`, as fp32 values.
std::vector<float> all_values(const nn::Decoder& model) {
  std::vector<float> out;
  std::vector<const nn::Parameter*> ps = model.frozen_parameters();
  for (const nn::Parameter* p : model.parameters()) ps.push_back(p);
  for (const nn::Parameter* p : ps) {
    std::vector<float> v = p->value.to_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// ZeRO-3 reads a model directory straight into each rank's shards: setting up
// holds no full parameter buffer (the communication category, where ZeRO-3's
// gathered parameters are accounted, does not grow; parameters grow by the
// shards alone), and the gathered parameters equal what a whole read gives,
// bitwise, for a full model and for a LoRA base; training from the directory
// gives the same weights at stages 0 and 3.
TEST(ZeroInitFrom, Stage3ReadsOnlyItsShardOfAModelDirectory) {
  const int64_t n = g_comm->size();
  const std::string model = llama_model("llama");
  const std::string dir = llama_hf_dir(recipe({model}));
  for (const char* precision : {"fp32", "bf16"}) {
    for (bool lora : {false, true}) {
      std::vector<std::string> o = {model, std::string("precision=") + precision,
                                    "model.init_from=" + dir};
      if (lora) o.push_back("lora={r: 4, alpha: 8, targets: [q_proj, down_proj]}");
      const config::Recipe r = recipe(o);
      // What a whole read gives, on one rank, replicated.
      engine::Assembly whole_a = engine::assemble(r, 1);
      std::unique_ptr<nn::Decoder> whole = engine::build_model(whole_a);
      engine::load_weights(dir, *whole, "whole");
      const std::vector<float> expected = all_values(*whole);
      whole.reset();

      for (bool deferred : {true, false}) {
        config::Recipe r3 = recipe([&] {
          std::vector<std::string> v = o;
          v.push_back("zero.stage=3");
          return v;
        }());
        engine::Assembly a = engine::assemble(r3, int(n));
        MemoryAccountant& acc = MemoryAccountant::global();
        acc.reset_peaks();
        const int64_t comm0 = acc.current(MemCategory::kComm);
        const int64_t params0 =
            acc.current(MemCategory::kParams) + acc.current(MemCategory::kFrozen);
        std::unique_ptr<nn::Decoder> m;
        std::unique_ptr<zero::ZeroEngine> e;
        if (deferred) {  // the trainer's road
          m = engine::build_model(a, engine::Init::kDeferred);
          engine::InitialWeights init;
          init.seed = a.seed;
          init.init_from = dir;
          e = std::make_unique<zero::ZeroEngine>(*m, *g_comm, a.zero,
                                                 engine::initial_weights(*m, init));
        } else {  // the full buffers first, then ZeRO-3 shards them
          m = engine::build_model(a);
          engine::load_weights(dir, *m, "full");
          e = std::make_unique<zero::ZeroEngine>(*m, *g_comm, a.zero);
        }
        int64_t full = 0;  // the whole model's parameter bytes, as the groups are padded
        for (const nn::FlatParamGroup* g : m->groups()) full += g->numel() * dtype_size(a.dtype);
        for (const nn::FlatParamGroup* g : m->frozen_groups())
          full += g->numel() * dtype_size(a.dtype);
        const int64_t comm_peak = acc.peak(MemCategory::kComm) - comm0;
        const int64_t params_now =
            acc.current(MemCategory::kParams) + acc.current(MemCategory::kFrozen) - params0;
        if (g_comm->rank() == 0)
          std::printf(
              "world %lld %s%s, %s: setup peak of gathered/full parameter buffers %lld "
              "bytes, shards held %lld, whole model %lld\n",
              (long long)n, precision, lora ? " LoRA" : "",
              deferred ? "read into shards" : "full buffers first", (long long)comm_peak,
              (long long)params_now, (long long)full);
        EXPECT_EQ(params_now * n, full) << "every rank holds 1/N of the padded model";
        if (deferred) {
          EXPECT_EQ(comm_peak, 0) << precision << (lora ? " LoRA" : "");
          EXPECT_EQ(acc.peak(MemCategory::kParams) + acc.peak(MemCategory::kFrozen) - params0,
                    params_now)
              << "the shards are all the parameters setup ever held";
        } else {
          EXPECT_GE(comm_peak, full) << "the measurement sees full buffers when they exist";
        }
        std::vector<float> got;
        e->with_full_parameters([&] { got = all_values(*m); });
        EXPECT_EQ(got, expected) << precision << (lora ? " LoRA" : "") << " deferred " << deferred;
      }
    }
  }
  // Training from the directory: stages 0 and 3 agree bitwise (bf16, LoRA).
  std::string first;
  for (int stage : {0, 3}) {
    Result res = train(recipe({model, "precision=bf16", "model.init_from=" + dir, "steps=3",
                               "zero.stage=" + std::to_string(stage),
                               "lora={r: 4, alpha: 8, targets: [q_proj, down_proj]}"}),
                       *g_comm, "init_from");
    const std::string digest = res.summary["weights_sha256"];
    expect_same_on_all_ranks(digest);
    if (first.empty()) first = digest;
    EXPECT_EQ(digest, first) << "stage " << stage;
  }
  g_comm->barrier();
  if (g_comm->rank() == 0) std::filesystem::remove_all(dir);
}

TEST(ZeroWorld, MatchesWorldOneWithTheSameGlobalBatch) {
  const int n = g_comm->size();
  for (int stage : {0, 3}) {
    Result mine = train(recipe({"zero.stage=" + std::to_string(stage)}), *g_comm, "world");
    // The reference: this process alone, with micro batch n*2 (the same sequences).
    dist::LocalCommunicator local;
    Result ref = train(recipe({"batch.micro=" + std::to_string(2 * n)}), local, "world_ref");
    ASSERT_EQ(mine.weights.size(), ref.weights.size());
    double num = 0, den = 0, mx = 0;
    for (size_t i = 0; i < ref.weights.size(); ++i) {
      double d = double(mine.weights[i]) - double(ref.weights[i]);
      num += d * d;
      den += double(ref.weights[i]) * ref.weights[i];
      mx = std::max(mx, std::fabs(d));
    }
    const double rel = std::sqrt(num / den);
    if (g_comm->rank() == 0)
      std::printf(
          "world %d stage %d vs world 1 (same global batch, 20 steps): "
          "||w_N - w_1|| / ||w_1|| = %.3e, max |diff| = %.3e\n",
          n, stage, rel, mx);
    EXPECT_LE(rel, 1e-5);
  }
}

// fp32: params 4P, grads 4P, Adam m+v 8P, sharded by stage (the parameters are
// the master weights). bf16: the ZeRO paper's mixed-precision figures exactly.
class ZeroMemory : public ::testing::TestWithParam<const char*> {};

TEST_P(ZeroMemory, ModelStatesEqualTheEstimateAndThePaperFormulas) {
  const std::string precision = GetParam();
  const int64_t n = g_comm->size();
  for (int stage = 0; stage <= 3; ++stage) {
    config::Recipe r =
        recipe({"zero.stage=" + std::to_string(stage), "steps=2", "precision=" + precision});
    Result res = train(r, *g_comm, "memory");
    const auto& mem = res.summary["memory"];
    const auto& est = res.summary["model_state_bytes_estimate"];
    const int64_t P = res.summary["padded_params"];
    const int64_t measured = mem["params"].get<int64_t>() + mem["grads"].get<int64_t>() +
                             mem["master"].get<int64_t>() + mem["optimizer"].get<int64_t>();
    const int64_t fp32[] = {16 * P, 8 * P + 8 * P / n, 4 * P + 12 * P / n, 16 * P / n};
    const int64_t paper[] = {16 * P, 4 * P + 12 * P / n, 2 * P + 14 * P / n, 16 * P / n};
    const int64_t formula = precision == "fp32" ? fp32[stage] : paper[stage];
    if (g_comm->rank() == 0)
      std::printf(
          "world %lld %s stage %d: P = %lld; per-rank model states measured %lld, "
          "estimate %lld, formula %lld bytes (params %lld, grads %lld, master %lld, "
          "optimizer %lld)\n",
          (long long)n, precision.c_str(), stage, (long long)P, (long long)measured,
          (long long)est["total"].get<int64_t>(), (long long)formula,
          (long long)mem["params"].get<int64_t>(), (long long)mem["grads"].get<int64_t>(),
          (long long)mem["master"].get<int64_t>(), (long long)mem["optimizer"].get<int64_t>());
    EXPECT_EQ(measured, est["total"].get<int64_t>()) << "stage " << stage;
    EXPECT_EQ(measured, formula) << "stage " << stage;
    for (const char* k : {"params", "grads", "master", "optimizer"}) EXPECT_EQ(mem[k], est[k]) << k;
    // Every rank holds the same amount (equal shards).
    for (const auto& row : res.summary["memory_per_rank"]) {
      EXPECT_EQ(row["params"], mem["params"]);
      EXPECT_EQ(row["optimizer"], mem["optimizer"]);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Precision, ZeroMemory, ::testing::Values("fp32", "bf16"));

// LoRA: gradients, master weights and optimizer state exist for the adapters
// only (P = the padded adapter parameters); the frozen base costs its compute
// dtype once per rank, or a 1/N shard under stage 3.
TEST(ZeroMemoryLora, OnlyAdaptersHaveTrainingState) {
  const int64_t n = g_comm->size();
  for (const char* precision : {"fp32", "bf16"}) {
    for (int stage = 0; stage <= 3; ++stage) {
      Result res = train(
          recipe({"zero.stage=" + std::to_string(stage), "steps=2",
                  std::string("precision=") + precision, "lora={r: 4, targets: [c_attn, c_proj]}"}),
          *g_comm, "memory_lora");
      const auto& mem = res.summary["memory"];
      const auto& est = res.summary["model_state_bytes_estimate"];
      const int64_t P = res.summary["padded_params"];
      const int64_t measured = mem["params"].get<int64_t>() + mem["grads"].get<int64_t>() +
                               mem["master"].get<int64_t>() + mem["optimizer"].get<int64_t>();
      if (g_comm->rank() == 0)
        std::printf(
            "world %lld LoRA %s stage %d: adapters P = %lld (%lld trainable); model "
            "states %lld (estimate %lld); frozen base %lld (estimate %lld)\n",
            (long long)n, precision, stage, (long long)P,
            (long long)res.summary["num_params"].get<int64_t>(), (long long)measured,
            (long long)est["total"].get<int64_t>(), (long long)mem["frozen"].get<int64_t>(),
            (long long)res.summary["frozen_bytes_estimate"].get<int64_t>());
      EXPECT_EQ(measured, est["total"].get<int64_t>()) << precision << " stage " << stage;
      EXPECT_EQ(mem["frozen"], res.summary["frozen_bytes_estimate"]) << precision << " " << stage;
      EXPECT_LT(P, res.summary["frozen_params"].get<int64_t>() / 4);
    }
  }
}

// QLoRA: the base's blocks are held in their 4-bit form at every stage (a 1/N shard at stage 3,
// gathered per segment into comm buffers), in their own category: memory.quantized is those
// bytes plus the 4-bit matmul's scratch, memory.frozen the embedding and final segments in the
// compute dtype; both equal `fdtrain estimate`'s figures for the stage.
TEST(ZeroMemoryQlora, TheBaseIsHeldInFourBitsAndAsEstimated) {
  const int64_t n = g_comm->size();
  for (int stage = 0; stage <= 3; ++stage) {
    const config::Recipe r =
        recipe({"zero.stage=" + std::to_string(stage), "steps=2", "precision=bf16",
                llama_model("llama"), "lora={r: 4, alpha: 8, targets: [all-linear]}",
                "model.quantize={type: nf4, block_size: 64, double_quant: true}"});
    Result res = train(r, *g_comm, "memory_qlora");
    const auto& mem = res.summary["memory"];
    const int64_t base = res.summary["quantized_base_bytes"];
    const engine::Estimate e = engine::estimate(r, int(n));
    const engine::StageEstimate& st = e.stages[size_t(stage)];
    if (g_comm->rank() == 0)
      std::printf(
          "world %lld QLoRA bf16 stage %d: 4-bit base %lld bytes/rank (of %lld), memory "
          "quantized %lld (estimate %lld), frozen %lld (estimate %lld)\n",
          (long long)n, stage, (long long)base, (long long)e.quantized_bytes,
          (long long)mem["quantized"].get<int64_t>(), (long long)st.quantized,
          (long long)mem["frozen"].get<int64_t>(), (long long)st.frozen);
    EXPECT_EQ(base, stage == 3 ? e.quantized_bytes / n : e.quantized_bytes) << stage;
    EXPECT_GT(mem["quantized"].get<int64_t>(), base) << stage;  // + the dequantization scratch
    EXPECT_EQ(mem["quantized"].get<int64_t>(), st.quantized) << stage;
    EXPECT_EQ(mem["frozen"].get<int64_t>(), st.frozen) << stage;
    EXPECT_EQ(mem["frozen"], res.summary["frozen_bytes_estimate"]) << stage;
    // About a quarter of the blocks' bf16 bytes.
    int64_t bf16 = 0;
    for (const nn::SegmentSpec& s : nn::Decoder::segment_specs(e.model))
      if (s.name.rfind("h.", 0) == 0)
        for (const nn::ParamSpec& p : s.params) bf16 += 2 * p.shape.numel();
    EXPECT_LT(double(e.quantized_bytes), 0.3 * double(bf16));
  }
}

TEST(ZeroComm, BytesPerStepFollowTheRingModel) {
  const int64_t n = g_comm->size();
  for (int stage = 0; stage <= 3; ++stage) {
    Result res = train(recipe({"zero.stage=" + std::to_string(stage), "steps=3"}), *g_comm, "comm");
    const int64_t P = res.summary["padded_params"];
    const int64_t expected = (stage == 3 ? 3 : 2) * P * (n - 1) / n * 4;
    const int64_t measured = res.summary["comm_bytes_per_step"];
    if (g_comm->rank() == 0)
      std::printf("world %lld stage %d: comm bytes per step %lld, expected %lld (%s)\n",
                  (long long)n, stage, (long long)measured, (long long)expected,
                  stage == 3 ? "3P(N-1)/N*4" : "2P(N-1)/N*4");
    EXPECT_EQ(measured, expected) << "stage " << stage;
  }
}

}  // namespace
}  // namespace fd

int main(int argc, char** argv) {
  return fd::dist::testing::run_mpi_tests(argc, argv, &fd::g_comm);
}
