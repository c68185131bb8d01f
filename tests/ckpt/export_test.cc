// Consolidation, export and import: a sharded checkpoint consolidates to the
// model's exact weights at any world size; exports (.safetensors, .h5) load
// back into a fresh model bit for bit; Hugging Face GPT-2 files (prefix,
// mask buffers, lm_head) load; a file for another model is a clear error.
#include "lib/ckpt/export.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "lib/config/load.h"
#include "lib/tensor/safetensors.h"
#include "tests/ckpt/ckpt_test_util.h"

namespace fd::ckpt {
namespace {

using testing::error_of;
using testing::TempDir;
namespace fs = std::filesystem;

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Every parameter of `a` and `b` bitwise equal.
void expect_same_weights(const nn::Gpt& a, const nn::Gpt& b) {
  auto pa = a.parameters(), pb = b.parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_TRUE(same_bytes(pa[i]->value, pb[i]->value)) << pa[i]->name;
}

TEST(Consolidate, AssemblesEveryParameterAtAnyWorldSize) {
  for (int world : {1, 2, 3}) {
    TempDir tmp;
    auto model = testing::make_model(testing::tiny_config(), world);
    testing::write_test_checkpoint(tmp.path("ck"), *model, world, 11);
    std::map<std::string, Tensor> full = consolidate(tmp.path("ck"), DType::kF32);
    ASSERT_EQ(full.size(), model->parameters().size()) << "world " << world;
    for (const nn::Parameter* p : model->parameters()) {
      ASSERT_TRUE(full.count(p->name)) << p->name;
      EXPECT_TRUE(same_bytes(full[p->name], p->value)) << p->name << " world " << world;
    }
    std::map<std::string, Tensor> bf = consolidate(tmp.path("ck"), DType::kBF16);
    for (const nn::Parameter* p : model->parameters())
      EXPECT_TRUE(same_bytes(bf[p->name], p->value.to(DType::kBF16))) << p->name;
  }
}

TEST(Inspect, ReportsTheCheckpointAndVerifiesChecksums) {
  TempDir tmp;
  auto model = testing::make_model(testing::tiny_config(), 2);
  testing::write_test_checkpoint(tmp.path("run/checkpoints/step_00000007"), *model, 2, 7,
                                 DType::kBF16, "bf16");
  write_latest(tmp.path("run/checkpoints"), 7);
  std::string report = inspect_checkpoint(tmp.path("run"));  // run dir -> latest
  for (const char* want :
       {"step_00000007", "step 7, world size 2, ZeRO stage 1, precision bf16, format version 1",
        "rank_00000.h5", "rank_00001.h5", "embed", "h.1", "final", "params bf16[", "master f32[",
        "checksums ok (32 datasets in 2 shards"}) {
    EXPECT_NE(report.find(want), std::string::npos) << "missing '" << want << "' in\n" << report;
  }
}

TEST(Export, SafetensorsRoundTripIsBitwise) {
  TempDir tmp;
  auto model = testing::make_model(testing::tiny_config(), 2);
  testing::write_test_checkpoint(tmp.path("ck"), *model, 2, 5);
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

  auto fresh = testing::make_model(testing::tiny_config(), 1, /*seed=*/99);
  load_weights(out, *fresh, "");
  expect_same_weights(*model, *fresh);

  // Into a bf16 model: converted with round to nearest even.
  auto bf = std::make_unique<nn::Gpt>(testing::tiny_config(), DType::kBF16);
  load_weights(out, *bf, "");
  for (const nn::Parameter* p : model->parameters())
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
  nn::GptConfig c = testing::tiny_config();
  c.vocab_size = 256;
  auto model = testing::make_model(c, 1);
  ShardMeta meta = testing::test_meta(*model, 1, 0, 2, "fp32");
  meta.recipe_yaml = config::to_yaml(r.recipe);
  fs::create_directories(tmp.path("ck"));
  write_shard(tmp.path("ck/rank_00000.h5"), meta, testing::test_ranges(*model, 1, 0, DType::kF32));
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
    auto model = testing::make_model(testing::tiny_config(), 1);
    testing::write_test_checkpoint(tmp.path("ck"), *model, 1, 5);
    std::string out = tmp.path("model.h5");
    export_checkpoint(tmp.path("ck"), out, dtype, false);
    auto fresh = std::make_unique<nn::Gpt>(testing::tiny_config(), dtype);
    load_weights(out, *fresh, "");
    for (const nn::Parameter* p : model->parameters())
      EXPECT_TRUE(same_bytes(fresh->find(p->name)->value, p->value.to(dtype))) << p->name;
  }
}

TEST(Export, RefusesUnknownExtension) {
  TempDir tmp;
  auto model = testing::make_model(testing::tiny_config(), 1);
  testing::write_test_checkpoint(tmp.path("ck"), *model, 1, 5);
  std::string msg =
      error_of([&] { export_checkpoint(tmp.path("ck"), tmp.path("m.bin"), DType::kF32, false); });
  EXPECT_NE(msg.find("must end in .safetensors or .h5"), std::string::npos) << msg;
}

// A file laid out as Hugging Face's GPT-2 model.safetensors: "transformer."
// prefix, causal-mask buffers, an lm_head tied to wte.
std::string write_hf_style(const std::string& path, const nn::Gpt& model, bool lm_head_equal) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const nn::Parameter* p : model.parameters())
    tensors.emplace_back("transformer." + p->name, p->value);
  for (int i = 0; i < model.config().n_layer; ++i) {
    int t = model.config().max_seq_len;
    tensors.emplace_back("transformer.h." + std::to_string(i) + ".attn.bias",
                         Tensor::zeros(Shape{1, 1, t, t}));
    tensors.emplace_back("transformer.h." + std::to_string(i) + ".attn.masked_bias",
                         Tensor::from_vector({-1e4f}, Shape{}));
  }
  Tensor head = model.find("wte.weight")->value.to(DType::kF32);
  if (!lm_head_equal) head.f32()[3] += 1.0f;
  tensors.emplace_back("lm_head.weight", head);
  write_safetensors(path, tensors, {{"format", "pt"}});
  return path;
}

