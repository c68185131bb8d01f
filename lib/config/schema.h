// Internal to lib/config: the recipe schema, and the conversion of a resolved
// tree (includes inlined, overrides applied) into a validated Recipe.
#pragma once

#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "lib/config/recipe.h"
#include "lib/config/tree.h"

namespace fd::config {

// The recipe's top-level keys, in the order to_yaml() prints them.
const std::vector<std::string>& top_level_keys();

// True for the keys whose value is a map ("model", "data", "lora", ...): the
// ones that may instead name a fragment file to include.
bool is_section(std::string_view key);

// Checks that `key_path` ("optimizer.lr") names a key of the schema. Returns
// "" when it does, else the message tail "optimizer.lrr: unknown key; did you
// mean 'lr'?".
std::string check_key_path(std::string_view key_path);

// Converts and validates `root` into *recipe (fields not given keep their
// defaults; recipe->sources is filled). Every problem is appended to *errors
// as "location: key.path: what". `recipe_file` is named by errors that have
// no better location (a missing required key). `broken_sections` are
// sections whose include failed (already reported): they are not checked
// further. Without check_files, the files the recipe names (data globs,
// model.init_from, lora.adapter) are taken as written, not looked for.
// Doubtful but valid values are appended to *warnings in the same form.
void build_recipe(const Node& root, const std::string& recipe_file,
                  const std::set<std::string>& broken_sections, bool check_files, Recipe* recipe,
                  std::vector<std::string>* errors, std::vector<std::string>* warnings);

}  // namespace fd::config
