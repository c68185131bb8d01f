// fdtrain: the command-line front end. Parses arguments with CLI11 and calls
// into lib/; no training logic lives here.
//
//   fdtrain train RECIPE [KEY=VALUE | ~KEY ...] [--run-dir DIR] [--overwrite] [--no-progress]
//   [--profile] fdtrain RECIPE ...                       (shorthand for train) fdtrain validate
//   RECIPE [overrides...]   exit 0 when the recipe and its data files are
//                                            valid, 2 with every error
//   fdtrain help [COMMAND [SUBCOMMAND]]      the same as fdtrain [COMMAND ...] --help
//   fdtrain print-config RECIPE [overrides...]
//   fdtrain estimate RECIPE [overrides...] [--world-size N] [--json]
//                                            memory and communication per rank, every ZeRO stage
//   fdtrain ckpt inspect PATH                step, world, stage, shards; verifies every checksum
//   fdtrain ckpt export PATH --out FILE [--dtype fp32|bf16] [--overwrite]
//                                            consolidated weights as .safetensors (HF GPT-2) or .h5
//   fdtrain ckpt export PATH --lora-adapter DIR [--merge-lora --out FILE] [...]
//   fdtrain ckpt export PATH --merge-lora --out FILE [--dtype fp32|bf16] [--overwrite]
//                                            a LoRA run: the adapter in PEFT format, and/or
//                                            the base with the adapters merged in
//   fdtrain ckpt export PATH --hf-dir DIR [--dtype fp32|bf16] [--merge-lora] [--overwrite]
//                                         [--max-shard-size BYTES|5GB]
//                                            a Hugging Face model directory (config.json,
//                                            safetensors, tokenizer files of model.init_from)
//   fdtrain ckpt diff A B                    weights of two checkpoints compared
//   fdtrain ls | cp NAME DEST | schema [--markdown]
//                                            shipped recipes; the recipe reference (catalog_cmd.cc)
//   fdtrain eval MODEL --data FILE [--seq-len T] [--windows N] [--json]
//                                            mean loss and perplexity (eval_cmd.cc)
//   fdtrain generate MODEL [--prompt TEXT | --tokens IDS] [--max-tokens N] ...
//                                            sampled text, KV-cached (generate_cmd.cc)
//   fdtrain runs DIR... [--json]             run directories (or a sweep) as one table
//   (runs_cmd.cc) fdtrain plot DIR... --out FILE.svg       train/eval loss vs step of those runs
//   (runs_cmd.cc)
//
// Exit codes: 0 success, 2 usage or recipe error, 1 runtime failure.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "apps/fdtrain/subcommand.h"
#include "lib/base/error.h"
#include "lib/base/log.h"
#include "lib/base/strings.h"
#include "lib/base/version.h"
#include "lib/ckpt/export.h"
#include "lib/config/load.h"
#include "lib/dist/fault.h"
#include "lib/dist/init.h"
#include "lib/engine/assemble.h"
#include "lib/engine/estimate.h"
#include "lib/engine/export.h"
#include "lib/engine/trainer.h"
#include "lib/ops/blas_setup.h"

namespace {

void print_warnings(const std::vector<std::string>& warnings) {
  for (const std::string& w : warnings) std::fprintf(stderr, "fdtrain: warning: %s\n", w.c_str());
}

void print_error(const std::string& message) {
  for (const std::string& line : fd::split(message, '\n'))
    if (!line.empty()) {
      std::fprintf(stderr, "fdtrain: error: %s\n", line.c_str());
      fd::log::write_file_only(fd::log::Level::kError, line);  // RUN/logs/rank<r>.log, if open
    }
}

// A stop request for the trainer (Trainer::request_stop). A second SIGINT or
// SIGTERM while the first is pending means "now": the default action.
void on_stop_signal(int signo) {
  if ((signo == SIGINT || signo == SIGTERM) && fd::engine::Trainer::stop_signal() == signo) {
    std::signal(signo, SIG_DFL);
    std::raise(signo);
    return;
  }
  fd::engine::Trainer::request_stop(signo);
  if (signo == SIGINT) {
    static const char kMsg[] =
        "\nfdtrain: stopping at the next step boundary (a checkpoint is saved); press Ctrl-C "
        "again to stop at once\n";
    ssize_t n = write(STDERR_FILENO, kMsg, sizeof kMsg - 1);
    (void)n;
  }
}

void install_stop_handlers() {
  struct sigaction sa = {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int s : {SIGUSR1, SIGTERM, SIGINT}) sigaction(s, &sa, nullptr);
}

std::string join_command_line(int argc, char** argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    bool plain = a.find_first_of(" \t\"'$`\\") == std::string::npos && !a.empty();
    s += (i ? " " : "") + (plain ? a : "'" + a + "'");
  }
  return s;
}

