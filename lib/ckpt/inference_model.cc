#include "lib/ckpt/inference_model.h"

#include <filesystem>
#include <map>
#include <regex>

#include "lib/base/error.h"
#include "lib/base/log.h"
#include "lib/ckpt/export.h"
#include "lib/config/load.h"

namespace fd::ckpt {
namespace {

namespace fs = std::filesystem;

std::string dims(const nn::GptConfig& c) {
  return fmt::format("n_layer {}, n_head {}, d_model {}, vocab_size {}, max_seq_len {}", c.n_layer,
                     c.n_head, c.d_model, c.vocab_size, c.max_seq_len);
}

// Copies tensors by name into the parameters; every parameter must be there with its shape.
void fill(const std::vector<const nn::Parameter*>& params,
          const std::map<std::string, Tensor>& tensors, const std::string& where) {
  for (const nn::Parameter* p : params) {
    auto it = tensors.find(p->name);
    if (it == tensors.end())
      usage_error(
          "{}: has no tensor '{}', which the model of its recipe needs; the checkpoint "
          "is inconsistent",
          where, p->name);
    if (it->second.shape() != p->value.shape())
      usage_error(
          "{}: tensor '{}' has shape {} but the model of its recipe needs {}; the "
          "checkpoint is inconsistent",
          where, p->name, it->second.shape().str(), p->value.shape().str());
    p->value.copy_from(it->second);
  }
}

InferenceModel from_checkpoint(const std::string& path) {
  Checkpoint c = open_checkpoint(path);
  config::LoadResult r = config::try_parse_stored_recipe(c.meta().recipe_yaml, "checkpoint recipe");
  if (!r.ok())
    usage_error(
        "{}: the checkpoint's stored recipe does not validate, so its model cannot be "
        "rebuilt:\n{}",
        c.dir, fmt::join(r.errors, "\n"));
  const config::Recipe& recipe = r.recipe;
  nn::GptConfig mc{recipe.model.n_layer, recipe.model.n_head, recipe.model.d_model,
                   recipe.model.vocab_size, recipe.model.max_seq_len};
  nn::LoraConfig lora;
  if (recipe.lora) {
    lora.r = recipe.lora->r;
    lora.alpha = float(recipe.lora->alpha);
    lora.dropout = 0.0f;  // inference
    lora.modules = nn::lora_modules_for_targets(recipe.lora->targets);
    lora.layers = recipe.lora->layers;
  }
  InferenceModel m;
  m.model = std::make_unique<nn::Gpt>(mc, DType::kF32, nn::GroupLayout{}, lora);
  std::map<std::string, Tensor> tensors;
  for (auto& [name, t] : consolidate_ordered(c, DType::kF32)) tensors[name] = t;
  if (lora.enabled()) {
    const std::string& base = recipe.model.init_from;
    if (base.empty() || !fs::exists(base))
      usage_error(
          "{}: a LoRA checkpoint holds only the adapters, and its base model "
          "(model.init_from '{}') is not here; run from the directory the run was "
          "started in, or export the merged model with `fdtrain ckpt export {} "
          "--merge-lora --out FILE` and use FILE",
          c.dir, base, path);
    load_weights(base, *m.model, fmt::format("{}: base model (model.init_from)", c.dir));
  }
  fill(m.model->parameters(), tensors, c.dir);
  m.source = c.dir;
  m.description =
      fmt::format("checkpoint {} (step {}{}; {})", c.dir, c.meta().step,
                  lora.enabled() ? ", LoRA merged into " + recipe.model.init_from : "", dims(mc));
  m.recipe = recipe;
  return m;
}

InferenceModel from_file(const std::string& path) {
  WeightsInfo info = read_weights_info(path);
  nn::GptConfig mc{0, 0, 0, 0, 0};
  static const std::regex kBlock(R"(^h\.(\d+)\..*)");
  std::smatch match;
  for (const auto& [name, shape] : info.shapes) {
    if (std::regex_match(name, match, kBlock))
      mc.n_layer = std::max(mc.n_layer, std::stoi(match[1].str()) + 1);
    if (name == "wte.weight" && shape.size() == 2) {
      mc.vocab_size = int(shape[0]);
      mc.d_model = int(shape[1]);
    }
    if (name == "wpe.weight" && shape.size() == 2) mc.max_seq_len = int(shape[0]);
  }
  if (mc.d_model <= 0 || mc.max_seq_len <= 0)
    usage_error(
        "{}: no wte.weight / wpe.weight tensors: not a GPT-2 model (give an fdtrain "
        "export, a Hugging Face GPT-2 model.safetensors, or a checkpoint directory)",
        path);
  auto it = info.metadata.find("n_head");
  if (it != info.metadata.end()) {
    try {
      mc.n_head = std::stoi(it->second);
    } catch (const std::exception&) {
      usage_error("{}: metadata n_head '{}' is not a number", path, it->second);
    }
    if (mc.n_head < 1 || mc.d_model % mc.n_head != 0)
      usage_error("{}: metadata n_head {} does not divide d_model {}", path, mc.n_head, mc.d_model);
  } else if (mc.d_model % 64 == 0) {
    mc.n_head = mc.d_model / 64;
    log::warn("{}: the file does not record n_head; assuming GPT-2's head size of 64 (n_head {})",
              path, mc.n_head);
  } else {
    usage_error(
        "{}: the file does not record n_head and d_model {} is not a multiple of GPT-2's "
        "head size 64; re-export it with `fdtrain ckpt export`",
        path, mc.d_model);
  }
  InferenceModel m;
  m.model = std::make_unique<nn::Gpt>(mc);
  load_weights(path, *m.model, "");
  m.source = path;
  auto step = info.metadata.find("step");
  m.description =
      fmt::format("{}{} ({})", path,
                  step == info.metadata.end() ? "" : " (step " + step->second + ")", dims(mc));
  return m;
}

}  // namespace

InferenceModel load_inference_model(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec))
    usage_error(
        "{} does not exist; give a run directory, a checkpoint directory or a weights "
        "file (.safetensors, .h5)",
        path);
  return fs::is_directory(path, ec) ? from_checkpoint(path) : from_file(path);
}

}  // namespace fd::ckpt
