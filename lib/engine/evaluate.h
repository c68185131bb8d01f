// Evaluation of a model on the start of a token stream: the mean loss and
// perplexity that `fdtrain eval` reports, defined so that any implementation
// can reproduce it exactly:
//
//   window i (0 <= i < N) = tokens [i (T + 1), (i + 1) (T + 1)) of the stream;
//   its inputs are its first T tokens, its targets its last T (next tokens);
//   mean loss = the mean, over all N T targets, of -log softmax(logits)[target];
//   perplexity = exp(mean loss).
//
// Each window is an independent sequence (positions 0..T-1, no state carried
// between windows), as in training.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "lib/nn/decoder.h"

namespace fd::engine {

struct EvalResult {
  double mean_loss = 0.0;   // nats per target token
  double perplexity = 0.0;  // exp(mean_loss)
  int64_t windows = 0;      // N
  int seq_len = 0;          // T
  int64_t targets = 0;      // N * T
};

// Called after each forward with the windows done so far, the total, and the
// mean loss over the targets of the windows done (for a progress line).
using EvalProgress = std::function<void(int64_t windows_done, int64_t windows, double mean_loss)>;

// Evaluates `model` on windows = tokens.size() / (seq_len + 1) windows of
// `tokens` (the first windows * (seq_len + 1) tokens of the stream; the size
// must be a multiple of seq_len + 1, each id < vocab_size). Requires
// 1 <= seq_len <= max_seq_len. Runs `batch` windows per forward, without
// autograd; the result does not depend on `batch` beyond float rounding.
// `progress`, if set, is called after every forward; its last call has
// windows_done == windows and the result's mean_loss.
EvalResult evaluate_windows(const nn::Decoder& model, std::span<const int32_t> tokens, int seq_len,
                            int batch = 8, const EvalProgress& progress = {});

}  // namespace fd::engine
