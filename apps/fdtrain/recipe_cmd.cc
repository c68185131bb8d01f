// fdtrain validate | print-config | estimate: a recipe checked, resolved or
// sized, without training.
//
//   fdtrain validate RECIPE [overrides...]      exit 0 when the recipe and its data files are
//                                               valid, 2 with every error
//   fdtrain print-config RECIPE [overrides...]  the fully resolved recipe as YAML
//   fdtrain estimate RECIPE [overrides...] [--world-size N] [--nodes H] [--json]
//                                               memory and communication per rank, every ZeRO
//                                               stage (lib/engine/estimate.h)
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "apps/fdtrain/subcommand.h"
#include "lib/base/error.h"
#include "lib/engine/assemble.h"
#include "lib/engine/estimate.h"
#include "lib/engine/process.h"

namespace fd::cli {
namespace {

struct RecipeArgs {
  std::string recipe;
  std::vector<std::string> overrides;
};

int run_validate(const RecipeArgs& a) {
  config::LoadResult loaded = config::try_load_recipe(a.recipe, a.overrides);
  std::vector<std::string> errors = loaded.errors;
  if (errors.empty()) {
    // The data files, opened and split as train opens them (nothing trains).
    try {
      engine::open_dataset(loaded.recipe);
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kUsage) throw;
      errors.push_back(e.what());
    }
  }
  print_warnings(loaded.warnings);
  if (errors.empty()) {
    std::printf("%s: ok\n", a.recipe.c_str());
    return 0;
  }
  for (const auto& e : errors) print_error(e);
  std::fprintf(stderr, "fdtrain: %zu error%s in %s\n", errors.size(), errors.size() == 1 ? "" : "s",
               a.recipe.c_str());
  return 2;
}

int run_print_config(const RecipeArgs& a) {
  config::LoadResult loaded = load_recipe(a.recipe, a.overrides);
  print_warnings(loaded.warnings);
  std::fputs(config::to_yaml(loaded.recipe).c_str(), stdout);
  return 0;
}

struct EstimateArgs {
  RecipeArgs recipe;
  int world_size = 1;
  int nodes = 1;
  bool json = false;
};

int run_estimate(const EstimateArgs& a) {
  if (a.world_size < 1) {
    print_error(fmt::format("--world-size must be >= 1, got {}", a.world_size));
    return 2;
  }
  config::LoadResult loaded = load_recipe(a.recipe.recipe, a.recipe.overrides);
  print_warnings(loaded.warnings);
  if (a.nodes < 1 || a.world_size % a.nodes != 0) {
    print_error(
        fmt::format("--nodes {}: the {} rank(s) of --world-size must split evenly over the "
                    "nodes (each host world-size / nodes consecutive ranks); give a "
                    "divisor of {}",
                    a.nodes, a.world_size, a.world_size));
    return 2;
  }
  engine::Estimate e = engine::estimate(loaded.recipe, a.world_size, a.nodes);
  e.recipe_path = a.recipe.recipe;
  std::fputs(a.json ? (engine::estimate_json(e).dump(2) + "\n").c_str()
                    : engine::format_estimate(e).c_str(),
             stdout);
  return 0;
}

}  // namespace

void add_recipe_args(CLI::App* cmd, std::string* recipe, std::vector<std::string>* overrides) {
  cmd->add_option("recipe", *recipe, "recipe file (YAML)")->required();
  cmd->add_option("overrides", *overrides,
                  "overrides: key.path=value (YAML scalar or flow list) or ~key.path to delete");
}

config::LoadResult load_recipe(const std::string& recipe,
                               const std::vector<std::string>& overrides) {
  config::LoadResult loaded = config::try_load_recipe(recipe, overrides);
  if (!loaded.ok()) {
    // Under mpirun every rank reads the recipe and finds the same errors:
    // rank 0 prints them, the others end with the same exit status quietly. A
    // rank that cannot see the recipe file at all (another host's file
    // system) says so itself.
    const bool quiet = engine::launcher_rank() > 0 && std::filesystem::exists(recipe);
    throw Error(ErrorKind::kUsage,
                quiet ? std::string() : fmt::format("{}", fmt::join(loaded.errors, "\n")));
  }
  return loaded;
}

void add_recipe_commands(CLI::App& app, std::vector<Subcommand>* out) {
  auto validate_args = std::make_shared<RecipeArgs>();
  CLI::App* validate = app.add_subcommand(
      "validate", "check a recipe and open its data files as train would; report every error");
  add_recipe_args(validate, &validate_args->recipe, &validate_args->overrides);
  out->push_back({validate, [validate_args] { return run_validate(*validate_args); }});

  auto print_args = std::make_shared<RecipeArgs>();
  CLI::App* print = app.add_subcommand("print-config", "print the fully resolved recipe as YAML");
  add_recipe_args(print, &print_args->recipe, &print_args->overrides);
  out->push_back({print, [print_args] { return run_print_config(*print_args); }});

  auto estimate_args = std::make_shared<EstimateArgs>();
  CLI::App* estimate = app.add_subcommand(
      "estimate", "print the memory and communication per rank for every ZeRO stage");
  add_recipe_args(estimate, &estimate_args->recipe.recipe, &estimate_args->recipe.overrides);
  estimate->add_option("--world-size", estimate_args->world_size, "number of ranks N (default 1)");
  estimate->add_option("--nodes", estimate_args->nodes,
                       "hosts the ranks run on, N / nodes consecutive ranks each (default 1): "
                       "the network traffic split into inside a node and across nodes");
  estimate->add_flag("--json", estimate_args->json, "machine-readable output (exact bytes)");
  out->push_back({estimate, [estimate_args] { return run_estimate(*estimate_args); }});
}

}  // namespace fd::cli
