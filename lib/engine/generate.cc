#include "lib/engine/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "lib/autograd/tape.h"
#include "lib/base/rng.h"

namespace fd::engine {

std::vector<int32_t> generate(const nn::Gpt& model, const std::vector<int32_t>& prompt,
                              const SampleOptions& options) {
  autograd::NoGradGuard no_grad;
  const int V = model.config().vocab_size;
  const int ctx = options.max_context > 0
                      ? std::min(options.max_context, model.config().max_seq_len)
                      : model.config().max_seq_len;
  std::vector<int32_t> seq = prompt.empty() ? std::vector<int32_t>{options.start_token} : prompt;
  std::vector<int32_t> out;
  std::vector<float> probs(static_cast<size_t>(V));
  std::vector<int> order(static_cast<size_t>(V));
  for (int i = 0; i < options.max_new_tokens; ++i) {
    int64_t start = std::max<int64_t>(0, int64_t(seq.size()) - ctx);
    int64_t T = int64_t(seq.size()) - start;
    Tensor tokens = Tensor::empty(Shape{1, T}, DType::kI32);
    std::copy(seq.begin() + start, seq.end(), tokens.i32());
    std::vector<float> logits = model.forward(tokens).value().to_vector();
    const float* last = logits.data() + (T - 1) * V;
    float mx = *std::max_element(last, last + V);
    for (int v = 0; v < V; ++v) probs[v] = std::exp((last[v] - mx) / options.temperature);
    if (options.top_k > 0 && options.top_k < V) {
      std::iota(order.begin(), order.end(), 0);
      std::nth_element(order.begin(), order.begin() + options.top_k, order.end(),
                       [&](int a, int b) { return probs[a] > probs[b]; });
      for (int r = options.top_k; r < V; ++r) probs[order[r]] = 0.0f;
    }
    double total = std::accumulate(probs.begin(), probs.end(), 0.0);
    double u = uniform01(hash_words(options.seed, 0x5a3b1e, uint64_t(i))) * total;
    int pick = -1;
    for (int v = 0; v < V; ++v) {
      if (probs[v] <= 0.0f) continue;
      pick = v;  // rounding can leave u >= 0 at the end: keep the last possible token
      u -= probs[v];
      if (u < 0) break;
    }
    seq.push_back(pick);
    out.push_back(pick);
  }
  return out;
}

}  // namespace fd::engine
