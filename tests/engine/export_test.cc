// `fdtrain ckpt export` as lib/engine does it, reading what only the
// checkpoint's stored recipe says: exports (.safetensors, .h5) load back into
// a fresh model bit for bit and record n_head from the recipe; a LoRA run's
// checkpoint exports as a PEFT adapter (settings from its lora section) or
// merged into its base (model.init_from, checked by SHA-256 and against the
// recipe's model), in-process and through the fdtrain binary.
#include "lib/engine/export.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "lib/ckpt/export.h"
#include "lib/ckpt/lora_base.h"
#include "lib/ckpt/manifest.h"
#include "lib/ckpt/peft.h"
#include "lib/ckpt/shard.h"
#include "lib/config/load.h"
#include "lib/engine/weights_io.h"
#include "lib/nn/decoder.h"
#include "lib/tensor/safetensors.h"
#include "tests/engine/weights_test_util.h"

namespace fd::engine {
namespace {

using ckpt::file_sha256;
using ckpt::kFormatVersion;
using ckpt::LoraSpec;
using ckpt::Manifest;
using ckpt::merge_lora;
using ckpt::ParamLayout;
using ckpt::PeftAdapter;
using ckpt::read_peft_adapter;
using ckpt::SegmentRange;
using ckpt::shard_file_name;
using ckpt::ShardMeta;
using ckpt::write_latest;
using ckpt::write_manifest;
using ckpt::write_shard;
using ckpt::testing::gpt2_base;
using ckpt::testing::kWidth;
using ckpt::testing::Named;
using ckpt::testing::random_lora;
using testing::error_of;
using testing::expect_same_weights;
using testing::run_command;
using testing::same_bytes;
using testing::TempDir;
namespace fs = std::filesystem;

TEST(Export, SafetensorsRoundTripIsBitwise) {
  TempDir tmp;
  auto model = ckpt::testing::make_model(testing::tiny_config(), 2);
  ckpt::testing::write_test_checkpoint(tmp.path("ck"), *model, 2, 5);
  std::string out = tmp.path("model.safetensors");
  std::string summary = export_checkpoint(tmp.path("ck"), out, DType::kF32, false);
  EXPECT_NE(summary.find("exported 28 tensors"), std::string::npos) << summary;
  EXPECT_FALSE(fs::exists(out + ".tmp"));

  SafetensorsFile f = SafetensorsFile::open(out);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("step"), "5");
  EXPECT_EQ(f.metadata().at("n_layer"), "2");
  EXPECT_EQ(f.metadata().at("d_model"), "16");
  EXPECT_EQ(f.metadata().at("vocab_size"), "64");
  EXPECT_EQ(f.metadata().at("max_seq_len"), "16");
  EXPECT_EQ(f.shape("h.0.attn.c_attn.weight"), (Shape{16, 48}));  // Conv1D (in, out)
  EXPECT_EQ(f.dtype("wte.weight"), DType::kF32);
  EXPECT_FALSE(f.contains("lm_head.weight"));

  auto fresh = testing::make_gpt(testing::tiny_config(), /*seed=*/99);
  load_weights(out, *fresh, "");
  expect_same_weights(*model, *fresh);

  // Into a bf16 model: converted with round to nearest even.
  auto bf = std::make_unique<nn::Decoder>(testing::gpt_config(testing::tiny_config()), DType::kBF16);
  load_weights(out, *bf, "");
  for (const testing::TestParam* p : model->parameters())
    EXPECT_TRUE(same_bytes(bf->find(p->name)->value, p->value.to(DType::kBF16))) << p->name;

