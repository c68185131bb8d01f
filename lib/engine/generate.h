// Text generation from a trained model: temperature + top-k sampling,
// deterministic in the seed. Used for the sample printed at the end of a run.
#pragma once

#include <cstdint>
#include <vector>

#include "lib/nn/gpt.h"

namespace fd::engine {

struct SampleOptions {
  int max_new_tokens = 200;  // tokens to generate
  float temperature = 0.8f;  // > 0; logits are divided by it
  int top_k = 40;            // keep the k most likely tokens; 0 = all
  uint64_t seed = 1337;      // sampling is a function of (seed, position)
  int max_context = 0;        // tokens of context; 0 = the model's max_seq_len. Use the
                              // trained sequence length: later positions are untrained
  int32_t start_token = 10;  // context for an empty prompt ('\n' for byte-level text), < vocab
};

// Continues `prompt` (token ids; may be empty, then generation starts from
// options.start_token) by up to max_new_tokens tokens, using at most max_context (or max_seq_len)
// tokens of context. Returns only the new tokens.
std::vector<int32_t> generate(const nn::Gpt& model, const std::vector<int32_t>& prompt,
                              const SampleOptions& options);

}  // namespace fd::engine
