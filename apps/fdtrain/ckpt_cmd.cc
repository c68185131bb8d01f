// fdtrain ckpt inspect | export | diff: a checkpoint read back.
//
//   fdtrain ckpt inspect PATH                step, world, stage, shards; verifies every checksum
//   fdtrain ckpt export PATH --out FILE [--dtype fp32|bf16] [--overwrite]
//                                            consolidated weights as .safetensors (HF GPT-2) or .h5
//   fdtrain ckpt export PATH --lora-adapter DIR [--merge-lora --out FILE] [...]
//   fdtrain ckpt export PATH --merge-lora --out FILE [--dtype fp32|bf16] [--overwrite]
//                                            a LoRA run: the adapter in PEFT format, and/or
//                                            the base with the adapters merged in
//   fdtrain ckpt export PATH --hf-dir DIR [--dtype fp32|bf16] [--merge-lora | --quantized]
//                                         [--overwrite] [--max-shard-size BYTES|5GB]
//                                            a Hugging Face model directory (config.json,
//                                            safetensors, tokenizer files of model.init_from);
//                                            --quantized: a QLoRA run's 4-bit base as a
//                                            transformers 4-bit directory
//   fdtrain ckpt diff A B                    weights of two checkpoints compared
//
// PATH is a step directory, a checkpoints directory or a run directory (then
// its latest checkpoint). The work is lib/engine/export.h's.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "apps/fdtrain/subcommand.h"
#include "lib/engine/export.h"

