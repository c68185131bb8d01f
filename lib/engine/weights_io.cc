#include "lib/engine/weights_io.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <optional>
#include <vector>

#include "lib/base/error.h"
#include "lib/base/log.h"
#include "lib/ckpt/peft.h"
#include "lib/ckpt/weights_file.h"

namespace fd::engine {
namespace {

std::string shape_str(const std::vector<int64_t>& shape) {
  return Shape(std::span<const int64_t>(shape)).str();
}

}  // namespace

void load_weights(const std::string& file, const nn::Module& model, const std::string& where) {
  std::string prefix = where.empty() ? "" : where + ": ";
  std::optional<ckpt::WeightsFile> opened;
  try {
    opened.emplace(ckpt::WeightsFile::open(file));
  } catch (const Error& e) {
    throw Error(e.kind(), prefix + e.what());
  }
  const ckpt::WeightsFile& w = *opened;
  const std::map<std::string, std::vector<int64_t>>& file_shapes = w.shapes();

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
  std::string hint =
      ckpt::dims_hint(ckpt::implied_dims(file_shapes), ckpt::implied_dims(model_shapes));

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
      p->value.copy_from(w.load(p->name));
    } catch (const Error& e) {
      throw Error(e.kind(), prefix + e.what());
    }
  }
  if (w.lm_head()) {
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
