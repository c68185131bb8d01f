#include "lib/engine/evaluate.h"

#include <algorithm>
#include <cmath>

#include "lib/autograd/tape.h"
#include "lib/base/check.h"

namespace fd::engine {

EvalResult evaluate_windows(const nn::Decoder& model, std::span<const int32_t> tokens, int seq_len,
                            int batch, const EvalProgress& progress) {
  const int64_t T = seq_len, W = T + 1;
  FD_CHECK(seq_len >= 1 && seq_len <= model.config().max_position_embeddings,
           "seq_len {} outside 1..max_position_embeddings {}", seq_len,
           model.config().max_position_embeddings);
  FD_CHECK(int64_t(tokens.size()) % W == 0 && !tokens.empty(),
           "{} tokens are not a whole number of windows of {}", tokens.size(), W);
  FD_CHECK(batch >= 1, "batch must be >= 1");
  autograd::NoGradGuard no_grad;
  const int64_t N = int64_t(tokens.size()) / W;
  double sum = 0.0;  // of the per-token losses: each batch's mean times its token count
  for (int64_t first = 0; first < N; first += batch) {
    const int64_t B = std::min<int64_t>(batch, N - first);
    Tensor in = Tensor::empty(Shape{B, T}, DType::kI32, MemCategory::kOther, Device::cpu());
    Tensor out = Tensor::empty(Shape{B, T}, DType::kI32, MemCategory::kOther, Device::cpu());
    for (int64_t b = 0; b < B; ++b) {
      const int32_t* w = tokens.data() + (first + b) * W;
      std::copy(w, w + T, in.i32() + b * T);
      std::copy(w + 1, w + W, out.i32() + b * T);
    }
    const double mean = model.loss(in, out).value().to_vector()[0];
    sum += mean * double(B * T);
    if (progress) progress(first + B, N, sum / double((first + B) * T));
  }
  EvalResult r;
  r.windows = N;
  r.seq_len = seq_len;
  r.targets = N * T;
  r.mean_loss = sum / double(r.targets);
  r.perplexity = std::exp(r.mean_loss);
  return r;
}

}  // namespace fd::engine
