#include "lib/nn/gpt.h"

#include <fmt/format.h>

#include <cmath>

#include "lib/base/rng.h"
#include "lib/ops/attention.h"
#include "lib/ops/cross_entropy.h"
#include "lib/ops/elementwise.h"
#include "lib/ops/embedding.h"
#include "lib/ops/gelu.h"
#include "lib/ops/layernorm.h"
#include "lib/ops/matmul.h"

namespace fd::nn {

using autograd::Variable;

int64_t GptConfig::num_params() const {
  int64_t C = d_model;
  int64_t per_block =
      2 * C + (C * 3 * C + 3 * C) + (C * C + C) + 2 * C + (C * 4 * C + 4 * C) + (4 * C * C + C);
  return int64_t(vocab_size) * C + int64_t(max_seq_len) * C + n_layer * per_block + 2 * C;
}

double GptConfig::flops_per_token(int seq_len) const {
  return 6.0 * double(num_params()) + 12.0 * n_layer * double(seq_len) * d_model;
}

std::vector<SegmentSpec> Gpt::segment_specs(const GptConfig& config) {
  const int64_t C = config.d_model, V = config.vocab_size, T = config.max_seq_len;
  std::vector<SegmentSpec> out;
  out.push_back({"embed", {{"wte.weight", Shape{V, C}, true}, {"wpe.weight", Shape{T, C}, true}}});
  for (int l = 0; l < config.n_layer; ++l) {
    auto n = [l](const char* s) { return fmt::format("h.{}.{}", l, s); };
    out.push_back({fmt::format("h.{}", l),
                   {
                       {n("ln_1.weight"), Shape{C}, false},
                       {n("ln_1.bias"), Shape{C}, false},
                       {n("attn.c_attn.weight"), Shape{C, 3 * C}, true},
                       {n("attn.c_attn.bias"), Shape{3 * C}, false},
                       {n("attn.c_proj.weight"), Shape{C, C}, true},
                       {n("attn.c_proj.bias"), Shape{C}, false},
                       {n("ln_2.weight"), Shape{C}, false},
                       {n("ln_2.bias"), Shape{C}, false},
                       {n("mlp.c_fc.weight"), Shape{C, 4 * C}, true},
                       {n("mlp.c_fc.bias"), Shape{4 * C}, false},
                       {n("mlp.c_proj.weight"), Shape{4 * C, C}, true},
                       {n("mlp.c_proj.bias"), Shape{C}, false},
                   }});
  }
  out.push_back({"final", {{"ln_f.weight", Shape{C}, false}, {"ln_f.bias", Shape{C}, false}}});
  return out;
}

Gpt::Gpt(const GptConfig& config, DType dtype, const GroupLayout& layout)
    : config_(config), dtype_(dtype) {
  FD_CHECK(config.d_model % config.n_head == 0, "d_model {} not divisible by n_head {}",
           config.d_model, config.n_head);
  for (SegmentSpec& s : segment_specs(config))
    segments_.push_back(
        std::make_unique<FlatParamGroup>(std::move(s.name), std::move(s.params), dtype, layout));
}

std::vector<const Parameter*> Gpt::parameters() const {
  std::vector<const Parameter*> out;
  for (const auto& s : segments_)
    for (const auto& p : s->params()) out.push_back(&p);
  return out;
}

std::vector<const FlatParamGroup*> Gpt::groups() const {
  std::vector<const FlatParamGroup*> out;
  for (const auto& s : segments_) out.push_back(s.get());
  return out;
}

void Gpt::init_gpt2(uint64_t seed) {
  const float std_base = 0.02f;
  const float std_resid = 0.02f / std::sqrt(2.0f * float(config_.n_layer));
  auto ends_with = [](const std::string& s, std::string_view suffix) {
    return s.size() >= suffix.size() &&
           s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  for (const Parameter* p : parameters()) {
    const int64_t n = p->value.numel();
    std::vector<float> v(size_t(n), 0.0f);
    bool is_norm = p->name.find("ln_") != std::string::npos;
    if (is_norm && ends_with(p->name, ".weight")) {
      std::fill(v.begin(), v.end(), 1.0f);
    } else if (p->decay) {  // 2-D weights
      float std = ends_with(p->name, "c_proj.weight") ? std_resid : std_base;
      // Our own hash of the name (std::hash differs between platforms).
      uint64_t name_hash = 0;
      for (char c : p->name) name_hash = mix64(name_hash ^ uint8_t(c));
      for (int64_t i = 0; i < n; ++i)
        v[size_t(i)] = std * normal01(hash_words(seed, name_hash, uint64_t(i), 0),
                                      hash_words(seed, name_hash, uint64_t(i), 1));
    }
    p->value.copy_from(Tensor::from_vector(v, p->value.shape()));
  }
}

Variable Gpt::block_forward(int layer, const Variable& x) const {
  const FlatParamGroup& g = *segments_[size_t(layer) + 1];
  const auto& ps = g.params();  // order fixed by the constructor
  Variable h = ops::layernorm(x, ps[0].var(), ps[1].var());
  Variable qkv = ops::matmul(h, ps[2].var(), ps[3].var());
  Variable att = ops::causal_attention(qkv, config_.n_head);
  Variable x2 = ops::add(x, ops::matmul(att, ps[4].var(), ps[5].var()));
  Variable h2 = ops::layernorm(x2, ps[6].var(), ps[7].var());
  Variable f = ops::gelu(ops::matmul(h2, ps[8].var(), ps[9].var()));
  return ops::add(x2, ops::matmul(f, ps[10].var(), ps[11].var()));
}

Variable Gpt::forward(const Tensor& tokens, SegmentRunner* runner) const {
  FD_CHECK(tokens.shape().ndim() == 2, "tokens must be (B, T), got {}", tokens.shape().str());
  const int64_t B = tokens.shape()[0], T = tokens.shape()[1];
  FD_CHECK(T <= config_.max_seq_len, "sequence of {} exceeds max_seq_len {}", T,
           config_.max_seq_len);
  if (!positions_.defined() || positions_.shape() != tokens.shape()) {
    positions_ = Tensor::empty(tokens.shape(), DType::kI32, MemCategory::kOther);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) positions_.i32()[b * T + t] = int32_t(t);
  }
  DirectRunner direct;
  SegmentRunner& run = runner ? *runner : direct;
  const FlatParamGroup& embed = *segments_.front();
  Variable x = run.run(
      kEmbedSegment,
      [&](const Variable&) {
        const auto& ps = embed.params();
        return ops::add(ops::embedding(ps[0].var(), tokens), ops::embedding(ps[1].var(), positions_));
      },
      Variable(), {});
  for (int l = 0; l < config_.n_layer; ++l)
    x = run.run(1 + l, [&, l](const Variable& in) { return block_forward(l, in); }, x, {});
  const FlatParamGroup& fin = *segments_.back();
  return run.run(
      final_segment(),
      [&](const Variable& in) {
        const auto& ps = fin.params();
        Variable h = ops::layernorm(in, ps[0].var(), ps[1].var());
        // Tied lm head: logits = h @ wte^T.
        return ops::matmul(h, embed.params()[0].var(), {},
                           ops::MatmulOptions{.trans_a = false, .trans_b = true});
      },
      x, {kEmbedSegment});
}

Variable Gpt::loss(const Tensor& tokens, const Tensor& targets, SegmentRunner* runner) const {
  return ops::cross_entropy(forward(tokens, runner), targets, -1);
}

}  // namespace fd::nn
