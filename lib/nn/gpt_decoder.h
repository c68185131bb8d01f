// GptDecoder: inference-only, incremental forward of a Gpt with a KV cache.
//
// In a causal model a new token changes nothing at earlier positions: its
// query attends over keys and values that were already computed. So the
// decoder keeps, per block, the keys and values of every position so far (a
// (max_seq_len, d_model) fp32 cache each) and runs only the new tokens'
// forward: per token, one row through every linear layer and one attention
// row over the cache. Generating n tokens costs O(n) token forwards instead of
// the O(n^2) of re-running the sequence.
//
// This is a separate code path from Gpt::forward: plain fp32 arithmetic with
// BLAS on the CPU, no autograd, no tape, no allocation once the buffers have
// grown. It computes the same function: every position's logits equal
// Gpt::forward's on the same prefix up to float rounding (fp32 models: rel
// < 1e-5, tests/nn/gpt_decoder_test.cc). Models in bf16/f16 or on the GPU are
// read once into fp32 host copies, and LoRA adapters are merged into their
// base weights (W + alpha/r A^T B^T, no adapter dropout: this is inference).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "lib/nn/gpt.h"

namespace fd::nn {

class GptDecoder {
 public:
  // Reads the weights of `model`. For an fp32 model on the CPU the decoder
  // reads the parameters in place, so `model` must outlive the decoder and
  // not change while it is used.
  explicit GptDecoder(const Gpt& model);
  GptDecoder(const GptDecoder&) = delete;
  GptDecoder& operator=(const GptDecoder&) = delete;

  const GptConfig& config() const { return config_; }
  // Positions held in the cache; the next token goes to position length().
  int length() const { return length_; }
  // The most positions the cache can hold: the model's max_seq_len.
  int capacity() const { return config_.max_seq_len; }
  // Empties the cache (the next append() starts at position 0).
  void reset() { length_ = 0; }

  // Runs `tokens` (each in [0, vocab_size)) at positions length() ..
  // length() + n - 1, adds their keys and values to the cache, and returns
  // logits: the last position's (vocab_size floats), or with all_logits every
  // appended position's (n x vocab_size, row-major). Requires n >= 1 and
  // length() + n <= capacity(). The span is valid until the next call.
  std::span<const float> append(std::span<const int32_t> tokens, bool all_logits = false);

 private:
  // A weight as fp32 on the host: the parameter itself or an owned copy.
  struct Weight {
    const float* borrowed = nullptr;
    std::vector<float> owned;
    const float* data() const { return owned.empty() ? borrowed : owned.data(); }
  };
  struct Block {
    Weight ln1_w, ln1_b, attn_w, attn_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, mlp_w, mlp_b;
    std::vector<float> k, v;  // (capacity, C) each: the cache
  };

  void attention(const Block& b, int first, int n);

  GptConfig config_;
  Weight wte_, wpe_, lnf_w_, lnf_b_;
  std::vector<Block> blocks_;
  int length_ = 0;
  // Scratch for a chunk of n rows, grown as needed.
  std::vector<float> x_, h_, big_, att_, scores_, logits_;
};

}  // namespace fd::nn
