// bf16 PyTorch parity: fdtrain's GPT built in bf16 (parameters stored in bf16,
// every op computing in fp32 and rounding its output to bf16) against golden
// data from torch running the same model in bfloat16 on the CPU
// (tests/golden/make_golden.py, gpt_tiny_bf16.safetensors). Checks the logits,
// the loss and every parameter gradient, printing for each tensor the
// relative error ||ours - ref|| / ||ref||, the largest elementwise
// difference, and for context how far torch's own bf16 result is from its
// fp32 result (gpt_tiny.safetensors). Tolerances and why: tests/golden/README.md.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "lib/autograd/tape.h"
#include "lib/nn/decoder.h"
#include "lib/tensor/safetensors.h"
#include "tests/golden/parity_util.h"

namespace fd {
namespace {

const char* kGoldenBf16 = FD_SOURCE_DIR "/tests/golden/gpt_tiny_bf16.safetensors";
const char* kGoldenF32 = FD_SOURCE_DIR "/tests/golden/gpt_tiny.safetensors";

// Tolerances (README.md "bf16 parity"), about 2x the measured worst cases:
// logits rel 6.6e-3, gradients rel 1.5e-2 (h.1.ln_1.weight), loss 8e-5.
constexpr double kLogitsRel = 1.5e-2;
constexpr double kGradRel = 3e-2;
constexpr double kLossAbs = 5e-4;

using golden::compare;
using golden::Diff;
using golden::meta_int;

// One tensor's comparison: ours vs torch bf16, and torch bf16 vs torch fp32.
struct Row {
  std::string name;
  Diff ours;
  Diff torch_bf16_vs_f32;
  double tol;
};

struct Result {
  std::vector<Row> rows;  // logits, then every gradient in canonical order
  float our_loss = 0, ref_loss = 0, f32_loss = 0;
};

// Builds Decoder(config, kBF16) from the golden parameters (with `swap` names
// exchanged, to show the test can fail), runs forward, loss and backward on the
// tape and compares everything with the golden data.
Result run_parity(std::pair<std::string, std::string> swap = {}) {
  SafetensorsFile file = SafetensorsFile::open(kGoldenBf16);
  SafetensorsFile f32 = SafetensorsFile::open(kGoldenF32);
  nn::GptConfig c;
  c.n_layer = meta_int(file, "n_layer");
  c.n_head = meta_int(file, "n_head");
  c.d_model = meta_int(file, "d_model");
  c.vocab_size = meta_int(file, "vocab_size");
  c.max_seq_len = meta_int(file, "max_seq_len");
  nn::Decoder model(c, DType::kBF16);
  for (const nn::Parameter* p : model.parameters()) {
    std::string src = p->name == swap.first    ? swap.second
                      : p->name == swap.second ? swap.first
                                               : p->name;
    EXPECT_TRUE(file.contains(src)) << src;
    EXPECT_EQ(file.dtype(src), DType::kBF16) << src;
    EXPECT_EQ(file.shape(src), p->value.shape()) << src;
    EXPECT_EQ(p->value.dtype(), DType::kBF16) << p->name;
    p->value.copy_from(file.load(src));  // bf16 -> bf16: exact
  }
  Tensor tokens = file.load("batch.tokens");
  Tensor targets = file.load("batch.targets");

  Result r;
  auto row = [&](const std::string& name, const std::vector<float>& ours, const std::string& key,
                 double tol) {
    std::vector<float> ref = file.load(key).to_vector();
    r.rows.push_back({name, compare(ours, ref), compare(ref, f32.load(key).to_vector()), tol});
  };
  {
    autograd::Tape tape;
    autograd::TapeScope scope(tape);
    autograd::Variable logits = model.forward(tokens);
    EXPECT_EQ(logits.value().dtype(), DType::kBF16);
    row("logits", logits.value().to_vector(), "out.logits", kLogitsRel);
  }
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  model.zero_grads();
  autograd::Variable loss = model.loss(tokens, targets);
  r.our_loss = loss.value().to_vector()[0];
  r.ref_loss = file.load("out.loss").to_vector()[0];
  r.f32_loss = f32.load("out.loss").to_vector()[0];
  tape.backward(loss);
  for (const nn::Parameter* p : model.parameters()) {
    EXPECT_EQ(p->grad.dtype(), DType::kBF16) << p->name;
    row("grad " + p->name, p->grad.to_vector(), "grad." + p->name, kGradRel);
  }
  return r;
}

void print(const Result& r) {
  std::printf("%-32s %-22s %-11s %s\n", "tensor", "ours vs torch-bf16", "", "torch-bf16 vs fp32");
  std::printf("%-32s %-11s %-11s %s\n", "", "rel", "max|diff|", "rel");
  for (const Row& w : r.rows)
    std::printf("%-32s %.3e   %.3e   %.3e\n", w.name.c_str(), w.ours.rel, w.ours.max_abs,
                w.torch_bf16_vs_f32.rel);
  std::printf("%-32s ours %.6f  torch-bf16 %.6f  |diff| %.3e  (torch fp32 %.6f)\n", "loss",
              r.our_loss, r.ref_loss, std::fabs(r.our_loss - r.ref_loss), r.f32_loss);
}

TEST(ParityBf16, LogitsLossAndEveryGradient) {
  Result r = run_parity();
  print(r);
  ASSERT_EQ(r.rows.size(), 1u + 28u);
  double worst_grad = 0;
  for (const Row& w : r.rows) {
    EXPECT_LE(w.ours.rel, w.tol) << w.name;
    if (w.name != "logits") worst_grad = std::max(worst_grad, w.ours.rel);
  }
  EXPECT_LE(std::fabs(r.our_loss - r.ref_loss), kLossAbs);
  std::printf("worst gradient rel %.3e (tolerance %.0e)\n", worst_grad, kGradRel);
}

// Two parameters of the same shape exchanged: the comparison must notice.
TEST(ParityBf16, SwappedParametersFail) {
  Result r = run_parity({"h.0.mlp.c_fc.weight", "h.1.mlp.c_fc.weight"});
  int failing = 0;
  for (const Row& w : r.rows) failing += w.ours.rel > w.tol;
  std::printf(
      "swapped h.0/h.1 mlp.c_fc.weight: logits rel %.3e, %d of %zu tensors over "
      "tolerance\n",
      r.rows[0].ours.rel, failing, r.rows.size());
  EXPECT_GT(r.rows[0].ours.rel, kLogitsRel);
  EXPECT_GE(failing, 10);
}

}  // namespace
}  // namespace fd
