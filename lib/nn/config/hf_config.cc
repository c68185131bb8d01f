#include "lib/nn/config/hf_config.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>

#include "lib/base/error.h"
#include "lib/base/input_file.h"

namespace fd::nn {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kSupportedTypes = "gpt2, llama, mistral, qwen2, qwen3";

// Keys that only matter to the transformers runtime or to the hub: they do
// not change the computation fdtrain performs, so they are accepted unread.
const std::set<std::string_view> kIgnoredKeys = {
    "_name_or_path",         // where the hub copy came from
    "architectures",         // the transformers class (our family decides the names)
    "transformers_version",  // the writer's version
    "torch_dtype",           // the checkpoint's dtype: safetensors headers say it per tensor
    "dtype",                 // newer spelling of torch_dtype
    "use_cache",             // KV cache at generation
    "initializer_range",     // init of a fresh model; fdtrain's init is the recipe's
    "pad_token_id",          // padding is the data pipeline's business
};

[[noreturn]] void refuse(const std::string& where, const std::string& key, const json& value,
                         const std::string& why) {
  usage_error("{}: {} = {}: {}", where, key, value.dump(), why);
}

// The range an integer field may take, and why (for the message). Every
// integer of a config.json is read through one of these, so that no value is
// narrowed or wraps: a layer count of 2^32 + 2 is refused, not read as 2.
struct IntRange {
  int64_t min, max;
  const char* meaning;  // "transformer blocks", ...
};
// Generous bounds, far beyond any published model (Llama 3.1 405B: 126
// layers, 128 heads, hidden 16384, MLP 53248, vocabularies to 256k), that keep
// every size computed from them (parameter counts, bytes) well inside int64.
constexpr IntRange kLayers{1, 4096, "transformer blocks"};
constexpr IntRange kHeads{1, 4096, "attention heads"};
constexpr IntRange kHeadDim{1, 4096, "the width of one attention head"};
constexpr IntRange kHidden{1, int64_t(1) << 20, "the width of the residual stream"};
constexpr IntRange kIntermediate{1, int64_t(1) << 22, "the width of the MLP"};
// Token ids and positions are 32-bit in fdtrain (token files, batches, --context).
constexpr IntRange kVocab{1, INT32_MAX, "token ids are 32-bit"};
constexpr IntRange kPositions{1, INT32_MAX, "positions are 32-bit"};
// A parameter count beyond this is no model fdtrain can hold (4.4 TB in fp32): a damaged file.
constexpr int64_t kMaxParams = int64_t(1) << 40;
// Real values: norm eps 1e-6 .. 1e-5, rope_theta 1e4 .. 1e7, scaling factors 1 .. 64.
constexpr double kMaxNormEps = 1.0;
constexpr const char* kNormEpsMeaning = "added to the variance in every norm";
constexpr double kMaxRopeTheta = 1e12;
constexpr double kMaxRopeFactor = 1e6;

// `value` (the field `key` of `where`) as an integer in `range`; refuses
// anything else: a non-integer, a value past int64, a value outside the range.
int64_t integer_in(const std::string& where, const std::string& key, const json& value,
                   const IntRange& range) {
  const bool too_big = value.is_number_unsigned() &&
                       value.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max());
  if (!value.is_number_integer() || too_big || value.get<int64_t>() < range.min ||
      value.get<int64_t>() > range.max)
    refuse(
        where, key, value,
        fmt::format("expected an integer in [{}, {}] ({})", range.min, range.max, range.meaning));
  return value.get<int64_t>();
}

// The same for a number: finite, > 0 and <= max.
double positive_in(const std::string& where, const std::string& key, const json& value, double max,
                   const char* meaning) {
  if (!value.is_number() || !std::isfinite(value.get<double>()) || !(value.get<double>() > 0) ||
      value.get<double>() > max)
    refuse(where, key, value, fmt::format("expected a number in (0, {:g}] ({})", max, meaning));
  return value.get<double>();
}

// Reads keys from one JSON object, remembering which it has consumed.
class Reader {
 public:
  Reader(const json& j, std::string where) : j_(j), where_(std::move(where)) {}

  const std::string& where() const { return where_; }