namespace fd::cli {
namespace {

struct ExportArgs {
  std::string path;
  std::string out;
  std::string dtype = "fp32";
  bool overwrite = false;
  std::string lora_adapter_dir;
  bool merge_lora = false;
  bool quantized = false;
  std::string hf_dir;
  std::string max_shard_size = "5GB";
  CLI::App* cmd = nullptr;  // to ask whether --dtype and --max-shard-size were given
};

bool given(const ExportArgs& a, const std::string& option) {
  return a.cmd->get_option(option)->count() > 0;
}

int run_hf_dir_export(const ExportArgs& a, DType dtype) {
  if (!a.out.empty() || !a.lora_adapter_dir.empty()) {
    print_error(
        "--hf-dir writes the whole model on its own; give --out FILE or --lora-adapter DIR "
        "in a separate ckpt export");
    return 2;
  }
  engine::HfDirExport options;
  if (given(a, "--dtype")) options.dtype = dtype;
  options.merge_lora = a.merge_lora;
  options.quantized = a.quantized;
  options.overwrite = a.overwrite;
  options.max_shard_bytes = engine::parse_shard_size(a.max_shard_size);
  options.max_shard_given = given(a, "--max-shard-size");
  std::printf("%s\n", engine::export_hf_dir(a.path, a.hf_dir, options).c_str());
  return 0;
}

// The usage error of a combination of --out, --lora-adapter and --merge-lora
// that asks for nothing or for something ckpt export cannot write; "" if none.
std::string file_export_misuse(const ExportArgs& a) {
  if (given(a, "--max-shard-size")) return "--max-shard-size applies to --hf-dir only";
  if (a.quantized)
    return "--quantized applies to --hf-dir only (a QLoRA run's 4-bit base as a transformers "
           "4-bit directory): give --hf-dir DIR";
  if (a.merge_lora && a.out.empty())
    return "--merge-lora needs --out FILE (.safetensors or .h5) for the merged model";
  if (!a.lora_adapter_dir.empty() && !a.out.empty() && !a.merge_lora)
    return "--out with --lora-adapter needs --merge-lora (a LoRA checkpoint holds only the "
           "adapters; --merge-lora --out FILE writes the merged model)";
  if (a.lora_adapter_dir.empty() && !a.merge_lora && a.out.empty())
    return "ckpt export needs --out FILE, --hf-dir DIR, --lora-adapter DIR or --merge-lora --out "
           "FILE";
  return "";
}

int run_export(const ExportArgs& a) {
  const DType dtype = a.dtype == "bf16" ? DType::kBF16 : DType::kF32;
  if (!a.hf_dir.empty()) return run_hf_dir_export(a, dtype);
  if (const std::string misuse = file_export_misuse(a); !misuse.empty()) {
    print_error(misuse);
    return 2;
  }
  if (!a.lora_adapter_dir.empty())
    std::printf(
        "%s\n",
        engine::export_lora_adapter(a.path, a.lora_adapter_dir, dtype, a.overwrite).c_str());
  if (a.merge_lora)
    std::printf("%s\n", engine::export_merged_lora(a.path, a.out, dtype, a.overwrite).c_str());
  if (a.lora_adapter_dir.empty() && !a.merge_lora)
    std::printf("%s\n", engine::export_checkpoint(a.path, a.out, dtype, a.overwrite).c_str());
  return 0;
}

CLI::App* add_export(CLI::App* ckpt, ExportArgs* a) {
  CLI::App* cmd = ckpt->add_subcommand(
      "export",
      "write a checkpoint's weights to one .safetensors (Hugging Face GPT-2) or .h5 file, a "
      "Hugging Face model directory (--hf-dir), or a LoRA run's PEFT adapter");
  a->cmd = cmd;
  cmd->add_option("path", a->path, "step directory, checkpoints directory or run directory")
      ->required();
  cmd->add_option("--out", a->out, "output file (.safetensors or .h5)");
  cmd->add_option("--hf-dir", a->hf_dir,
                  "write a Hugging Face model directory (config.json, model*.safetensors, "
                  "the tokenizer files of model.init_from when it is a directory); "
                  "--dtype defaults to the run's precision");
  cmd->add_option("--max-shard-size", a->max_shard_size,
                  "with --hf-dir: largest safetensors file, bytes or e.g. 5GB (default), "
                  "500MB, 2GiB");
  cmd->add_option("--dtype", a->dtype, "fp32 (default) or bf16")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  cmd->add_flag("--overwrite", a->overwrite, "replace an existing output file");
  cmd->add_option("--lora-adapter", a->lora_adapter_dir,
                  "LoRA runs: write the adapter to this directory in Hugging Face PEFT "
                  "format (adapter_config.json, adapter_model.safetensors)");
  cmd->add_flag("--merge-lora", a->merge_lora,
                "LoRA runs: write the base model (model.init_from) with the adapters "
                "merged in to --out (or --hf-dir); a QLoRA run's base is dequantized first");
  cmd->add_flag("--quantized", a->quantized,
                "QLoRA runs (model.quantize), with --hf-dir: write the base as the run held it "
                "in 4 bits, as a transformers 4-bit directory (bitsandbytes), without the "
                "adapters (export those with --lora-adapter)");
  return cmd;
}

}  // namespace

void add_ckpt_commands(CLI::App& app, std::vector<Subcommand>* out) {
  CLI::App* ckpt = app.add_subcommand("ckpt", "inspect or export a checkpoint");
  ckpt->require_subcommand(1);

  auto inspect_path = std::make_shared<std::string>();
  CLI::App* inspect = ckpt->add_subcommand(
      "inspect", "print a checkpoint's step, world size, stage, shards; verify every checksum");
  inspect
      ->add_option("path", *inspect_path, "step directory, checkpoints directory or run directory")
      ->required();
  out->push_back({inspect, [inspect_path] {
                    std::fputs(engine::inspect_checkpoint(*inspect_path).c_str(), stdout);
                    return 0;
                  }});

  auto export_args = std::make_shared<ExportArgs>();
  CLI::App* export_cmd = add_export(ckpt, export_args.get());
  out->push_back({export_cmd, [export_args] { return run_export(*export_args); }});

  auto diff_paths = std::make_shared<std::vector<std::string>>(2);
  CLI::App* diff = ckpt->add_subcommand(
      "diff", "compare two checkpoints' weights: per tensor and ||a - b|| / ||b|| overall");
  diff->add_option("a", (*diff_paths)[0], "checkpoint A")->required();
  diff->add_option("b", (*diff_paths)[1], "checkpoint B (the reference)")->required();
  out->push_back({diff, [diff_paths] {
                    std::fputs(engine::diff_checkpoints((*diff_paths)[0], (*diff_paths)[1]).c_str(),
                               stdout);
                    return 0;
                  }});
}

}  // namespace fd::cli
