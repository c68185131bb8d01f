#include "lib/ckpt/peft.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>

#include "lib/base/atomic_file.h"
#include "lib/base/error.h"
#include "lib/base/input_file.h"
#include "lib/ckpt/finite.h"
#include "lib/ckpt/manifest.h"
#include "lib/nn/config/decoder_config.h"
#include "lib/tensor/lora_merge.h"
#include "lib/tensor/safetensors.h"

namespace fd::ckpt {

namespace fs = std::filesystem;

namespace {

// PEFT's key prefixes: GPT2LMHeadModel holds the blocks in .transformer, the
// Llama family's *ForCausalLM in .model (which the parameter names include).
constexpr const char* kPeftPrefix = "base_model.model.transformer.";
constexpr const char* kPeftLlamaPrefix = "base_model.model.";
constexpr const char* kConfigFile = "adapter_config.json";
constexpr const char* kModelFile = "adapter_model.safetensors";

// The modules a block has, in canonical order: GPT-2's Conv1D layers with
// their (in, out) sizes as multiples of the model width C, then the Llama
// family's Linear layers (llama: sizes depend on more than C, so unchecked).
struct ModuleInfo {
  const char* path;
  int in_mult, out_mult;
  bool llama;  // "model.layers.N." block, Linear [out, in]; else "h.N.", Conv1D (in, out)
};
constexpr std::array<ModuleInfo, 11> kModules = {{
    {"attn.c_attn", 1, 3, false},
    {"attn.c_proj", 1, 1, false},
    {"mlp.c_fc", 1, 4, false},
    {"mlp.c_proj", 4, 1, false},
    {"self_attn.q_proj", 0, 0, true},
    {"self_attn.k_proj", 0, 0, true},
    {"self_attn.v_proj", 0, 0, true},
    {"self_attn.o_proj", 0, 0, true},
    {"mlp.gate_proj", 0, 0, true},
    {"mlp.up_proj", 0, 0, true},
    {"mlp.down_proj", 0, 0, true},
}};

// Target names: the model family's (nn::lora_targets, the table the recipe is
// checked against), less all-linear, which names no one module.
std::vector<std::string> family_targets(nn::ModelFamily family) {
  std::vector<std::string> out;
  for (const nn::LoraTarget& t : nn::lora_targets(family))
    if (!t.modules.empty()) out.emplace_back(t.name);
  return out;
}
const std::vector<std::string> kGpt2Targets = family_targets(nn::ModelFamily::kGpt2);
const std::vector<std::string> kLlamaTargets = family_targets(nn::ModelFamily::kLlama);
// Either family's (an adapter_config.json is read before its tensors say which).
const std::vector<std::string> kTargets = [] {
  std::vector<std::string> all = kGpt2Targets;
  all.insert(all.end(), kLlamaTargets.begin(), kLlamaTargets.end());
  return all;
}();
// PEFT spellings we map to target names: a module's full path, for the
// targets that name exactly that one module under a shorter name
// (self_attn.q_proj -> q_proj, mlp.c_fc -> c_fc).
const std::map<std::string, std::string> kTargetAliases = [] {
  std::map<std::string, std::string> aliases;
  for (nn::ModelFamily family : {nn::ModelFamily::kGpt2, nn::ModelFamily::kLlama})
    for (const nn::LoraTarget& t : nn::lora_targets(family))
      if (t.modules.size() == 1 && std::string(t.modules[0]) != t.name)
        aliases.emplace(t.modules[0], t.name);
  return aliases;
}();

constexpr const char* kExpectedNames =
    "h.N.{attn.c_attn,attn.c_proj,mlp.c_fc,mlp.c_proj}.lora_{A,B}.weight (GPT-2) or "
    "model.layers.N.{self_attn.{q,k,v,o}_proj,mlp.{gate,up,down}_proj}.lora_{A,B}.weight "
    "(Llama family)";

// PEFT's rule: a target names a module when it equals the module's path or
// is a dot-separated suffix of it.
bool target_matches(const std::string& target, const std::string& module) {
  return module == target ||
         (module.size() > target.size() &&
          module.compare(module.size() - target.size(), target.size(), target) == 0 &&
          module[module.size() - target.size() - 1] == '.');
}

bool targeted(const std::vector<std::string>& targets, const std::string& module) {
  return std::any_of(targets.begin(), targets.end(),
                     [&](const std::string& t) { return target_matches(t, module); });
}

// A parsed LoRA parameter name.
struct LoraName {
  int layer;
  int module;  // index into kModules
  bool is_a;
};

std::optional<LoraName> parse_lora_name(const std::string& name) {
  static const std::regex kName(
      R"(^(h|model\.layers)\.(\d{1,6})\.([a-z_]+\.[a-z_]+)\.lora_([AB])\.weight$)");
  std::smatch m;
  if (!std::regex_match(name, m, kName)) return std::nullopt;
  const bool llama = m[1].str() != "h";
  for (size_t i = 0; i < kModules.size(); ++i)
    if (m[3].str() == kModules[i].path && kModules[i].llama == llama)
      return LoraName{std::stoi(m[2].str()), int(i), m[4].str() == "A"};
  return std::nullopt;
}

std::string block_prefix(int layer, int module) {
  return (kModules[size_t(module)].llama ? "model.layers." : "h.") + std::to_string(layer) + ".";
}

std::string lora_name(int layer, int module, bool is_a) {
  return fmt::format("{}{}.lora_{}.weight", block_prefix(layer, module),
                     kModules[size_t(module)].path, is_a ? "A" : "B");
}

std::string module_name(int layer, int module) {
  return block_prefix(layer, module) + kModules[size_t(module)].path;
}

// The PEFT key prefix of a (parsed) fdtrain LoRA name.
const char* peft_prefix(const LoraName& n) {
  return kModules[size_t(n.module)].llama ? kPeftLlamaPrefix : kPeftPrefix;
}

// One adapted module: its A and B, and how the caller names them in messages.
struct Pair {
  Tensor a, b;
  std::string a_name, b_name;
};
using Pairs = std::map<std::pair<int, int>, Pair>;  // (layer, module) -> pair

std::string shape_of(const Tensor& t) { return t.shape().str(); }

// Groups `tensors` (fdtrain names) into pairs; `display` maps an fdtrain name
// to what messages call it; `where` prefixes every message.
Pairs collect_pairs(const std::vector<std::pair<std::string, Tensor>>& tensors,
                    const std::function<std::string(const std::string&)>& display,
                    const std::string& where) {
  Pairs pairs;
  for (const auto& [name, t] : tensors) {
    std::optional<LoraName> n = parse_lora_name(name);
    if (!n)
      usage_error("{}: '{}' is not a LoRA weight of a GPT-2 or Llama-family block (expected {})",
                  where, display(name), kExpectedNames);
    if (!t.defined() || t.shape().ndim() != 2)
      usage_error("{}: '{}' has shape {}, but a LoRA weight is a matrix", where, display(name),
                  t.defined() ? shape_of(t) : "(none)");
    if (t.dtype() == DType::kI32)
      usage_error("{}: '{}' has dtype {}, but a LoRA weight is floating point", where,
                  display(name), dtype_name(t.dtype()));
    Pair& p = pairs[{n->layer, n->module}];
    Tensor& slot = n->is_a ? p.a : p.b;
    if (slot.defined()) usage_error("{}: '{}' appears twice", where, display(name));
    slot = t;
    (n->is_a ? p.a_name : p.b_name) = display(name);
  }
  for (const auto& [key, p] : pairs) {
    if (!p.a.defined() || !p.b.defined())
      usage_error("{}: '{}' has no matching '{}'; LoRA weights come in A/B pairs", where,
                  p.a.defined() ? p.a_name : p.b_name,
                  display(lora_name(key.first, key.second, !p.a.defined())));
  }
  return pairs;
}

// Checks the pairs against each other and `spec`: A (r, in), B (out, r) with
// one r and one model width C; modules named by the targets; blocks in
// spec.layers; every targeted module in each block that has adapters.
void check_pairs(const Pairs& pairs, const LoraSpec& spec, const std::string& where) {
  if (pairs.empty()) usage_error("{}: no LoRA weights", where);
  int64_t width = -1;
  std::string width_from;
  for (const auto& [key, p] : pairs) {
    const ModuleInfo& m = kModules[size_t(key.second)];
    const std::string module = module_name(key.first, key.second);
    if (p.a.shape()[0] != spec.r)
      usage_error("{}: '{}' has shape {}, but lora_A is (r, in) with r = {}", where, p.a_name,
                  shape_of(p.a), spec.r);
    if (p.b.shape()[1] != spec.r)
      usage_error("{}: '{}' has shape {}, but lora_B is (out, r) with r = {}", where, p.b_name,
                  shape_of(p.b), spec.r);
    const int64_t in = p.a.shape()[1], out = p.b.shape()[0];
    if (m.llama) {  // sizes depend on heads, head_dim and the MLP width: the model checks them
      if (!targeted(spec.targets, m.path))
        usage_error("{}: there are LoRA weights for {}, but the targets [{}] do not name it", where,
                    module, fmt::join(spec.targets, ", "));
      if (!spec.layers.empty() &&
          !std::binary_search(spec.layers.begin(), spec.layers.end(), key.first))
        usage_error("{}: there are LoRA weights for block {}, but the layers [{}] do not list it",
                    where, key.first, fmt::join(spec.layers, ", "));
      continue;
    }
    if (in % m.in_mult != 0 || out % m.out_mult != 0 || in / m.in_mult != out / m.out_mult)
      usage_error(
          "{}: '{}' {} and '{}' {} do not fit {}, which maps C to {}C features (in {}, out {})",
          where, p.a_name, shape_of(p.a), p.b_name, shape_of(p.b), m.path, m.out_mult, in, out);
    const int64_t c = in / m.in_mult;
    if (width < 0) {
      width = c;
      width_from = p.a_name;
    } else if (c != width) {
      usage_error("{}: '{}' {} implies model width {}, but '{}' implies {}", where, p.a_name,
                  shape_of(p.a), c, width_from, width);
    }
    if (!targeted(spec.targets, m.path))
      usage_error("{}: there are LoRA weights for {}, but the targets [{}] do not name it", where,
                  module, fmt::join(spec.targets, ", "));
    if (!spec.layers.empty() &&
        !std::binary_search(spec.layers.begin(), spec.layers.end(), key.first))
      usage_error("{}: there are LoRA weights for block {}, but the layers [{}] do not list it",
                  where, key.first, fmt::join(spec.layers, ", "));
  }
  std::set<int> blocks;
  for (const auto& [key, p] : pairs) blocks.insert(key.first);
  for (int layer : spec.layers)
    if (!blocks.count(layer))
      usage_error("{}: layers lists block {}, but there are no LoRA weights for it", where, layer);
  const bool llama = kModules[size_t(pairs.begin()->first.second)].llama;
  for (const auto& [key, p] : pairs)
    if (kModules[size_t(key.second)].llama != llama)
      usage_error("{}: '{}' and '{}' belong to different model families (GPT-2 and Llama)", where,
                  pairs.begin()->second.a_name, p.a_name);
  for (int layer : blocks)
    for (size_t i = 0; i < kModules.size(); ++i)
      if (kModules[i].llama == llama && targeted(spec.targets, kModules[i].path) &&
          !pairs.count({layer, int(i)}))
        usage_error("{}: the targets [{}] name {}, but there are no LoRA weights for it", where,
                    fmt::join(spec.targets, ", "), module_name(layer, int(i)));
}

// `family`: the targets valid for the adapter's family (kTargets when not yet known).
void check_spec(const LoraSpec& spec, const std::string& where,
                const std::vector<std::string>& family) {
  if (spec.r < 1) usage_error("{}: r must be >= 1, got {}", where, spec.r);
  if (!(spec.alpha > 0) || !std::isfinite(spec.alpha))
    usage_error("{}: lora_alpha must be > 0, got {}", where, spec.alpha);
  if (!(spec.dropout >= 0 && spec.dropout < 1))
    usage_error("{}: lora_dropout must be in [0, 1), got {}", where, spec.dropout);
  if (spec.targets.empty()) usage_error("{}: target_modules is empty", where);
  for (const std::string& t : spec.targets)
    if (std::find(family.begin(), family.end(), t) == family.end())
      usage_error("{}: target module '{}' is not one fdtrain adapts; the valid names are {}", where,
                  t, fmt::join(family, ", "));
  if (!std::is_sorted(spec.layers.begin(), spec.layers.end()) ||
      std::adjacent_find(spec.layers.begin(), spec.layers.end()) != spec.layers.end() ||
      (!spec.layers.empty() && spec.layers.front() < 0))
    usage_error("{}: layers must be sorted, unique block indices >= 0, got [{}]", where,
                fmt::join(spec.layers, ", "));
}

// The pairs as a flat list in canonical order, A before B, under fdtrain names.
std::vector<std::pair<std::string, Tensor>> flatten(const Pairs& pairs) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [key, p] : pairs) {  // std::map: by (layer, module)
    out.emplace_back(lora_name(key.first, key.second, true), p.a);
    out.emplace_back(lora_name(key.first, key.second, false), p.b);
  }
  return out;
}

