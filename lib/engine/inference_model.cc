#include "lib/engine/inference_model.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "lib/base/error.h"
#include "lib/base/log.h"
#include "lib/ckpt/bnb4bit.h"
#include "lib/ckpt/export.h"
#include "lib/ckpt/finite.h"
#include "lib/ckpt/lora_base.h"
#include "lib/ckpt/manifest.h"
#include "lib/ckpt/weights_file.h"
#include "lib/config/load.h"
#include "lib/config/model_dir.h"
#include "lib/engine/assemble.h"
#include "lib/engine/resume.h"
#include "lib/engine/weights_io.h"
#include "lib/nn/config/hf_config.h"

namespace fd::engine {
namespace {

namespace fs = std::filesystem;

std::string dims(const nn::DecoderConfig& c) {
  if (c.family != nn::ModelFamily::kGpt2) return c.summary();
  return fmt::format("n_layer {}, n_head {}, d_model {}, vocab_size {}, max_seq_len {}",
                     c.num_layers, c.num_heads, c.hidden_size, c.vocab_size,
                     c.max_position_embeddings);
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
    ckpt::check_finite(it->second, where, p->name);
    p->value.copy_from(it->second);
  }
}

// Reads a file whole; nullopt if it cannot be read.
std::optional<std::string> slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The last step a run directory records: summary.json "steps", else the last
// "step" in metrics.jsonl; -1 when neither says. Sets *from to the file used.
int64_t run_last_step(const fs::path& run, std::string* from) {
  if (std::optional<std::string> text = slurp(run / "summary.json")) {
    nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("steps") && j["steps"].is_number_integer()) {
      *from = (run / "summary.json").string();
      return j["steps"].get<int64_t>();
    }
  }
  if (std::optional<std::string> text = slurp(run / "metrics.jsonl")) {
    std::istringstream lines(*text);
    int64_t last = -1;
    for (std::string line; std::getline(lines, line);) {
      nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.contains("step") && j["step"].is_number_integer())
        last = j["step"].get<int64_t>();
    }
    if (last >= 0) {
      *from = (run / "metrics.jsonl").string();
      return last;
    }
  }
  return -1;
}

// `run` (a run directory) has no checkpoint: throws an error that says why.
[[noreturn]] void no_checkpoints(const fs::path& run) {
  const fs::path config = run / "config.yaml";
  const std::string where = run.string();
  std::optional<std::string> yaml = slurp(config);
  std::optional<config::Recipe> recipe;
  if (yaml) {
    config::LoadResult r = config::try_parse_stored_recipe(*yaml, config.string());
    if (r.ok()) recipe = r.recipe;
  }
  if (!recipe)
    usage_error(
        "{} has no checkpoints ({} has no `latest`); give a run directory with checkpoints, "
        "a step directory or a weights file",
        where, (run / "checkpoints").string());
  const int every = recipe->checkpoint.every;
  if (every == 0 && !recipe->checkpoint.at_end)
    usage_error(
        "{} has no checkpoints: the run saved none (checkpoint.every: 0 and checkpoint.at_end: "
        "false in {}); train with checkpoint.at_end=true (the default) to save the weights at the "
        "end, or checkpoint.every=N to save every N steps",
        where, config.string());
  std::string from;
  const int64_t last = run_last_step(run, &from);
  if (every == 0)
    usage_error(
        "{} has no checkpoints: the run saves its weights only at its end (checkpoint.every: 0) "
        "and has not saved them ({}); wait for it to finish, or train with checkpoint.every=N "
        "to save every N steps",
        where,
        last < 0 ? std::string("no step logged yet")
                 : fmt::format("it got to step {}, {}", last, from));
  if (last < 0)
    usage_error(
        "{} has no checkpoints: checkpoint.every is {}, but the run has logged no step yet "
        "(still starting, or it stopped before its first save); wait for step {}, or train again",
        where, every, every);
  // A run that completes saves at its last step; one that stops early only every N steps.
  std::string exit_reason;
  if (std::optional<std::string> text = slurp(run / "summary.json")) {
    nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("exit_reason") && j["exit_reason"].is_string())
      exit_reason = j["exit_reason"].get<std::string>();
  }
  if (last < every && exit_reason != "completed")
    usage_error(
        "{} has no checkpoints: checkpoint.every is {}, but the run stopped at step {} ({}{}), "
        "before its first save; train again (or wait, if it is still running)",
        where, every, last, from, exit_reason.empty() ? "" : ", exit_reason " + exit_reason);
  usage_error(
      "{} has no checkpoints: checkpoint.every is {} and the run got to step {} ({}), but {} "
      "has no `latest`: its checkpoints were removed or moved; give a step directory, or train "
      "again",
      where, every, last, from, (run / "checkpoints").string());
}

