// Fuzz target: the recipe loader (lib/config) with command-line overrides.
//
// Input: the YAML text of a recipe, then optionally NUL-separated overrides
// ("key.path=value" or "~key.path"), exactly as the CLI passes them:
//   <yaml> [\0 <override>]...
// Run from the repository root, so that includes such as
// configs/models/gpt-nano.yaml and the fortunes data files resolve.
//
// Checked:
//   - loading never throws and never crashes: every problem is an error line;
//   - a recipe that loads prints (to_yaml) as YAML that loads again, without
//     errors, to an equal Recipe (load.h's promise for the resolved recipe);
//   - check_world_size() throws nothing but fd::Error.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "lib/config/load.h"
#include "lib/config/recipe.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

void check(std::string_view yaml, const std::vector<std::string>& overrides) {
  fd::config::LoadResult r = fd::config::try_parse_recipe(yaml, "fuzz.yaml", overrides);
  for (const std::string& e : r.errors) {
    if (e.empty()) {
      std::fprintf(stderr, "recipe_fuzz: an empty error message\n");
      std::abort();
    }
  }
  if (!r.ok()) return;
  for (int world : {1, 2, 3}) fd::fuzz::expect_clean([&] { check_world_size(r.recipe, world); });

  const std::string printed = fd::config::to_yaml(r.recipe);
  fd::config::LoadResult again = fd::config::try_parse_recipe(printed, "resolved.yaml");
  if (!again.ok() || !(again.recipe == r.recipe)) {
    std::fprintf(stderr, "recipe_fuzz: the resolved recipe does not load back %s:\n%s\n",
                 again.ok() ? "equal" : "cleanly", printed.c_str());
    for (const std::string& e : again.errors) std::fprintf(stderr, "  %s\n", e.c_str());
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in = fd::fuzz::as_view(data, size);
  size_t nul = in.find('\0');
  std::string_view yaml = in.substr(0, nul);
  std::vector<std::string> overrides;
  while (nul != std::string_view::npos) {
    size_t next = in.find('\0', nul + 1);
    overrides.emplace_back(in.substr(nul + 1, next == std::string_view::npos ? next : next - nul - 1));
    nul = next;
  }
  check(yaml, overrides);
  return 0;
}
