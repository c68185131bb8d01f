// The decoder's forward for a chunk of n new rows at positions [first, first + n):
//   x = embed[token] (+ positions[position] for GPT-2)
//   per block: h = norm_1(x); q, k, v = h W_q, h W_k, h W_v (GPT-2: one fused c_attn);
//              q, k: per-head RMSNorm (Qwen3), then RoPE at their positions (Llama family);
//              cache rows [first, first + n) = k, v;
//              x += attention(q over cache rows [0, position]) W_o;
//              x += mlp(norm_2(x))  (GPT-2 c_proj(gelu(c_fc)), else down(silu(gate) * up))
//   logits = norm(x) head^T (the embedding when tied), for the rows asked for.
// Matrix products of the n rows go through one sgemm each (sgemv for one
// row); an attention row is two sgemv over the cached keys and values of the
// query head's key/value head.
#include "lib/nn/kv_decoder.h"

#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "lib/base/check.h"
#include "lib/base/error.h"
#include "lib/tensor/lora_merge.h"

namespace fd::nn {
namespace {

// GELU, tanh approximation (ops::gelu, GPT-2's).
float gelu(float v) {
  constexpr float kScale = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * v * (1.0f + std::tanh(kScale * (v + 0.044715f * v * v * v)));
}

float silu(float v) { return v / (1.0f + std::exp(-v)); }

// A model's trainable and frozen parameters by name.
class ParameterIndex {
 public:
  explicit ParameterIndex(const Decoder& model) {
    for (const Parameter* p : model.parameters()) by_name_[p->name] = p;
    for (const Parameter* p : model.frozen_parameters()) by_name_[p->name] = p;
  }
  const Parameter* find(const std::string& name) const {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : it->second;
  }

 private:
  std::map<std::string, const Parameter*> by_name_;
};

}  // namespace

KvDecoder::KvDecoder(const Decoder& model, int capacity)
    : config_(model.config()), conv1d_(model.config().family == ModelFamily::kGpt2) {
  const DecoderConfig& c = config_;
  const bool learned = c.positions == PositionKind::kLearned;
  capacity_ = capacity > 0 ? capacity : int(c.max_position_embeddings);
  if (learned && capacity_ > c.max_position_embeddings)
    usage_error("a context of {} positions is longer than the model's {} learned positions",
                capacity_, c.max_position_embeddings);
  const ParameterIndex by_name(model);
  auto find = [&](const std::string& name) { return by_name.find(name); };
  auto weight = [&](const std::string& name, bool required = true) {
    Weight w;
    const Parameter* p = find(name);
    FD_CHECK(p != nullptr || !required, "KvDecoder: the model has no parameter {}", name);
    if (p == nullptr) return w;
    if (model.quantized(*p) != nullptr)  // a 4-bit base weight: what the forward computes with
      w.owned = model.dequantized(*p);
    else if (p->value.dtype() == DType::kF32 && !p->value.is_cuda())
      w.borrowed = p->value.f32();
    else
      w.owned = p->value.to_vector();
    return w;
  };
  // A block's linear layer, with its LoRA update merged in if it has one.
  const LoraConfig& lora = model.lora();
  auto linear = [&](int layer, const LinearShape& shape) {
    const std::string base = family_names(c).block_prefix(layer) + shape.module;
    Linear l{weight(base + ".weight"), weight(base + ".bias", false), shape.in, shape.out};
    if (!lora.applies(layer, shape.module)) return l;
    if (l.w.owned.empty()) l.w.owned.assign(l.w.borrowed, l.w.borrowed + shape.in * shape.out);
    const std::vector<float> a = find(base + ".lora_A.weight")->value.to_vector();  // (r, in)
    const std::vector<float> b = find(base + ".lora_B.weight")->value.to_vector();  // (out, r)
    merge_lora_into(l.w.owned, a, b, lora.r, shape.in, shape.out, double(lora.scaling()),
                    conv1d_ ? WeightLayout::kInOut : WeightLayout::kOutIn);
    return l;
  };
  const FamilyNames names = family_names(c);
  embed_ = weight(names.embed);
  if (learned) positions_ = weight(names.positions);
  final_w_ = weight(names.final_norm + ".weight");
  final_b_ = weight(names.final_norm + ".bias", false);
  head_ = c.tie_word_embeddings ? weight(names.embed) : weight(names.lm_head);
  const std::vector<LinearShape> shapes = block_linears(c);
  const size_t n_attn = conv1d_ ? 1 : 3;  // linear layers before o_proj
  const size_t kv_width = size_t(c.num_kv_heads) * size_t(c.head_dim);
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = names.block_prefix(l);
    Block b;
    b.norm1_w = weight(p + names.norm1 + ".weight");
    b.norm1_b = weight(p + names.norm1 + ".bias", false);
    b.norm2_w = weight(p + names.norm2 + ".weight");
    b.norm2_b = weight(p + names.norm2 + ".bias", false);
    if (c.qk_norm) {
      b.q_norm = weight(p + "self_attn.q_norm.weight");
      b.k_norm = weight(p + "self_attn.k_norm.weight");
    }
    for (size_t i = 0; i < n_attn; ++i) b.qkv.push_back(linear(l, shapes[i]));
    b.o = linear(l, shapes[n_attn]);
    for (size_t i = n_attn + 1; i < shapes.size(); ++i) b.mlp.push_back(linear(l, shapes[i]));
    b.k.resize(size_t(capacity_) * kv_width);
    b.v.resize(size_t(capacity_) * kv_width);
    blocks_.push_back(std::move(b));
  }
  if (c.positions == PositionKind::kRope) {  // the training forward's tables (ops::rope_tables)
    const ops::RopeTables t = ops::rope_tables(rope_options(c), capacity_);
    rope_cos_ = t.cos.to_vector();
    rope_sin_ = t.sin.to_vector();
  }
}