  // No silent overwrite.
  std::string msg = error_of([&] { export_checkpoint(tmp.path("ck"), out, DType::kF32, false); });
  EXPECT_NE(msg.find("already exists; pass --overwrite"), std::string::npos) << msg;
  EXPECT_NO_THROW(export_checkpoint(tmp.path("ck"), out, DType::kBF16, true));
  EXPECT_EQ(SafetensorsFile::open(out).dtype("wte.weight"), DType::kBF16);
}

TEST(Export, MetadataTakesNHeadFromTheCheckpointsRecipe) {
  TempDir tmp;
  std::ofstream(tmp.path("data.txt")) << "some training text for a valid recipe\n";
  std::string yaml =
      "model: {n_layer: 2, n_head: 2, d_model: 16, vocab_size: 256, max_seq_len: 16}\n"
      "data: {format: text, train: [" +
      tmp.path("data.txt") + "], val_fraction: 0.0, seq_len: 8}\nsteps: 3\n";
  config::LoadResult r = config::try_parse_recipe(yaml, "test recipe");
  ASSERT_TRUE(r.ok()) << (r.errors.empty() ? "" : r.errors[0]);
  testing::TinyConfig c = testing::tiny_config();
  c.vocab_size = 256;
  auto model = ckpt::testing::make_model(c, 1);
  ShardMeta meta = ckpt::testing::test_meta(*model, 1, 0, 2, "fp32");
  meta.recipe_yaml = config::to_yaml(r.recipe);
  fs::create_directories(tmp.path("ck"));
  write_shard(tmp.path("ck/rank_00000.h5"), meta,
              ckpt::testing::test_ranges(*model, 1, 0, DType::kF32));
  Manifest mf;
  mf.step = 2;
  mf.precision = "fp32";
  mf.files = {shard_file_name(0)};
  for (const auto& seg : model->segments()) mf.segments.push_back({seg->name(), seg->numel()});
  write_manifest(tmp.path("ck"), mf);
  export_checkpoint(tmp.path("ck"), tmp.path("m.safetensors"), DType::kF32, false);
  SafetensorsFile f = SafetensorsFile::open(tmp.path("m.safetensors"));
  EXPECT_EQ(f.metadata().at("n_head"), "2");
  EXPECT_EQ(f.metadata().at("vocab_size"), "256");
}

TEST(Export, H5RoundTripIsBitwise) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    TempDir tmp;
    auto model = ckpt::testing::make_model(testing::tiny_config(), 1);
    ckpt::testing::write_test_checkpoint(tmp.path("ck"), *model, 1, 5);
    std::string out = tmp.path("model.h5");
    export_checkpoint(tmp.path("ck"), out, dtype, false);
    auto fresh = std::make_unique<nn::Decoder>(testing::gpt_config(testing::tiny_config()), dtype);
    load_weights(out, *fresh, "");
    for (const testing::TestParam* p : model->parameters())
      EXPECT_TRUE(same_bytes(fresh->find(p->name)->value, p->value.to(dtype))) << p->name;
  }
}

// ---------------------------------------------------------------------------
// Exports from a LoRA run's checkpoint (settings and base from its recipe).

// An llm.c token file of `n` tokens.
void write_tokens(const std::string& path, int n) {
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = 1;
  header[2] = n;
  std::vector<uint16_t> tokens(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) tokens[size_t(i)] = uint16_t(i % 64);
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(header.data()), 1024);
  f.write(reinterpret_cast<const char*>(tokens.data()), std::streamsize(2 * n));
}

// A checkpoint as a LoRA run of the tiny model (2 blocks, C = 16) writes one
// at world size `world`: the layout holds only the adapters, one segment per
// block, the recipe names the base and the lora section, and the shards record
// the base file's SHA-256. `base_layers` other than 2 writes a base that does
// not fit the recipe (an inconsistent checkpoint that records its digest).
struct LoraRun {
  std::string base;    // the base model file (HF names, "transformer." prefix, mask buffers)
  Named base_tensors;  // as HF names without the prefix
  Named lora;
  std::string ckpt;
};

