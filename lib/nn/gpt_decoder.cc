// The decoder's forward for a chunk of n new rows at positions [first, first + n):
//   x = wte[token] + wpe[position]
//   per block: h = ln_1(x); qkv = h W_attn + b; K, V cache rows [first, first + n) = k, v;
//              x += attention(q over cache rows [0, position]) W_proj + b;
//              x += gelu(ln_2(x) W_fc + b) W_mlp + b
//   logits = ln_f(x) wte^T (the tied head), for the rows asked for.
// Matrix products of the n rows go through one sgemm each; an attention row
// is two sgemv over the cached keys and values of one head.
#include "lib/nn/gpt_decoder.h"

#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "lib/base/check.h"

namespace fd::nn {
namespace {

constexpr float kLayerNormEps = 1e-5f;  // as ops::layernorm's default (GPT-2's)

// out (n x C) = layernorm of each row of x (n x C), then * w + b.
void layernorm_rows(const float* x, const float* w, const float* b, int64_t n, int64_t C,
                    float* out) {
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * C;
    float* y = out + r * C;
    float sum = 0.0f;
    for (int64_t i = 0; i < C; ++i) sum += xr[i];
    const float mean = sum / float(C);
    float sq = 0.0f;
    for (int64_t i = 0; i < C; ++i) sq += (xr[i] - mean) * (xr[i] - mean);
    const float rstd = 1.0f / std::sqrt(sq / float(C) + kLayerNormEps);
    for (int64_t i = 0; i < C; ++i) y[i] = (xr[i] - mean) * rstd * w[i] + b[i];
  }
}

// out (n x k_out) = x (n x k_in) W (k_in x k_out) + bias, or += when accumulate.
void linear_rows(const float* x, const float* w, const float* bias, int64_t n, int64_t k_in,
                 int64_t k_out, float* out, bool accumulate) {
  if (!accumulate)
    for (int64_t r = 0; r < n; ++r) std::copy(bias, bias + k_out, out + r * k_out);
  else
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < k_out; ++j) out[r * k_out + j] += bias[j];
  if (n == 1)  // one token: out = W^T x (sgemv streams W once, no packing)
    cblas_sgemv(CblasRowMajor, CblasTrans, int(k_in), int(k_out), 1.0f, w, int(k_out), x, 1, 1.0f,
                out, 1);
  else
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(n), int(k_out), int(k_in), 1.0f, x,
                int(k_in), w, int(k_out), 1.0f, out, int(k_out));
}

// GELU, tanh approximation (ops::gelu, GPT-2's).
float gelu(float v) {
  constexpr float kScale = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * v * (1.0f + std::tanh(kScale * (v + 0.044715f * v * v * v)));
}

}  // namespace

GptDecoder::GptDecoder(const Gpt& model) : config_(model.config()) {
  std::map<std::string, const Parameter*> by_name;
  for (const Parameter* p : model.parameters()) by_name[p->name] = p;
  for (const Parameter* p : model.frozen_parameters()) by_name[p->name] = p;
  auto param = [&](const std::string& name) -> const Parameter& {
    auto it = by_name.find(name);
    FD_CHECK(it != by_name.end(), "GptDecoder: the model has no parameter {}", name);
    return *it->second;
  };
  auto weight = [&](const std::string& name) {
    const Tensor& t = param(name).value;
    Weight w;
    if (t.dtype() == DType::kF32 && !t.is_cuda())
      w.borrowed = t.f32();
    else
      w.owned = t.to_vector();
    return w;
  };
  // A block's Conv1D weight (in, out), with its LoRA update merged in if it has one.
  const LoraConfig& lora = model.lora();
  auto linear_weight = [&](int layer, const char* module) {
    const std::string base = fmt::format("h.{}.{}", layer, module);
    Weight w = weight(base + ".weight");
    if (!lora.applies(layer, module)) return w;
    if (w.owned.empty()) {
      const Tensor& t = param(base + ".weight").value;
      w.owned.assign(w.borrowed, w.borrowed + t.numel());
    }
    const Tensor& a = param(base + ".lora_A.weight").value;  // (r, in)
    const Tensor& b = param(base + ".lora_B.weight").value;  // (out, r)
    const std::vector<float> av = a.to_vector(), bv = b.to_vector();
    const int64_t r = a.shape()[0], in = a.shape()[1], out = b.shape()[0];
    // W (in, out) += alpha/r * A^T (in, r) B^T (r, out)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasTrans, int(in), int(out), int(r),
                lora.alpha / float(lora.r), av.data(), int(in), bv.data(), int(r), 1.0f,
                w.owned.data(), int(out));
    return w;
  };
  wte_ = weight("wte.weight");
  wpe_ = weight("wpe.weight");
  lnf_w_ = weight("ln_f.weight");
  lnf_b_ = weight("ln_f.bias");
  const size_t cache = size_t(config_.max_seq_len) * size_t(config_.d_model);
  for (int l = 0; l < config_.n_layer; ++l) {
    auto n = [l](const char* s) { return fmt::format("h.{}.{}", l, s); };
    Block b;
    b.ln1_w = weight(n("ln_1.weight"));
    b.ln1_b = weight(n("ln_1.bias"));
    b.attn_w = linear_weight(l, "attn.c_attn");
    b.attn_b = weight(n("attn.c_attn.bias"));
    b.proj_w = linear_weight(l, "attn.c_proj");
    b.proj_b = weight(n("attn.c_proj.bias"));
    b.ln2_w = weight(n("ln_2.weight"));
    b.ln2_b = weight(n("ln_2.bias"));
    b.fc_w = linear_weight(l, "mlp.c_fc");
    b.fc_b = weight(n("mlp.c_fc.bias"));
    b.mlp_w = linear_weight(l, "mlp.c_proj");
    b.mlp_b = weight(n("mlp.c_proj.bias"));
    b.k.resize(cache);
    b.v.resize(cache);
    blocks_.push_back(std::move(b));
  }
}

