// fdtrain: the command-line front end. Parses arguments with CLI11 and calls
// into lib/engine (and lib/config, lib/data for what a user hands it as files);
// no training logic lives here. Each subcommand's options and handler live in
// its own file (subcommand.h):
//
//   fdtrain train RECIPE [overrides...] ...  train a model (train_cmd.cc)
//   fdtrain RECIPE ...                       shorthand for train
//   fdtrain validate | print-config | estimate RECIPE [overrides...]
//                                            a recipe checked, resolved or sized (recipe_cmd.cc)
//   fdtrain ckpt inspect | export | diff     a checkpoint read back (ckpt_cmd.cc)
//   fdtrain ls | cp NAME DEST | schema [--markdown]
//                                            shipped recipes; the recipe reference (catalog_cmd.cc)
//   fdtrain eval MODEL --data FILE [--seq-len T] [--windows N] [--json]
//                                            mean loss and perplexity (eval_cmd.cc)
//   fdtrain generate MODEL [--prompt TEXT | --tokens IDS] [--max-tokens N] ...
//                                            sampled text, KV-cached (generate_cmd.cc)
//   fdtrain runs DIR... [--json]             run directories (or a sweep) as one table
//   fdtrain plot DIR... --out FILE.svg       train/eval loss vs step of those runs (runs_cmd.cc)
//   fdtrain tokenize ...                     text to an llm.c token file (tokenize_cmd.cc)
//   fdtrain template | data preview ...      chat templates and examples as the model sees them
//                                            (chat_cmd.cc)
//   fdtrain help [COMMAND [SUBCOMMAND]]      the same as fdtrain [COMMAND ...] --help
//
// Exit codes: 0 success, 2 usage or recipe error, 1 runtime failure.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "apps/fdtrain/subcommand.h"
#include "lib/base/error.h"
#include "lib/base/log.h"
#include "lib/base/strings.h"
#include "lib/base/version.h"
#include "lib/engine/process.h"

namespace fd::cli {

void print_warnings(const std::vector<std::string>& warnings) {
  for (const std::string& w : warnings) std::fprintf(stderr, "fdtrain: warning: %s\n", w.c_str());
}

void print_error(const std::string& message) {
  for (const std::string& line : split(message, '\n'))
    if (!line.empty()) {
      std::fprintf(stderr, "fdtrain: error: %s\n", line.c_str());
      log::write_file_only(log::Level::kError, line);  // RUN/logs/rank<r>.log, if open
    }
}

}  // namespace fd::cli

namespace {

using fd::cli::print_error;

const std::vector<std::string> kCommands = {
    "train", "validate", "print-config", "estimate", "ckpt",     "ls",       "cp",   "schema",
    "eval",  "generate", "runs",         "plot",     "tokenize", "template", "data", "calibrate"};

// The command line as CLI11 parses it (reversed), with the shorthands
// expanded: `fdtrain RECIPE ...` is `fdtrain train RECIPE ...`, `fdtrain help
// [COMMAND [SUBCOMMAND]]` is `fdtrain [COMMAND [SUBCOMMAND]] --help`. False
// (the error printed) for help on a command that does not exist.
bool expand_shorthands(std::vector<std::string>& args) {
  if (!args.empty() && args[0] == "help") {
    args.erase(args.begin());
    if (!args.empty() &&
        std::find(kCommands.begin(), kCommands.end(), args[0]) == kCommands.end()) {
      std::string near = fd::nearest(args[0], kCommands);
      print_error(fmt::format("help: no command '{}'{}; the commands are {}", args[0],
                              near.empty() ? "" : fmt::format(" (did you mean '{}'?)", near),
                              fmt::join(kCommands, ", ")));
      return false;
    }
    args.push_back("--help");
  }
  if (!args.empty() && args[0].rfind("-", 0) != 0 &&
      std::find(kCommands.begin(), kCommands.end(), args[0]) == kCommands.end()) {
    args.insert(args.begin(), "train");
  }
  std::reverse(args.begin(), args.end());  // CLI11 parses a reversed vector
  return true;
}

int run(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!expand_shorthands(args)) return 2;

  CLI::App app{
      "fdtrain: memory-efficient distributed training of transformer language models "
      "from a YAML recipe",
      "fdtrain"};  // the name in "Usage: fdtrain ckpt export ..." (args come without argv[0])
  app.set_version_flag("--version", std::string("fdtrain ") + fd::version());
  app.require_subcommand(1);
  app.footer("'fdtrain help COMMAND' (or 'fdtrain COMMAND --help') shows a command's options.");

  // In this order in --help.
  std::vector<fd::cli::Subcommand> subcommands;
  fd::cli::add_train_command(app, &subcommands, &argc, &argv);
  fd::cli::add_recipe_commands(app, &subcommands);
  fd::cli::add_ckpt_commands(app, &subcommands);
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
  return 2;  // not reached: CLI11 requires one subcommand
}

}  // namespace

int main(int argc, char** argv) {
  fd::engine::start_process(argv);
  try {
    return run(argc, argv);
  } catch (const fd::Error& e) {
    print_error(e.what());  // empty on ranks that only learnt that another rank failed
    // A quiet rank (the message is rank 0's to print) lingers a moment before it exits: mpirun
    // ends the job at the first rank's non-zero exit, and rank 0 must have printed by then.
    if (*e.what() == '\0' && fd::engine::launcher_rank() > 0)
      std::this_thread::sleep_for(std::chrono::seconds(2));
    fd::engine::leave_job();
    return e.exit_code();
  } catch (const std::bad_alloc&) {
    print_error("out of memory; lower batch.micro, data.seq_len or the model size");
    return 1;
  } catch (const std::exception& e) {
    print_error(std::string("unexpected failure: ") + e.what());
    return 1;
  }
}