int64_t KvDecoder::host_bytes(const Decoder& model, int capacity, int rows) {
  const DecoderConfig& c = model.config();
  const int64_t cap = capacity > 0 ? capacity : c.max_position_embeddings;
  // As the constructor's weight(): a parameter read in place when it is fp32 on the host.
  auto owned = [&](const Parameter* p) -> int64_t {
    if (p == nullptr) return 0;
    const bool in_place =
        model.quantized(*p) == nullptr && p->value.dtype() == DType::kF32 && !p->value.is_cuda();
    return in_place ? 0 : p->value.numel();
  };
  const ParameterIndex by_name(model);
  auto find = [&](const std::string& name) { return by_name.find(name); };
  const FamilyNames names = family_names(c);
  int64_t floats = owned(find(names.embed)) + owned(find(names.final_norm + ".weight")) +
                   owned(find(names.final_norm + ".bias"));
  if (c.positions == PositionKind::kLearned) floats += owned(find(names.positions));
  // The head: its own copy even when tied to the embedding.
  floats += owned(find(c.tie_word_embeddings ? names.embed : names.lm_head));
  const LoraConfig& lora = model.lora();
  const std::vector<LinearShape> shapes = block_linears(c);
  const int64_t kv_width = int64_t(c.num_kv_heads) * c.head_dim;
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = names.block_prefix(l);
    for (const std::string& n : {names.norm1, names.norm2})
      floats += owned(find(p + n + ".weight")) + owned(find(p + n + ".bias"));
    if (c.qk_norm)
      floats +=
          owned(find(p + "self_attn.q_norm.weight")) + owned(find(p + "self_attn.k_norm.weight"));
    for (const LinearShape& shape : shapes) {
      const std::string base = p + shape.module;
      floats += owned(find(base + ".bias"));
      // A LoRA-merged weight is always a copy.
      floats +=
          lora.applies(l, shape.module) ? shape.in * shape.out : owned(find(base + ".weight"));
    }
    floats += 2 * cap * kv_width;  // the cache
  }
  if (c.positions == PositionKind::kRope) floats += 2 * cap * c.head_dim;
  // Scratch (append()): x, h, qkv, att and the MLP's rows, the scores, the last row's logits.
  const int64_t n = std::max(rows, 1), C = c.hidden_size, D = c.head_dim;
  const int64_t q_width = c.num_heads * D, width = q_width + 2 * kv_width;
  const int64_t mlp = c.mlp == MlpKind::kSwiGlu ? 2 * c.intermediate_size : c.intermediate_size;
  floats += n * (2 * C + width + q_width + mlp) + cap + c.vocab_size;
  return floats * int64_t(sizeof(float));
}

int64_t KvDecoder::bytes() const {
  size_t floats = 0;
  auto add = [&](const Weight& w) { floats += w.owned.size(); };
  add(embed_), add(positions_), add(final_w_), add(final_b_), add(head_);
  for (const Block& b : blocks_) {
    add(b.norm1_w), add(b.norm1_b), add(b.norm2_w), add(b.norm2_b), add(b.q_norm), add(b.k_norm);
    for (const Linear& l : b.qkv) add(l.w), add(l.b);
    add(b.o.w), add(b.o.b);
    for (const Linear& l : b.mlp) add(l.w), add(l.b);
    floats += b.k.size() + b.v.size();
  }
  floats += rope_cos_.size() + rope_sin_.size();
  for (const std::vector<float>* v : {&x_, &h_, &qkv_, &big_, &att_, &scores_, &logits_})
    floats += v->capacity();  // scratch keeps what its largest append needed
  return int64_t(floats * sizeof(float));
}

