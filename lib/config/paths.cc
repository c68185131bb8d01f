#include "lib/config/paths.h"

namespace fd::config {

namespace {

void absolute(std::string& path, const std::filesystem::path& base) {
  if (path.empty()) return;
  std::filesystem::path p(path);
  if (p.is_absolute()) return;
  path = (base / p).lexically_normal().string();
}

}  // namespace

void make_paths_absolute(Recipe& recipe, const std::filesystem::path& base) {
  for (std::string& f : recipe.data.train) absolute(f, base);
  for (std::string& f : recipe.data.val) absolute(f, base);
  absolute(recipe.model.init_from, base);
  if (recipe.lora) absolute(recipe.lora->adapter, base);
  if (recipe.objective) absolute(recipe.objective->reference, base);
  absolute(recipe.zero.offload_optimizer.path, base);
  absolute(recipe.zero.offload_params.path, base);
}

}  // namespace fd::config