  // The value of `key`, or nullptr when absent or null. Marks the key read.
  const json* get(const std::string& key) {
    seen_.insert(key);
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  bool has(const std::string& key) const { return j_.contains(key); }

  int64_t integer(const std::string& key, const IntRange& range,
                  std::optional<int64_t> def = std::nullopt) {
    const json* v = get(key);
    if (!v) return required(key, def);
    return integer_in(where_, key, *v, range);
  }
  // A positive finite number up to `max`.
  double number(const std::string& key, double max, const char* meaning,
                std::optional<double> def = std::nullopt) {
    const json* v = get(key);
    if (!v) return required(key, def);
    return positive_in(where_, key, *v, max, meaning);
  }
  bool boolean(const std::string& key, bool def) {
    const json* v = get(key);
    if (!v) return def;
    if (!v->is_boolean()) refuse(where_, key, *v, "expected true or false");
    return v->get<bool>();
  }
  std::string string(const std::string& key, std::optional<std::string> def = std::nullopt) {
    const json* v = get(key);
    if (!v) return required(key, def);
    if (!v->is_string()) refuse(where_, key, *v, "expected a string");
    return v->get<std::string>();
  }
  // A key that is accepted only with the value fdtrain implements.
  void expect(const std::string& key, const json& supported, const std::string& why) {
    const json* v = get(key);
    if (!v || *v == supported) return;
    // 0 and 0.0 are the same dropout.
    if (v->is_number() && supported.is_number() && v->get<double>() == supported.get<double>())
      return;
    refuse(where_, key, *v, fmt::format("fdtrain supports only {} ({})", supported.dump(), why));
  }

  // Refuses the first key neither read nor listed in `allowed`.
  void refuse_unknown(const std::set<std::string_view>& allowed) const {
    for (const auto& [key, value] : j_.items()) {
      if (seen_.count(key) || allowed.count(key) || kIgnoredKeys.count(key)) continue;
      refuse(where_, key, value,
             "unknown key; fdtrain refuses keys it does not implement rather than ignore "
             "them (remove it if it does not change the model)");
    }
  }

 private:
  template <typename T>
  T required(const std::string& key, const std::optional<T>& def) {
    if (def) return *def;
    usage_error("{}: required field {} is missing", where_, key);
  }

  const json& j_;
  std::string where_;
  std::set<std::string> seen_;
};

// A token id of a vocabulary of `vocab` ids (0: not known yet, any 32-bit id).
IntRange token_ids(int64_t vocab) {
  return {0, (vocab > 0 ? vocab : int64_t(INT32_MAX) + 1) - 1,
          vocab > 0 ? "an id of the vocabulary, below vocab_size" : "token ids are 32-bit"};
}

// bos_token_id: an integer or null.
std::optional<int64_t> read_bos(Reader& r, int64_t vocab) {
  const json* v = r.get("bos_token_id");
  if (!v) return std::nullopt;
  return integer_in(r.where(), "bos_token_id", *v, token_ids(vocab));
}

// eos_token_id: an integer, a list of integers, or null.
std::vector<int64_t> read_eos(Reader& r, int64_t vocab) {
  const json* v = r.get("eos_token_id");
  if (!v) return {};
  if (v->is_number_integer()) return {integer_in(r.where(), "eos_token_id", *v, token_ids(vocab))};
  if (!v->is_array() ||
      !std::all_of(v->begin(), v->end(), [](const json& e) { return e.is_number_integer(); }))
    refuse(r.where(), "eos_token_id", *v, "expected an integer or a list of integers");
  std::vector<int64_t> ids;
  for (const json& e : *v)
    ids.push_back(integer_in(r.where(), "eos_token_id", e, token_ids(vocab)));
  return ids;
}

// rope_scaling (or rope_parameters, where newer transformers also puts
// rope_theta): {rope_type | type, factor, low_freq_factor, high_freq_factor,
// original_max_position_embeddings}.
void read_rope(Reader& top, const std::string& key, DecoderConfig& c) {
  const json* v = top.get(key);
  if (!v) return;
  const std::string where = top.where() + ": " + key;
  if (!v->is_object()) refuse(top.where(), key, *v, "expected an object");
  Reader r(*v, where);
  if (r.has("rope_theta")) c.rope_theta = r.number("rope_theta", kMaxRopeTheta, "the RoPE base");
  std::string type = "default";
  if (r.has("rope_type")) {
    type = r.string("rope_type");
    if (r.has("type") && r.string("type") != type)
      refuse(where, "type", v->at("type"), "disagrees with rope_type");
  } else if (r.has("type")) {
    type = r.string("type");
  }
  RopeScaling& s = c.rope_scaling;
  if (type == "default") {
    s.kind = RopeScalingKind::kDefault;
  } else if (type == "linear") {
    s.kind = RopeScalingKind::kLinear;
    s.factor = r.number("factor", kMaxRopeFactor, "how much longer the context gets");
  } else if (type == "llama3") {
    s.kind = RopeScalingKind::kLlama3;
    s.factor = r.number("factor", kMaxRopeFactor, "how much longer the context gets");
    s.low_freq_factor = r.number("low_freq_factor", kMaxRopeFactor, "a wavelength ratio");
    s.high_freq_factor = r.number("high_freq_factor", kMaxRopeFactor, "a wavelength ratio");
    s.original_max_position_embeddings = r.integer("original_max_position_embeddings", kPositions);
  } else {
    refuse(where, "rope_type", json(type),
           "unsupported RoPE scaling; fdtrain supports default, linear and llama3");
  }
  r.refuse_unknown({});
}

DecoderConfig read_gpt2(Reader& r) {
  DecoderConfig c;
  c.family = ModelFamily::kGpt2;
  c.hidden_size = r.integer("n_embd", kHidden);
  c.num_layers = static_cast<int>(r.integer("n_layer", kLayers));
  c.num_heads = static_cast<int>(r.integer("n_head", kHeads));
  c.num_kv_heads = c.num_heads;
  if (c.num_heads > 0 && c.hidden_size % c.num_heads != 0)
    refuse(r.where(), "n_head", json(c.num_heads),
           fmt::format("does not divide n_embd ({})", c.hidden_size));
  c.head_dim = c.num_heads > 0 ? static_cast<int>(c.hidden_size / c.num_heads) : 0;
  c.intermediate_size = r.integer("n_inner", kIntermediate, 4 * c.hidden_size);  // null: 4 * n_embd
  c.vocab_size = r.integer("vocab_size", kVocab);
  c.max_position_embeddings = r.integer("n_positions", kPositions);
  c.norm = NormKind::kLayerNorm;
  c.norm_eps = r.number("layer_norm_epsilon", kMaxNormEps, kNormEpsMeaning, 1e-5);
  c.positions = PositionKind::kLearned;
  c.attention_bias = c.o_proj_bias = c.mlp_bias = true;
  c.mlp = MlpKind::kGeluTanh;
  c.tie_word_embeddings = r.boolean("tie_word_embeddings", true);
  c.bos_token_id = read_bos(r, c.vocab_size);
  c.eos_token_ids = read_eos(r, c.vocab_size);
  const std::string act = r.string("activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh")
    refuse(r.where(), "activation_function", json(act),
           "unsupported activation; fdtrain's GPT-2 MLP is GELU-tanh (gelu_new, "
           "gelu_pytorch_tanh)");
  r.expect("scale_attn_weights", true, "attention scaled by 1/sqrt(head_dim)");
  r.expect("scale_attn_by_inverse_layer_idx", false, "no per-layer attention scaling");
  r.expect("add_cross_attention", false, "decoder-only");
  // n_ctx is GPT-2's legacy copy of n_positions.
  if (r.has("n_ctx") && r.integer("n_ctx", kPositions) != c.max_position_embeddings)
    refuse(r.where(), "n_ctx", json(r.integer("n_ctx", kPositions)),
           fmt::format("disagrees with n_positions ({})", c.max_position_embeddings));
  r.refuse_unknown({
      // Dropout probabilities of the original training: fdtrain's dropout is a recipe setting.
      "attn_pdrop",
      "embd_pdrop",
      "resid_pdrop",
      // The sequence-summary head of GPT2DoubleHeadsModel / classification: not a causal LM part.
      "summary_activation",
      "summary_first_dropout",
      "summary_proj_to_labels",
      "summary_type",
      "summary_use_proj",
      // Generation defaults of the hub pipeline.
      "task_specific_params",
      // Upcasts attention to fp32 in transformers; fdtrain's attention accumulates in fp32.
      "reorder_and_upcast_attn",
  });
  return c;
}

DecoderConfig read_llama_family(Reader& r, ModelFamily family) {
  DecoderConfig c;
  c.family = family;
  c.hidden_size = r.integer("hidden_size", kHidden);
  c.intermediate_size = r.integer("intermediate_size", kIntermediate);
  c.num_layers = static_cast<int>(r.integer("num_hidden_layers", kLayers));
  c.num_heads = static_cast<int>(r.integer("num_attention_heads", kHeads));
  c.num_kv_heads = static_cast<int>(
      r.integer("num_key_value_heads",
                {1, c.num_heads, "key/value heads, at most num_attention_heads"}, c.num_heads));
  if (r.get("head_dim")) {  // absent or null: hidden_size / num_attention_heads
    c.head_dim = static_cast<int>(r.integer("head_dim", kHeadDim));
  } else {
    if (c.num_heads > 0 && c.hidden_size % c.num_heads != 0)
      refuse(
          r.where(), "num_attention_heads", json(c.num_heads),
          fmt::format("does not divide hidden_size ({}) and there is no head_dim", c.hidden_size));
    c.head_dim = c.num_heads > 0 ? static_cast<int>(c.hidden_size / c.num_heads) : 0;
  }
  c.vocab_size = r.integer("vocab_size", kVocab);
  c.max_position_embeddings = r.integer("max_position_embeddings", kPositions);
  c.norm = NormKind::kRmsNorm;
  c.norm_eps = r.number("rms_norm_eps", kMaxNormEps, kNormEpsMeaning);
  c.positions = PositionKind::kRope;
  // transformers' default for all four
  c.rope_theta = r.number("rope_theta", kMaxRopeTheta, "the RoPE base", 10000.0);
  read_rope(r, "rope_scaling", c);
  if (r.get("rope_parameters") && r.get("rope_scaling") && !r.get("rope_scaling")->is_null()) {
    // Both: they must say the same, or which one transformers uses decides the model.
    DecoderConfig other = c;
    read_rope(r, "rope_parameters", other);
    if (!(other.rope_scaling == c.rope_scaling) || other.rope_theta != c.rope_theta)
      refuse(r.where(), "rope_parameters", *r.get("rope_parameters"),
             "disagrees with rope_scaling; keep one of the two");
  } else {
    read_rope(r, "rope_parameters", c);
  }
  c.mlp = MlpKind::kSwiGlu;
  c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);  // the classes' default
  c.bos_token_id = read_bos(r, c.vocab_size);
  c.eos_token_ids = read_eos(r, c.vocab_size);
  const std::string act = r.string("hidden_act");
  if (act != "silu")
    refuse(r.where(), "hidden_act", json(act),
           "unsupported activation; fdtrain's SwiGLU MLP uses silu");
  r.expect("attention_dropout", 0.0, "no attention dropout");