void KvDecoder::linear(const Linear& l, const float* x, int64_t n, float* out, int64_t ldo,
                       bool accumulate) const {
  for (int64_t r = 0; r < n; ++r) {
    float* y = out + r * ldo;
    if (!accumulate) std::fill(y, y + l.out, 0.0f);
    if (!l.b.empty())
      for (int64_t j = 0; j < l.out; ++j) y[j] += l.b.data()[j];
  }
  const int in = int(l.in), o = int(l.out);
  if (n == 1) {  // one token: sgemv streams W once, no packing
    if (conv1d_)
      cblas_sgemv(CblasRowMajor, CblasTrans, in, o, 1.0f, l.w.data(), o, x, 1, 1.0f, out, 1);
    else
      cblas_sgemv(CblasRowMajor, CblasNoTrans, o, in, 1.0f, l.w.data(), in, x, 1, 1.0f, out, 1);
  } else if (conv1d_) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(n), o, in, 1.0f, x, in, l.w.data(),
                o, 1.0f, out, int(ldo));
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), o, in, 1.0f, x, in, l.w.data(), in,
                1.0f, out, int(ldo));
  }
}

// out (n x width) = norm of each row of x, as the model's norm computes it.
void KvDecoder::norm(const float* x, const Weight& w, const Weight& b, int64_t n, int64_t width,
                     float* out) const {
  const float eps = float(config_.norm_eps);
  const bool layer_norm = config_.norm == NormKind::kLayerNorm;
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * width;
    float* y = out + r * width;
    float mean = 0.0f;
    if (layer_norm) {
      for (int64_t i = 0; i < width; ++i) mean += xr[i];
      mean /= float(width);
    }
    float sq = 0.0f;
    for (int64_t i = 0; i < width; ++i) sq += (xr[i] - mean) * (xr[i] - mean);
    const float rstd = 1.0f / std::sqrt(sq / float(width) + eps);
    for (int64_t i = 0; i < width; ++i)
      y[i] = layer_norm ? (xr[i] - mean) * rstd * w.data()[i] + b.data()[i]
                        : w.data()[i] * ((xr[i] - mean) * rstd);
  }
}

// Rotates `heads` heads of each of n rows (row stride ld) at positions first + j.
void KvDecoder::rope_rows(float* x, int64_t n, int64_t ld, int heads, int first) const {
  const int64_t D = config_.head_dim, half = D / 2;
  for (int64_t j = 0; j < n; ++j) {
    const float* cs = rope_cos_.data() + (first + j) * D;
    const float* sn = rope_sin_.data() + (first + j) * D;
    for (int h = 0; h < heads; ++h) {
      float* v = x + j * ld + h * D;
      for (int64_t i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * cs[i] - b * sn[i];
        v[i + half] = b * cs[i + half] + a * sn[i + half];
      }
    }
  }
}

// att_ rows [0, n) = causal attention of the chunk's queries (in qkv_) over
// cache rows [0, first + j] for row j; query head h reads key/value head
// h / (n_head / n_kv_head).
void KvDecoder::attention(const Block& b, int first, int n) {
  const int64_t D = config_.head_dim, H = config_.num_heads, group = H / config_.num_kv_heads;
  const int64_t q_width = H * D, kv_width = config_.num_kv_heads * D;
  const int64_t width = q_width + 2 * kv_width;
  const float scale = 1.0f / std::sqrt(float(D));
  for (int j = 0; j < n; ++j) {
    const int64_t keys = first + j + 1;
    const float* q = qkv_.data() + int64_t(j) * width;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kvh = h / group;
      float* s = scores_.data();
      // s = K_kvh (keys x D, row stride kv_width) q_h * scale
      cblas_sgemv(CblasRowMajor, CblasNoTrans, int(keys), int(D), scale, b.k.data() + kvh * D,
                  int(kv_width), q + h * D, 1, 0.0f, s, 1);
      const float mx = *std::max_element(s, s + keys);
      float total = 0.0f;
      for (int64_t t = 0; t < keys; ++t) total += (s[t] = std::exp(s[t] - mx));
      const float inv = 1.0f / total;
      for (int64_t t = 0; t < keys; ++t) s[t] *= inv;
      // out_h = V_kvh^T (D x keys) s
      cblas_sgemv(CblasRowMajor, CblasTrans, int(keys), int(D), 1.0f, b.v.data() + kvh * D,
                  int(kv_width), s, 1, 0.0f, att_.data() + int64_t(j) * q_width + h * D, 1);
    }
  }
}