nlohmann::ordered_json number_json(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return int64_t(v);
  return v;
}

}  // namespace

// ---------------------------------------------------------------------------

bool is_lora_name(const std::string& name) {
  return name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
}

std::string peft_key(const std::string& fdtrain_name) {
  std::optional<LoraName> n = parse_lora_name(fdtrain_name);
  if (!n)
    usage_error("'{}' is not a LoRA weight of a GPT-2 or Llama-family block (expected {})",
                fdtrain_name, kExpectedNames);
  return peft_prefix(*n) + fdtrain_name;
}

void write_peft_adapter(const std::string& dir, const LoraSpec& spec,
                        const std::vector<std::pair<std::string, Tensor>>& lora_tensors,
                        bool overwrite) {
  const std::string where = "LoRA adapter " + dir;
  Pairs pairs = collect_pairs(
      lora_tensors, [](const std::string& n) { return n; }, where);
  const bool llama = !pairs.empty() && kModules[size_t(pairs.begin()->first.second)].llama;
  // The Llama family's target_modules: the short names PEFT uses (q_proj, ...), of
  // the modules that have adapters (the recipe may say all-linear or self_attn.q_proj).
  LoraSpec written = spec;
  if (llama) {
    written.targets.clear();
    for (size_t i = 0; i < kModules.size(); ++i) {
      const bool present = std::any_of(pairs.begin(), pairs.end(),
                                       [&](const auto& kv) { return kv.first.second == int(i); });
      if (present) written.targets.push_back(kTargetAliases.at(kModules[i].path));
    }
  }
  check_spec(written, where, llama ? kLlamaTargets : kGpt2Targets);
  check_pairs(pairs, written, where);

  std::error_code ec;
  fs::path final_dir = fs::path(dir).lexically_normal();
  if (final_dir.filename().empty()) final_dir = final_dir.parent_path();  // "dir/"
  if (fs::exists(final_dir, ec) && !overwrite)
    usage_error("{} already exists; pass --overwrite to replace it, or choose another directory",
                dir);
  if (!final_dir.parent_path().empty()) fs::create_directories(final_dir.parent_path(), ec);
  // Staged in a fresh DIR.tmp-XXXXXX (never a directory that was there before), removed again
  // if the write fails; only a crash leaves it behind (lib/base/atomic_file.h).
  StagingDir staging(final_dir);
  const fs::path& tmp = staging.path();

  nlohmann::ordered_json cfg;
  cfg["peft_type"] = "LORA";
  cfg["task_type"] = "CAUSAL_LM";
  cfg["r"] = spec.r;
  cfg["lora_alpha"] = number_json(spec.alpha);
  cfg["lora_dropout"] = spec.dropout;
  cfg["target_modules"] = written.targets;
  cfg["bias"] = "none";
  cfg["fan_in_fan_out"] = !llama;  // Conv1D (in, out) weights: true; Linear [out, in]: false
  cfg["base_model_name_or_path"] = spec.base;
  cfg["inference_mode"] = true;
  cfg["layers_to_transform"] =
      spec.layers.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(spec.layers);
  cfg["modules_to_save"] = nullptr;
  cfg["init_lora_weights"] = true;
  cfg["use_rslora"] = false;
  cfg["use_dora"] = false;
  {
    const fs::path cfg_path = tmp / kConfigFile;
    std::ofstream f(cfg_path);
    f << cfg.dump(2) << "\n";
    f.close();
    if (!f) runtime_error("cannot write {}; check free space and permissions", cfg_path.string());
  }
  std::vector<std::pair<std::string, Tensor>> keyed;
  for (const auto& [name, t] : flatten(pairs)) keyed.emplace_back(peft_key(name), t);
  write_safetensors((tmp / kModelFile).string(), keyed, {{"format", "pt"}});

  replace_directory(tmp.string(), final_dir.string());
  staging.committed();
}

