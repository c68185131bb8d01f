#include "lib/nn/gpt.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "lib/base/rng.h"
#include "lib/ops/attention.h"
#include "lib/ops/cross_entropy.h"
#include "lib/ops/dropout.h"
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

namespace {

// Writes fp32 initial values into a parameter: straight into its memory on
// the CPU (a temporary Tensor would stay in the allocator's cache), through a
// host staging copy on the GPU.
void store_init(const Tensor& param, const std::vector<float>& v) {
  if (!param.is_cuda()) {
    convert_f32_to(param.dtype(), v.data(), param.raw(), v.size());
    return;
  }
  Tensor host = Tensor::empty(param.shape(), param.dtype(), MemCategory::kOther, Device::cpu());
  convert_f32_to(param.dtype(), v.data(), host.raw(), v.size());
  param.copy_from(host);
}

// The block modules adapters can target, with their Conv1D (in, out) and the
// index of their weight within the block's parameters.
struct ModuleShape {
  const char* name;
  int64_t in, out;
};
std::vector<ModuleShape> block_modules(const GptConfig& c) {
  const int64_t C = c.d_model;
  return {{"attn.c_attn", C, 3 * C}, {"attn.c_proj", C, C}, {"mlp.c_fc", C, 4 * C},
          {"mlp.c_proj", 4 * C, C}};
}

}  // namespace

bool LoraConfig::applies(int layer, const std::string& module) const {
  if (!enabled()) return false;
  if (!layers.empty() && std::find(layers.begin(), layers.end(), layer) == layers.end())
    return false;
  return std::find(modules.begin(), modules.end(), module) != modules.end();
}

int64_t LoraConfig::num_params(const GptConfig& config) const {
  int64_t n = 0;
  for (int l = 0; l < config.n_layer; ++l)
    for (const ModuleShape& m : block_modules(config))
      if (applies(l, m.name)) n += int64_t(r) * (m.in + m.out);
  return n;
}

std::vector<std::string> lora_modules_for_targets(const std::vector<std::string>& targets) {
  std::vector<std::string> out;
  auto add = [&](const char* m) {
    if (std::find(out.begin(), out.end(), m) == out.end()) out.push_back(m);
  };
  for (const std::string& t : targets) {
    if (t == "c_attn" || t == "attn.c_attn") add("attn.c_attn");
    if (t == "c_proj" || t == "attn.c_proj") add("attn.c_proj");
    if (t == "c_fc" || t == "mlp.c_fc") add("mlp.c_fc");
    if (t == "c_proj" || t == "mlp.c_proj") add("mlp.c_proj");
  }
  return out;
}

