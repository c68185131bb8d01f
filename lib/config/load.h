// Loading a recipe: YAML file -> includes -> overrides -> validated Recipe.
//
//   Recipe r = fd::config::load_recipe("recipes/quickstart.yaml", {"steps=10"});
//
// Every problem found is reported, not just the first, one line each:
//   <file>:<line>:<col>: <key.path>: <what>[; did you mean '<nearest>'?]
// with "override 'k=v'" in place of the file position for values set by an
// override, and just "<file>" when there is no better place (a missing
// required key). Warnings (a valid recipe that probably does not do what was
// meant) have the same form. The include and override rules are in
// docs/RECIPE.md.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "lib/config/recipe.h"

namespace fd::config {

// The outcome of reading a recipe.
struct LoadResult {
  Recipe recipe;                    // meaningful only when errors is empty
  std::vector<std::string> errors;  // one complete message per problem
  // One complete message per doubtful but valid value (e.g. a warmup longer
  // than the run); the caller prints them and carries on.
  std::vector<std::string> warnings;
  bool ok() const { return errors.empty(); }
};

// Reads the recipe at `path` (a path as the user gave it; relative to the
// working directory), applies `overrides` ("key.path=value" sets a value,
// parsed as YAML; "~key.path" deletes a key so its default applies) and
// validates the result. Never throws for anything the user can cause.
LoadResult try_load_recipe(const std::string& path, const std::vector<std::string>& overrides = {});

// As try_load_recipe(), from YAML text (e.g. the resolved recipe stored in a
// checkpoint). `name` stands in for the file name in messages; includes are
// resolved from the working directory.
LoadResult try_parse_recipe(std::string_view yaml, const std::string& name,
                            const std::vector<std::string>& overrides = {});

// As try_parse_recipe(), for a recipe an earlier run stored (a checkpoint's
// resolved recipe), to learn what that run was: the files it names (data,
// model.init_from, lora.adapter) need not exist here and are kept as written.
LoadResult try_parse_stored_recipe(std::string_view yaml, const std::string& name);

// As try_load_recipe(), but throws one fd::Error (ErrorKind::kUsage) whose
// message is all the error lines joined by '\n'. Warnings are dropped.
Recipe load_recipe(const std::string& path, const std::vector<std::string>& overrides = {});

// The fully resolved recipe as YAML: includes inlined, every default written
// out, data globs expanded to their files, numbers printed so that they read
// back exactly. Loading it again yields an equal Recipe.
std::string to_yaml(const Recipe& recipe);
// to_yaml()'s first line begins so: it marks the config.yaml of a run directory.
inline constexpr const char* kResolvedHeader = "# fdtrain recipe, fully resolved";

// The resolved recipe as the list of its fields, in to_yaml()'s order: the
// one place that enumerates a Recipe's fields for output (to_yaml() writes
// them, diff_recipes() compares them).
struct RecipeField {
  std::string path;                // "optimizer.lr"; a top-level key has no dot ("steps")
  std::string value;               // the YAML scalar or flow list ("3e-04", "[0.9, 0.95]")
  std::vector<std::string> items;  // block: the list's entries, as YAML scalars
  bool block = false;              // written as a block list (data.train, data.val)
};
std::vector<RecipeField> recipe_fields(const Recipe& recipe);

}  // namespace fd::config
