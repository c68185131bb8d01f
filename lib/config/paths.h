// Absolute paths for a recipe's files, so that a run's config.yaml and its
// checkpoints' recipes name the same files from any working directory.
#pragma once

#include <filesystem>

#include "lib/config/recipe.h"

namespace fd::config {

// Makes every file path of `recipe` absolute against `base` (the working
// directory the recipe's relative paths are read from): data.train and
// data.val entries (globs stay globs), model.init_from and lora.adapter.
// Paths are made absolute lexically (no symlink resolution, no check that
// they exist); empty paths stay empty. Sources (where()) are unchanged.
void make_paths_absolute(Recipe& recipe, const std::filesystem::path& base);

}  // namespace fd::config
