// Text generation from a trained model: temperature + top-k sampling,
// deterministic in the seed. Used for the sample printed at the end of a run
// and by `fdtrain generate`.
//
// Decoding is incremental (nn::GptDecoder): the prompt runs once, then each
// new token costs one token's forward over the KV cache, so time grows
// linearly with the number of tokens (bench/generate_bench.sh).
//
// The context window is max_context tokens (or the model's max_seq_len).
// While the sequence fits, every token sees the whole sequence, exactly as a
// full forward of it would. When the window is full, the oldest tokens are
// dropped so that the newest ceil(window / 2) remain; these are re-run as a
// prompt (positions from 0) and decoding continues. So past the window each
// token is predicted from between ceil(window / 2) and window tokens of
// context, and the cost stays linear (one re-run of half a window per half
// window of new tokens) instead of a full window's forward per token.
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
  int max_context = 0;       // tokens of context; 0 = the model's max_seq_len. Use the
                             // trained sequence length: later positions are untrained
  int32_t start_token = 10;  // context for an empty prompt ('\n' for byte-level text), < vocab
};

// Continues `prompt` (token ids < vocab_size; may be empty, then generation
// starts from options.start_token) by max_new_tokens tokens within a context
// window of max_context (or max_seq_len) tokens, as described above. Only the
// last window of a longer prompt is read. Returns only the new tokens. Token i
// is drawn with uniform01(hash(seed, i)) from softmax(logits / temperature)
// restricted to the top_k largest logits.
std::vector<int32_t> generate(const nn::Gpt& model, const std::vector<int32_t>& prompt,
                              const SampleOptions& options);

}  // namespace fd::engine