LoraRun write_lora_run(const TempDir& tmp, int world, bool with_lora_section = true,
                       int base_layers = 2) {
  LoraRun run;
  run.base = tmp.path("base.safetensors");
  run.base_tensors = gpt2_base(base_layers, kWidth, 64, 16, 21);
  Named file;
  for (const auto& [n, t] : run.base_tensors) file.emplace_back("transformer." + n, t);
  file.emplace_back("transformer.h.0.attn.bias", Tensor::zeros(Shape{1, 1, 16, 16}));
  file.emplace_back("lm_head.weight", run.base_tensors[0].second);
  write_safetensors(run.base, file);
  write_tokens(tmp.path("train.bin"), 4096);
  std::string recipe = fmt::format(
      "model:\n  n_layer: 2\n  n_head: 2\n  d_model: 16\n  vocab_size: 64\n  max_seq_len: 16\n"
      "  init_from: {}\ndata:\n  format: tokens\n  seq_len: 8\n  train: {}\nsteps: 5\n",
      run.base, tmp.path("train.bin"));
  if (with_lora_section)
    recipe +=
        "lora:\n  r: 2\n  alpha: 3\n  dropout: 0.1\n  targets: [c_attn, c_proj]\n  layers: [1]\n";
  run.lora = random_lora(2, {1}, {"attn.c_attn", "attn.c_proj", "mlp.c_proj"}, 33);

  // One segment "h.1" with the six tensors back to back, padded for `world`.
  std::vector<ParamLayout> layout;
  std::vector<float> flat;
  for (const auto& [n, t] : run.lora) {
    std::vector<int64_t> shape = {t.shape()[0], t.shape()[1]};
    layout.push_back({n, "h.1", int64_t(flat.size()), shape, false});
    std::vector<float> v = t.to_vector();
    flat.insert(flat.end(), v.begin(), v.end());
  }
  while (flat.size() % size_t(world)) flat.push_back(0.0f);
  const int64_t numel = int64_t(flat.size()), share = numel / world;
  Tensor all = Tensor::from_vector(flat, Shape{numel});
  run.ckpt = tmp.path("run/checkpoints/step_00000006");
  fs::create_directories(run.ckpt);
  Manifest mf;
  mf.format_version = kFormatVersion;
  mf.step = 6;
  mf.world_size = world;
  mf.zero_stage = 2;
  mf.precision = "fp32";
  mf.segments.push_back({"h.1", numel});
  for (int r = 0; r < world; ++r) {
    ShardMeta m;
    m.step = 6;
    m.world_size = world;
    m.rank = r;
    m.zero_stage = 2;
    m.precision = "fp32";
    m.recipe_yaml = recipe;
    m.optimizer_step = 6;
    m.seed = 1;
    m.layout = layout;
    m.fdtrain_version = "fdtrain test";
    m.base_sha256 = file_sha256(run.base);
    SegmentRange range{"h.1", numel, r * share, share, {}, {}, {}, {}, {}, {}};
    range.master = all.flat_slice(r * share, share).to(DType::kF32);
    range.exp_avg = Tensor::zeros(Shape{share});
    range.exp_avg_sq = Tensor::zeros(Shape{share});
    write_shard((fs::path(run.ckpt) / shard_file_name(r)).string(), m, {range});
    mf.files.push_back(shard_file_name(r));
  }
  write_manifest(run.ckpt, mf);
  write_latest(tmp.path("run/checkpoints"), 6);
  return run;
}

TEST(LoraExport, AdapterFromACheckpoint) {
  TempDir tmp;
  LoraRun run = write_lora_run(tmp, 2);
  std::string summary =
      export_lora_adapter(tmp.path("run"), tmp.path("adapter"), DType::kF32, false);
  EXPECT_NE(summary.find("6 tensors"), std::string::npos) << summary;
  PeftAdapter a = read_peft_adapter(tmp.path("adapter"));
  EXPECT_EQ(a.spec, (LoraSpec{2, 3.0, 0.1, {"c_attn", "c_proj"}, {1}, run.base}));
  ASSERT_EQ(a.tensors.size(), run.lora.size());
  for (size_t i = 0; i < run.lora.size(); ++i) {
    EXPECT_EQ(a.tensors[i].first, run.lora[i].first);
    EXPECT_TRUE(same_bytes(a.tensors[i].second, run.lora[i].second)) << run.lora[i].first;
  }
  export_lora_adapter(tmp.path("run"), tmp.path("adapter_bf16"), DType::kBF16, false);
  PeftAdapter b = read_peft_adapter(tmp.path("adapter_bf16"));
  for (size_t i = 0; i < run.lora.size(); ++i)
    EXPECT_TRUE(same_bytes(b.tensors[i].second, run.lora[i].second.to(DType::kBF16)));

  std::string msg = error_of(
      [&] { export_lora_adapter(tmp.path("run"), tmp.path("adapter"), DType::kF32, false); });
  EXPECT_NE(msg.find("already exists"), std::string::npos) << msg;
  msg = error_of(
      [&] { export_checkpoint(tmp.path("run"), tmp.path("m.safetensors"), DType::kF32, false); });
  EXPECT_NE(msg.find("--lora-adapter DIR"), std::string::npos) << msg;
}