std::span<const float> KvDecoder::append(std::span<const int32_t> tokens, bool all_logits) {
  const int n = int(tokens.size());
  FD_CHECK(n >= 1, "KvDecoder::append: no tokens");
  FD_CHECK(length_ + n <= capacity(),
           "KvDecoder::append: {} + {} positions exceed the {} of the cache", length_, n,
           capacity());
  const DecoderConfig& c = config_;
  const int64_t C = c.hidden_size, V = c.vocab_size, I = c.intermediate_size, D = c.head_dim;
  const int64_t q_width = c.num_heads * D, kv_width = c.num_kv_heads * D;
  const int64_t width = q_width + 2 * kv_width;
  const bool swiglu = c.mlp == MlpKind::kSwiGlu;
  const int first = length_;
  x_.resize(size_t(n * C));
  h_.resize(size_t(n * C));
  qkv_.resize(size_t(n * width));
  att_.resize(size_t(n * q_width));
  big_.resize(size_t(n * (swiglu ? 2 * I : I)));
  scores_.resize(size_t(capacity()));
  for (int j = 0; j < n; ++j) {
    const int32_t tok = tokens[size_t(j)];
    FD_CHECK(tok >= 0 && tok < V, "KvDecoder::append: token {} outside the vocabulary of {}", tok,
             V);
    const float* e = embed_.data() + int64_t(tok) * C;
    float* x = x_.data() + int64_t(j) * C;
    std::copy(e, e + C, x);
    if (!positions_.empty()) {
      const float* p = positions_.data() + int64_t(first + j) * C;
      for (int64_t i = 0; i < C; ++i) x[i] += p[i];
    }
  }
  for (Block& b : blocks_) {
    norm(x_.data(), b.norm1_w, b.norm1_b, n, C, h_.data());
    if (conv1d_) {  // the fused c_attn writes q | k | v
      linear(b.qkv[0], h_.data(), n, qkv_.data(), width, false);
    } else {
      linear(b.qkv[0], h_.data(), n, qkv_.data(), width, false);
      linear(b.qkv[1], h_.data(), n, qkv_.data() + q_width, width, false);
      linear(b.qkv[2], h_.data(), n, qkv_.data() + q_width + kv_width, width, false);
    }
    for (int j = 0; j < n; ++j) {
      float* row = qkv_.data() + int64_t(j) * width;
      if (c.qk_norm) {  // per head, before the rotation
        norm(row, b.q_norm, {}, c.num_heads, D, row);
        norm(row + q_width, b.k_norm, {}, c.num_kv_heads, D, row + q_width);
      }
    }
    if (c.positions == PositionKind::kRope) {
      rope_rows(qkv_.data(), n, width, c.num_heads, first);
      rope_rows(qkv_.data() + q_width, n, width, c.num_kv_heads, first);
    }
    for (int j = 0; j < n; ++j) {
      const float* row = qkv_.data() + int64_t(j) * width;
      std::copy(row + q_width, row + q_width + kv_width, b.k.begin() + (first + j) * kv_width);
      std::copy(row + q_width + kv_width, row + width, b.v.begin() + (first + j) * kv_width);
    }
    attention(b, first, n);
    linear(b.o, att_.data(), n, x_.data(), C, true);
    norm(x_.data(), b.norm2_w, b.norm2_b, n, C, h_.data());
    if (swiglu) {  // gate | up side by side, then silu(gate) * up packed into rows of I
      linear(b.mlp[0], h_.data(), n, big_.data(), 2 * I, false);
      linear(b.mlp[1], h_.data(), n, big_.data() + I, 2 * I, false);
      // Row j's I outputs land at j*I, never past its own inputs at 2*j*I: in place is safe.
      for (int64_t j = 0; j < n; ++j)
        for (int64_t i = 0; i < I; ++i)
          big_[size_t(j * I + i)] =
              silu(big_[size_t(2 * j * I + i)]) * big_[size_t(2 * j * I + I + i)];
      linear(b.mlp[2], big_.data(), n, x_.data(), C, true);
    } else {
      linear(b.mlp[0], h_.data(), n, big_.data(), I, false);
      for (int64_t i = 0; i < n * I; ++i) big_[size_t(i)] = gelu(big_[size_t(i)]);
      linear(b.mlp[1], big_.data(), n, x_.data(), C, true);
    }
  }
  length_ += n;
  const int rows = all_logits ? n : 1;
  const float* last = x_.data() + int64_t(n - rows) * C;
  norm(last, final_w_, final_b_, rows, C, h_.data());
  logits_.resize(size_t(rows * V));
  // logits (rows x V) = h (rows x C) head^T, head stored (V, C)
  if (rows == 1)
    cblas_sgemv(CblasRowMajor, CblasNoTrans, int(V), int(C), 1.0f, head_.data(), int(C), h_.data(),
                1, 0.0f, logits_.data(), 1);
  else
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, int(V), int(C), 1.0f, h_.data(),
                int(C), head_.data(), int(C), 0.0f, logits_.data(), int(V));
  return {logits_.data(), logits_.size()};
}

}  // namespace fd::nn
