#include "lib/config/diff.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>
#include <utility>
#include <vector>

#include "lib/config/load.h"

namespace fd::config {

RecipeDiff diff_recipes(const Recipe& saved, const Recipe& now) {
  // One text per field: a list's items joined, as the old flat form had them.
  auto flat = [](const Recipe& r) {
    std::vector<std::pair<std::string, std::string>> out;
    for (const RecipeField& f : recipe_fields(r))
      out.emplace_back(f.path, f.block ? fmt::format("{}", fmt::join(f.items, ", ")) : f.value);
    return out;
  };
  const auto a = flat(saved), b = flat(now);
  auto find = [](const auto& v, const std::string& k) -> const std::string* {
    for (const auto& [key, value] : v)
      if (key == k) return &value;
    return nullptr;
  };
  std::vector<std::string> keys;
  for (const auto& [k, v] : a) keys.push_back(k);
  for (const auto& [k, v] : b)
    if (find(a, k) == nullptr) keys.push_back(k);
  RecipeDiff d;
  for (const std::string& k : keys) {
    const std::string* va = find(a, k);
    const std::string* vb = find(b, k);
    const std::string sa = va ? *va : "(absent)", sb = vb ? *vb : "(absent)";
    if (sa == sb) continue;
    std::string line = fmt::format("{}: {} -> {}", k, sa, sb);
    // Shapes and the trainable set: the model's dimensions and the adapters'
    // rank, targets and layers. Which base file (model.init_from) is checked by
    // its digest instead; alpha, dropout and the adapter directory may change.
    const bool shape = (k.rfind("model.", 0) == 0 && k != "model.init_from") || k == "lora" ||
                       k == "lora.r" || k == "lora.targets" || k == "lora.layers";
    (shape ? d.refused : d.warnings).push_back(line);
  }
  return d;
}

}  // namespace fd::config
