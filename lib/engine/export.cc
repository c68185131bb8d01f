#include "lib/engine/export.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>

#include "lib/base/error.h"
#include "lib/base/log.h"
#include "lib/ckpt/export.h"
#include "lib/ckpt/lora_base.h"
#include "lib/config/load.h"
#include "lib/engine/assemble.h"
#include "lib/engine/output_path.h"
#include "lib/engine/weights_io.h"
#include "lib/nn/decoder.h"

namespace fd::engine {
namespace {

// What a LoRA export needs from the checkpoint's stored recipe.
struct LoraRun {
  ckpt::LoraSpec spec;    // the lora section, base = model.init_from
  ckpt::ModelDims model;  // the model the adapters belong to
  nn::ModelFamily family;
  std::vector<std::string> tensor_order;  // the base model's parameter names, in layout order
};

// Reads the LoRA run's settings from the checkpoint's stored recipe. Throws
// fd::Error kUsage if it does not validate or has no lora section.
LoraRun lora_run(const ckpt::Checkpoint& c) {
  config::LoadResult r = config::try_parse_stored_recipe(c.meta().recipe_yaml, "checkpoint recipe");
  if (!r.ok())
    usage_error(
        "{}: the checkpoint's stored recipe does not validate, so its LoRA settings cannot be "
        "read (was it written by another fdtrain version?):\n{}",
        c.dir, fmt::join(r.errors, "\n"));
  if (!r.recipe.lora)
    usage_error(
        "{}: the checkpoint is not from a LoRA run (its recipe has no lora section); export it "
        "with --out FILE",
        c.dir);
  const nn::DecoderConfig m = assemble_for_inference(r.recipe).model;
  std::vector<std::string> order;
  for (const nn::SegmentSpec& segment : nn::Decoder::segment_specs(m))
    for (const nn::ParamSpec& p : segment.params) order.push_back(p.name);
  return {lora_spec(r.recipe),
          {m.num_layers, m.num_heads, m.hidden_size, m.vocab_size, m.max_position_embeddings},
          m.family,
          std::move(order)};
}

}  // namespace

std::string export_checkpoint(const std::string& path, const std::string& out, DType dtype,
                              bool overwrite) {
  check_output_path(out, OutputKind::kFile, "--out");
  ckpt::check_export_file(out, dtype, overwrite);
  ckpt::Checkpoint c = ckpt::open_checkpoint(path);
  std::optional<int64_t> n_head;
  if (!ckpt::is_lora_checkpoint(c)) {  // a LoRA checkpoint is refused, recipe or not
    config::LoadResult r =
        config::try_parse_stored_recipe(c.meta().recipe_yaml, "checkpoint recipe");
    if (r.ok())
      n_head = assemble_for_inference(r.recipe).model.num_heads;
    else
      log::warn(
          "{}: the checkpoint's recipe does not validate; n_head is left out of the export's "
          "metadata",
          c.dir);
  }
  return ckpt::export_checkpoint(c, out, dtype, overwrite, n_head);
}

std::string export_lora_adapter(const std::string& path, const std::string& dir, DType dtype,
                                bool overwrite) {
  check_output_path(dir, OutputKind::kDirectory, "--lora-adapter");
  ckpt::check_export_dir(dir, dtype, overwrite);
  ckpt::Checkpoint c = ckpt::open_checkpoint(path);
  return ckpt::export_lora_adapter(c, dir, dtype, overwrite, lora_run(c).spec);
}

std::string export_merged_lora(const std::string& path, const std::string& out, DType dtype,
                               bool overwrite) {
  check_output_path(out, OutputKind::kFile, "--out");
  ckpt::check_export_file(out, dtype, overwrite);
  ckpt::Checkpoint c = ckpt::open_checkpoint(path);
  const LoraRun run = lora_run(c);
  // --out FILE is fdtrain's GPT-2 weights file; the Llama family's merged model is a directory.
  if (run.family != nn::ModelFamily::kGpt2)
    usage_error(
        "{}: --merge-lora --out FILE writes a GPT-2 weights file, and this is a {} run; write "
        "the merged model as a Hugging Face directory with --merge-lora --hf-dir DIR",
        c.dir, nn::family_name(run.family));
  return ckpt::export_merged_lora(c, out, dtype, overwrite, run.spec, run.model, run.tensor_order);
}

std::string export_hf_dir(const std::string& path, const std::string& dir,
                          const HfDirExport& options) {
  HfExportOptions out;
  out.dtype = options.dtype.value_or(DType::kF32);
  out.max_shard_bytes = options.max_shard_bytes;
  out.overwrite = options.overwrite;
  check_hf_export_dir(dir, out);
  check_output_path(dir, OutputKind::kDirectory, "--hf-dir");
  ckpt::Checkpoint c = ckpt::open_checkpoint(path);
  const bool lora = ckpt::is_lora_checkpoint(c);
  if (lora && !options.merge_lora)
    usage_error(
        "{}: the checkpoint is from a LoRA run and holds only the adapters; --hf-dir writes a "
        "full model: add --merge-lora to merge them into the base (model.init_from), or export "
        "the adapter alone with --lora-adapter DIR (PEFT format)",
        c.dir);
  if (!lora && options.merge_lora)
    usage_error(
        "{}: --merge-lora: the checkpoint is not from a LoRA run (it holds no adapters); drop "
        "--merge-lora",
        c.dir);
  config::LoadResult r = config::try_parse_stored_recipe(c.meta().recipe_yaml, "checkpoint recipe");
  if (!r.ok())
    usage_error(
        "{}: the checkpoint's stored recipe does not validate, so its config.json cannot be "
        "written (was it written by another fdtrain version?):\n{}",
        c.dir, fmt::join(r.errors, "\n"));
  const config::Recipe& recipe = r.recipe;
  if (!options.dtype) out.dtype = compute_dtype(recipe.precision);  // the run's
  // Never replace what the export reads: the checkpoint (or a directory above it) or the base.
  {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path target = fs::weakly_canonical(dir, ec);
    auto inside = [&](const fs::path& p) {
      const fs::path q = fs::weakly_canonical(p, ec);
      auto [t, qi] = std::mismatch(target.begin(), target.end(), q.begin(), q.end());
      return t == target.end();  // q is target or below it
    };
    if (inside(c.dir))
      usage_error("--hf-dir {}: the checkpoint read ({}) is inside it; choose another --hf-dir",
                  dir, c.dir);
    if (!recipe.model.init_from.empty() && inside(recipe.model.init_from))
      usage_error(
          "--hf-dir {}: it holds the run's base model (model.init_from {}), which the run's "
          "checkpoints depend on; choose another --hf-dir",
          dir, recipe.model.init_from);
  }

  const Assembly a = assemble_for_inference(recipe);  // fp32, CPU, adapter dropout off
  std::unique_ptr<nn::Decoder> model = build_model(a, Init::kNone);
  if (a.lora.enabled()) {
    const std::string base =
        ckpt::find_lora_base(c.dir, recipe.model.init_from, c.meta().base_sha256);
    load_weights(base, *model, fmt::format("{}: base model (model.init_from)", c.dir));
  }
  std::map<std::string, Tensor> tensors;
  for (auto& [name, t] : ckpt::consolidate_ordered(c, DType::kF32)) tensors[name] = t;
  for (const nn::Parameter* p : model->parameters()) {
    auto it = tensors.find(p->name);
    if (it == tensors.end() || it->second.shape() != p->value.shape())
      usage_error(
          "{}: the checkpoint has no parameter '{}' of shape {}, which its recipe's model has; "
          "the checkpoint is inconsistent",
          c.dir, p->name, p->value.shape().str());
    p->value.copy_from(it->second);
  }

  out.metadata = {{"step", std::to_string(c.meta().step)},
                  {"source", c.dir},
                  {"fdtrain_version", c.meta().fdtrain_version}};
  // The tokenizer the run's data was encoded with (data.tokenizer), else the base directory's.
  std::error_code ec;
  const std::string& tokenizer = recipe.data.tokenizer;
  if (!tokenizer.empty() && std::filesystem::is_directory(tokenizer, ec))
    out.tokenizer_from = tokenizer;
  else if (!tokenizer.empty())
    log::warn(
        "the run's data.tokenizer {} is no longer a directory; the export has no tokenizer "
        "files (copy them into {} by hand)",
        tokenizer, dir);
  else if (!recipe.model.init_from.empty() &&
           std::filesystem::is_directory(recipe.model.init_from, ec))
    out.tokenizer_from = recipe.model.init_from;
  out.token_ids = export_token_ids(a.model, recipe.model.init_from, out.tokenizer_from);
  const std::vector<std::string> copied = write_hf_model(*model, dir, out);
  return fmt::format("exported {} ({}{}, step {}, {}) to {} (Hugging Face directory{})",
                     a.model.summary(), c.dir, lora ? ", LoRA merged" : "", c.meta().step,
                     dtype_name(out.dtype), dir,
                     copied.empty() ? ""
                                    : fmt::format("; tokenizer files from {}: {}",
                                                  out.tokenizer_from, fmt::join(copied, ", ")));
}

std::string inspect_checkpoint(const std::string& path) { return ckpt::inspect_checkpoint(path); }

std::string diff_checkpoints(const std::string& a, const std::string& b) {
  return ckpt::diff_checkpoints(a, b, nullptr);
}

}  // namespace fd::engine
