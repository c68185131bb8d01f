// KvDecoder: inference-only, incremental forward of a Decoder with a KV cache.
//
// In a causal model a new token changes nothing at earlier positions: its
// query attends over keys and values that were already computed. So the
// decoder keeps, per block, the keys and values of every position so far (a
// (capacity, n_kv_head * head_dim) fp32 cache each: with GQA the cache is
// n_head / n_kv_head times smaller than the queries) and runs only the new
// tokens' forward: per token, one row through every linear layer and one
// attention row over the cache. Generating n tokens costs O(n) token
// forwards instead of the O(n^2) of re-running the sequence.
//
// This is a separate code path from Decoder::forward: plain fp32 arithmetic
// with BLAS on the CPU, no autograd, no tape, no allocation once the buffers
// have grown. It computes the same function for every family (GPT-2 and the
// Llama family: RMSNorm, RoPE, GQA, q/k norm, SwiGLU, untied head): every
// position's logits equal Decoder::forward's on the same prefix up to float
// rounding (fp32 models: rel < 1e-5, tests/nn/kv_decoder_test.cc). Models in
// bf16/f16 or on the GPU are read once into fp32 host copies, and LoRA
// adapters are merged into their base weights (no adapter dropout: this is
// inference) by merge_lora_into (lib/tensor/lora_merge.h), the merge every
// export uses: the weights are those of `ckpt export --merge-lora`.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "lib/nn/decoder.h"

namespace fd::nn {

class KvDecoder {
 public:
  // Reads the weights of `model`. For an fp32 model on the CPU the decoder
  // reads the parameters in place, so `model` must outlive the decoder and
  // not change while it is used. `capacity`: positions the cache holds; 0 =
  // the model's max_position_embeddings (a RoPE model trained at 128k
  // positions wants a smaller cache: pass the context you generate with).
  explicit KvDecoder(const Decoder& model, int capacity = 0);
  // The host memory a KvDecoder of `model` holds once appends of up to `rows` tokens at a time
  // have run: its fp32 copies of weights it cannot read in place (16-bit, GPU, 4-bit or LoRA-
  // merged), the cache, the RoPE tables and the scratch. The model may live on the counting
  // device (Device::meta(): `fdtrain estimate`'s end-of-run sample, process_memory.h). Equals
  // bytes() of such a decoder (tests/nn/kv_decoder_test.cc).
  static int64_t host_bytes(const Decoder& model, int capacity, int rows);
  // The bytes this decoder holds now (its vectors' capacities).
  int64_t bytes() const;
  KvDecoder(const KvDecoder&) = delete;
  KvDecoder& operator=(const KvDecoder&) = delete;

  const DecoderConfig& config() const { return config_; }
  // Positions held in the cache; the next token goes to position length().
  int length() const { return length_; }
  // The most positions the cache can hold.
  int capacity() const { return capacity_; }
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
    bool empty() const { return borrowed == nullptr && owned.empty(); }
  };
  // A linear layer: weight as stored (GPT-2 (in, out), else [out, in]) and bias.
  struct Linear {
    Weight w, b;
    int64_t in = 0, out = 0;
  };
  struct Block {
    Weight norm1_w, norm1_b, norm2_w, norm2_b, q_norm, k_norm;
    // GPT-2: qkv (fused) at index 0; Llama family: q, k, v. Then o, then the MLP's.
    std::vector<Linear> qkv;
    Linear o;
    std::vector<Linear> mlp;  // GPT-2: c_fc, c_proj; Llama family: gate, up, down
    std::vector<float> k, v;  // (capacity, kv_width) each: the cache
  };

  // out (n x l.out) = x (n x l.in) W + b (at row stride ldo), or += when accumulate.
  void linear(const Linear& l, const float* x, int64_t n, float* out, int64_t ldo,
              bool accumulate) const;
  void norm(const float* x, const Weight& w, const Weight& b, int64_t n, int64_t width,
            float* out) const;
  void rope_rows(float* x, int64_t n, int64_t ld, int heads, int first) const;
  void attention(const Block& b, int first, int n);

  DecoderConfig config_;
  bool conv1d_ = false;  // GPT-2's weights are stored (in, out)
  int capacity_ = 0;
  Weight embed_, positions_, final_w_, final_b_, head_;
  std::vector<Block> blocks_;
  std::vector<float> rope_cos_, rope_sin_;  // (capacity, head_dim), RoPE only
  int length_ = 0;
  // Scratch for a chunk of n rows, grown as needed.
  std::vector<float> x_, h_, qkv_, big_, att_, scores_, logits_;
};

}  // namespace fd::nn