int run(int argc, char** argv) {
  // `fdtrain RECIPE ...` is shorthand for `fdtrain train RECIPE ...`.
  std::vector<std::string> args(argv + 1, argv + argc);
  static const std::vector<std::string> kCommands = {
      "train", "validate", "print-config", "estimate", "ckpt",     "ls",       "cp",  "schema",
      "eval",  "generate", "runs",         "plot",     "tokenize", "template", "data"};
  // `fdtrain help [COMMAND [SUBCOMMAND]]` is `fdtrain [COMMAND [SUBCOMMAND]] --help`.
  if (!args.empty() && args[0] == "help") {
    args.erase(args.begin());
    if (!args.empty() &&
        std::find(kCommands.begin(), kCommands.end(), args[0]) == kCommands.end()) {
      std::string near = fd::nearest(args[0], kCommands);
      print_error(fmt::format("help: no command '{}'{}; the commands are {}", args[0],
                              near.empty() ? "" : fmt::format(" (did you mean '{}'?)", near),
                              fmt::join(kCommands, ", ")));
      return 2;
    }
    args.push_back("--help");
  }
  if (!args.empty() && args[0].rfind("-", 0) != 0 &&
      std::find(kCommands.begin(), kCommands.end(), args[0]) == kCommands.end()) {
    args.insert(args.begin(), "train");
  }
  std::reverse(args.begin(), args.end());  // CLI11 parses a reversed vector

  CLI::App app{
      "fdtrain: memory-efficient distributed training of transformer language models "
      "from a YAML recipe",
      "fdtrain"};  // the name in "Usage: fdtrain ckpt export ..." (args come without argv[0])
  app.set_version_flag("--version", std::string("fdtrain ") + fd::version());
  app.require_subcommand(1);
  app.footer("'fdtrain help COMMAND' (or 'fdtrain COMMAND --help') shows a command's options.");

  std::string recipe;
  std::vector<std::string> overrides;
  std::string run_dir;
  bool overwrite = false;
  bool no_progress = false;

  auto add_recipe_args = [&](CLI::App* cmd) {
    cmd->add_option("recipe", recipe, "recipe file (YAML)")->required();
    cmd->add_option("overrides", overrides,
                    "overrides: key.path=value (YAML scalar or flow list) or ~key.path to delete");
  };
  CLI::App* train = app.add_subcommand("train", "train a model from a recipe");
  add_recipe_args(train);
  train->add_option("--run-dir", run_dir, "run directory (default: runs/<recipe name>)");
  train->add_flag("--overwrite", overwrite, "replace a run already in the run directory");
  train->add_flag("--no-progress", no_progress, "no progress line on the terminal");
  std::string resume;
  train->add_option("--resume", resume,
                    "resume: 'auto' (from RUN/checkpoints/latest if present, else start fresh) or "
                    "a checkpoint directory");
  bool profile = false;
  train->add_flag("--profile", profile,
                  "per-phase wall-time breakdown (data, forward, backward, communication wait, "
                  "optimizer, checkpoint) in the log and summary.json");
  bool force_progress = false;
  train->add_flag("--progress", force_progress,
                  "show the progress line even when stderr is not a terminal (e.g. under mpirun)");
  CLI::App* validate = app.add_subcommand(
      "validate", "check a recipe and open its data files as train would; report every error");
  add_recipe_args(validate);
  CLI::App* print = app.add_subcommand("print-config", "print the fully resolved recipe as YAML");
  add_recipe_args(print);
  CLI::App* estimate = app.add_subcommand(
      "estimate", "print the memory and communication per rank for every ZeRO stage");
  add_recipe_args(estimate);
  int world_size = 1;
  bool json = false;
  estimate->add_option("--world-size", world_size, "number of ranks N (default 1)");
  estimate->add_flag("--json", json, "machine-readable output (exact bytes)");

  // fdtrain ckpt inspect|export: PATH is a step directory, a checkpoints
  // directory or a run directory (then its latest checkpoint).
  CLI::App* ckpt = app.add_subcommand("ckpt", "inspect or export a checkpoint");
  ckpt->require_subcommand(1);
  std::string ckpt_path;
  CLI::App* inspect = ckpt->add_subcommand(
      "inspect", "print a checkpoint's step, world size, stage, shards; verify every checksum");
  inspect->add_option("path", ckpt_path, "step directory, checkpoints directory or run directory")
      ->required();
  CLI::App* export_cmd = ckpt->add_subcommand(
      "export",
      "write a checkpoint's weights to one .safetensors (Hugging Face GPT-2) or .h5 file, a "
      "Hugging Face model directory (--hf-dir), or a LoRA run's PEFT adapter");
  export_cmd
      ->add_option("path", ckpt_path, "step directory, checkpoints directory or run directory")
      ->required();
  std::string export_out;
  std::string export_dtype = "fp32";
  bool export_overwrite = false;
  std::string lora_adapter_dir;
  bool merge_lora = false;
  std::string hf_dir;
  std::string max_shard_size = "5GB";
  export_cmd->add_option("--out", export_out, "output file (.safetensors or .h5)");
  export_cmd->add_option("--hf-dir", hf_dir,
                         "write a Hugging Face model directory (config.json, model*.safetensors, "
                         "the tokenizer files of model.init_from when it is a directory); "
                         "--dtype defaults to the run's precision");
  export_cmd->add_option("--max-shard-size", max_shard_size,
                         "with --hf-dir: largest safetensors file, bytes or e.g. 5GB (default), "
                         "500MB, 2GiB");
  export_cmd->add_option("--dtype", export_dtype, "fp32 (default) or bf16")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  export_cmd->add_flag("--overwrite", export_overwrite, "replace an existing output file");
  export_cmd->add_option("--lora-adapter", lora_adapter_dir,
                         "LoRA runs: write the adapter to this directory in Hugging Face PEFT "
                         "format (adapter_config.json, adapter_model.safetensors)");
  export_cmd->add_flag("--merge-lora", merge_lora,
                       "LoRA runs: write the base model (model.init_from) with the adapters "
                       "merged in to --out");
  std::string diff_other;
  CLI::App* diff_cmd = ckpt->add_subcommand(
      "diff", "compare two checkpoints' weights: per tensor and ||a - b|| / ||b|| overall");
  diff_cmd->add_option("a", ckpt_path, "checkpoint A")->required();
  diff_cmd->add_option("b", diff_other, "checkpoint B (the reference)")->required();

  // Subcommands defined in their own files (apps/fdtrain/subcommand.h).
  std::vector<fd::cli::Subcommand> subcommands;
  fd::cli::add_catalog_commands(app, &subcommands);
  fd::cli::add_eval_command(app, &subcommands);
  fd::cli::add_generate_command(app, &subcommands);
  fd::cli::add_runs_commands(app, &subcommands);
  fd::cli::add_tokenize_command(app, &subcommands);
  fd::cli::add_chat_commands(app, &subcommands);

  try {
    app.parse(args);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    print_error(std::string(e.what()) + " (run 'fdtrain --help' for usage)");
    return 2;
  }
  for (const fd::cli::Subcommand& s : subcommands)
    if (*s.app) return s.run();

  if (*validate) {
    fd::config::LoadResult loaded = fd::config::try_load_recipe(recipe, overrides);
    std::vector<std::string> errors = loaded.errors;
    if (errors.empty()) {
      // The data files, opened and split as train opens them (nothing trains).
      try {
        fd::engine::open_dataset(loaded.recipe);
      } catch (const fd::Error& e) {
        if (e.kind() != fd::ErrorKind::kUsage) throw;
        errors.push_back(e.what());
      }
    }
    print_warnings(loaded.warnings);
    if (errors.empty()) {
      std::printf("%s: ok\n", recipe.c_str());
      return 0;
    }
    for (const auto& e : errors) print_error(e);
    std::fprintf(stderr, "fdtrain: %zu error%s in %s\n", errors.size(),
                 errors.size() == 1 ? "" : "s", recipe.c_str());
    return 2;
  }
  if (*inspect) {
    std::fputs(fd::ckpt::inspect_checkpoint(ckpt_path).c_str(), stdout);
    return 0;
  }
  if (*diff_cmd) {
    std::fputs(fd::ckpt::diff_checkpoints(ckpt_path, diff_other, nullptr).c_str(), stdout);
    return 0;
  }
  if (*export_cmd) {
    fd::DType dtype = export_dtype == "bf16" ? fd::DType::kBF16 : fd::DType::kF32;
    if (!hf_dir.empty()) {
      if (!export_out.empty() || !lora_adapter_dir.empty()) {
        print_error(
            "--hf-dir writes the whole model on its own; give --out FILE or --lora-adapter DIR "
            "in a separate ckpt export");
        return 2;
      }
      fd::engine::HfDirExport options;
      if (export_cmd->get_option("--dtype")->count() > 0) options.dtype = dtype;
      options.merge_lora = merge_lora;
      options.overwrite = export_overwrite;
      options.max_shard_bytes = fd::engine::parse_shard_size(max_shard_size);
      std::printf("%s\n", fd::engine::export_hf_dir(ckpt_path, hf_dir, options).c_str());
      return 0;
    }
    if (export_cmd->get_option("--max-shard-size")->count() > 0) {
      print_error("--max-shard-size applies to --hf-dir only");
      return 2;
    }
    if (merge_lora && export_out.empty()) {
      print_error("--merge-lora needs --out FILE (.safetensors or .h5) for the merged model");
      return 2;
    }
    if (!lora_adapter_dir.empty() && !export_out.empty() && !merge_lora) {
      print_error(
          "--out with --lora-adapter needs --merge-lora (a LoRA checkpoint holds only the "
          "adapters; --merge-lora --out FILE writes the merged model)");
      return 2;
    }
    if (lora_adapter_dir.empty() && !merge_lora && export_out.empty()) {
      print_error(
          "ckpt export needs --out FILE, --hf-dir DIR, --lora-adapter DIR or --merge-lora --out "
          "FILE");
      return 2;
    }
    if (!lora_adapter_dir.empty())
      std::printf("%s\n", fd::engine::export_lora_adapter(ckpt_path, lora_adapter_dir, dtype,
                                                          export_overwrite)
                              .c_str());
    if (merge_lora)
      std::printf(
          "%s\n",
          fd::engine::export_merged_lora(ckpt_path, export_out, dtype, export_overwrite).c_str());
    if (lora_adapter_dir.empty() && !merge_lora)
      std::printf(
          "%s\n",
          fd::engine::export_checkpoint(ckpt_path, export_out, dtype, export_overwrite).c_str());
    return 0;
  }
  if (*estimate && world_size < 1) {
    print_error(fmt::format("--world-size must be >= 1, got {}", world_size));
    return 2;
  }
  fd::config::LoadResult loaded = fd::config::try_load_recipe(recipe, overrides);
  if (!loaded.ok()) {
    // Under mpirun every rank reads the recipe and finds the same errors:
    // rank 0 prints them, the others end with the same exit status quietly. A
    // rank that cannot see the recipe file at all (another host's file
    // system) says so itself.
    const bool quiet = fd::dist::launcher_rank() > 0 && std::filesystem::exists(recipe);
    throw fd::Error(fd::ErrorKind::kUsage,
                    quiet ? std::string() : fmt::format("{}", fmt::join(loaded.errors, "\n")));
  }
  const std::vector<std::string> warnings = std::move(loaded.warnings);
  fd::config::Recipe r = std::move(loaded.recipe);
  if (!*train) print_warnings(warnings);  // train: rank 0 only, below
  if (*estimate) {
    fd::engine::Estimate e = fd::engine::estimate(r, world_size);
    e.recipe_path = recipe;
    std::fputs(json ? (fd::engine::estimate_json(e).dump(2) + "\n").c_str()
                    : fd::engine::format_estimate(e).c_str(),
               stdout);
    return 0;
  }
  if (*print) {
    std::fputs(fd::config::to_yaml(r).c_str(), stdout);
    return 0;
  }
  fd::engine::TrainOptions options;
  options.recipe_path = recipe;
  options.overrides = overrides;
  options.run_dir =
      run_dir.empty()
          ? (std::filesystem::path("runs") / std::filesystem::path(recipe).stem()).string()
          : run_dir;
  options.overwrite = overwrite;
  options.progress = !no_progress;
  options.force_progress = force_progress;
  options.command_line = join_command_line(argc, argv);
  options.fault = fd::dist::fault_from_env();
  options.resume = resume;
  options.profile = profile;
  // SIGUSR1 (mpirun forwards it to every rank), SIGTERM (a scheduler's
  // preemption: Slurm, Kubernetes) and SIGINT (Ctrl-C): checkpoint at the next
  // step boundary and end with status "interrupted" (exit 0, 143, 130). A
  // second SIGINT or SIGTERM ends the process at once.
  install_stop_handlers();

  // dist.timeout_s bounds every wait on other ranks, MPI initialisation included,
  // and (the exit guard) how long a rank may stay stopped after it finished.
  std::unique_ptr<fd::dist::Communicator> comm =
      fd::dist::init(&argc, &argv, r.dist.timeout_s, /*exit_guard=*/true);
  if (comm->rank() != 0) fd::log::set_rank(comm->rank());
  if (comm->rank() == 0) print_warnings(warnings);
  int code = 0;
  {
    // Setup errors are agreed by every rank (Trainer's constructor) and end
    // the job cleanly; a failure while training is local to one rank and must
    // take the whole job down, or its peers would wait for it forever.
    fd::engine::Trainer trainer(r, options, *comm);
    if (trainer.finished()) {
      // A resume of a run whose checkpoint is at its last step: nothing to do.
      if (comm->rank() == 0) std::printf("%s\n", trainer.finished_message().c_str());
    } else {
      try {
        nlohmann::json summary = trainer.run();
        if (summary.contains("error")) {
          if (comm->rank() == 0) print_error(summary["error"].get<std::string>());
          code = 1;
        } else if (summary["status"] == "interrupted") {
          code = summary["signal"] == "SIGTERM"  ? 128 + SIGTERM
                 : summary["signal"] == "SIGINT" ? 128 + SIGINT
                                                 : 0;
        }
      } catch (const std::exception& e) {
        const bool oom = dynamic_cast<const std::bad_alloc*>(&e) != nullptr;
        const std::string what =
            oom ? std::string("out of memory; lower batch.micro, data.seq_len or the model size")
                : std::string(e.what());
        if (comm->size() == 1) {
          // Into the log file while it is open (main() prints the message);
          // with more ranks, abort() logs it.
          fd::log::write_file_only(fd::log::Level::kError, what);
          trainer.record_failure(what);
          throw;
        }
        const auto* fe = dynamic_cast<const fd::Error*>(&e);
        // abort() records the failure in summary.json (the trainer's abort hook).
        comm->abort(fe ? fe->exit_code() : 1,
                    fmt::format("rank {} failed at step {}: {}", comm->rank(),
                                trainer.current_step() + 1, what));
      }
    }
  }
  comm.reset();
  fd::dist::finalize();
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  fd::ops::select_blas_kernel(argv);
  try {
    return run(argc, argv);
  } catch (const fd::Error& e) {
    print_error(e.what());  // empty on ranks that only learnt that another rank failed
    fd::dist::finalize();
    return e.exit_code();
  } catch (const std::bad_alloc&) {
    print_error("out of memory; lower batch.micro, data.seq_len or the model size");
    return 1;
  } catch (const std::exception& e) {
    print_error(std::string("unexpected failure: ") + e.what());
    return 1;
  }
}