// att_ rows [0, n) = causal attention of the chunk's queries (in big_, the qkv
// rows) over cache rows [0, first + j] for row j.
void GptDecoder::attention(const Block& b, int first, int n) {
  const int64_t C = config_.d_model, H = config_.n_head, hs = C / H;
  const float scale = 1.0f / std::sqrt(float(hs));
  for (int j = 0; j < n; ++j) {
    const int64_t keys = first + j + 1;
    const float* q = big_.data() + int64_t(j) * 3 * C;
    for (int64_t h = 0; h < H; ++h) {
      float* s = scores_.data();
      // s = K_h (keys x hs, row stride C) q_h * scale
      cblas_sgemv(CblasRowMajor, CblasNoTrans, int(keys), int(hs), scale, b.k.data() + h * hs,
                  int(C), q + h * hs, 1, 0.0f, s, 1);
      const float mx = *std::max_element(s, s + keys);
      float total = 0.0f;
      for (int64_t t = 0; t < keys; ++t) total += (s[t] = std::exp(s[t] - mx));
      const float inv = 1.0f / total;
      for (int64_t t = 0; t < keys; ++t) s[t] *= inv;
      // out_h = V_h^T (hs x keys) s
      cblas_sgemv(CblasRowMajor, CblasTrans, int(keys), int(hs), 1.0f, b.v.data() + h * hs, int(C),
                  s, 1, 0.0f, att_.data() + int64_t(j) * C + h * hs, 1);
    }
  }
}

std::span<const float> GptDecoder::append(std::span<const int32_t> tokens, bool all_logits) {
  const int n = int(tokens.size());
  FD_CHECK(n >= 1, "GptDecoder::append: no tokens");
  FD_CHECK(length_ + n <= capacity(),
           "GptDecoder::append: {} + {} positions exceed the {} of the cache", length_, n,
           capacity());
  const int64_t C = config_.d_model, V = config_.vocab_size;
  const int first = length_;
  x_.resize(size_t(n * C));
  h_.resize(size_t(n * C));
  att_.resize(size_t(n * C));
  big_.resize(size_t(n * 4 * C));
  scores_.resize(size_t(capacity()));
  for (int j = 0; j < n; ++j) {
    const int32_t tok = tokens[size_t(j)];
    FD_CHECK(tok >= 0 && tok < V, "GptDecoder::append: token {} outside the vocabulary of {}", tok,
             V);
    const float* e = wte_.data() + int64_t(tok) * C;
    const float* p = wpe_.data() + int64_t(first + j) * C;
    for (int64_t i = 0; i < C; ++i) x_[size_t(j * C + i)] = e[i] + p[i];
  }
  for (Block& b : blocks_) {
    layernorm_rows(x_.data(), b.ln1_w.data(), b.ln1_b.data(), n, C, h_.data());
    linear_rows(h_.data(), b.attn_w.data(), b.attn_b.data(), n, C, 3 * C, big_.data(), false);
    for (int j = 0; j < n; ++j) {
      const float* row = big_.data() + int64_t(j) * 3 * C;
      std::copy(row + C, row + 2 * C, b.k.begin() + (first + j) * C);
      std::copy(row + 2 * C, row + 3 * C, b.v.begin() + (first + j) * C);
    }
    attention(b, first, n);
    linear_rows(att_.data(), b.proj_w.data(), b.proj_b.data(), n, C, C, x_.data(), true);
    layernorm_rows(x_.data(), b.ln2_w.data(), b.ln2_b.data(), n, C, h_.data());
    linear_rows(h_.data(), b.fc_w.data(), b.fc_b.data(), n, C, 4 * C, big_.data(), false);
    for (int64_t i = 0; i < n * 4 * C; ++i) big_[size_t(i)] = gelu(big_[size_t(i)]);
    linear_rows(big_.data(), b.mlp_w.data(), b.mlp_b.data(), n, 4 * C, C, x_.data(), true);
  }
  length_ += n;
  const int rows = all_logits ? n : 1;
  const float* last = x_.data() + int64_t(n - rows) * C;
  layernorm_rows(last, lnf_w_.data(), lnf_b_.data(), rows, C, h_.data());
  logits_.resize(size_t(rows * V));
  // logits (rows x V) = h (rows x C) wte^T
  if (rows == 1)
    cblas_sgemv(CblasRowMajor, CblasNoTrans, int(V), int(C), 1.0f, wte_.data(), int(C), h_.data(),
                1, 0.0f, logits_.data(), 1);
  else
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, int(V), int(C), 1.0f, h_.data(),
                int(C), wte_.data(), int(C), 0.0f, logits_.data(), int(V));
  return {logits_.data(), logits_.size()};
}

}  // namespace fd::nn