PeftAdapter read_peft_adapter(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    usage_error("{} is not a directory; a PEFT adapter is a directory with {} and {}", dir,
                kConfigFile, kModelFile);
  const std::string cfg_path = (fs::path(dir) / kConfigFile).string();
  const std::string model_path = (fs::path(dir) / kModelFile).string();
  if (!fs::exists(cfg_path, ec))
    usage_error("{} does not exist; is {} a PEFT adapter?", cfg_path, dir);
  if (!fs::exists(model_path, ec)) {
    if (fs::exists(fs::path(dir) / "adapter_model.bin", ec))
      usage_error(
          "{} does not exist (there is a pickled adapter_model.bin, which fdtrain does not "
          "read); save the adapter with safe_serialization=True",
          model_path);
    usage_error("{} does not exist; is {} a PEFT adapter?", model_path, dir);
  }

  // A regular file of configuration size and depth (a directory or FIFO is refused by name).
  const nlohmann::json cfg = read_json_file(cfg_path, "the adapter's");
  if (!cfg.is_object()) usage_error("{}: not a JSON object; the file is corrupt", cfg_path);
  // An integer of the file in [lo, hi], never narrowed (r = 2^32 + 4 is not 4).
  auto in_range = [](const nlohmann::json& v, int64_t lo, int64_t hi) {
    return v.is_number_integer() &&
           !(v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)) &&
           v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
  };
  constexpr int64_t kMaxRank = 65536, kMaxLayer = 65535;
  auto bad = [&](const std::string& what) { usage_error("{}: {}", cfg_path, what); };
  auto has = [&](const char* key) { return cfg.contains(key) && !cfg[key].is_null(); };

  if (!cfg.contains("peft_type") || cfg["peft_type"] != "LORA")
    bad(fmt::format("peft_type is {}, but fdtrain reads only \"LORA\" adapters",
                    cfg.contains("peft_type") ? cfg["peft_type"].dump() : "missing"));
  if (has("task_type") && cfg["task_type"] != "CAUSAL_LM")
    bad(fmt::format("task_type is {}, expected \"CAUSAL_LM\"", cfg["task_type"].dump()));
  if (!cfg.contains("fan_in_fan_out") || !cfg["fan_in_fan_out"].is_boolean())
    bad(fmt::format("fan_in_fan_out is {}, expected true (GPT-2) or false (Llama family)",
                    cfg.contains("fan_in_fan_out") ? cfg["fan_in_fan_out"].dump() : "missing"));
  const bool fan_in_fan_out = cfg["fan_in_fan_out"].get<bool>();
  if (has("bias") && cfg["bias"] != "none")
    bad(fmt::format("bias is {}; fdtrain adapters train no biases (\"none\")", cfg["bias"].dump()));
  for (const char* flag : {"use_rslora", "use_dora"})
    if (has(flag) && cfg[flag] != false)
      bad(fmt::format("{} is {}; fdtrain supports plain LoRA only", flag, cfg[flag].dump()));
  for (const char* pattern : {"rank_pattern", "alpha_pattern"})
    if (has(pattern) && !(cfg[pattern].is_object() && cfg[pattern].empty()))
      bad(fmt::format("{} is {}; fdtrain supports one r and alpha for all modules", pattern,
                      cfg[pattern].dump()));
  if (has("modules_to_save") &&
      !(cfg["modules_to_save"].is_array() && cfg["modules_to_save"].empty()))
    bad(fmt::format("modules_to_save is {}; fdtrain adapters hold only LoRA weights",
                    cfg["modules_to_save"].dump()));

  LoraSpec spec;
  if (!cfg.contains("r") || !in_range(cfg["r"], 1, kMaxRank))
    bad(fmt::format("r must be an integer in [1, {}]", kMaxRank) +
        (cfg.contains("r") ? ", got " + cfg["r"].dump() : std::string(", but it is missing")));
  spec.r = cfg["r"].get<int>();
  if (!cfg.contains("lora_alpha") || !cfg["lora_alpha"].is_number())
    bad("lora_alpha must be a number > 0" + (cfg.contains("lora_alpha")
                                                 ? ", got " + cfg["lora_alpha"].dump()
                                                 : std::string(", but it is missing")));
  spec.alpha = cfg["lora_alpha"].get<double>();
  if (has("lora_dropout")) {
    if (!cfg["lora_dropout"].is_number())
      bad("lora_dropout must be a number in [0, 1), got " + cfg["lora_dropout"].dump());
    spec.dropout = cfg["lora_dropout"].get<double>();
  }
  if (!cfg.contains("target_modules") || !cfg["target_modules"].is_array())
    bad(fmt::format("target_modules must be a list of module names ({}){}",
                    fmt::join(kTargets, ", "),
                    cfg.contains("target_modules") ? ", got " + cfg["target_modules"].dump()
                                                   : std::string(", but it is missing")));
  for (const auto& t : cfg["target_modules"]) {
    if (!t.is_string()) bad("target_modules holds " + t.dump() + ", which is not a name");
    std::string name = t.get<std::string>();
    if (auto it = kTargetAliases.find(name); it != kTargetAliases.end()) name = it->second;
    if (std::find(kTargets.begin(), kTargets.end(), name) == kTargets.end())
      bad(fmt::format("target module '{}' is not one fdtrain adapts; the valid names are {}",
                      t.get<std::string>(), fmt::join(kTargets, ", ")));
    if (std::find(spec.targets.begin(), spec.targets.end(), name) == spec.targets.end())
      spec.targets.push_back(name);
  }
  if (has("layers_to_transform")) {
    const auto& l = cfg["layers_to_transform"];
    if (l.is_number_integer()) {
      if (!in_range(l, 0, kMaxLayer))
        bad("layers_to_transform is " + l.dump() + ", which is not a block index");
      spec.layers.push_back(l.get<int>());
    } else if (l.is_array()) {
      for (const auto& i : l) {
        if (!in_range(i, 0, kMaxLayer))
          bad("layers_to_transform holds " + i.dump() + ", which is not a block index");
        spec.layers.push_back(i.get<int>());
      }
      std::sort(spec.layers.begin(), spec.layers.end());
      spec.layers.erase(std::unique(spec.layers.begin(), spec.layers.end()), spec.layers.end());
    } else {
      bad("layers_to_transform must be null or a list of block indices, got " + l.dump());
    }
  }
  if (has("base_model_name_or_path")) {
    if (!cfg["base_model_name_or_path"].is_string())
      bad("base_model_name_or_path must be a string, got " + cfg["base_model_name_or_path"].dump());
    spec.base = cfg["base_model_name_or_path"].get<std::string>();
  }
  check_spec(spec, cfg_path, kTargets);

  SafetensorsFile f = SafetensorsFile::open(model_path);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const std::string& key : f.names()) {
    std::string name;
    for (const char* prefix : {kPeftPrefix, kPeftLlamaPrefix})
      if (name.empty() && key.rfind(prefix, 0) == 0) {
        std::optional<LoraName> n = parse_lora_name(key.substr(std::string(prefix).size()));
        if (n && std::string(peft_prefix(*n)) == prefix)
          name = key.substr(std::string(prefix).size());
      }
    if (name.empty())
      usage_error(
          "{}: key '{}' is not a LoRA weight of a GPT-2 block (expected {}h.N.<module>.lora_{{A,B}}"
          ".weight) or of a Llama-family block ({}model.layers.N.<module>.lora_{{A,B}}.weight); "
          "fdtrain names {}",
          model_path, key, kPeftPrefix, kPeftLlamaPrefix, kExpectedNames);
    const std::string& dt = f.entry(key).dtype;
    if (dt != "F32" && dt != "BF16" && dt != "F16")
      usage_error("{}: '{}' has dtype {}, but a LoRA weight is F32, BF16 or F16", model_path, key,
                  dt);
    tensors.emplace_back(name, f.load(key, MemCategory::kOther));
    check_finite(tensors.back().second, model_path, key);
  }
  Pairs pairs = collect_pairs(
      tensors, [](const std::string& n) { return peft_key(n); }, model_path);
  const bool llama = !pairs.empty() && kModules[size_t(pairs.begin()->first.second)].llama;
  check_spec(spec, cfg_path, llama ? kLlamaTargets : kGpt2Targets);
  if (!pairs.empty() && fan_in_fan_out == llama)
    bad(llama ? "fan_in_fan_out is true, but the Llama family's Linear layers store [out, in] "
                "weights and need false"
              : "fan_in_fan_out is false, but GPT-2's Conv1D layers store (in, out) weights and "
                "need true");
  check_pairs(pairs, spec, model_path + " with " + kConfigFile);
  return PeftAdapter{spec, flatten(pairs)};
}

