// PyTorch parity: fdtrain's GPT against golden data written by
// tests/golden/make_golden.py (Debian's python3-torch). Checks the fp32
// logits, the loss, every parameter gradient (relative error
// ||ours - ref|| / ||ref|| <= 1e-5, printed with the largest elementwise
// difference for every tensor) and the losses of 10 AdamW steps (<= 1e-5 abs).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "lib/autograd/tape.h"
#include "lib/nn/decoder.h"
#include "lib/optim/adamw.h"
#include "lib/optim/clip.h"
#include "lib/tensor/safetensors.h"
#include "tests/golden/parity_util.h"

namespace fd {
namespace {

const char* kGolden = FD_SOURCE_DIR "/tests/golden/gpt_tiny.safetensors";

using golden::compare;
using golden::Diff;
using golden::meta_int;

class Parity : public ::testing::Test {
 protected:
  void SetUp() override {
    nn::GptConfig c;
    c.n_layer = meta_int(file_, "n_layer");
    c.n_head = meta_int(file_, "n_head");
    c.d_model = meta_int(file_, "d_model");
    c.vocab_size = meta_int(file_, "vocab_size");
    c.max_seq_len = meta_int(file_, "max_seq_len");
    model_ = std::make_unique<nn::Decoder>(c);
    for (const nn::Parameter* p : model_->parameters()) {
      ASSERT_TRUE(file_.contains(p->name)) << p->name;
      ASSERT_EQ(file_.shape(p->name), p->value.shape()) << p->name;
      p->value.copy_from(file_.load(p->name));
    }
    tokens_ = file_.load("batch.tokens");
    targets_ = file_.load("batch.targets");
  }

  std::vector<const nn::FlatParamGroup*> groups() const { return model_->groups(); }

  SafetensorsFile file_ = SafetensorsFile::open(kGolden);
  std::unique_ptr<nn::Decoder> model_;
  Tensor tokens_, targets_;
};

TEST_F(Parity, LogitsLossAndEveryGradient) {
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  autograd::Variable logits = model_->forward(tokens_);
  Diff d = compare(logits.value().to_vector(), file_.load("out.logits").to_vector());
  std::printf("%-28s rel %.3e  max|diff| %.3e\n", "logits", d.rel, d.max_abs);
  EXPECT_LE(d.rel, 1e-5);
  tape.clear();

  model_->zero_grads();
  autograd::Variable loss = model_->loss(tokens_, targets_);
  float ref_loss = file_.load("out.loss").to_vector()[0];
  float our_loss = loss.value().to_vector()[0];
  std::printf("%-28s ours %.7f  ref %.7f  |diff| %.3e\n", "loss", our_loss, ref_loss,
              std::fabs(our_loss - ref_loss));
  EXPECT_LE(std::fabs(our_loss - ref_loss), 1e-5);
  tape.backward(loss);
  int checked = 0;
  for (const nn::Parameter* p : model_->parameters()) {
    Diff g = compare(p->grad.to_vector(), file_.load("grad." + p->name).to_vector());
    std::printf("grad %-23s rel %.3e  max|diff| %.3e\n", p->name.c_str(), g.rel, g.max_abs);
    EXPECT_LE(g.rel, 1e-5) << p->name;
    ++checked;
  }
  EXPECT_EQ(checked, 28);
}

TEST_F(Parity, TenAdamWStepsWithClipping) {
  optim::AdamWOptions o;
  o.lr = std::stof(file_.metadata().at("lr"));
  o.beta1 = 0.9f;
  o.beta2 = 0.95f;
  o.eps = std::stof(file_.metadata().at("eps"));
  o.weight_decay = std::stof(file_.metadata().at("weight_decay"));
  ASSERT_EQ(file_.metadata().at("betas"), "[0.9, 0.95]");
  const float clip = std::stof(file_.metadata().at("grad_clip"));
  const int steps = meta_int(file_, "steps");
  optim::AdamW opt(groups(), o);
  std::vector<float> ref_losses = file_.load("adamw.losses").to_vector();
  std::vector<float> ref_norms = file_.load("adamw.grad_norms").to_vector();
  ASSERT_EQ(int(ref_losses.size()), steps);
  for (int s = 0; s < steps; ++s) {
    model_->zero_grads();
    autograd::Tape tape;
    autograd::TapeScope scope(tape);
    autograd::Variable loss = model_->loss(tokens_, targets_);
    float l = loss.value().to_vector()[0];
    tape.backward(loss);
    double norm = optim::global_grad_norm(groups());
    optim::clip_grad_norm(groups(), norm, clip);
    opt.step(o.lr);
    std::printf("step %d  loss ours %.7f ref %.7f |diff| %.2e   grad_norm ours %.6f ref %.6f\n", s,
                l, ref_losses[s], std::fabs(l - ref_losses[s]), norm, ref_norms[s]);
    EXPECT_LE(std::fabs(l - ref_losses[s]), 1e-5) << "step " << s;
    EXPECT_LE(std::fabs(norm - ref_norms[s]) / ref_norms[s], 1e-4) << "step " << s;
  }
  // Final weights. The key part of c_attn.bias, [C, 2C), has a gradient that is
  // zero in exact arithmetic (adding a constant to every key shifts each
  // softmax row uniformly), so both sides see only rounding noise of ~1e-9
  // there, which Adam's normalisation turns into O(lr * |g| / eps) updates
  // that differ between any two implementations. It gets an absolute bound.
  const int64_t C = model_->config().hidden_size;
  for (const nn::Parameter* p : model_->parameters()) {
    std::vector<float> ours = p->value.to_vector();
    std::vector<float> ref = file_.load("final." + p->name).to_vector();
    if (p->name.find("c_attn.bias") != std::string::npos) {
      for (int64_t i = C; i < 2 * C; ++i) {
        EXPECT_LE(std::fabs(ours[i] - ref[i]), 1e-3) << p->name << "[" << i << "]";
        ours[i] = ref[i] = 0.0f;
      }
    }
    Diff d = compare(ours, ref);
    std::printf("final %-22s rel %.3e  max|diff| %.3e\n", p->name.c_str(), d.rel, d.max_abs);
    EXPECT_LE(d.rel, 1e-4) << p->name;
  }
}

}  // namespace
}  // namespace fd