std::vector<SegmentSpec> Gpt::segment_specs(const GptConfig& config, const LoraConfig& lora) {
  if (lora.enabled()) {
    std::vector<SegmentSpec> out;
    out.push_back({"embed", {}});
    for (int l = 0; l < config.n_layer; ++l) {
      SegmentSpec seg{fmt::format("h.{}", l), {}};
      for (const ModuleShape& m : block_modules(config)) {
        if (!lora.applies(l, m.name)) continue;
        seg.params.push_back({fmt::format("h.{}.{}.lora_A.weight", l, m.name), Shape{lora.r, m.in}, true});
        seg.params.push_back({fmt::format("h.{}.{}.lora_B.weight", l, m.name), Shape{m.out, lora.r}, true});
      }
      out.push_back(std::move(seg));
    }
    out.push_back({"final", {}});
    return out;
  }
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

Gpt::Gpt(const GptConfig& config, DType dtype, const GroupLayout& layout, const LoraConfig& lora,
         const GroupLayout& frozen_layout)
    : config_(config), dtype_(dtype), lora_(lora) {
  FD_CHECK(config.d_model % config.n_head == 0, "d_model {} not divisible by n_head {}",
           config.d_model, config.n_head);
  for (SegmentSpec& s : segment_specs(config, lora))
    segments_.push_back(
        std::make_unique<FlatParamGroup>(std::move(s.name), std::move(s.params), dtype, layout));
  if (lora.enabled()) {
    GroupLayout fl = frozen_layout;
    fl.with_grads = false;
    for (SegmentSpec& s : segment_specs(config))
      frozen_.push_back(
          std::make_unique<FlatParamGroup>(std::move(s.name), std::move(s.params), dtype, fl));
  }
}

std::vector<const Parameter*> Gpt::parameters() const {
  std::vector<const Parameter*> out;
  for (const auto& s : segments_)
    for (const auto& p : s->params()) out.push_back(&p);
  return out;
}

std::vector<const Parameter*> Gpt::frozen_parameters() const {
  std::vector<const Parameter*> out;
  for (const auto& s : frozen_)
    for (const auto& p : s->params()) out.push_back(&p);
  return out;
}

std::vector<const FlatParamGroup*> Gpt::frozen_groups() const {
  std::vector<const FlatParamGroup*> out;
  for (const auto& s : frozen_) out.push_back(s.get());
  return out;
}

const FlatParamGroup& Gpt::base_group(int segment) const {
  return lora_.enabled() ? *frozen_[size_t(segment)] : *segments_[size_t(segment)];
}

Variable Gpt::base_var(int segment, int index) const {
  const Parameter& p = base_group(segment).params()[size_t(index)];
  return lora_.enabled() ? Variable(p.value, false) : p.var();
}

Variable Gpt::linear(int layer, const std::string& module, const Variable& x,
                     int weight_index) const {
  const int seg = 1 + layer;
  Variable y = ops::matmul(x, base_var(seg, weight_index), base_var(seg, weight_index + 1));
  if (!lora_.applies(layer, module)) return y;
  const FlatParamGroup& g = *segments_[size_t(seg)];
  const std::string a_name = fmt::format("h.{}.{}.lora_A.weight", layer, module);
  const Parameter* a = nullptr;
  const Parameter* b = nullptr;
  for (size_t i = 0; i + 1 < g.params().size(); ++i)
    if (g.params()[i].name == a_name) {
      a = &g.params()[i];
      b = &g.params()[i + 1];
    }
  FD_CHECK(a != nullptr, "no adapter {}", a_name);
  Variable in = x;
  if (lora_.dropout > 0.0f) {
    uint64_t stream = 0;
    for (char c : a_name) stream = mix64(stream ^ uint8_t(c));
    in = ops::dropout(x, lora_.dropout, dropout_seed_, stream);
  }
  const ops::MatmulOptions t{.trans_a = false, .trans_b = true};
  Variable low = ops::matmul(in, a->var(), {}, t);    // (..., r)
  Variable up = ops::matmul(low, b->var(), {}, t);    // (..., out)
  return ops::add(y, ops::scale(up, lora_.alpha / float(lora_.r)));
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
  // Meta parameters hold no values (lib/tensor/device.h): nothing to draw.
  if (segments_.front()->flat_params().is_meta()) return;
  std::vector<const Parameter*> all = lora_.enabled() ? frozen_parameters() : parameters();
  for (const Parameter* p : all) {
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
    store_init(p->value, v);
  }
  if (!lora_.enabled()) return;
  // Adapters: A Kaiming-uniform with a = sqrt(5) (PEFT): bound = 1/sqrt(in); B zero.
  for (const Parameter* p : parameters()) {
    const int64_t n = p->value.numel();
    std::vector<float> v(size_t(n), 0.0f);
    if (p->name.find(".lora_A.") != std::string::npos) {
      const float bound = 1.0f / std::sqrt(float(p->value.shape()[1]));
      uint64_t name_hash = 0;
      for (char c : p->name) name_hash = mix64(name_hash ^ uint8_t(c));
      for (int64_t i = 0; i < n; ++i)
        v[size_t(i)] = bound * (2.0f * uniform01(hash_words(seed, name_hash, uint64_t(i), 2)) - 1.0f);
    }
    store_init(p->value, v);
  }
}

Variable Gpt::block_forward(int layer, const Variable& x) const {
  const int seg = layer + 1;  // parameter order fixed by segment_specs
  Variable h = ops::layernorm(x, base_var(seg, 0), base_var(seg, 1));
  Variable qkv = linear(layer, "attn.c_attn", h, 2);
  Variable att = ops::causal_attention(qkv, config_.n_head);
  Variable x2 = ops::add(x, linear(layer, "attn.c_proj", att, 4));
  Variable h2 = ops::layernorm(x2, base_var(seg, 6), base_var(seg, 7));
  Variable f = ops::gelu(linear(layer, "mlp.c_fc", h2, 8));
  return ops::add(x2, linear(layer, "mlp.c_proj", f, 10));
}

Variable Gpt::forward(const Tensor& tokens, SegmentRunner* runner) const {
  FD_CHECK(tokens.shape().ndim() == 2, "tokens must be (B, T), got {}", tokens.shape().str());
  const int64_t B = tokens.shape()[0], T = tokens.shape()[1];
  FD_CHECK(T <= config_.max_seq_len, "sequence of {} exceeds max_seq_len {}", T,
           config_.max_seq_len);
  if (!positions_.defined() || positions_.shape() != tokens.shape() ||
      positions_.device() != default_device()) {
    std::vector<float> ids(size_t(B * T));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) ids[size_t(b * T + t)] = float(t);
    positions_ = Tensor::from_vector(ids, tokens.shape(), DType::kI32, MemCategory::kOther);
  }
  DirectRunner direct;
  SegmentRunner& run = runner ? *runner : direct;
  Variable x = run.run(
      kEmbedSegment,
      [&](const Variable&) {
        return ops::add(ops::embedding(base_var(kEmbedSegment, 0), tokens),
                        ops::embedding(base_var(kEmbedSegment, 1), positions_));
      },
      Variable(), {});
  for (int l = 0; l < config_.n_layer; ++l)
    x = run.run(1 + l, [&, l](const Variable& in) { return block_forward(l, in); }, x, {});
  const int fin = final_segment();
  return run.run(
      fin,
      [&, fin](const Variable& in) {
        Variable h = ops::layernorm(in, base_var(fin, 0), base_var(fin, 1));
        // Tied lm head: logits = h @ wte^T.
        return ops::matmul(h, base_var(kEmbedSegment, 0), {},
                           ops::MatmulOptions{.trans_a = false, .trans_b = true});
      },
      x, {kEmbedSegment});
}

Variable Gpt::loss(const Tensor& tokens, const Tensor& targets, SegmentRunner* runner) const {
  return ops::cross_entropy(forward(tokens, runner), targets, -1);
}

}  // namespace fd::nn
