// Text generation from a trained model: greedy decoding, or temperature +
// top-k + top-p (nucleus) sampling, deterministic in the seed. Used for the
// sample printed at the end of a run and by `fdtrain generate`.
//
// Decoding is incremental (nn::KvDecoder): the prompt runs once, then each
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

#include "lib/nn/decoder.h"

namespace fd::engine {

// The context of an empty prompt: '\n' for byte-level text, else GPT-2's
// <|endoftext|> (50256) when the vocabulary has it, else token 0.
int32_t default_start_token(bool byte_level, int vocab_size);

struct SampleOptions {
  int max_new_tokens = 200;  // tokens to generate
  float temperature = 0.8f;  // >= 0; logits are divided by it. 0 = greedy: the argmax
                             // (the lowest id among ties); top_k and top_p do not matter
  int top_k = 40;            // keep the k most likely tokens; 0 = all
  float top_p = 1.0f;        // in (0, 1]: then keep the smallest set of the likeliest tokens
                             // whose probability (after top_k) sums to >= top_p; 1 = all
  uint64_t seed = 1337;      // sampling is a function of (seed, position)
  int max_context = 0;       // tokens of context; 0 = the model's max_seq_len. Use the
                             // trained sequence length: later positions are untrained
  int32_t start_token = 10;  // context for an empty prompt ('\n' for byte-level text), < vocab
  std::vector<int32_t> stop_tokens;  // generation ends after drawing one of these (the
                                     // tokenizer's EOS / end-of-turn ids); it is returned
};

// Continues `prompt` (token ids < vocab_size; may be empty, then generation
// starts from options.start_token) by max_new_tokens tokens within a context
// window of max_context (or max_seq_len) tokens, as described above. Only the
// last window of a longer prompt is read. Returns only the new tokens. Token i
// is drawn with uniform01(hash(seed, i)) from p = softmax(logits / temperature)
// restricted first to the top_k largest logits, then to the nucleus: with
// tokens sorted by p descending (ties: lower id first), the shortest prefix
// whose renormalised p sums to >= top_p (never empty), as Hugging Face's
// TopPLogitsWarper after its TopKLogitsWarper. temperature 0 takes the argmax.
// Checks 0 <= temperature, 0 <= top_k and 0 < top_p <= 1 (FD_CHECK).
std::vector<int32_t> generate(const nn::Decoder& model, const std::vector<int32_t>& prompt,
                              const SampleOptions& options);

}  // namespace fd::engine
