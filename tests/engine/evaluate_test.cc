// evaluate_windows() against PyTorch: the golden model's weights (tests/golden)
// written as a weights file and read back through load_inference_model(), as
// `fdtrain eval` reads one, on a
// stream whose windows are the golden batch's rows, so the reference loss
// comes from torch's own logits (out.logits) computed in float64 here. Also:
// the result does not depend on how many windows run per forward, and equals
// the mean of the model's per-window training loss.
#include "lib/engine/evaluate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "lib/autograd/tape.h"
#include "lib/engine/inference_model.h"
#include "lib/tensor/safetensors.h"

namespace fd::engine {
namespace {

const char* kGolden = FD_SOURCE_DIR "/tests/golden/gpt_tiny.safetensors";

class Evaluate : public ::testing::Test {
 protected:
  void SetUp() override {
    SafetensorsFile f = SafetensorsFile::open(kGolden);
    // The parameters alone (the golden file also holds the batch, outputs,
    // gradients, ...), with the metadata an fdtrain export has.
    std::vector<std::pair<std::string, Tensor>> params;
    for (const std::string& name : f.names())
      if (name.find("batch.") != 0 && name.find("out.") != 0 && name.find("grad.") != 0 &&
          name.find("adamw.") != 0 && name.find("final.") != 0)
        params.emplace_back(name, f.load(name));
    ASSERT_EQ(params.size(), 28u);
    weights_ = ::testing::TempDir() + "evaluate_test_gpt_tiny.safetensors";
    write_safetensors(weights_, params, {{"n_head", f.metadata().at("n_head")}});
    Tensor tokens = f.load("batch.tokens");      // (3, 11)
    Tensor targets = f.load("batch.targets");    // (3, 11)
    logits_ = f.load("out.logits").to_vector();  // (3, 11, 67)
    B_ = tokens.shape()[0];
    T_ = int(tokens.shape()[1]);
    // Window i = golden row i followed by one more token, so its targets are
    // row i shifted by one and that token.
    for (int64_t b = 0; b < B_; ++b) {
      for (int t = 0; t < T_; ++t) stream_.push_back(tokens.i32()[b * T_ + t]);
      const int32_t last = targets.i32()[b * T_ + T_ - 1];
      stream_.push_back(last >= 0 ? last : int32_t(7 * b + 3));
    }
  }

  // The reference: mean over windows and positions of logsumexp(z) - z[target], in float64.
  double torch_loss() const {
    const int V = 67;
    double sum = 0;
    for (int64_t b = 0; b < B_; ++b)
      for (int t = 0; t < T_; ++t) {
        const float* z = logits_.data() + (b * T_ + t) * V;
        const int32_t target = stream_[size_t(b * (T_ + 1) + t + 1)];
        double mx = z[0], s = 0;
        for (int v = 0; v < V; ++v) mx = std::max(mx, double(z[v]));
        for (int v = 0; v < V; ++v) s += std::exp(double(z[v]) - mx);
        sum += mx + std::log(s) - double(z[target]);
      }
    return sum / double(B_ * T_);
  }

  std::string weights_;
  int64_t B_ = 0;
  int T_ = 0;
  std::vector<float> logits_;
  std::vector<int32_t> stream_;
};

TEST_F(Evaluate, MatchesTorchOnTheGoldenModel) {
  InferenceModel m = load_inference_model(weights_);
  EXPECT_EQ(m.model->config().num_heads, 3);  // from the file's metadata
  EvalResult r = evaluate_windows(*m.model, stream_, T_);
  EXPECT_EQ(r.windows, B_);
  EXPECT_EQ(r.targets, B_ * T_);
  const double want = torch_loss();
  std::printf("  mean loss %.9f, torch (float64 from its logits) %.9f, |diff| %.2e\n", r.mean_loss,
              want, std::fabs(r.mean_loss - want));
  EXPECT_NEAR(r.mean_loss, want, 1e-6);
  EXPECT_DOUBLE_EQ(r.perplexity, std::exp(r.mean_loss));
  // The check has teeth: windows one token off give another loss.
  std::vector<int32_t> shifted(stream_.begin() + 1, stream_.end());
  shifted.push_back(0);
  EXPECT_GT(std::fabs(evaluate_windows(*m.model, shifted, T_).mean_loss - want), 1e-2);
}

TEST_F(Evaluate, BatchDoesNotChangeTheResultAndMatchesTheTrainingLoss) {
  InferenceModel m = load_inference_model(weights_);
  // Six windows of 8 + 1 tokens from a longer stream.
  std::vector<int32_t> s;
  for (int i = 0; i < 6 * 9; ++i) s.push_back(int32_t((i * 37 + 11) % 67));
  const double one = evaluate_windows(*m.model, s, 8, 1).mean_loss;
  for (int batch : {2, 4, 8})
    EXPECT_NEAR(evaluate_windows(*m.model, s, 8, batch).mean_loss, one, 1e-6);
  // The training loss (Decoder::loss) of each window, averaged.
  autograd::NoGradGuard no_grad;
  double sum = 0;
  for (int w = 0; w < 6; ++w) {
    Tensor in = Tensor::empty(Shape{1, 8}, DType::kI32),
           out = Tensor::empty(Shape{1, 8}, DType::kI32);
    for (int t = 0; t < 8; ++t) {
      in.i32()[t] = s[size_t(w * 9 + t)];
      out.i32()[t] = s[size_t(w * 9 + t + 1)];
    }
    sum += m.model->loss(in, out).value().to_vector()[0];
  }
  EXPECT_NEAR(one, sum / 6, 1e-6);
}

// The progress callback: one call per forward (7 windows in batches of 3: after
// 3, 6 and 7), the running mean being that of the windows done so far (checked
// against evaluating just those), the last call the result itself.
TEST_F(Evaluate, ProgressReportsTheRunningMean) {
  InferenceModel m = load_inference_model(weights_);
  std::vector<int32_t> s;
  for (int i = 0; i < 7 * 9; ++i) s.push_back(int32_t((i * 29 + 5) % 67));
  std::vector<int64_t> done;
  std::vector<double> means;
  EvalResult r = evaluate_windows(*m.model, s, 8, 3, [&](int64_t d, int64_t total, double mean) {
    EXPECT_EQ(total, 7);
    done.push_back(d);
    means.push_back(mean);
  });
  ASSERT_EQ(done, (std::vector<int64_t>{3, 6, 7}));
  EXPECT_DOUBLE_EQ(means.back(), r.mean_loss);
  for (size_t i = 0; i < done.size(); ++i) {
    std::span<const int32_t> head(s.data(), size_t(done[i] * 9));
    EXPECT_NEAR(means[i], evaluate_windows(*m.model, head, 8, 3).mean_loss, 1e-9) << done[i];
  }
  EXPECT_GT(std::fabs(means[0] - means[2]), 1e-6);  // the means differ: the check has teeth
}

}  // namespace
}  // namespace fd::engine
