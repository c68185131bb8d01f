#include "lib/engine/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>

#include "lib/base/check.h"
#include "lib/base/rng.h"
#include "lib/nn/kv_decoder.h"

namespace fd::engine {
namespace {

// Token `index` of the output drawn from `logits` (vocab_size floats).
class TokenSampler {
 public:
  TokenSampler(int vocab_size, const SampleOptions& options)
      : options_(options), probs_(size_t(vocab_size)), order_(size_t(vocab_size)) {}

  int32_t draw(std::span<const float> logits, int index) {
    const int V = int(probs_.size());
    const auto max_it = std::max_element(logits.begin(), logits.end());
    if (options_.temperature == 0.0f) return int32_t(max_it - logits.begin());  // greedy
    const float mx = *max_it;
    for (int v = 0; v < V; ++v) probs_[v] = std::exp((logits[v] - mx) / options_.temperature);
    if (options_.top_k > 0 && options_.top_k < V) {
      std::iota(order_.begin(), order_.end(), 0);
      std::nth_element(order_.begin(), order_.begin() + options_.top_k, order_.end(),
                       [&](int a, int b) { return probs_[a] > probs_[b]; });
      for (int r = options_.top_k; r < V; ++r) probs_[order_[r]] = 0.0f;
    }
    // 1 keeps everything: skipped, as summing floats to 1 could cut the tail by rounding.
    if (options_.top_p < 1.0f) keep_nucleus();
    double total = std::accumulate(probs_.begin(), probs_.end(), 0.0);
    double u = uniform01(hash_words(options_.seed, 0x5a3b1e, uint64_t(index))) * total;
    int32_t pick = -1;
    for (int v = 0; v < V; ++v) {
      if (probs_[v] <= 0.0f) continue;
      pick = v;  // rounding can leave u >= 0 at the end: keep the last possible token
      u -= probs_[v];
      if (u < 0) break;
    }
    return pick;
  }

 private:
  // Zeroes every token outside the nucleus of the (unnormalised) probs_: with
  // the tokens sorted by probability, descending (ties: lower id first), the
  // shortest prefix holding >= top_p of the total; at least one token.
  void keep_nucleus() {
    std::iota(order_.begin(), order_.end(), 0);
    const auto end = std::partition(order_.begin(), order_.end(),
                                    [&](int v) { return probs_[size_t(v)] > 0.0f; });
    std::sort(order_.begin(), end, [&](int a, int b) {
      return probs_[size_t(a)] > probs_[size_t(b)] ||
             (probs_[size_t(a)] == probs_[size_t(b)] && a < b);
    });
    double total = 0.0;
    for (auto it = order_.begin(); it != end; ++it) total += probs_[size_t(*it)];
    const double want = double(options_.top_p) * total;
    double sum = 0.0;
    auto it = order_.begin();
    while (it != end) {
      sum += probs_[size_t(*it++)];
      if (sum >= want) break;
    }
    for (; it != end; ++it) probs_[size_t(*it)] = 0.0f;
  }

  const SampleOptions& options_;
  std::vector<float> probs_;
  std::vector<int> order_;
};

}  // namespace

int32_t default_start_token(bool byte_level, int vocab_size) {
  return byte_level ? 10 : (vocab_size > 50256 ? 50256 : 0);
}

std::vector<int32_t> generate(const nn::Decoder& model, const std::vector<int32_t>& prompt,
                              const SampleOptions& options) {
  FD_CHECK(options.temperature >= 0.0f && std::isfinite(options.temperature),
           "temperature must be >= 0, got {}", options.temperature);
  FD_CHECK(options.top_k >= 0, "top_k must be >= 0, got {}", options.top_k);
  FD_CHECK(options.top_p > 0.0f && options.top_p <= 1.0f, "top_p must be in (0, 1], got {}",
           options.top_p);
  std::vector<int32_t> out;
  if (options.max_new_tokens <= 0) return out;
  // The cache holds the context window: options.max_context, else the model's.
  nn::KvDecoder decoder(model, std::max(options.max_context, 0));
  const int window = decoder.capacity();
  const int keep = (window + 1) / 2;  // what remains of a full window
  std::vector<int32_t> seq = prompt.empty() ? std::vector<int32_t>{options.start_token} : prompt;
  TokenSampler sampler(model.config().vocab_size, options);
  auto last = [&](size_t n) {
    return std::span<const int32_t>(seq).subspan(seq.size() - std::min(n, seq.size()));
  };
  std::span<const float> logits = decoder.append(last(size_t(window)));
  for (int i = 0; i < options.max_new_tokens; ++i) {
    const int32_t pick = sampler.draw(logits, i);
    seq.push_back(pick);
    out.push_back(pick);
    if (i + 1 == options.max_new_tokens) break;
    if (std::find(options.stop_tokens.begin(), options.stop_tokens.end(), pick) !=
        options.stop_tokens.end())
      break;
    if (decoder.length() < window) {
      logits = decoder.append(std::span<const int32_t>(&seq.back(), 1));
    } else {  // the window is full: keep its newest half and run that again
      decoder.reset();
      logits = decoder.append(last(size_t(keep)));
    }
  }
  return out;
}

}  // namespace fd::engine
