#include "lib/engine/export.h"

#include <fmt/ranges.h>

#include <optional>

#include "lib/base/error.h"
#include "lib/base/log.h"
#include "lib/ckpt/export.h"
#include "lib/config/load.h"
#include "lib/engine/assemble.h"

namespace fd::engine {
namespace {

// What a LoRA export needs from the checkpoint's stored recipe.
struct LoraRun {
  ckpt::LoraSpec spec;    // the lora section, base = model.init_from
  ckpt::ModelDims model;  // the model the adapters belong to
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
  return {lora_spec(r.recipe),
          {m.num_layers, m.num_heads, m.hidden_size, m.vocab_size, m.max_position_embeddings}};
}

}  // namespace

std::string export_checkpoint(const std::string& path, const std::string& out, DType dtype,
                              bool overwrite) {
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
  ckpt::check_export_dir(dir, dtype, overwrite);
  ckpt::Checkpoint c = ckpt::open_checkpoint(path);
  return ckpt::export_lora_adapter(c, dir, dtype, overwrite, lora_run(c).spec);
}

std::string export_merged_lora(const std::string& path, const std::string& out, DType dtype,
                               bool overwrite) {
  ckpt::check_export_file(out, dtype, overwrite);
  ckpt::Checkpoint c = ckpt::open_checkpoint(path);
  const LoraRun run = lora_run(c);
  return ckpt::export_merged_lora(c, out, dtype, overwrite, run.spec, run.model);
}

}  // namespace fd::engine