  std::set<std::string_view> allowed;  // keys accepted unread, besides kIgnoredKeys
  switch (family) {
    case ModelFamily::kLlama:
      c.attention_bias = r.boolean("attention_bias", false);
      c.o_proj_bias = c.attention_bias;  // Llama's attention_bias covers o_proj too
      c.mlp_bias = r.boolean("mlp_bias", false);
      r.expect("pretraining_tp", 1, "no tensor-parallel slicing of the projections");
      // nanotron's keys (SmolLM): its Llama with the rotate_half RoPE Hugging Face uses.
      r.expect("rope_interleaved", false, "RoPE in the rotate_half convention");
      allowed.insert("is_llama_config");  // a marker of nanotron's converter
      break;
    case ModelFamily::kMistral:
      if (const json* w = r.get("sliding_window"))
        refuse(r.where(), "sliding_window", *w,
               "sliding-window attention is not supported; fdtrain supports full causal "
               "attention (sliding_window null)");
      break;
    case ModelFamily::kQwen2:
    case ModelFamily::kQwen3: {
      // Qwen files carry sliding_window and max_window_layers even when the
      // window is off; they matter only with use_sliding_window.
      r.expect("use_sliding_window", false,
               "sliding-window attention is not supported; fdtrain supports full causal "
               "attention");
      r.get("sliding_window");
      r.get("max_window_layers");
      if (const json* types = r.get("layer_types")) {
        if (!types->is_array()) refuse(r.where(), "layer_types", *types, "expected a list");
        for (const json& t : *types)
          if (t != "full_attention")
            refuse(r.where(), "layer_types", t,
                   "only full_attention layers are supported (no sliding-window attention)");
      }
      if (family == ModelFamily::kQwen2) {
        c.attention_bias = true;  // Qwen2's q/k/v always have biases; o_proj has none
      } else {
        c.attention_bias = r.boolean("attention_bias", false);
        c.o_proj_bias = c.attention_bias;
        c.qk_norm = true;
      }
      break;
    }
    case ModelFamily::kGpt2:
      break;
  }
  r.refuse_unknown(allowed);
  return c;
}

}  // namespace