bool is_run_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p / "checkpoints", ec) || fs::exists(p / "config.yaml", ec) ||
         fs::exists(p / "metrics.jsonl", ec) || fs::exists(p / "summary.json", ec);
}

// The checkpoint `path` names, opened and verified: a step directory as
// resolve_step_dir() finds it, a run or checkpoints directory's newest
// checkpoint that verifies (as --resume auto chooses, resume.h), saying which
// one and, when it is not `latest`, why; and why there is none. Sets *run to
// the run directory, if `path` is in one.
std::unique_ptr<OpenCheckpoint> choose_checkpoint(const std::string& path, fs::path* run) {
  std::error_code ec;
  fs::path p = fs::path(path).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "RUN/" -> "RUN"
  // A step directory: the user chose it.
  if (fs::exists(p / "manifest.json", ec))
    return std::make_unique<OpenCheckpoint>(ckpt::resolve_step_dir(path));
  fs::path checkpoints;
  if (is_run_dir(p)) {
    *run = p;
    checkpoints = p / "checkpoints";
  } else if (fs::exists(p / "latest", ec) || p.filename() == "checkpoints") {
    checkpoints = p;
    const fs::path parent = p.has_parent_path() ? p.parent_path() : fs::path(".");
    if (is_run_dir(parent)) *run = parent;
  } else {
    return std::make_unique<OpenCheckpoint>(ckpt::resolve_step_dir(path));  // neither: its error
  }
  NewestCheckpoint newest = fs::is_directory(checkpoints, ec)
                                ? newest_verified_checkpoint(checkpoints)
                                : NewestCheckpoint{};
  if (!newest.checkpoint && newest.tried_any)
    usage_error("{}: no checkpoint verifies:\n{}", path, fmt::join(newest.passed_over, "\n"));
  if (!newest.checkpoint) {
    if (!run->empty()) no_checkpoints(*run);
    return std::make_unique<OpenCheckpoint>(ckpt::resolve_step_dir(path));
  }
  const std::string name = newest.checkpoint->dir().filename().string();
  if (newest.fell_back()) {
    for (const std::string& line : newest.passed_over) log::warn("{}", line);
    log::warn("{}: {}; using {}, the newest checkpoint that verifies", path,
              newest.has_latest ? "`latest` does not verify" : "no `latest` pointer", name);
  }
  log::info("using checkpoint {} of {}", name, path);
  return std::move(newest.checkpoint);
}

InferenceModel from_checkpoint(const std::string& path) {
  fs::path run;
  const std::unique_ptr<OpenCheckpoint> opened = choose_checkpoint(path, &run);
  const ckpt::Checkpoint& c = opened->checkpoint();
  if (!run.empty()) {
    std::string from;
    const int64_t last = run_last_step(run, &from);
    if (last > c.meta().step)
      log::warn(
          "{} is at step {}, but the run went on to step {} ({}); it is not the run's final "
          "model (the later steps were not saved); give a step directory to choose a "
          "checkpoint",
          fs::path(c.dir).filename().string(), c.meta().step, last, from);
  }
  config::LoadResult r = config::try_parse_stored_recipe(c.meta().recipe_yaml, "checkpoint recipe");
  if (!r.ok())
    usage_error(
        "{}: the checkpoint's stored recipe does not validate, so its model cannot be "
        "rebuilt:\n{}",
        c.dir, fmt::join(r.errors, "\n"));
  const config::Recipe& recipe = r.recipe;
  const Assembly a = assemble_for_inference(recipe);  // fp32, one rank, adapter dropout off
  InferenceModel m;
  m.model = build_model(a, Init::kNone);  // every parameter is loaded below
  std::map<std::string, Tensor> tensors;
  for (auto& [name, t] : ckpt::consolidate_ordered(c, DType::kF32)) tensors[name] = t;
  if (a.lora.enabled()) {
    // A LoRA checkpoint holds only the adapters: the base must be the very file they were
    // trained on.
    const std::string base =
        ckpt::find_lora_base(c.dir, recipe.model.init_from, c.meta().base_sha256);
    // A QLoRA base as the run held it: in its compute dtype, quantized from those values.
    load_weights(base, *m.model, fmt::format("{}: base model (model.init_from)", c.dir),
                 a.quantize ? compute_dtype(recipe.precision) : DType::kF32);
  }
  fill(m.model->parameters(), tensors, c.dir);
  m.source = c.dir;
  m.description = fmt::format(
      "checkpoint {} (step {}{}; {})", c.dir, c.meta().step,
      a.lora.enabled() ? ", LoRA merged into " + recipe.model.init_from : "", dims(a.model));
  m.recipe = recipe;
  m.tokenizer_dir = recipe.data.tokenizer;
  m.trained_seq_len = a.seq_len;
  m.byte_level = a.byte_level;
  return m;
}