std::vector<std::pair<std::string, Tensor>> merge_lora(
    const std::vector<std::pair<std::string, Tensor>>& base,
    const std::vector<std::pair<std::string, Tensor>>& lora, double scaling) {
  const std::string where = "merging LoRA weights";
  Pairs pairs = collect_pairs(
      lora, [](const std::string& n) { return n; }, where);
  std::map<std::string, size_t> index;  // base name without "transformer." -> position
  for (size_t i = 0; i < base.size(); ++i) {
    const std::string& n = base[i].first;
    index[n.rfind("transformer.", 0) == 0 ? n.substr(12) : n] = i;
  }
  std::vector<std::pair<std::string, Tensor>> out = base;
  for (const auto& [key, p] : pairs) {
    const std::string weight = module_name(key.first, key.second) + ".weight";
    auto it = index.find(weight);
    if (it == index.end())
      usage_error("{}: the base model has no '{}' for '{}' and '{}'; is it the adapter's base?",
                  where, weight, p.a_name, p.b_name);
    const Tensor& w = base[it->second].second;
    const int64_t r = p.a.shape()[0], in = p.a.shape()[1], n_out = p.b.shape()[0];
    if (p.b.shape()[1] != r)
      usage_error("{}: '{}' {} and '{}' {} have different ranks", where, p.a_name, shape_of(p.a),
                  p.b_name, shape_of(p.b));
    const bool linear = kModules[size_t(key.second)].llama;  // [out, in], else Conv1D (in, out)
    const int64_t rows = linear ? n_out : in, cols = linear ? in : n_out;
    if (w.shape().ndim() != 2 || w.shape()[0] != rows || w.shape()[1] != cols)
      usage_error(
          "{}: '{}' has shape {} in the base, but '{}' {} and '{}' {} need ({}, {}) ({}); is it "
          "the adapter's base?",
          where, weight, shape_of(w), p.a_name, shape_of(p.a), p.b_name, shape_of(p.b), rows, cols,
          linear ? "Linear [out, in]" : "Conv1D (in, out)");
    std::vector<float> merged = w.to_vector();
    merge_lora_into(merged, p.a.to_vector(), p.b.to_vector(), r, in, n_out, scaling,
                    linear ? WeightLayout::kOutIn : WeightLayout::kInOut);
    out[it->second].second =
        Tensor::from_vector(merged, w.shape(), DType::kF32, MemCategory::kOther);
    if (w.dtype() != DType::kF32)
      out[it->second].second = out[it->second].second.to(w.dtype(), MemCategory::kOther);
  }
  return out;
}

}  // namespace fd::ckpt
