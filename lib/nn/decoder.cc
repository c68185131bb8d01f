#include "lib/nn/decoder.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "lib/base/error.h"
#include "lib/base/rng.h"
#include "lib/ops/attention.h"
#include "lib/ops/dropout.h"
#include "lib/ops/elementwise.h"
#include "lib/ops/embedding.h"
#include "lib/ops/gelu.h"
#include "lib/ops/layernorm.h"
#include "lib/ops/linear_cross_entropy.h"
#include "lib/ops/matmul.h"
#include "lib/ops/narrow.h"
#include "lib/ops/rms_norm.h"
#include "lib/ops/rope.h"
#include "lib/ops/swiglu.h"
#include "lib/ops/tp_regions.h"
#include "lib/ops/ulysses.h"
#include "lib/ops/vocab_parallel_cross_entropy.h"
#include "lib/quant/linear_4bit.h"

namespace fd::nn {

using autograd::Variable;

namespace {

bool is_gpt2(const DecoderConfig& c) { return c.family == ModelFamily::kGpt2; }

std::string block_prefix(const DecoderConfig& c, int layer) {
  return family_names(c).block_prefix(layer);
}

// A linear layer's weight as stored: GPT-2's Conv1D (in, out), else nn.Linear [out, in].
Shape stored_shape(const DecoderConfig& c, const LinearShape& l) {
  return is_gpt2(c) ? Shape{l.in, l.out} : Shape{l.out, l.in};
}

uint64_t name_hash(const std::string& name) {
  uint64_t h = 0;  // our own hash (std::hash differs between platforms)
  for (char ch : name) h = mix64(h ^ uint8_t(ch));
  return h;
}

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

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::string FamilyNames::block_prefix(int layer) const {
  return gpt2_blocks ? fmt::format("h.{}.", layer) : fmt::format("model.layers.{}.", layer);
}

FamilyNames family_names(const DecoderConfig& c) {
  if (is_gpt2(c))
    return {"wte.weight", "wpe.weight", "ln_f", "lm_head.weight", "ln_1", "ln_2", true};
  return {
      "model.embed_tokens.weight", "wpe.weight", "model.norm", "lm_head.weight", "input_layernorm",
      "post_attention_layernorm",  false};
}

ops::RopeOptions rope_options(const DecoderConfig& c) {
  const RopeScaling& s = c.rope_scaling;
  ops::RopeOptions o;
  o.head_dim = c.head_dim;
  o.theta = c.rope_theta;
  o.kind = s.kind == RopeScalingKind::kLinear   ? ops::RopeScalingKind::kLinear
           : s.kind == RopeScalingKind::kLlama3 ? ops::RopeScalingKind::kLlama3
                                                : ops::RopeScalingKind::kDefault;
  o.factor = s.factor;
  o.low_freq_factor = s.low_freq_factor;
  o.high_freq_factor = s.high_freq_factor;
  o.original_max_position_embeddings = s.original_max_position_embeddings;
  return o;
}

std::vector<LinearShape> block_linears(const DecoderConfig& c) {
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  const int64_t q_out = int64_t{c.num_heads} * c.head_dim,
                kv_out = int64_t{c.num_kv_heads} * c.head_dim;
  if (is_gpt2(c))
    return {{"attn.c_attn", H, q_out + 2 * kv_out, c.attention_bias},
            {"attn.c_proj", q_out, H, c.o_proj_bias},
            {"mlp.c_fc", H, I, c.mlp_bias},
            {"mlp.c_proj", I, H, c.mlp_bias}};
  return {{"self_attn.q_proj", H, q_out, c.attention_bias},
          {"self_attn.k_proj", H, kv_out, c.attention_bias},
          {"self_attn.v_proj", H, kv_out, c.attention_bias},
          {"self_attn.o_proj", q_out, H, c.o_proj_bias},
          {"mlp.gate_proj", H, I, c.mlp_bias},
          {"mlp.up_proj", H, I, c.mlp_bias},
          {"mlp.down_proj", I, H, c.mlp_bias}};
}

bool LoraConfig::applies(int layer, const std::string& module) const {
  if (!enabled()) return false;
  if (!layers.empty() && std::find(layers.begin(), layers.end(), layer) == layers.end())
    return false;
  return std::find(modules.begin(), modules.end(), module) != modules.end();
}

int64_t LoraConfig::num_params(const DecoderConfig& config) const {
  int64_t n = 0;
  for (int l = 0; l < config.num_layers; ++l)
    for (const LinearShape& m : block_linears(config))
      if (applies(l, m.module)) n += int64_t(r) * (m.in + m.out);
  return n;
}

std::vector<std::string> lora_modules_for_targets(const DecoderConfig& config,
                                                  const std::vector<std::string>& targets) {
  std::vector<std::string> out;
  auto add = [&](const std::string& m) {
    if (std::find(out.begin(), out.end(), m) == out.end()) out.push_back(m);
  };
  const std::vector<LinearShape> linears = block_linears(config);
  for (const std::string& t : targets) {
    if (t == "lm_head" || t == "embed_tokens" || t == "wte" || t == "wpe")
      usage_error(
          "lora.targets: {} is not supported: adapters go on the blocks' linear layers, the "
          "embedding and the head stay frozen (train them without lora instead)",
          t);
    bool known = false;
    for (const LoraTarget& target : lora_targets(config.family)) {
      if (t != target.name) continue;
      known = true;
      for (const char* m : target.modules) add(m);
      if (target.modules.empty())
        for (const LinearShape& l : linears) add(l.module);
    }
    for (const LinearShape& l : linears)  // a module's own name (as some PEFT configs write it)
      if (t == l.module) add(l.module), known = true;
    if (!known)
      usage_error("lora.targets: a {} model has no module {}; its targets are {}",
                  family_name(config.family), t,
                  fmt::format("{}", fmt::join(lora_target_names(config.family), ", ")));
  }
  return out;
}

Decoder::Split Decoder::split_of(const DecoderConfig& c, const std::string& module, int size) {
  if (size <= 1) return Split::kNone;
  if (module == "self_attn.o_proj" || module == "mlp.down_proj" || module == "attn.c_proj" ||
      module == "mlp.c_proj")
    return Split::kRow;
  if ((module == "self_attn.k_proj" || module == "self_attn.v_proj") &&
      kv_heads_replicated(c, size))
    return Split::kReplicated;
  return Split::kColumn;
}

std::vector<SegmentSpec> Decoder::segment_specs(const DecoderConfig& c, const LoraConfig& lora,
                                                const TensorParallel& tp) {
  const int64_t H = c.hidden_size;
  const bool layer_norm = c.norm == NormKind::kLayerNorm;
  const FamilyNames names = family_names(c);
  const std::vector<LinearShape> linears = block_linears(c);
  const int T = tp.size, t = tp.rank;
  FD_CHECK(T >= 1 && t >= 0 && t < T, "tensor-parallel rank {} of {}", t, T);
  if (T > 1) {
    const std::string why = tensor_parallel_refusal(c, T);
    FD_CHECK(why.empty(), "tensor parallelism: {}", why);
  }
  // dim of `shape` sliced to rank t's part: `blocks` equal parts (GPT-2's q | k | v), each
  // split into T.
  auto sliced = [&](Shape shape, int dim, int blocks = 1) -> std::pair<Shape, TensorSlice> {
    std::vector<int64_t> dims;
    for (int d = 0; d < shape.ndim(); ++d) dims.push_back(shape[d]);
    const int64_t part = dims[size_t(dim)] / blocks, local = part / T;
    dims[size_t(dim)] = local * blocks;
    return {Shape(std::span<const int64_t>(dims)), TensorSlice{dim, t * local, part, blocks}};
  };
  auto add_norm = [&](std::vector<ParamSpec>& ps, const std::string& name, int64_t n) {
    ps.push_back({name + ".weight", Shape{n}, false});
    if (layer_norm) ps.push_back({name + ".bias", Shape{n}, false});
  };
  // Stored weights: GPT-2's Conv1D (in, out), else [out, in]; the output features' and the
  // input features' dimensions.
  const int out_dim = is_gpt2(c) ? 1 : 0, in_dim = 1 - out_dim;
  auto blocks_of = [&](const LinearShape& l) { return l.module == "attn.c_attn" ? 3 : 1; };
  auto add_linear = [&](std::vector<ParamSpec>& ps, const std::string& prefix,
                        const LinearShape& l) {
    const std::string name = prefix + l.module;
    const Shape w = stored_shape(c, l);
    switch (split_of(c, l.module, T)) {
      case Split::kColumn: {
        auto [ws, wsl] = sliced(w, out_dim, blocks_of(l));
        ps.push_back({name + ".weight", ws, true, wsl});
        if (l.bias) {
          auto [bs, bsl] = sliced(Shape{l.out}, 0, blocks_of(l));
          ps.push_back({name + ".bias", bs, false, bsl});
        }
        return;
      }
      case Split::kRow: {
        auto [ws, wsl] = sliced(w, in_dim);
        ps.push_back({name + ".weight", ws, true, wsl});
        if (l.bias) ps.push_back({name + ".bias", Shape{l.out}, false});
        return;
      }
      case Split::kNone:
      case Split::kReplicated:
        ps.push_back({name + ".weight", w, true});
        if (l.bias) ps.push_back({name + ".bias", Shape{l.out}, false});
        return;
    }
  };
  // With LoRA: a block's adapters (the other segments have none), split as their base.
  auto adapters = [&](int l) {
    std::vector<ParamSpec> ps;
    for (const LinearShape& m : linears) {
      if (!lora.applies(l, m.module)) continue;
      const std::string base = block_prefix(c, l) + m.module;
      ParamSpec a{base + ".lora_A.weight", Shape{lora.r, m.in}, true};
      ParamSpec b{base + ".lora_B.weight", Shape{m.out, lora.r}, true};
      const Split sp = split_of(c, m.module, T);
      if (sp == Split::kColumn) std::tie(b.shape, b.slice) = sliced(b.shape, 0, blocks_of(m));
      if (sp == Split::kRow) std::tie(a.shape, a.slice) = sliced(a.shape, 1);
      ps.push_back(std::move(a));
      ps.push_back(std::move(b));
    }
    return ps;
  };
  auto block = [&](int l) {
    const std::string p = block_prefix(c, l);
    std::vector<ParamSpec> ps;
    if (is_gpt2(c)) {  // GPT-2's state_dict order: ln_1, attn, ln_2, mlp
      add_norm(ps, p + names.norm1, H);
      add_linear(ps, p, linears[0]);
      add_linear(ps, p, linears[1]);
      add_norm(ps, p + names.norm2, H);
      add_linear(ps, p, linears[2]);
      add_linear(ps, p, linears[3]);
    } else {  // the Llama family's: self_attn (q, k, v, o, q/k norms), mlp, the two norms
      for (size_t i = 0; i < 4; ++i) add_linear(ps, p, linears[i]);
      if (c.qk_norm) {
        ps.push_back({p + "self_attn.q_norm.weight", Shape{c.head_dim}, false});
        ps.push_back({p + "self_attn.k_norm.weight", Shape{c.head_dim}, false});
      }
      for (size_t i = 4; i < linears.size(); ++i) add_linear(ps, p, linears[i]);
      add_norm(ps, p + names.norm1, H);
      add_norm(ps, p + names.norm2, H);
    }
    return ps;
  };
  // The embedding's and the head's rows: the vocabulary's slice (uneven: the first V % T ranks
  // hold one row more).
  auto vocab_rows = [&](const std::string& name) -> ParamSpec {
    if (T == 1) return {name, Shape{c.vocab_size, H}, true};
    const ops::VocabRange r = ops::vocab_shard_range(c.vocab_size, t, T);
    return {name, Shape{r.count, H}, true, TensorSlice{0, r.begin, c.vocab_size, 1}};
  };

  std::vector<SegmentSpec> out;
  for (const SegmentInfo& seg : decoder_segments(c)) {
    std::vector<ParamSpec> ps;
    switch (seg.role) {
      case SegmentRole::kEmbedding:
        if (lora.enabled()) break;
        ps.push_back(vocab_rows(names.embed));
        if (c.positions == PositionKind::kLearned)
          ps.push_back({names.positions, Shape{c.max_position_embeddings, H}, true});
        break;
      case SegmentRole::kBlock:
        ps = lora.enabled() ? adapters(seg.block) : block(seg.block);
        break;
      case SegmentRole::kHead:  // the final norm, and the head's matrix unless tied
        if (lora.enabled()) break;
        add_norm(ps, names.final_norm, H);
        if (seg.tied_to < 0) ps.push_back(vocab_rows(names.lm_head));
        break;
    }
    out.push_back({seg.name, std::move(ps)});
  }
  return out;
}

Decoder::Decoder(const DecoderConfig& config, DType dtype, const GroupLayout& layout,
                 const LoraConfig& lora, const GroupLayout& frozen_layout,
                 const std::function<bool(int segment)>& present,
                 const std::optional<quant::QuantOptions>& quantize, const TensorParallel& tp,
                 const SequenceParallel& sp)
    : config_(config), quantize_(quantize), lora_(lora), tp_(tp), sp_(sp) {
  config.validate();
  FD_CHECK(!quantize || lora.enabled(), "a 4-bit base is frozen: it needs LoRA adapters");
  FD_CHECK(!tp.enabled() ||
               (tp.group != nullptr && tp.group->size() == tp.size && tp.group->rank() == tp.rank),
           "tensor parallelism: rank {} of {} needs its tp group", tp.rank, tp.size);
  if (tp.enabled() && quantize) {
    const std::string why =
        quantized_tensor_parallel_refusal(config, tp.size, quantize->block_size);
    FD_CHECK(why.empty(), "QLoRA with tensor parallelism: {}", why);
  }
  FD_CHECK(!tp.sequence_parallel || tp.enabled(),
           "sequence parallelism needs tensor parallelism over more than one rank");
  FD_CHECK(!sp.enabled() || (sp.group != nullptr && sp.group->size() == sp.size &&
                             sp.group->rank() == sp.rank && !tp.sequence_parallel),
           "Ulysses: rank {} of {} needs its sp group (and not Megatron's sequence parallelism)",
           sp.rank, sp.size);
  if (tp.enabled())
    vocab_begin_ = ops::vocab_shard_range(config.vocab_size, tp.rank, tp.size).begin;
  // An absent segment (another pipeline stage's) keeps its layout with
  // released buffers: sizes and names stay, nothing is allocated. Acquired,
  // they are communication buffers (the end-of-run gather of every stage's
  // parameters).
  auto absent = [](GroupLayout l) {
    l.params_resident = false;
    l.grads_resident = false;
    l.params_category = l.grads_category = MemCategory::kComm;
    return l;
  };
  info_ = decoder_segments(config);
  embedding_ = find_segment(info_, SegmentRole::kEmbedding);
  head_ = find_segment(info_, SegmentRole::kHead);
  for (int g = 0; g < int(info_.size()); ++g) present_.push_back(!present || present(g));
  int g = 0;
  for (SegmentSpec& s : segment_specs(config, lora, tp)) {
    segments_.push_back(
        std::make_unique<FlatParamGroup>(std::move(s.name), std::move(s.params), dtype,
                                         present_[size_t(g)] ? layout : absent(layout)));
    ++g;
  }
  if (lora.enabled()) {
    GroupLayout fl = frozen_layout;
    fl.with_grads = false;
    logical_.resize(info_.size());
    g = 0;
    for (SegmentSpec& s : segment_specs(config, {}, tp)) {
      const GroupLayout& l = present_[size_t(g)] ? fl : absent(fl);
      if (quantize && info_[size_t(g)].role == SegmentRole::kBlock) {
        add_quantized_segment(g, std::move(s), dtype, l);
      } else {
        frozen_.push_back(
            std::make_unique<FlatParamGroup>(std::move(s.name), std::move(s.params), dtype, l));
      }
      ++g;
    }
  }
  // Resolve every parameter the forward reads once, by name.
  auto find = [](const std::vector<Parameter>& g, const std::string& name) -> const Parameter* {
    for (const Parameter& p : g)
      if (p.name == name) return &p;
    return nullptr;
  };
  const FamilyNames names = family_names(config);
  const std::vector<Parameter>& emb = base_params(embedding_);
  embed_w_ = find(emb, names.embed);
  positions_w_ = find(emb, names.positions);
  const std::vector<Parameter>& fin = base_params(head_);
  final_w_ = find(fin, names.final_norm + ".weight");
  final_b_ = find(fin, names.final_norm + ".bias");
  lm_head_ = find(fin, names.lm_head);
  for (int l = 0; l < config.num_layers; ++l) {
    const int seg = find_segment(info_, SegmentRole::kBlock, l);
    const std::vector<Parameter>& g = base_params(seg);
    const std::string p = block_prefix(config, l);
    BlockParams b;
    b.norm1_w = find(g, p + names.norm1 + ".weight");
    b.norm1_b = find(g, p + names.norm1 + ".bias");
    b.norm2_w = find(g, p + names.norm2 + ".weight");
    b.norm2_b = find(g, p + names.norm2 + ".bias");
    b.q_norm = find(g, p + "self_attn.q_norm.weight");
    b.k_norm = find(g, p + "self_attn.k_norm.weight");
    for (const LinearShape& m : block_linears(config)) {
      BlockParams::Linear lin{find(g, p + m.module + ".weight"), find(g, p + m.module + ".bias")};
      lin.q = lin.w ? quantized(*lin.w) : nullptr;
      if (lora.applies(l, m.module)) {
        const std::vector<Parameter>& a = segments_[size_t(seg)]->params();
        lin.lora_a = find(a, p + m.module + ".lora_A.weight");
        lin.lora_b = find(a, p + m.module + ".lora_B.weight");
      }
      b.linears[m.module] = lin;
    }
    blocks_.push_back(std::move(b));
  }
}

std::vector<const Parameter*> Decoder::parameters() const {
  std::vector<const Parameter*> out;
  for (const auto& s : segments_)
    for (const auto& p : s->params()) out.push_back(&p);
  return out;
}

std::vector<const Parameter*> Decoder::frozen_parameters() const {
  std::vector<const Parameter*> out;
  for (size_t g = 0; g < frozen_.size(); ++g)
    for (const Parameter& p : base_params(int(g))) out.push_back(&p);
  return out;
}

std::vector<const FlatParamGroup*> Decoder::groups() const {
  std::vector<const FlatParamGroup*> out;
  for (const auto& s : segments_) out.push_back(s.get());
  return out;
}

std::vector<const FlatParamGroup*> Decoder::frozen_groups() const {
  std::vector<const FlatParamGroup*> out;
  for (const auto& s : frozen_) out.push_back(s.get());
  return out;
}

const FlatParamGroup& Decoder::base_group(int segment) const {
  return lora_.enabled() ? *frozen_[size_t(segment)] : *segments_[size_t(segment)];
}

const std::vector<Parameter>& Decoder::base_params(int segment) const {
  if (!logical_.empty() && !logical_[size_t(segment)].empty()) return logical_[size_t(segment)];
  return base_group(segment).params();
}

namespace {
// Whether `name` is the weight of one of a block's linear layers (what QLoRA stores in 4 bits).
bool is_linear_weight(const DecoderConfig& c, const std::string& name) {
  for (const LinearShape& m : block_linears(c))
    if (ends_with(name, "." + m.module + ".weight")) return true;
  return false;
}

// How a 4-bit member is stored: a whole weight as the recipe says; a tensor-parallel slice keeps
// the whole weight's blocks with their absmax in fp32 (without double quantization: the
// nested statistics are the whole tensor's, over blocks other ranks hold), so that its values
// are those of the unsharded model exactly.
quant::QuantOptions member_options(const quant::QuantOptions& o, const TensorSlice& slice) {
  quant::QuantOptions m = o;
  if (!slice.whole()) m.double_quant = false;
  return m;
}

// The 4-bit layout [out, in] of a weight of logical shape `shape` (GPT-2's Conv1D (in, out) is
// stored transposed).
std::vector<int64_t> quantized_shape(const DecoderConfig& c, const Shape& shape) {
  return is_gpt2(c) ? std::vector<int64_t>{shape[1], shape[0]}
                    : std::vector<int64_t>{shape[0], shape[1]};
}

// Rank's slice `l` of a whole 4-bit weight `whole`: the blocks it holds, codes as they are and
// absmax in fp32 (quant::block_absmax: what the whole weight's dequantization multiplies by).
// The slice must hold whole blocks (quantized_tensor_parallel_refusal; checked here).
quant::Quantized4bit slice_blocks(const DecoderConfig& c, const quant::Quantized4bit& whole,
                                  const Parameter& l) {
  // The slice in the 4-bit layout.
  Parameter q;
  q.name = l.name;
  q.slice = l.slice;
  if (is_gpt2(c)) q.slice.dim = 1 - q.slice.dim;
  const std::vector<int64_t> shape = quantized_shape(c, l.value.shape());
  q.value = Tensor::released(Shape(std::span<const int64_t>(shape)), DType::kU8,
                             MemCategory::kOther, Device::cpu());
  const int64_t bs = whole.block_size, n = q.value.numel(), total = whole.numel();
  const std::vector<float> absmax = quant::block_absmax(whole);
  quant::Quantized4bit out;
  out.type = whole.type;
  out.block_size = bs;
  out.shape = shape;
  out.packed.assign(size_t((n + 1) / 2), 0);
  out.absmax.assign(size_t((n + bs - 1) / bs), 0.0f);
  for_each_global_run(q, 0, n, [&](int64_t g, int64_t at, int64_t count) {
    FD_CHECK(g % bs == 0 && at % bs == 0 && (count % bs == 0 || g + count == total),
             "{}: elements [{}, {}) of the whole weight are not whole blocks of {}", l.name, g,
             g + count, bs);
    // bs is even: runs start on whole bytes; an odd run ends the weight with its padding nibble.
    std::memcpy(out.packed.data() + at / 2, whole.packed.data() + g / 2, size_t((count + 1) / 2));
    std::copy_n(absmax.begin() + g / bs, (count + bs - 1) / bs, out.absmax.begin() + at / bs);
  });
  return out;
}
}  // namespace

void Decoder::add_quantized_segment(int segment, SegmentSpec spec, DType dtype,
                                    GroupLayout layout) {
  const quant::QuantOptions& q = *quantize_;
  const int64_t elem = int64_t(dtype_size(dtype));
  // Held (not a stage-3 gather buffer nor another stage's): the 4-bit base's own category.
  if (layout.params_category != MemCategory::kComm)
    layout.params_category = MemCategory::kQuantized;
  std::vector<ParamSpec> bytes;
  std::vector<bool> is_q;
  for (const ParamSpec& p : spec.params) {
    is_q.push_back(is_linear_weight(config_, p.name));
    bytes.push_back(
        {p.name,
         Shape{is_q.back()
                   ? quant::encoded_layout(p.shape.numel(), member_options(q, p.slice)).bytes
                   : p.shape.numel() * elem},
         false});
  }
  frozen_.push_back(
      std::make_unique<FlatParamGroup>(spec.name, std::move(bytes), DType::kU8, layout));
  const FlatParamGroup& grp = *frozen_.back();
  const std::shared_ptr<Storage>& storage = grp.flat_params().storage();
  std::vector<Parameter>& logical = logical_[size_t(segment)];
  logical.reserve(spec.params.size());  // pointers to its elements are kept below
  for (size_t i = 0; i < spec.params.size(); ++i) {
    const ParamSpec& p = spec.params[i];
    const Parameter& stored = grp.params()[i];
    Parameter l;
    l.name = p.name;
    l.decay = p.decay;
    l.slice = p.slice;  // the whole tensor's part it is (tensor parallelism)
    // Byte offsets are multiples of FlatParamGroup::kAlignElems (16): aligned for any dtype.
    FD_CHECK(stored.offset % 16 == 0, "{} at byte {} of its segment", p.name, stored.offset);
    if (is_q[i]) {
      l.value = Tensor::released(p.shape, dtype, layout.params_category);  // no storage of its own
      l.offset = stored.offset;
    } else {
      l.value = Tensor::view_of(storage, size_t(stored.offset / elem), p.shape, dtype);
      l.offset = stored.offset / elem;
    }
    logical.push_back(std::move(l));
  }
  for (size_t i = 0; i < logical.size(); ++i) {
    const Parameter& stored = grp.params()[i];
    logical_of_[&stored] = &logical[i];
    if (!is_q[i]) continue;
    quantized_.emplace(&logical[i], quant::QuantizedWeight::view(
                                        storage, size_t(stored.offset),
                                        quantized_shape(config_, logical[i].value.shape()),
                                        member_options(q, logical[i].slice)));
  }
}

const quant::QuantizedWeight* Decoder::quantized(const Parameter& p) const {
  auto it = quantized_.find(&p);
  return it == quantized_.end() ? nullptr : &it->second;
}

namespace {
// (rows, cols) row-major -> (cols, rows).
std::vector<float> transposed(const std::vector<float>& v, int64_t rows, int64_t cols) {
  std::vector<float> t(v.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[size_t(c * rows + r)] = v[size_t(r * cols + c)];
  return t;
}
}  // namespace

std::vector<float> Decoder::dequantized(const Parameter& p) const {
  const quant::QuantizedWeight* w = quantized(p);
  FD_CHECK(w != nullptr, "{} is not stored in 4 bits", p.name);
  std::vector<float> v = quant::dequantize(w->to_quantized4bit());
  if (is_gpt2(config_)) v = transposed(v, w->shape()[0], w->shape()[1]);
  return v;
}

ParamFill Decoder::storage_fill(ParamFill logical, QuantizedSource stored) const {
  if (!quantize_) return logical;
  // The encoded bytes of the last stored member asked for: a rank's shard asks for a range of
  // each member it overlaps, once.
  struct Last {
    const Parameter* p = nullptr;
    std::vector<uint8_t> bytes;
  };
  auto last = std::make_shared<Last>();
  return [this, logical = std::move(logical), stored = std::move(stored), last](
             const Parameter& p, int64_t begin, int64_t count, const Tensor& out) {
    auto it = logical_of_.find(&p);
    if (it == logical_of_.end()) {  // not in a 4-bit segment
      logical(p, begin, count, out);
      return;
    }
    FD_CHECK(out.dtype() == DType::kU8 && out.numel() == count && begin >= 0 &&
                 begin + count <= p.value.numel(),
             "storage_fill of {}: bytes [{}, {}) of {} into {} of {}", p.name, begin, begin + count,
             p.value.numel(), out.numel(), dtype_name(out.dtype()));
    if (out.is_meta() || count == 0) return;
    if (last->p != &p) {
      last->p = nullptr;
      last->bytes = encoded(*it->second, logical, stored);
      last->p = &p;
    }
    FD_CHECK(int64_t(last->bytes.size()) == p.value.numel(), "{}: {} encoded bytes for {}", p.name,
             last->bytes.size(), p.value.numel());
    const uint8_t* src = last->bytes.data() + begin;
    if (!out.is_cuda()) {
      std::memcpy(out.raw(), src, size_t(count));
      return;
    }
    Tensor host = Tensor::empty(Shape{count}, DType::kU8, MemCategory::kOther, Device::cpu());
    std::memcpy(host.raw(), src, size_t(count));
    out.copy_from(host);
  };
}

std::vector<uint8_t> Decoder::encoded(const Parameter& l, const ParamFill& logical,
                                      const QuantizedSource& stored) const {
  const int64_t n = l.value.numel();
  // The value in the compute dtype, as the logical fill gives it (a CPU staging tensor).
  auto value = [&] {
    Tensor t = Tensor::empty(Shape{n}, l.value.dtype(), MemCategory::kOther, Device::cpu());
    logical(l, 0, n, t);
    return t;
  };
  const quant::QuantizedWeight* w = quantized(l);
  if (w == nullptr) {  // a norm or a bias: its bytes
    const Tensor t = value();
    std::vector<uint8_t> bytes(t.nbytes());
    if (!bytes.empty()) std::memcpy(bytes.data(), t.raw(), bytes.size());
    return bytes;
  }
  const quant::QuantOptions& o = *quantize_;
  // A tensor-parallel slice: the whole weight's 4-bit form (as the unsharded model holds it),
  // then its blocks. The whole weight is asked for by a stand-in of its name and global shape,
  // which the logical fill and `stored` serve as whole (nn::global_fill).
  Parameter whole;
  if (!l.slice.whole()) {
    whole.name = l.name;
    whole.decay = l.decay;
    whole.value =
        Tensor::released(l.global_shape(), l.value.dtype(), MemCategory::kOther, Device::cpu());
  }
  const Parameter& from = l.slice.whole() ? l : whole;
  const std::vector<int64_t> shape = quantized_shape(config_, from.value.shape());
  std::optional<quant::Quantized4bit> q = stored ? stored(from) : std::nullopt;
  if (q) {
    FD_CHECK(q->type == o.type && q->block_size == o.block_size &&
                 q->nested.has_value() == o.double_quant && q->shape == shape,
             "{}: the stored 4-bit weight ({}, block {}, double quant {}, shape [{}]) is not "
             "the model's ({}, block {}, double quant {}, shape [{}])",
             l.name, quant::quant_type_name(q->type), q->block_size, q->nested.has_value(),
             fmt::join(q->shape, ", "), quant::quant_type_name(o.type), o.block_size,
             o.double_quant, fmt::join(shape, ", "));
  } else {
    const int64_t count = from.value.numel();
    Tensor t = Tensor::empty(Shape{count}, l.value.dtype(), MemCategory::kOther, Device::cpu());
    logical(from, 0, count, t);
    std::vector<float> v = t.to_vector();
    if (is_gpt2(config_)) v = transposed(v, shape[1], shape[0]);
    q = quant::quantize(v, shape, o, l.name);
  }
  if (!l.slice.whole()) q = slice_blocks(config_, *q, l);
  std::vector<uint8_t> bytes(size_t(quant::encoded_layout(n, member_options(o, l.slice)).bytes));
  quant::encode(*q, bytes);
  return bytes;
}

Variable Decoder::base_var(const Parameter& p) const {
  return lora_.enabled() ? Variable(p.value, false) : p.var();
}

void Decoder::init_values(uint64_t seed, const Parameter& p, int64_t begin, int64_t count,
                          const Tensor& out) const {
  FD_CHECK(begin >= 0 && count >= 0 && begin + count <= p.value.numel(),
           "init_values of {}: elements [{}, {}) of {}", p.name, begin, begin + count,
           p.value.numel());
  FD_CHECK(out.numel() == count && out.dtype() == p.value.dtype(),
           "init_values of {}: out has {} elements of {}", p.name, out.numel(),
           dtype_name(out.dtype()));
  if (out.is_meta()) return;  // meta tensors hold no values
  std::vector<float> v(size_t(count), 0.0f);
  const uint64_t h = name_hash(p.name);
  const bool is_norm =
      p.name.find("ln_") != std::string::npos || p.name.find("norm") != std::string::npos;
  if (p.name.find(".lora_A.") != std::string::npos) {
    // Kaiming-uniform with a = sqrt(5) (PEFT): bound = 1/sqrt(in).
    const float bound = 1.0f / std::sqrt(float(p.value.shape()[1]));
    for (int64_t i = 0; i < count; ++i)
      v[size_t(i)] = bound * (2.0f * uniform01(hash_words(seed, h, uint64_t(begin + i), 2)) - 1.0f);
  } else if (p.name.find(".lora_B.") != std::string::npos) {
    // zero
  } else if (is_norm && ends_with(p.name, ".weight")) {
    std::fill(v.begin(), v.end(), 1.0f);
  } else if (p.decay) {  // 2-D weights
    const float std = is_gpt2(config_) && ends_with(p.name, "c_proj.weight")
                          ? 0.02f / std::sqrt(2.0f * float(config_.num_layers))
                          : 0.02f;
    for (int64_t i = 0; i < count; ++i)
      v[size_t(i)] = std * normal01(hash_words(seed, h, uint64_t(begin + i), 0),
                                    hash_words(seed, h, uint64_t(begin + i), 1));
  }
  store_init(out, v);
}

void Decoder::init_weights(uint64_t seed) {
  // Meta parameters hold no values (lib/tensor/device.h): nothing to draw.
  if (segments_.front()->flat_params().is_meta()) return;
  // A 4-bit segment's members are encoded from their initial values (storage_fill).
  // A tensor-parallel rank's slices draw the whole tensors' values (global_fill).
  const ParamFill fill = storage_fill(
      global_fill([this, seed](const Parameter& p, int64_t begin, int64_t count,
                               const Tensor& out) { init_values(seed, p, begin, count, out); }));
  for (size_t g = 0; g < segments_.size(); ++g) {
    if (!present_[g]) continue;  // another pipeline stage's
    std::vector<const FlatParamGroup*> groups{segments_[g].get()};
    if (!frozen_.empty()) groups.insert(groups.begin(), frozen_[g].get());
    for (const FlatParamGroup* grp : groups)
      for (const Parameter& p : grp->params())
        fill(p, 0, p.value.numel(), p.value.flat_slice(0, p.value.numel()));
  }
}

bool Decoder::present(int segment) const {
  FD_CHECK(segment >= 0 && segment < int(present_.size()), "segment {} of {}", segment,
           present_.size());
  return present_[size_t(segment)];
}

Variable Decoder::tp_copy(const Variable& x) const {
  return tp_.enabled() ? ops::copy_to_tp_region(x, *tp_.group) : x;
}

Variable Decoder::tp_in(const Variable& h) const {
  if (!tp_.enabled()) return h;
  return tp_.sequence_parallel ? ops::gather_from_sequence_region(h, *tp_.group)
                               : ops::copy_to_tp_region_overlapped(h, *tp_.group);
}

Variable Decoder::tp_last_column(const Variable& y) const {
  return tp_.enabled() ? ops::weight_grads_behind(y) : y;
}

// With tensor parallelism a column-parallel linear's input is already through f (the caller's
// tp_in, once for q, k and v, once for gate and up); a row-parallel one ends with g.
Variable Decoder::linear(int layer, const std::string& module, const Variable& x) const {
  const BlockParams::Linear& p = blocks_[size_t(layer)].linears.at(module);
  const Split sp = split_of(config_, module, tp_.size);
  // Whole parameters whose gradient is partial on each rank go through f (decoder.h).
  auto partial = [this](const Variable& v) { return tp_copy(v); };
  const ops::MatmulOptions stored{.trans_a = false, .trans_b = !is_gpt2(config_)};
  Variable bias = p.b ? base_var(*p.b) : Variable();
  if (bias.defined() && sp == Split::kReplicated) bias = partial(bias);
  // A row-parallel bias is added once, by rank 0, before g sums the ranks' parts.
  if (bias.defined() && sp == Split::kRow)
    bias = ops::scale(partial(bias), tp_.rank == 0 ? 1.0f : 0.0f);
  Variable w = p.q ? Variable() : base_var(*p.w);  // a 4-bit weight: frozen, read by linear_4bit
  if (w.defined() && sp == Split::kReplicated) w = partial(w);
  Variable y = p.q ? quant::linear_4bit(x, *p.q, bias) : ops::matmul(x, w, bias, stored);
  if (p.lora_a != nullptr && adapters_enabled_) {
    Variable in = x;
    if (lora_.dropout > 0.0f)
      in = ops::dropout(x, lora_.dropout, dropout_seed_, name_hash(p.lora_a->name));
    const ops::MatmulOptions t{.trans_a = false, .trans_b = true};
    Variable a = p.lora_a->var(), b = p.lora_b->var();
    if (sp == Split::kColumn || sp == Split::kReplicated) a = partial(a);
    if (sp == Split::kRow || sp == Split::kReplicated) b = partial(b);
    Variable low = ops::matmul(in, a, {}, t);  // (..., r)
    Variable up = ops::matmul(low, b, {}, t);  // (..., out)
    y = ops::add(y, ops::scale(up, lora_.scaling()));
  }
  if (sp != Split::kRow) return y;
  return tp_.sequence_parallel ? ops::reduce_scatter_to_sequence_region(y, *tp_.group)
                               : ops::reduce_from_tp_region(y, *tp_.group);
}

// Sequence parallelism: x is this rank's slice of the sequence, so the norm's weights get
// partial gradients (sequence_norm_var: through f).
Variable Decoder::norm(const Variable& x, const Parameter* w, const Parameter* b) const {
  if (config_.norm == NormKind::kLayerNorm)
    return ops::layernorm(x, sequence_norm_var(*w), sequence_norm_var(*b), float(config_.norm_eps));
  return ops::rms_norm(x, sequence_norm_var(*w), float(config_.norm_eps));
}

ops::AddNorm Decoder::add_norm(const Variable& x, const Variable& y, const Parameter* w,
                               const Parameter* b) const {
  if (config_.norm == NormKind::kLayerNorm)
    return ops::add_layernorm(x, y, sequence_norm_var(*w), sequence_norm_var(*b),
                              float(config_.norm_eps));
  return ops::add_rms_norm(x, y, sequence_norm_var(*w), float(config_.norm_eps));
}

void Decoder::ensure_rope_tables(int64_t positions) const {
  if (rope_cos_.defined() && rope_cos_.shape()[0] >= positions &&
      rope_cos_.device() == default_device())
    return;
  ops::RopeTables t = ops::rope_tables(rope_options(config_), positions);
  rope_cos_ = t.cos;
  rope_sin_ = t.sin;
}

Variable Decoder::attention(int layer, const Variable& h, const Packing& packing) const {
  const DecoderConfig& c = config_;
  // Tensor parallelism: this rank's query heads (and key/value heads), h through f once.
  const int T = tp_.size, heads = c.num_heads / T;
  const Variable in = tp_in(h);
  if (is_gpt2(c) && !sp_.enabled()) {  // one fused c_attn: q | k | v
    Variable qkv = tp_last_column(linear(layer, "attn.c_attn", in));
    return linear(layer, "attn.c_proj", ops::causal_attention(qkv, heads, packing.doc_starts));
  }
  if (is_gpt2(c)) {  // Ulysses: q, k and v exchanged one by one
    Variable qkv = tp_last_column(linear(layer, "attn.c_attn", in));
    const int64_t w = int64_t{heads} * c.head_dim;
    int hs = 0;
    Variable q = ulysses_in(ops::narrow_last(qkv, 0, w), heads, false, 0, 1, &hs);
    Variable k = ulysses_in(ops::narrow_last(qkv, w, w), heads, false, 0, 1, &hs);
    Variable v = ulysses_in(ops::narrow_last(qkv, 2 * w, w), heads, false, 0, 1, &hs);
    Variable att = ops::causal_attention(q, k, v, hs, hs, packing.doc_starts);
    return linear(layer, "attn.c_proj", ops::heads_to_sequence(att, heads, *sp_.group));
  }
  const BlockParams& b = blocks_[size_t(layer)];
  Variable q = linear(layer, "self_attn.q_proj", in);
  Variable k = linear(layer, "self_attn.k_proj", in);
  Variable v = tp_last_column(linear(layer, "self_attn.v_proj", in));
  int kv_heads = c.num_kv_heads / T;
  if (kv_heads_replicated(c, T)) {  // every KV head computed here; attend with this rank's one
    const int64_t kv = (int64_t{tp_.rank} * heads) / (c.num_heads / c.num_kv_heads);
    k = ops::narrow_last(k, kv * c.head_dim, c.head_dim);
    v = ops::narrow_last(v, kv * c.head_dim, c.head_dim);
    kv_heads = 1;
  }
  if (c.qk_norm) {  // per head, before the rotation (Qwen3)
    q = ops::rms_norm(q, tp_copy(base_var(*b.q_norm)), float(c.norm_eps));
    k = ops::rms_norm(k, tp_copy(base_var(*b.k_norm)), float(c.norm_eps));
  }
  if (c.positions == PositionKind::kRope) {
    q = ops::rope(q, rope_cos_, rope_sin_, packing.positions);
    k = ops::rope(k, rope_cos_, rope_sin_, packing.positions);
  }
  if (!sp_.enabled()) {
    Variable att = ops::causal_attention(q, k, v, heads, kv_heads, packing.doc_starts);
    return linear(layer, "self_attn.o_proj", att);
  }
  // Ulysses: the whole sequence for this rank's share of the heads, attention over the whole
  // rows, the positions back.
  int q_heads = 0, kv_att = 0;
  q = ulysses_in(q, heads, false, 0, 1, &q_heads);
  const int q_first = sp_.rank * q_heads, q_per_kv = heads / kv_heads;
  k = ulysses_in(k, kv_heads, true, q_first, q_per_kv, &kv_att);
  v = ulysses_in(v, kv_heads, true, q_first, q_per_kv, &kv_att);
  Variable att = ops::causal_attention(q, k, v, q_heads, kv_att, packing.doc_starts);
  return linear(layer, "self_attn.o_proj", ops::heads_to_sequence(att, heads, *sp_.group));
}

Variable Decoder::ulysses_in(const Variable& x, int heads, bool kv, int q_first, int q_per_kv,
                             int* heads_out) const {
  const int S = sp_.size;
  if (heads % S == 0) {
    *heads_out = heads / S;
    return ops::sequence_to_heads(x, heads, *sp_.group);
  }
  // Fewer key/value heads than ranks: every one over the whole sequence, then the one this
  // rank's query heads [q_first, q_first + heads/S) share.
  FD_CHECK(kv && S % heads == 0, "Ulysses: {} heads over {} ranks", heads, S);
  const Variable whole = ops::gather_from_sequence_region(x, *sp_.group);
  *heads_out = 1;
  const int64_t D = config_.head_dim;
  return ops::narrow_last(whole, int64_t{q_first / q_per_kv} * D, D);
}

Variable Decoder::mlp(int layer, const Variable& h) const {
  const Variable in = tp_in(h);  // tensor parallelism: f once for the column-parallel pair
  if (config_.mlp == MlpKind::kGeluTanh)
    return linear(layer, "mlp.c_proj", ops::gelu(tp_last_column(linear(layer, "mlp.c_fc", in))));
  if (tp_.enabled()) {  // up's last: the weight gradients behind f
    Variable gate = linear(layer, "mlp.gate_proj", in);
    Variable up = tp_last_column(linear(layer, "mlp.up_proj", in));
    return linear(layer, "mlp.down_proj", ops::swiglu(gate, up));
  }
  return linear(layer, "mlp.down_proj",
                ops::swiglu(linear(layer, "mlp.gate_proj", in), linear(layer, "mlp.up_proj", in)));
}

Variable Decoder::block_forward(int layer, const Variable& x, const Packing& packing) const {
  const BlockParams& b = blocks_[size_t(layer)];
  // x2 = x + attention(norm1(x)) and norm2(x2) in one op; then x2 + mlp(norm2(x2)).
  const ops::AddNorm x2 =
      add_norm(x, attention(layer, norm(x, b.norm1_w, b.norm1_b), packing), b.norm2_w, b.norm2_b);
  return ops::add(x2.sum, mlp(layer, x2.normed));
}

Decoder::Packing Decoder::packing(const Tensor& tokens, const Tensor& doc_starts) const {
  const int64_t B = tokens.shape()[0], T = tokens.shape()[1];
  if (!doc_starts.defined() && !sp_.enabled()) return {};
  if (doc_starts.defined()) ops::check_doc_starts(doc_starts, B, T);  // once for every layer
  const Device where = doc_starts.defined() ? doc_starts.device() : tokens.device();
  Tensor positions = Tensor::empty(Shape{B, T}, DType::kI32, MemCategory::kOther, where);
  if (!positions.is_meta()) {
    int32_t* pos = positions.data<int32_t>();
    const int32_t* st = doc_starts.defined() ? doc_starts.data<int32_t>() : nullptr;
    for (int64_t i = 0; i < B * T; ++i) pos[i] = int32_t(i % T) - (st ? st[i] : 0);
  }
  // Ulysses: the whole rows' document starts for attention, this rank's positions.
  if (sp_.enabled()) positions = columns(positions, sp_.rank, sp_.size);
  // A GPU model reads both on the GPU: copied once here, not by every layer's ops.
  if (default_device().is_cuda())
    return {doc_starts.to_device(default_device(), MemCategory::kOther),
            positions.to_device(default_device(), MemCategory::kOther)};
  return {doc_starts, positions};
}

Variable Decoder::embed(const Tensor& tokens, const Packing& packing) const {
  // Tensor parallelism: each rank looks up the rows it holds and g sums them (sequence
  // parallelism: a reduce-scatter, each rank keeping its slice of the sequence).
  Variable x;
  if (!tp_.enabled()) {
    x = ops::embedding(base_var(*embed_w_), tokens);
  } else {
    Variable part = ops::embedding_shard(base_var(*embed_w_), tokens, vocab_begin_);
    x = tp_.sequence_parallel ? ops::reduce_scatter_to_sequence_region(part, *tp_.group)
                              : ops::reduce_from_tp_region(part, *tp_.group);
  }
  if (positions_w_ == nullptr) return x;
  Tensor ids = packing.positions;
  if (!ids.defined()) {
    if (!position_ids_.defined() || position_ids_.shape() != tokens.shape() ||
        position_ids_.device() != default_device()) {
      const int64_t B = tokens.shape()[0], T = tokens.shape()[1];
      std::vector<float> v(size_t(B * T));
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t) v[size_t(b * T + t)] = float(t);
      position_ids_ = Tensor::from_vector(v, tokens.shape(), DType::kI32, MemCategory::kOther);
    }
    ids = position_ids_;
  }
  if (!tp_.sequence_parallel) return ops::add(x, ops::embedding(base_var(*positions_w_), ids));
  // Sequence parallelism: this rank's positions, from a table each rank reads in part.
  return ops::add(
      x, ops::embedding(sequence_norm_var(*positions_w_), columns(ids, tp_.rank, tp_.size)));
}

Tensor Decoder::columns(const Tensor& ids, int part, int parts) {
  const int64_t B = ids.shape()[0], T = ids.shape()[1], Ts = T / parts;
  FD_CHECK(Ts * parts == T && ids.dtype() == DType::kI32,
           "columns: {} parts of a (B, T) = {} i32 tensor", parts, ids.shape().str());
  Tensor out = Tensor::empty(Shape{B, Ts}, DType::kI32, MemCategory::kOther, ids.device());
  if (ids.is_meta()) return out;
  const int32_t* src = ids.data<int32_t>();
  int32_t* dst = out.data<int32_t>();
  for (int64_t b = 0; b < B; ++b)
    std::memcpy(dst + b * Ts, src + b * T + int64_t{part} * Ts, size_t(Ts) * sizeof(int32_t));
  return out;
}

Variable Decoder::sequence_norm_var(const Parameter& p) const {
  return tp_.sequence_parallel ? tp_copy(base_var(p)) : base_var(p);
}

Variable Decoder::final_norm(const Variable& x) const { return norm(x, final_w_, final_b_); }

Variable Decoder::head_weight() const { return base_var(lm_head_ ? *lm_head_ : *embed_w_); }

int64_t Decoder::head_chunk_rows(int64_t rows) const {
  // A vocabulary-parallel head plans for the largest shard, the same on every rank of the group.
  const int64_t vocab =
      tp_.enabled() ? (config_.vocab_size + tp_.size - 1) / tp_.size : config_.vocab_size;
  // The budget is static: the plan, hence the gradients' bits, must not depend on what a layout
  // holds (activation checkpointing, a pipeline's split, ZeRO stage) nor differ between the ranks
  // of a group that issue collectives per chunk. 16 x C x L x R fp32 words: about what the
  // blocks keep for their backward without checkpointing (docs/ZERO.md: a GPT-2 block keeps
  // 16RC + 4R + HR words; a Llama block about as much). The same on the GPU, whose one-chunk
  // head keeps its logits in the operands' dtype (half the fp32 plan's bytes for 16-bit).
  const int64_t budget =
      int64_t{16} * config_.hidden_size * config_.num_layers * rows * int64_t(sizeof(float));
  head_plan_ = ops::head_chunk_plan(rows, vocab, budget);
  return head_plan_.chunk_rows;
}

// The segments in order, each run by its role (segment_info()); the head's
// function is `head`. A runner may keep a segment's function to run it again
// in backward (activation checkpointing), so each one owns what it captures.
namespace {
// Segments first..last (all of them for a whole model) from `x` (ignored
// when first is the embedding).
Variable run_segments(const Decoder& m, SegmentRunner* runner, const SegmentFn& embed_fn,
                      std::function<Variable(int, const Variable&)> block_fn, const SegmentFn& head,
                      int first, int last, Variable x) {
  const std::vector<SegmentInfo>& segments = m.segment_info();
  FD_CHECK(0 <= first && first <= last && last < int(segments.size()),
           "segments {}..{} of a model of {}", first, last, segments.size());
  for (int g = first; g <= last; ++g)
    FD_CHECK(m.present(g), "segment {} is not held here (another pipeline stage's)", g);
  DirectRunner direct;
  SegmentRunner& run = runner ? *runner : direct;
  for (int g = first; g <= last; ++g) {
    const SegmentInfo& s = segments[size_t(g)];
    switch (s.role) {
      case SegmentRole::kEmbedding:
        x = run.run(g, embed_fn, Variable(), {});
        break;
      case SegmentRole::kBlock:
        x = run.run(g, [block_fn, l = s.block](const Variable& in) { return block_fn(l, in); }, x,
                    {});
        break;
      case SegmentRole::kHead:
        // A tied head reads another segment's matrix: keep it resident through this one.
        x = run.run(g, head, x, s.tied_to >= 0 ? std::vector<int>{s.tied_to} : std::vector<int>{});
        break;
    }
  }
  return x;
}
}  // namespace

Variable Decoder::forward(const Tensor& tokens, SegmentRunner* runner,
                          const Tensor& doc_starts) const {
  FD_CHECK(tokens.shape().ndim() == 2, "tokens must be (B, T), got {}", tokens.shape().str());
  FD_CHECK(!tp_.enabled(), "forward(): a tensor-parallel model has only its vocabulary's logits");
  FD_CHECK(!sp_.enabled(), "forward(): a Ulysses rank computes only its slice of the sequence");
  const int64_t T = tokens.shape()[1];
  FD_CHECK(positions_w_ == nullptr || T <= config_.max_position_embeddings,
           "sequence of {} exceeds the {} learned positions", T, config_.max_position_embeddings);
  if (config_.positions == PositionKind::kRope) ensure_rope_tables(T);
  const Packing pk = packing(tokens, doc_starts);
  return run_segments(
      *this, runner, [this, tokens, pk](const Variable&) { return embed(tokens, pk); },
      [this, pk](int l, const Variable& in) { return block_forward(l, in, pk); },
      [this](const Variable& in) {
        return ops::matmul(final_norm(in), head_weight(), {},
                           ops::MatmulOptions{.trans_a = false, .trans_b = true});
      },
      embedding_, head_, Variable());
}

Variable Decoder::loss(const Tensor& tokens, const Tensor& targets, SegmentRunner* runner,
                       const Tensor& doc_starts) const {
  return stage_loss(embedding_, head_, tokens, targets, Variable(), runner, doc_starts);
}

Variable Decoder::stage_loss(int first, int last, const Tensor& tokens, const Tensor& targets,
                             const Variable& input, SegmentRunner* runner,
                             const Tensor& doc_starts) const {
  FD_CHECK(tokens.shape().ndim() == 2 && targets.shape() == tokens.shape(),
           "tokens {} and targets {} must both be (B, T)", tokens.shape().str(),
           targets.shape().str());
  FD_CHECK(first == embedding_ || input.defined(),
           "a stage starting at segment {} needs the previous stage's hidden state", first);
  const int64_t T = tokens.shape()[1];
  FD_CHECK(positions_w_ == nullptr || T <= config_.max_position_embeddings,
           "sequence of {} exceeds the {} learned positions", T, config_.max_position_embeddings);
  if (config_.positions == PositionKind::kRope) ensure_rope_tables(T);
  const Packing pk = packing(tokens, doc_starts);
  // Ulysses: this rank's positions of the rows, and its share of the micro-batch's targets.
  const Tensor mine = sp_.enabled() ? columns(tokens, sp_.rank, sp_.size) : tokens;
  const Tensor my_targets = sp_.enabled() ? columns(targets, sp_.rank, sp_.size) : targets;
  float share = 1.0f;
  if (sp_.enabled() && !targets.is_meta()) {
    auto live = [](const Tensor& t) {
      const int32_t* p = t.data<int32_t>();
      return std::count_if(p, p + t.numel(), [](int32_t v) { return v != -1; });
    };
    const int64_t all = live(targets);
    share = all > 0 ? float(double(live(my_targets)) / double(all)) : 0.0f;
  }
  return run_segments(
      *this, runner, [this, mine, pk](const Variable&) { return embed(mine, pk); },
      [this, pk](int l, const Variable& in) { return block_forward(l, in, pk); },
      [this, targets = my_targets, whole = targets, share](const Variable& in) {
        if (head_loss_) {
          // Megatron's sequence parallelism: the whole sequence gathered, as for the loss below.
          const Variable h = tp_.sequence_parallel
                                 ? ops::gather_from_sequence_region(final_norm(in), *tp_.group)
                                 : final_norm(in);
          return head_loss_(h, head_weight(), whole);
        }
        const Variable w = head_weight();
        if (sp_.enabled()) {  // this rank's share of the micro-batch's mean
          const Variable h = final_norm(in);
          const int64_t chunk = head_chunk_rows(h.shape().rows());
          const Variable mean = tp_.enabled() ? ops::vocab_parallel_cross_entropy(
                                                    h, w, targets, vocab_begin_, config_.vocab_size,
                                                    *tp_.group, -1, chunk)
                                              : ops::linear_cross_entropy(h, w, targets, -1, chunk);
          return ops::scale(mean, share);
        }
        if (tp_.enabled()) {
          // Sequence parallelism: the whole sequence gathered for the head, whose dh partials
          // the gather's backward then sums (reduce-scatters) instead of the loss.
          const bool sp = tp_.sequence_parallel;
          const Variable h =
              sp ? ops::gather_from_sequence_region(final_norm(in), *tp_.group) : final_norm(in);
          return ops::vocab_parallel_cross_entropy(h, w, targets, vocab_begin_, config_.vocab_size,
                                                   *tp_.group, -1,
                                                   head_chunk_rows(h.shape().rows()), !sp);
        }
        const Variable h = final_norm(in);
        return ops::linear_cross_entropy(h, w, targets, -1, head_chunk_rows(h.shape().rows()));
      },
      first, last, input);
}

}  // namespace fd::nn
