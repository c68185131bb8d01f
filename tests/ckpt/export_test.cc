// Consolidation, export and reading weights files: a sharded checkpoint
// consolidates to the model's exact weights at any world size; an export
// records the n_head it is given and reads back (WeightsFile) bit for bit;
// Hugging Face GPT-2 files (prefix, mask buffers, lm_head) read under
// fdtrain's names. (Loading into a model and the exports that read the
// checkpoint's recipe: tests/engine/weights_io_test.cc, export_test.cc.)
#include "lib/ckpt/export.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <optional>

#include "lib/ckpt/weights_file.h"
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

TEST(Consolidate, AssemblesEveryParameterAtAnyWorldSize) {
  for (int world : {1, 2, 3}) {
    TempDir tmp;
    auto model = testing::make_model(testing::tiny_config(), world);
    testing::write_test_checkpoint(tmp.path("ck"), *model, world, 11);
    std::map<std::string, Tensor> full = consolidate(tmp.path("ck"), DType::kF32);
    ASSERT_EQ(full.size(), model->parameters().size()) << "world " << world;
    for (const testing::TestParam* p : model->parameters()) {
      ASSERT_TRUE(full.count(p->name)) << p->name;
      EXPECT_TRUE(same_bytes(full[p->name], p->value)) << p->name << " world " << world;
    }
    std::map<std::string, Tensor> bf = consolidate(tmp.path("ck"), DType::kBF16);
    for (const testing::TestParam* p : model->parameters())
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
       {"step_00000007", "step 7, world size 2, ZeRO stage 1, precision bf16, format version 2",
        "rank_00000.h5", "rank_00001.h5", "embed", "h.1", "final", "params bf16[", "master f32[",
        "checksums ok (32 datasets in 2 shards"}) {
    EXPECT_NE(report.find(want), std::string::npos) << "missing '" << want << "' in\n" << report;
  }
}

TEST(Export, RefusesUnknownExtension) {
  TempDir tmp;
  auto model = testing::make_model(testing::tiny_config(), 1);
  testing::write_test_checkpoint(tmp.path("ck"), *model, 1, 5);
  std::string msg = error_of([&] {
    export_checkpoint(open_checkpoint(tmp.path("ck")), tmp.path("m.bin"), DType::kF32, false,
                      std::nullopt);
  });
  EXPECT_NE(msg.find("must end in .safetensors or .h5"), std::string::npos) << msg;
  msg = error_of([&] { check_export_file(tmp.path("m.bin"), DType::kF32, false); });
  EXPECT_NE(msg.find("must end in .safetensors or .h5"), std::string::npos) << msg;
  msg = error_of([&] { check_export_file(tmp.path("m.h5"), DType::kF16, false); });
  EXPECT_NE(msg.find("--dtype must be fp32 or bf16"), std::string::npos) << msg;
}

// The caller (lib/engine, from the checkpoint's recipe) gives n_head; the
// layout gives the rest. The file reads back as it was written, in both formats.
TEST(Export, RecordsTheGivenNHeadAndReadsBack) {
  TempDir tmp;
  auto model = testing::make_model(testing::tiny_config(), 2);
  testing::write_test_checkpoint(tmp.path("ck"), *model, 2, 5);
  const Checkpoint c = open_checkpoint(tmp.path("ck"));
  EXPECT_FALSE(is_lora_checkpoint(c));
  for (const char* ext : {".safetensors", ".h5"}) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      const std::string out = tmp.path("m_" + std::string(dtype_name(dtype)) + ext);
      export_checkpoint(c, out, dtype, false, 2);
      WeightsFile w = WeightsFile::open(out);
      std::map<std::string, std::string> meta = w.metadata();
      EXPECT_EQ(meta.at("n_head"), "2") << out;
      EXPECT_EQ(meta.at("n_layer"), "2") << out;
      EXPECT_EQ(meta.at("d_model"), "16") << out;
      EXPECT_EQ(meta.at("step"), "5") << out;
      ASSERT_EQ(w.shapes().size(), model->parameters().size()) << out;
      EXPECT_FALSE(w.lm_head().has_value());
      for (const testing::TestParam* p : model->parameters()) {
        ASSERT_TRUE(w.shapes().count(p->name)) << p->name;
        EXPECT_EQ(w.stored_name(p->name), p->name);
        EXPECT_TRUE(same_bytes(w.load(p->name), p->value.to(dtype))) << p->name << " " << out;
      }
    }
  }
  export_checkpoint(c, tmp.path("none.safetensors"), DType::kF32, false, std::nullopt);
  EXPECT_FALSE(SafetensorsFile::open(tmp.path("none.safetensors")).metadata().count("n_head"));
}

// Hugging Face's GPT-2 layout: "transformer." prefix, causal-mask buffers,
// lm_head.weight: read under fdtrain's names, the buffers left out, the head
// set aside.
TEST(WeightsFile, ReadsHuggingFaceNames) {
  TempDir tmp;
  auto model = testing::make_model(testing::tiny_config(), 1);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const testing::TestParam* p : model->parameters())
    tensors.emplace_back("transformer." + p->name, p->value);
  tensors.emplace_back("transformer.h.0.attn.bias", Tensor::zeros(Shape{1, 1, 16, 16}));
  tensors.emplace_back("transformer.h.1.attn.masked_bias", Tensor::from_vector({-1e4f}, Shape{}));
  tensors.emplace_back("lm_head.weight", model->find("wte.weight")->value);
  write_safetensors(tmp.path("hf.safetensors"), tensors, {{"format", "pt"}});

  WeightsFile w = WeightsFile::open(tmp.path("hf.safetensors"));
  EXPECT_EQ(w.shapes().size(), model->parameters().size());
  for (const testing::TestParam* p : model->parameters()) {
    EXPECT_EQ(w.stored_name(p->name), "transformer." + p->name);
    EXPECT_TRUE(same_bytes(w.load(p->name), p->value)) << p->name;
  }
  ASSERT_TRUE(w.lm_head().has_value());
  EXPECT_EQ(w.lm_head()->stored_name, "lm_head.weight");
  EXPECT_EQ(w.lm_head()->shape, (std::vector<int64_t>{64, 16}));
  EXPECT_TRUE(same_bytes(w.load_lm_head(), model->find("wte.weight")->value));
  EXPECT_EQ(w.metadata().at("format"), "pt");

  ImpliedDims d = implied_dims(w.shapes());
  EXPECT_EQ(d.n_layer, 2);
  EXPECT_EQ(d.d_model, 16);
  EXPECT_EQ(d.vocab_size, 64);
  EXPECT_EQ(d.max_seq_len, 16);
  ImpliedDims wider = d;
  wider.d_model = 32;
  EXPECT_EQ(dims_hint(d, wider),
            "; the file holds a model with n_layer 2, d_model 16, vocab_size 64, max_seq_len 16: "
            "set model.d_model to 16 to load it");
  EXPECT_NE(dims_hint(d, d).find(": check model.n_head and the file"), std::string::npos);
}

TEST(WeightsFile, MissingOrBrokenFile) {
  TempDir tmp;
  std::string msg = error_of([&] { WeightsFile::open(tmp.path("nope.safetensors")); });
  EXPECT_NE(msg.find("nope.safetensors does not exist"), std::string::npos) << msg;
  std::ofstream(tmp.path("junk.h5")) << "junk";
  msg = error_of([&] { WeightsFile::open(tmp.path("junk.h5")); });
  EXPECT_NE(msg.find("is not an HDF5 file"), std::string::npos) << msg;
}

}  // namespace
}  // namespace fd::ckpt