DecoderConfig parse_hf_config(const std::string& json_text, const std::string& where) {
  json j;
  if (const std::string err = try_parse_json(json_text, j); !err.empty())
    usage_error("{}: {}; it should be a Hugging Face config.json", where, err);
  if (!j.is_object())
    usage_error("{} is not a JSON object; it should be a Hugging Face config.json", where);
  // A quantized model's config.json: its weights are not plain tensors of the model's shapes.
  // The recipe reads a bitsandbytes 4-bit directory's config.json without this key
  // (config::read_model_directory), the weights through ckpt::Bnb4bitDir.
  if (j.contains("quantization_config"))
    usage_error(
        "{}: has a quantization_config: the weights are quantized, not plain tensors; fdtrain "
        "reads a bitsandbytes 4-bit directory only as the frozen base of a QLoRA run "
        "(model.init_from with model.quantize and a lora section); give a bf16/fp32 model "
        "directory here",
        where);
  Reader r(j, where);
  const std::string type = r.string("model_type");
  DecoderConfig c;
  if (type == "gpt2") {
    c = read_gpt2(r);
  } else if (type == "llama") {
    c = read_llama_family(r, ModelFamily::kLlama);
  } else if (type == "mistral") {
    c = read_llama_family(r, ModelFamily::kMistral);
  } else if (type == "qwen2") {
    c = read_llama_family(r, ModelFamily::kQwen2);
  } else if (type == "qwen3") {
    c = read_llama_family(r, ModelFamily::kQwen3);
  } else {
    refuse(where, "model_type", json(type),
           fmt::format("unsupported model type; fdtrain supports {}", kSupportedTypes));
  }
  try {
    c.validate();
  } catch (const Error& e) {
    usage_error("{}: {}", where, e.what());
  }
  // Each field is in range, so the count cannot overflow; a model this large is a damaged file,
  // refused before anything is allocated for it.
  if (c.num_params() > kMaxParams)
    usage_error(
        "{}: the model it describes has {} parameters ({}), more than the {} fdtrain can hold; "
        "the file is damaged or its sizes are wrong",
        where, c.num_params(), c.summary(), kMaxParams);
  return c;
}

