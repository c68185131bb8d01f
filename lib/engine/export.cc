#include "lib/engine/export.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "lib/base/error.h"
#include "lib/base/log.h"
#include "lib/ckpt/bnb4bit.h"
#include "lib/ckpt/export.h"
#include "lib/ckpt/lora_base.h"
#include "lib/config/load.h"
#include "lib/engine/assemble.h"
#include "lib/engine/output_path.h"
#include "lib/engine/weights_io.h"
#include "lib/nn/decoder.h"
#include "lib/quant/tables.h"

namespace fd::engine {
namespace {

// What a LoRA export needs from the checkpoint's stored recipe.
struct LoraRun {
  ckpt::LoraSpec spec;    // the lora section, base = model.init_from
  ckpt::ModelDims model;  // the model the adapters belong to
  nn::ModelFamily family;
  std::vector<std::string> tensor_order;  // the base model's parameter names, in layout order
  bool quantized = false;                 // model.quantize: the base was held in 4 bits (QLoRA)
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
          std::move(order),
          r.recipe.model.quantize.has_value()};
}

// "nf4, blocks of 64, double quantization"
std::string quant_summary(const quant::QuantOptions& q) {
  return fmt::format("{}, blocks of {}, {}double quantization", quant::quant_type_name(q.type),
                     q.block_size, q.double_quant ? "" : "no ");
}

std::string copied_files(const HfExportOptions& out, const std::vector<std::string>& copied) {
  return copied.empty() ? ""
                        : fmt::format("; tokenizer files from {}: {}", out.tokenizer_from,
                                      fmt::join(copied, ", "));
}

// `--hf-dir --quantized`: the QLoRA run's base, exactly as the run held it in 4 bits, as a
// transformers 4-bit directory. The model is built in the run's compute dtype, as the run built
// it, so that a base quantized at load (an ordinary model.init_from) is quantized from the same
// values; a 4-bit model.init_from is used as stored (nothing is re-quantized either way).
std::string export_quantized_base(const ckpt::Checkpoint& c, const config::Recipe& recipe,
                                  Assembly a, const std::string& dir, const HfDirExport& options,
                                  const HfExportOptions& out) {
  const DType compute = compute_dtype(recipe.precision);
  a.dtype = compute;
  std::unique_ptr<nn::Decoder> model = build_model(a, Init::kNone);
  const std::string base =
      ckpt::find_lora_base(c.dir, recipe.model.init_from, c.meta().base_sha256);
  load_weights(base, *model, fmt::format("{}: base model (model.init_from)", c.dir));

  Bnb4bitExportOptions q;
  q.config.compute_dtype = torch_dtype_name(compute);
  q.default_blob_dtype = torch_dtype_name(compute);
  std::map<std::string, size_t> placement;
  if (is_bnb4bit_directory(base)) {
    // A 4-bit base directory: each blob's dtype and the config's other keys kept as they are
    // there, and its split into shards unless --max-shard-size asks for another.
    const ckpt::Bnb4bitDir stored = ckpt::Bnb4bitDir::open(base);
    q.config = stored.config();
    q.config.compute_dtype = torch_dtype_name(compute);
    for (const std::string& w : stored.quantized()) q.blob_dtype[w] = stored.header(w).dtype;
    // Its split, when it holds exactly the tensors written (not so with GPT-2's "transformer."
    // prefix or an lm_head.weight beside a tied head: then a split by size).
    std::set<std::string> theirs, ours;
    for (const std::string& t : stored.plain()) theirs.insert(t);
    for (const std::string& t : stored.quantized()) theirs.insert(t);
    for (const nn::Parameter* p : model->frozen_parameters()) ours.insert(p->name);
    placement = stored.weights().placement();
    size_t shards = 0;
    for (const auto& [name, shard] : placement) shards = std::max(shards, shard + 1);
    if (shards > 1 && !options.max_shard_given && theirs == ours) q.placement = &placement;
  }
  const std::vector<std::string> copied = write_bnb4bit_model(*model, dir, out, q);
  return fmt::format(
      "exported the 4-bit base of {} ({}, step {}: {}, the rest {}; compute dtype {}) to {} "
      "(transformers 4-bit directory{}); the LoRA adapters are not merged into it: export them "
      "with --lora-adapter DIR (the PEFT adapter to load over this base), or a merged model with "
      "--merge-lora --hf-dir DIR",
      a.model.summary(), c.dir, c.meta().step, quant_summary(*a.quantize), dtype_name(out.dtype),
      q.config.compute_dtype, dir, copied_files(out, copied));
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
  // lib/ckpt's merge reads the base file as it is; a QLoRA run trained over its 4-bit form.
  if (run.quantized)
    usage_error(
        "{}: --merge-lora --out FILE merges into the base file as it is, and this QLoRA run "
        "(model.quantize) trained over the base in 4 bits; write the merged model with "
        "--merge-lora --hf-dir DIR, which merges into the base dequantized from its 4 bits",
        c.dir);
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
  if (options.quantized && options.merge_lora)
    usage_error(
        "--quantized --merge-lora: --quantized writes the QLoRA run's 4-bit base as it was "
        "trained over, without the adapters, and --merge-lora merges the adapters into the base "
        "dequantized; give one of them");
  ckpt::Checkpoint c = ckpt::open_checkpoint(path);
  const bool lora = ckpt::is_lora_checkpoint(c);
  if (options.quantized && !lora)
    usage_error(
        "{}: --quantized writes the 4-bit base of a QLoRA run (model.quantize), and this "
        "checkpoint is not from a LoRA run; drop --quantized",
        c.dir);
  if (lora && !options.merge_lora && !options.quantized)
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
  if (options.quantized && !recipe.model.quantize)
    usage_error(
        "{}: --quantized writes the 4-bit base of a QLoRA run, and this LoRA run has no "
        "model.quantize (its base was not held in 4 bits); export the merged model with "
        "--merge-lora --hf-dir DIR, or the adapter with --lora-adapter DIR",
        c.dir);
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

  if (options.quantized) return export_quantized_base(c, recipe, a, dir, options, out);

  std::unique_ptr<nn::Decoder> model = build_model(a, Init::kNone);
  if (a.lora.enabled()) {
    const std::string base =
        ckpt::find_lora_base(c.dir, recipe.model.init_from, c.meta().base_sha256);
    // A QLoRA base as the run held it: in its compute dtype, quantized from those values.
    load_weights(base, *model, fmt::format("{}: base model (model.init_from)", c.dir),
                 a.quantize ? compute_dtype(recipe.precision) : DType::kF32);
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
  const std::vector<std::string> copied = write_hf_model(*model, dir, out);
  // A QLoRA run's base was held in 4 bits: the merge is over its dequantized values.
  const std::string merged =
      !lora        ? ""
      : a.quantize ? fmt::format(", LoRA merged into the base dequantized from 4 bits ({})",
                                 quant_summary(*a.quantize))
                   : ", LoRA merged";
  return fmt::format("exported {} ({}{}, step {}, {}{}) to {} (Hugging Face directory{})",
                     a.model.summary(), c.dir, merged, c.meta().step,
                     a.quantize ? "written in " : "", dtype_name(out.dtype), dir,
                     copied_files(out, copied));
}

std::string inspect_checkpoint(const std::string& path) { return ckpt::inspect_checkpoint(path); }

std::string diff_checkpoints(const std::string& a, const std::string& b) {
  return ckpt::diff_checkpoints(a, b, nullptr);
}

}  // namespace fd::engine
