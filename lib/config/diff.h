// diff_recipes(): what changed between the recipe a checkpoint was saved
// with and the recipe of the run that resumes it, field by field on the
// resolved recipes (recipe_fields(), load.h), never by reading YAML.
#pragma once

#include <string>
#include <vector>

#include "lib/config/recipe.h"

namespace fd::config {

// "key.path: saved -> now" lines ("(absent)" for a field only one side has,
// such as lora.r when the other has no lora section). `refused` holds the
// changes that alter shapes or what is trained: the model's dimensions
// (model.*, except model.init_from, whose identity a LoRA checkpoint checks by
// digest) and the adapters' presence, rank, targets and layers. `warnings`
// holds everything else (schedule, steps, batch, data, zero stage, precision,
// lora alpha/dropout/adapter, ...).
struct RecipeDiff {
  std::vector<std::string> refused;
  std::vector<std::string> warnings;
};
RecipeDiff diff_recipes(const Recipe& saved, const Recipe& now);

}  // namespace fd::config
