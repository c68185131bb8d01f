// Loading weights files into a model (load_weights, as model.init_from
// does): Hugging Face GPT-2 files (prefix, mask buffers, lm_head) load; the
// golden PyTorch file's extra tensors are named; a file for another model is
// one error that names the file, the tensor, both shapes and the recipe
// change that fits; a missing or broken file is an error prefixed with where
// it was named.
#include "lib/engine/weights_io.h"

#include <gtest/gtest.h>

#include <fstream>

#include "lib/engine/export.h"
#include "lib/nn/decoder.h"
#include "lib/tensor/safetensors.h"
#include "tests/engine/weights_test_util.h"

namespace fd::engine {
namespace {

using testing::error_of;
using testing::expect_same_weights;
using testing::TempDir;

// A file laid out as Hugging Face's GPT-2 model.safetensors: "transformer."
// prefix, causal-mask buffers, an lm_head tied to wte.
std::string write_hf_style(const std::string& path, const testing::TestModel& model,
                           bool lm_head_equal) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const testing::TestParam* p : model.parameters())
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
  auto model = ckpt::testing::make_model(testing::tiny_config(), 1);
  for (bool equal : {true, false}) {
    std::string file = write_hf_style(tmp.path("model.safetensors"), *model, equal);
    auto fresh = testing::make_gpt(testing::tiny_config(), 5);
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
  nn::Decoder model(c);
  std::string msg = error_of([&] { load_weights(golden, model, "here"); });
  EXPECT_NE(msg.find("which the model does not have"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("has no tensor"), std::string::npos) << msg;
}

class WrongModel : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = ckpt::testing::make_model(testing::tiny_config(2, 16), 1);
    ckpt::testing::write_test_checkpoint(tmp_.path("ck"), *model_, 1, 5);
    file_ = tmp_.path("m.safetensors");
    export_checkpoint(tmp_.path("ck"), file_, DType::kF32, false);
  }
  std::string load_into(const testing::TinyConfig& c) {
    nn::Decoder target(testing::gpt_config(c));
    std::string msg = error_of([&] { load_weights(file_, target, "r.yaml:4:3: model.init_from"); });
    EXPECT_EQ(msg.rfind("r.yaml:4:3: model.init_from: ", 0), 0u) << msg;
    EXPECT_NE(msg.find(file_), std::string::npos) << msg;
    return msg;
  }
  TempDir tmp_;
  std::unique_ptr<testing::TestModel> model_;
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
  nn::Decoder model(testing::gpt_config(testing::tiny_config()));
  std::string msg = error_of([&] { load_weights(tmp.path("nope.safetensors"), model, "w"); });
  EXPECT_NE(msg.find("nope.safetensors does not exist"), std::string::npos) << msg;
  std::ofstream(tmp.path("junk.safetensors")) << "junk";
  msg = error_of([&] { load_weights(tmp.path("junk.safetensors"), model, "w"); });
  EXPECT_EQ(msg.rfind("w: ", 0), 0u) << msg;
  EXPECT_NE(msg.find("junk.safetensors"), std::string::npos) << msg;
}

}  // namespace
}  // namespace fd::engine