TEST(LoadWeights, HuggingFaceStyleFileLoads) {
  TempDir tmp;
  auto model = testing::make_model(testing::tiny_config(), 1);
  for (bool equal : {true, false}) {
    std::string file = write_hf_style(tmp.path("model.safetensors"), *model, equal);
    auto fresh = testing::make_model(testing::tiny_config(), 1, 5);
    load_weights(file, *fresh, "recipes/x.yaml:3:14: model.init_from");
    expect_same_weights(*model, *fresh);
  }
}

TEST(LoadWeights, TheGoldenFileLoads) {
  // tests/golden/gpt_tiny.safetensors (written by PyTorch) holds extra
  // tensors (inputs, outputs, gradients): the model's must all be found, and
  // the extras named in the error.
  std::string golden = std::string(FD_SOURCE_DIR) + "/tests/golden/gpt_tiny.safetensors";
  nn::GptConfig c;
  c.n_layer = 2;
  c.n_head = 3;
  c.d_model = 24;
  c.vocab_size = 67;
  c.max_seq_len = 16;
  nn::Gpt model(c);
  std::string msg = error_of([&] { load_weights(golden, model, "here"); });
  EXPECT_NE(msg.find("which the model does not have"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("has no tensor"), std::string::npos) << msg;
}

class WrongModel : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = testing::make_model(testing::tiny_config(2, 16), 1);
    testing::write_test_checkpoint(tmp_.path("ck"), *model_, 1, 5);
    file_ = tmp_.path("m.safetensors");
    export_checkpoint(tmp_.path("ck"), file_, DType::kF32, false);
  }
  std::string load_into(const nn::GptConfig& c) {
    nn::Gpt target(c);
    std::string msg = error_of([&] { load_weights(file_, target, "r.yaml:4:3: model.init_from"); });
    EXPECT_EQ(msg.rfind("r.yaml:4:3: model.init_from: ", 0), 0u) << msg;
    EXPECT_NE(msg.find(file_), std::string::npos) << msg;
    return msg;
  }
  TempDir tmp_;
  std::unique_ptr<nn::Gpt> model_;
  std::string file_;
};

TEST_F(WrongModel, MoreLayersInTheModel) {
  std::string msg = load_into(testing::tiny_config(3, 16));
  EXPECT_NE(msg.find("has no tensor 'h.2."), std::string::npos) << msg;
  EXPECT_NE(msg.find("set model.n_layer to 2"), std::string::npos) << msg;
}

TEST_F(WrongModel, FewerLayersInTheModel) {
  std::string msg = load_into(testing::tiny_config(1, 16));
  EXPECT_NE(msg.find("holds tensor 'h.1."), std::string::npos) << msg;
  EXPECT_NE(msg.find("set model.n_layer to 2"), std::string::npos) << msg;
}

TEST_F(WrongModel, OtherWidth) {
  std::string msg = load_into(testing::tiny_config(2, 32));
  EXPECT_NE(
      msg.find("tensor 'wte.weight' has shape (64, 16) in the file but (64, 32) in the model"),
      std::string::npos)
      << msg;
  EXPECT_NE(msg.find("set model.d_model to 16"), std::string::npos) << msg;
}

TEST(LoadWeights, MissingOrBrokenFile) {
  TempDir tmp;
  nn::Gpt model(testing::tiny_config());
  std::string msg = error_of([&] { load_weights(tmp.path("nope.safetensors"), model, "w"); });
  EXPECT_NE(msg.find("nope.safetensors does not exist"), std::string::npos) << msg;
  std::ofstream(tmp.path("junk.safetensors")) << "junk";
  msg = error_of([&] { load_weights(tmp.path("junk.safetensors"), model, "w"); });
  EXPECT_EQ(msg.rfind("w: ", 0), 0u) << msg;
  EXPECT_NE(msg.find("junk.safetensors"), std::string::npos) << msg;
}

}  // namespace
}  // namespace fd::ckpt