TEST(LoraExport, MergedModelIsTheBasePlusTheDeltas) {
  for (const char* ext : {".safetensors", ".h5"}) {
    TempDir tmp;
    LoraRun run = write_lora_run(tmp, 3);
    std::string out = tmp.path(std::string("merged") + ext);
    std::string summary = export_merged_lora(tmp.path("run"), out, DType::kF32, false);
    EXPECT_NE(summary.find("merged with the LoRA adapter"), std::string::npos) << summary;
    Named want = merge_lora(run.base_tensors, run.lora, 3.0 / 2.0);

    // Loads into a plain model of the recipe's size, and holds exactly the merge.
    auto model = testing::make_gpt(testing::tiny_config(), 7);
    load_weights(out, *model, "");
    std::map<std::string, Tensor> by_name(want.begin(), want.end());
    ASSERT_EQ(model->parameters().size(), want.size());
    for (const nn::Parameter* p : model->parameters()) {
      ASSERT_TRUE(by_name.count(p->name)) << p->name;
      EXPECT_TRUE(same_bytes(p->value, by_name[p->name])) << p->name;
    }
    if (std::string(ext) == ".safetensors") {
      SafetensorsFile f = SafetensorsFile::open(out);
      EXPECT_EQ(f.names().size(), want.size());  // no mask buffers, no lm_head
      EXPECT_EQ(f.metadata().at("base"), run.base);
      EXPECT_EQ(f.metadata().at("lora"), "r=2 alpha=3 targets=c_attn,c_proj layers=1");
      EXPECT_EQ(f.metadata().at("n_head"), "2");
      EXPECT_FALSE(same_bytes(f.load("h.1.attn.c_attn.weight"), run.base_tensors[16].second));
    }
  }
}

TEST(LoraExport, MergeRefusesABaseThatDoesNotFitTheRecipe) {
  TempDir tmp;
  LoraRun run = write_lora_run(tmp, 1, true, /*base_layers=*/3);  // 3 blocks; the recipe has 2
  std::string msg = error_of(
      [&] { export_merged_lora(tmp.path("run"), tmp.path("m.safetensors"), DType::kF32, false); });
  EXPECT_NE(msg.find("set model.n_layer to 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find(run.base), std::string::npos) << msg;
}

// The adapters are deltas to one file: another one at the base's path is
// refused by its SHA-256, whether its shapes differ or one value does.
TEST(LoraExport, MergeRefusesAnotherBaseFile) {
  TempDir tmp;
  LoraRun run = write_lora_run(tmp, 1);
  const std::string trained = file_sha256(run.base);
  std::string bytes;
  {
    std::ifstream in(run.base, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  for (int other = 0; other < 2; ++other) {
    if (other == 0) {
      write_safetensors(run.base, gpt2_base(3, kWidth, 64, 16, 21));  // 3 blocks
    } else {
      bytes[bytes.size() - 3] ^= 1;  // one bit of the last tensor's data
      std::ofstream(run.base, std::ios::binary | std::ios::trunc) << bytes;
    }
    std::string msg = error_of([&] {
      export_merged_lora(tmp.path("run"), tmp.path("m.safetensors"), DType::kF32, false);
    });
    EXPECT_NE(msg.find("trained on a base with SHA-256 " + trained + ", but model.init_from (" +
                       run.base + ") has " + file_sha256(run.base)),
              std::string::npos)
        << msg;
    EXPECT_FALSE(fs::exists(tmp.path("m.safetensors")));
  }
}

TEST(LoraExport, RefusesACheckpointWithoutALoraSection) {
  TempDir tmp;
  write_lora_run(tmp, 1, /*with_lora_section=*/false);
  std::string msg =
      error_of([&] { export_lora_adapter(tmp.path("run"), tmp.path("a"), DType::kF32, false); });
  EXPECT_NE(msg.find("not from a LoRA run"), std::string::npos) << msg;
}

TEST(LoraExport, FdtrainCkptExportCommands) {
  std::string bin = std::string(FD_BINARY_DIR) + "/bin/fdtrain";
  if (!fs::exists(bin)) GTEST_SKIP() << bin << " not built";
  TempDir tmp;
  write_lora_run(tmp, 2);
  int rc = 0;
  std::string out = run_command(bin + " ckpt export '" + tmp.path("run") + "' --lora-adapter '" +
                                    tmp.path("adapter") + "' --merge-lora --out '" +
                                    tmp.path("merged.safetensors") + "'",
                                &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(fs::exists(tmp.path("adapter/adapter_config.json"))) << out;
  EXPECT_TRUE(fs::exists(tmp.path("adapter/adapter_model.safetensors"))) << out;
  EXPECT_TRUE(fs::exists(tmp.path("merged.safetensors"))) << out;
  out = run_command(bin + " ckpt export '" + tmp.path("run") + "' --merge-lora", &rc);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("--merge-lora needs --out"), std::string::npos) << out;
  out = run_command(bin + " ckpt export '" + tmp.path("run") + "' --out '" + tmp.path("x.h5") + "'",
                    &rc);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("from a LoRA run"), std::string::npos) << out;
  out = run_command(
      bin + " ckpt export '" + tmp.path("run") + "' --lora-adapter '" + tmp.path("adapter") + "'",
      &rc);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("already exists"), std::string::npos) << out;
}

}  // namespace
}  // namespace fd::engine
