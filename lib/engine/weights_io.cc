#include "lib/engine/weights_io.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <vector>

#include "lib/base/error.h"
#include "lib/base/log.h"
#include "lib/ckpt/hf_dir.h"
#include "lib/ckpt/peft.h"
#include "lib/ckpt/weights_file.h"

namespace fd::engine {
namespace {

std::string shape_str(const std::vector<int64_t>& shape) {
  return Shape(std::span<const int64_t>(shape)).str();
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A Hugging Face model directory's weights (lib/ckpt/hf_dir.h) into `model`'s
// parameters, by name: the family's Hugging Face names are the parameters'
// own (GPT-2's, also with the "transformer." prefix GPT2LMHeadModel writes).
// Tolerated extras: GPT-2's causal-mask buffers (attn.bias, attn.masked_bias)
// and an lm_head.weight beside a tied head (a note when it differs from the
// embedding, which the tied head uses).
void load_hf_dir(const std::string& dir, const nn::Module& model, const std::string& prefix) {
  std::optional<ckpt::HfWeights> opened;
  try {
    opened.emplace(ckpt::HfWeights::open(dir));
  } catch (const Error& e) {
    throw Error(e.kind(), prefix + e.what());
  }
  const ckpt::HfWeights& w = *opened;
  std::map<std::string, std::string> stored;  // our name -> the file's
  for (const std::string& name : w.names())
    stored[name.rfind("transformer.", 0) == 0 ? name.substr(12) : name] = name;
  std::vector<const nn::Parameter*> targets = model.frozen_parameters();
  if (targets.empty()) targets = model.parameters();
  std::map<std::string, const nn::Parameter*> ours;
  for (const nn::Parameter* p : targets) ours[p->name] = p;
  for (const nn::Parameter* p : targets) {
    auto it = stored.find(p->name);
    if (it == stored.end())
      usage_error(
          "{}{} has no tensor '{}' of shape {}, which the model of its config.json needs; is the "
          "directory complete (every shard of model.safetensors.index.json)?",
          prefix, dir, p->name, p->value.shape().str());
    ckpt::TensorInfo info;
    try {
      info = w.info(it->second);
    } catch (const Error& e) {
      throw Error(e.kind(), prefix + e.what());
    }
    if (info.shape != p->value.shape())
      usage_error("{}{}: tensor '{}' has shape {} in the files but {} in the model of its "
                  "config.json",
                  prefix, dir, it->second, info.shape.str(), p->value.shape().str());
  }
  bool head_differs = false;
  for (const auto& [name, file_name] : stored) {
    if (ours.count(name)) continue;
    if (ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias")) continue;
    if (name == "lm_head.weight") {
      head_differs = true;  // compared below, once the embedding is loaded
      continue;
    }
    usage_error("{}{} holds tensor '{}' {}, which the model of its config.json does not have",
                prefix, dir, file_name, w.info(file_name).shape.str());
  }
  for (const nn::Parameter* p : targets) {
    try {
      w.read(stored.at(p->name), p->value);
    } catch (const Error& e) {
      throw Error(e.kind(), prefix + e.what());
    }
  }
  if (!head_differs) return;
  // lm_head.weight beside a tied head: the embedding is what the head uses.
  const nn::Parameter* embed = nullptr;
  for (const char* n : {"wte.weight", "model.embed_tokens.weight"})
    if (ours.count(n)) embed = ours.at(n);
  const std::string& head = stored.at("lm_head.weight");
  bool same = false;
  if (embed != nullptr && w.info(head).shape == embed->value.shape()) {
    Tensor t = Tensor::empty(embed->value.shape(), DType::kF32, MemCategory::kOther, Device::cpu());
    w.read(head, t);
    same = t.to_vector() == embed->value.to_vector();
  }
  if (!same)
    log::warn("{}{}: lm_head.weight differs from the embedding; the model ties its head to the "
              "embedding (config.json tie_word_embeddings), so lm_head.weight is not used",
              prefix, dir);
}

}  // namespace

void load_weights(const std::string& file, const nn::Module& model, const std::string& where) {
  std::string prefix = where.empty() ? "" : where + ": ";
  std::error_code ec;
  if (std::filesystem::is_directory(file, ec)) {
    load_hf_dir(file, model, prefix);
    return;
  }
  std::optional<ckpt::WeightsFile> opened;
  try {
    opened.emplace(ckpt::WeightsFile::open(file));
  } catch (const Error& e) {
    throw Error(e.kind(), prefix + e.what());
  }
  const ckpt::WeightsFile& w = *opened;
  std::map<std::string, std::vector<int64_t>> file_shapes = w.shapes();

  // A LoRA model loads its frozen base; the adapters start from their own init.
  std::vector<const nn::Parameter*> targets = model.frozen_parameters();
  if (targets.empty()) targets = model.parameters();
  std::map<std::string, std::vector<int64_t>> model_shapes;
  for (const nn::Parameter* p : targets) {
    const Shape& s = p->value.shape();
    std::vector<int64_t> v;
    for (int i = 0; i < s.ndim(); ++i) v.push_back(s[i]);
    model_shapes[p->name] = v;
  }
  // An untied head (the Llama family) is a parameter like any other.
  const bool untied = model_shapes.count("lm_head.weight") != 0;
  if (untied && w.lm_head()) file_shapes["lm_head.weight"] = w.lm_head()->shape;
  std::string hint =
      ckpt::dims_hint(ckpt::implied_dims(file_shapes), ckpt::implied_dims(model_shapes));
  // A file of the other family: say so rather than list its tensors one by one.
  const bool file_llama = file_shapes.count("model.embed_tokens.weight") != 0;
  const bool model_llama = model_shapes.count("model.embed_tokens.weight") != 0;
  if (file_llama != model_llama)
    hint = file_llama ? "; the file holds a Llama-family model (model.embed_tokens.weight): set "
                        "model.arch and its shape keys to match it, or start from a Hugging Face "
                        "directory (fdtrain ckpt export --hf-dir), whose config.json says them"
                      : "; the file holds a GPT-2 model (wte.weight): set model.arch gpt2 and its "
                        "shape keys to match it";

  for (const nn::Parameter* p : targets) {
    auto it = file_shapes.find(p->name);
    if (it == file_shapes.end())
      usage_error("{}{} has no tensor '{}' of shape {}, which the model needs{}", prefix, file,
                  p->name, shape_str(model_shapes[p->name]), hint);
    if (it->second != model_shapes[p->name])
      usage_error("{}{}: tensor '{}' has shape {} in the file but {} in the model{}", prefix, file,
                  p->name, shape_str(it->second), shape_str(model_shapes[p->name]), hint);
  }
  for (const auto& [name, shape] : file_shapes)
    if (!model_shapes.count(name))
      usage_error("{}{} holds tensor '{}' {}, which the model does not have{}", prefix, file,
                  w.stored_name(name), shape_str(shape),
                  hint.empty() ? "; is it a GPT-2 model?" : hint);

  for (const nn::Parameter* p : targets) {
    try {
      p->value.copy_from(untied && p->name == "lm_head.weight" ? w.load_lm_head()
                                                                : w.load(p->name));
    } catch (const Error& e) {
      throw Error(e.kind(), prefix + e.what());
    }
  }
  if (w.lm_head() && !untied) {
    bool tied = false;
    if (file_shapes.count("wte.weight") && w.lm_head()->shape == file_shapes.at("wte.weight")) {
      std::vector<float> a = w.load_lm_head().to_vector();
      std::vector<float> b = w.load("wte.weight").to_vector();
      tied = a == b;
    }
    if (!tied)
      log::warn(
          "{}{}: lm_head.weight differs from wte.weight; fdtrain ties the head to wte, so "
          "lm_head.weight is ignored",
          prefix, file);
  }
}

void load_peft_adapter(const std::string& dir, const nn::Decoder& model, const nn::LoraConfig& lora,
                       const std::vector<std::string>& recipe_targets, const std::string& where) {
  ckpt::PeftAdapter a;
  try {
    a = ckpt::read_peft_adapter(dir);
  } catch (const Error& e) {
    throw Error(e.kind(), where + ": " + e.what());
  }
  std::vector<std::string> theirs = nn::lora_modules_for_targets(model.config(), a.spec.targets),
                           ours = lora.modules;
  std::sort(theirs.begin(), theirs.end());
  std::sort(ours.begin(), ours.end());
  if (a.spec.r != lora.r || theirs != ours || a.spec.layers != lora.layers) {
    usage_error(
        "{}: the adapter in {} has r = {}, targets [{}], layers [{}]; the recipe asks for "
        "r = {}, targets [{}], layers [{}]; make lora match the adapter",
        where, dir, a.spec.r, fmt::join(a.spec.targets, ", "), fmt::join(a.spec.layers, ", "),
        lora.r, fmt::join(recipe_targets, ", "), fmt::join(lora.layers, ", "));
  }
  for (const nn::Parameter* p : model.parameters()) {
    auto it = std::find_if(a.tensors.begin(), a.tensors.end(),
                           [&](const auto& t) { return t.first == p->name; });
    if (it == a.tensors.end()) usage_error("{}: the adapter in {} has no {}", where, dir, p->name);
    if (it->second.shape() != p->value.shape())
      usage_error("{}: {} in {} has shape {}, the model needs {}", where, p->name, dir,
                  it->second.shape().str(), p->value.shape().str());
    p->value.copy_from(it->second);
  }
}

}  // namespace fd::engine
