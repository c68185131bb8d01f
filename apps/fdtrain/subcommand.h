// A subcommand that lives in its own file (catalog_cmd.cc, eval_cmd.cc, ...).
//
// Each file has an add_*() function that registers its subcommand(s) on the
// CLI11 app, keeping its options in state owned by the returned `run`; main()
// calls add_*() before parsing and then runs the subcommand that was given.
// `run` returns the exit code (0, or 2 for usage errors, 1 for runtime
// failures) or throws fd::Error, which main() turns into one message.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

#include "lib/config/load.h"

namespace fd::cli {

// eval and generate ask for --seq-len / --context rather than use a model's own
// context when it is longer than this (a Hugging Face directory of a
// long-context model, where nothing says what length it was trained at).
inline constexpr int kLongContext = 8192;

struct Subcommand {
  CLI::App* app;             // owned by the parent CLI::App
  std::function<int()> run;  // runs it once the command line is parsed
};

// fdtrain train (train_cmd.cc); `argc`/`argv` are main's: the command line is
// recorded in the run, and MPI is initialised with them.
void add_train_command(CLI::App& app, std::vector<Subcommand>* out, int* argc, char*** argv);
// fdtrain validate | print-config | estimate: a recipe checked, resolved, sized (recipe_cmd.cc).
void add_recipe_commands(CLI::App& app, std::vector<Subcommand>* out);
// fdtrain ckpt inspect | export | diff (ckpt_cmd.cc).
void add_ckpt_commands(CLI::App& app, std::vector<Subcommand>* out);
// fdtrain ls | cp | schema: the shipped recipes and the recipe reference (catalog_cmd.cc).
void add_catalog_commands(CLI::App& app, std::vector<Subcommand>* out);
// fdtrain eval: loss and perplexity of a model on a data file (eval_cmd.cc).
void add_eval_command(CLI::App& app, std::vector<Subcommand>* out);
// fdtrain generate: text from a model, KV-cached (generate_cmd.cc).
void add_generate_command(CLI::App& app, std::vector<Subcommand>* out);
// fdtrain tokenize: text to an llm.c token file through a tokenizer.json (tokenize_cmd.cc).
void add_tokenize_command(CLI::App& app, std::vector<Subcommand>* out);
// fdtrain template | data preview: chat templates and examples as the model sees them
// (chat_cmd.cc).
void add_chat_commands(CLI::App& app, std::vector<Subcommand>* out);
// fdtrain runs | plot: run directories as a table, losses as an SVG (runs_cmd.cc).
void add_runs_commands(CLI::App& app, std::vector<Subcommand>* out);

// The arguments RECIPE [overrides...] of train, validate, print-config and
// estimate, into *recipe and *overrides (recipe_cmd.cc).
void add_recipe_args(CLI::App* cmd, std::string* recipe, std::vector<std::string>* overrides);
// The recipe at `recipe` with `overrides` applied and validated, or a usage
// fd::Error holding every error (quiet on ranks other than 0 of an MPI job,
// which find the same errors). The caller prints the warnings (recipe_cmd.cc).
config::LoadResult load_recipe(const std::string& recipe,
                               const std::vector<std::string>& overrides);

// On stderr, as every subcommand reports: "fdtrain: warning: W" per warning;
// "fdtrain: error: LINE" per line of `message`, also into this rank's log file
// when one is open (main.cc).
void print_warnings(const std::vector<std::string>& warnings);
void print_error(const std::string& message);

}  // namespace fd::cli