InferenceModel from_file(const std::string& path) {
  const ckpt::WeightsFile file = ckpt::WeightsFile::open(path);
  const std::map<std::string, std::string> metadata = file.metadata();
  // No recipe: the model is assembled from the file's shapes (fp32, no adapters).
  Assembly a;
  const ckpt::ImpliedDims d = ckpt::implied_dims(file.shapes());
  nn::GptConfig mc{0, 0, 0, 0, 0};
  mc.n_layer = int(std::max<int64_t>(d.n_layer, 0));
  mc.vocab_size = int(std::max<int64_t>(d.vocab_size, 0));
  mc.d_model = int(std::max<int64_t>(d.d_model, 0));
  mc.max_seq_len = int(std::max<int64_t>(d.max_seq_len, 0));
  if (mc.d_model <= 0 || mc.max_seq_len <= 0)
    usage_error(
        "{}: no wte.weight / wpe.weight tensors: not a GPT-2 model, and a weights file does "
        "not say the shape of any other; give a Hugging Face model directory (config.json + "
        "weights: `fdtrain ckpt export --hf-dir`), a checkpoint directory, an fdtrain export of "
        "a GPT-2 or a Hugging Face GPT-2 model.safetensors",
        path);
  auto it = metadata.find("n_head");
  if (it != metadata.end()) {
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
  a.model = nn::gpt2_config(mc);
  InferenceModel m;
  m.model = build_model(a, Init::kNone);
  load_weights(path, *m.model, "");
  m.source = path;
  m.byte_level = mc.vocab_size == 256;
  auto step = metadata.find("step");
  m.description = fmt::format(
      "{}{} ({})", path, step == metadata.end() ? "" : " (step " + step->second + ")",
      dims(a.model));
  return m;
}

// A Hugging Face model directory: config.json (nn::read_hf_config) and its weights. A
// transformers 4-bit directory (bitsandbytes) is read as its dequantized twin: its config.json
// without the quantization_config, each 4-bit weight dequantized to fp32 by the weights source
// (WeightsSource::read), exactly the values a QLoRA run over it computes with.
InferenceModel from_hf_dir(const std::string& dir) {
  Assembly a;             // fp32, one rank, unpadded, no adapters
  std::string quantized;  // "" or what the 4-bit directory stores, for the log and description
  if (is_bnb4bit_directory(dir)) {
    config::read_model_directory(dir);  // refuses another quantization than bitsandbytes 4-bit
    const ckpt::Bnb4bitDir d = ckpt::Bnb4bitDir::open(dir);  // every header and blob checked
    a.model = nn::parse_hf_config(d.model_config_json(), (fs::path(dir) / "config.json").string());
    const std::vector<std::string> weights = d.quantized();
    if (!weights.empty()) {
      const ckpt::Bnb4bitWeight& h = d.header(weights.front());
      quantized =
          fmt::format("{} linear weights in 4 bits: {}, blocks of {}, {}double quantization",
                      weights.size(), h.quant_type, h.block_size, h.nested ? "" : "no ");
    } else {
      quantized = "no 4-bit weights";
    }
  } else {
    a.model = nn::read_hf_config(dir);
  }
  check_weights_fit(dir, a.model, "");  // before anything is allocated for the model
  InferenceModel m;
  m.model = build_model(a, Init::kNone);
  load_weights(dir, *m.model, "");
  if (!quantized.empty())
    log::info("{} is a transformers 4-bit directory ({}); its weights are dequantized to fp32", dir,
              quantized);
  m.source = dir;
  m.byte_level = a.model.vocab_size == 256;
  if (a.model.bos_token_id) m.bos_token = int32_t(*a.model.bos_token_id);
  if (fs::exists(fs::path(dir) / "tokenizer.json")) m.tokenizer_dir = dir;
  m.description = fmt::format("Hugging Face model directory {} ({}{})", dir, dims(a.model),
                              quantized.empty() ? "" : "; " + quantized + ", dequantized");
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
  if (!fs::is_directory(path, ec)) return from_file(path);
  if (fs::exists(fs::path(path) / "config.json", ec)) return from_hf_dir(path);
  return from_checkpoint(path);
}

}  // namespace fd::engine