namespace {

const char* architecture(ModelFamily family) {
  switch (family) {
    case ModelFamily::kGpt2:
      return "GPT2LMHeadModel";
    case ModelFamily::kLlama:
      return "LlamaForCausalLM";
    case ModelFamily::kMistral:
      return "MistralForCausalLM";
    case ModelFamily::kQwen2:
      return "Qwen2ForCausalLM";
    case ModelFamily::kQwen3:
      return "Qwen3ForCausalLM";
  }
  return "";
}

// The first field in which `a` and `b` differ, by its DecoderConfig name ("" if none).
std::string first_difference(const DecoderConfig& a, const DecoderConfig& b) {
  const RopeScaling &s = a.rope_scaling, &t = b.rope_scaling;
  const std::pair<bool, const char*> fields[] = {
      {a.family == b.family, "family"},
      {a.hidden_size == b.hidden_size, "hidden_size"},
      {a.intermediate_size == b.intermediate_size, "intermediate_size"},
      {a.num_layers == b.num_layers, "num_layers"},
      {a.num_heads == b.num_heads, "num_heads"},
      {a.num_kv_heads == b.num_kv_heads, "num_kv_heads"},
      {a.head_dim == b.head_dim, "head_dim"},
      {a.vocab_size == b.vocab_size, "vocab_size"},
      {a.max_position_embeddings == b.max_position_embeddings, "max_position_embeddings"},
      {a.norm == b.norm, "norm"},
      {a.norm_eps == b.norm_eps, "norm_eps"},
      {a.positions == b.positions, "positions"},
      {a.rope_theta == b.rope_theta, "rope_theta"},
      {s.kind == t.kind, "rope_scaling.kind"},
      {s.factor == t.factor, "rope_scaling.factor"},
      {s.low_freq_factor == t.low_freq_factor, "rope_scaling.low_freq_factor"},
      {s.high_freq_factor == t.high_freq_factor, "rope_scaling.high_freq_factor"},
      {s.original_max_position_embeddings == t.original_max_position_embeddings,
       "rope_scaling.original_max_position_embeddings"},
      {a.attention_bias == b.attention_bias, "attention_bias"},
      {a.o_proj_bias == b.o_proj_bias, "o_proj_bias"},
      {a.qk_norm == b.qk_norm, "qk_norm"},
      {a.mlp == b.mlp, "mlp"},
      {a.mlp_bias == b.mlp_bias, "mlp_bias"},
      {a.tie_word_embeddings == b.tie_word_embeddings, "tie_word_embeddings"},
      {a.bos_token_id == b.bos_token_id, "bos_token_id"},
      {a.eos_token_ids == b.eos_token_ids, "eos_token_ids"},
  };
  for (const auto& [same, name] : fields)
    if (!same) return name;
  return "";
}

json rope_scaling_json(const RopeScaling& s) {
  switch (s.kind) {
    case RopeScalingKind::kDefault:
      return nullptr;
    case RopeScalingKind::kLinear:
      return {{"rope_type", "linear"}, {"factor", s.factor}};
    case RopeScalingKind::kLlama3:
      return {{"rope_type", "llama3"},
              {"factor", s.factor},
              {"low_freq_factor", s.low_freq_factor},
              {"high_freq_factor", s.high_freq_factor},
              {"original_max_position_embeddings", s.original_max_position_embeddings}};
  }
  return nullptr;
}

// The text of `dir_or_file` (a directory: its config.json), and its path in *path.
std::string config_text(const std::string& dir_or_file, std::string* path) {
  std::error_code ec;
  fs::path p = dir_or_file;
  if (fs::is_directory(p, ec)) p /= "config.json";
  *path = p.string();
  if (!fs::exists(p, ec))
    usage_error(
        "cannot read {}: no such file; a Hugging Face model directory must contain "
        "config.json",
        p.string());
  // A directory or FIFO in its place, or a file of absurd size, is refused by name.
  return read_input_file(p.string(), "the model's config.json");
}

// The token-id keys of `ids` as JSON values (parsed and checked as read_hf_config checks them),
// and `c` with the ids they state.
struct TokenIdKeys {
  std::optional<json> bos, eos;  // none: the key is left out
  DecoderConfig config;
};
TokenIdKeys token_id_keys(const DecoderConfig& c, const HfTokenIds& ids) {
  TokenIdKeys k;
  json j = json::object();
  for (const auto& [key, text] : {std::pair{"bos_token_id", &ids.bos_token_id},
                                  std::pair{"eos_token_id", &ids.eos_token_id}}) {
    if (!*text) continue;
    j[key] = json::parse(**text, nullptr, /*allow_exceptions=*/false);
    if (j[key].is_discarded())
      usage_error("cannot write a config.json: {} '{}' is not JSON", key, **text);
  }
  Reader r(j, "cannot write a config.json");
  k.config = c;
  k.config.bos_token_id = read_bos(r, c.vocab_size);
  k.config.eos_token_ids = read_eos(r, c.vocab_size);
  if (j.contains("bos_token_id")) k.bos = j["bos_token_id"];
  if (j.contains("eos_token_id")) k.eos = j["eos_token_id"];
  return k;
}

std::string config_json(const DecoderConfig& c, const std::string& torch_dtype,
                        const HfTokenIds* ids) {
  TokenIdKeys keys;
  if (ids) keys = token_id_keys(c, *ids);
  try {
    (ids ? keys.config : c).validate();
  } catch (const Error& e) {
    usage_error("cannot write a config.json: {}", e.what());
  }
  json j;  // std::map underneath: keys sorted, as transformers' to_json_string
  j["model_type"] = family_name(c.family);
  j["architectures"] = json::array({architecture(c.family)});
  j["torch_dtype"] = torch_dtype;
  j["use_cache"] = true;
  j["vocab_size"] = c.vocab_size;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["bos_token_id"] = c.bos_token_id ? json(*c.bos_token_id) : json(nullptr);
  if (c.eos_token_ids.empty())
    j["eos_token_id"] = nullptr;
  else if (c.eos_token_ids.size() == 1)
    j["eos_token_id"] = c.eos_token_ids.front();
  else
    j["eos_token_id"] = c.eos_token_ids;
  if (ids) {  // as `ids` has them: a value (null included), or no key at all
    j.erase("bos_token_id");
    j.erase("eos_token_id");
    if (keys.bos) j["bos_token_id"] = *keys.bos;
    if (keys.eos) j["eos_token_id"] = *keys.eos;
  }
  if (c.family == ModelFamily::kGpt2) {
    j["n_embd"] = c.hidden_size;
    j["n_layer"] = c.num_layers;
    j["n_head"] = c.num_heads;
    j["n_inner"] = c.intermediate_size;
    j["n_positions"] = c.max_position_embeddings;
    j["n_ctx"] = c.max_position_embeddings;
    j["layer_norm_epsilon"] = c.norm_eps;
    j["activation_function"] = "gelu_new";
    j["scale_attn_weights"] = true;
    j["scale_attn_by_inverse_layer_idx"] = false;
    j["reorder_and_upcast_attn"] = false;
    j["initializer_range"] = 0.02;
  } else {
    j["hidden_size"] = c.hidden_size;
    j["intermediate_size"] = c.intermediate_size;
    j["num_hidden_layers"] = c.num_layers;
    j["num_attention_heads"] = c.num_heads;
    j["num_key_value_heads"] = c.num_kv_heads;
    j["head_dim"] = c.head_dim;
    j["max_position_embeddings"] = c.max_position_embeddings;
    j["rms_norm_eps"] = c.norm_eps;
    j["rope_theta"] = c.rope_theta;
    j["rope_scaling"] = rope_scaling_json(c.rope_scaling);
    j["hidden_act"] = "silu";
    j["attention_dropout"] = 0.0;
    j["initializer_range"] = 0.02;
    switch (c.family) {
      case ModelFamily::kLlama:
        j["attention_bias"] = c.attention_bias;
        j["mlp_bias"] = c.mlp_bias;
        j["pretraining_tp"] = 1;
        break;
      case ModelFamily::kMistral:
        j["sliding_window"] = nullptr;
        break;
      case ModelFamily::kQwen3:
        j["attention_bias"] = c.attention_bias;
        [[fallthrough]];
      case ModelFamily::kQwen2:
        j["use_sliding_window"] = false;
        j["sliding_window"] = nullptr;
        j["max_window_layers"] = c.num_layers;
        break;
      case ModelFamily::kGpt2:
        break;
    }
  }
  std::string text = j.dump(2) + "\n";
  // The inverse, checked: a switch the family's file cannot express would
  // otherwise be lost without a word.
  const DecoderConfig back = parse_hf_config(text, "config.json");
  const std::string field = first_difference(ids ? keys.config : c, back);
  if (!field.empty())
    usage_error(
        "cannot write a {} config.json for this model: its {} has no {} config.json key "
        "(the file would describe another model); export it with --out FILE instead",
        family_name(c.family), field, family_name(c.family));
  return text;
}

}  // namespace

std::string hf_config_json(const DecoderConfig& c, const std::string& torch_dtype) {
  return config_json(c, torch_dtype, nullptr);
}

std::string hf_config_json(const DecoderConfig& c, const std::string& torch_dtype,
                           const HfTokenIds& ids) {
  return config_json(c, torch_dtype, &ids);
}

DecoderConfig read_hf_config(const std::string& dir_or_file) {
  std::string path;
  const std::string text = config_text(dir_or_file, &path);
  return parse_hf_config(text, path);
}

HfTokenIds read_hf_token_ids(const std::string& dir_or_file) {
  std::string path;
  const std::string text = config_text(dir_or_file, &path);
  const json j = parse_json_input(text, path);
  if (!j.is_object()) usage_error("{}: not a JSON object; is it a config.json?", path);
  Reader r(j, path);
  // Checked as read_hf_config checks them (against the model's vocabulary when written).
  read_bos(r, 0);
  read_eos(r, 0);
  HfTokenIds ids;
  if (j.contains("bos_token_id")) ids.bos_token_id = j["bos_token_id"].dump();
  if (j.contains("eos_token_id")) ids.eos_token_id = j["eos_token_id"].dump();
  return ids;
}

}  // namespace fd::nn
