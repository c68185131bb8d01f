// fdtrain ls | cp | schema: the shipped recipes and the recipe reference.
//
//   fdtrain ls                      every shipped recipe with its one-line description
//   fdtrain cp NAME DEST [--overwrite]
//                                   copies recipe NAME to DEST (a file, or a directory)
//   fdtrain schema [--markdown]     every recipe key: type, default, allowed values, meaning
//
// The shipped recipes are found in $FDTRAIN_RECIPES when it is set, else in
// <bin>/../share/fdtrain/recipes next to an installed binary, else in the
// source tree the binary was built from (FD_SOURCE_DIR/recipes). A recipe's
// description is its first line when that is a comment ("# name: what it is").
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "apps/fdtrain/subcommand.h"
#include "lib/base/error.h"
#include "lib/base/strings.h"
#include "lib/config/load.h"
#include "lib/config/reference.h"

#ifndef FD_SOURCE_DIR
#error "FD_SOURCE_DIR must be defined (CMakeLists.txt)"
#endif

namespace fd::cli {
namespace {

namespace fs = std::filesystem;

struct Recipe {
  std::string name;  // path below the recipes directory without ".yaml": "quickstart", "x/y"
  fs::path path;
  std::string description;
};

// The directory holding the shipped recipes; fd::Error when there is none.
fs::path recipes_dir() {
  std::error_code ec;
  if (const char* env = std::getenv("FDTRAIN_RECIPES"); env != nullptr && *env != '\0') {
    if (!fs::is_directory(env, ec))
      usage_error(
          "FDTRAIN_RECIPES={} is not a directory; point it at a directory of recipes "
          "(*.yaml), or unset it",
          env);
    return env;
  }
  std::vector<fs::path> tried;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec)
    tried.push_back(
        (exe.parent_path() / ".." / "share" / "fdtrain" / "recipes").lexically_normal());
  tried.push_back(fs::path(FD_SOURCE_DIR) / "recipes");
  for (const fs::path& dir : tried)
    if (fs::is_directory(dir, ec)) return dir;
  std::vector<std::string> shown;
  for (const fs::path& dir : tried) shown.push_back(dir.string());
  usage_error(
      "cannot find the shipped recipes (looked in {}); set FDTRAIN_RECIPES to the "
      "recipes/ directory of an fdtrain checkout",
      fmt::join(shown, " and "));
}

// "# quickstart: a small GPT ..." -> "a small GPT ..."; "" when the first line is no comment.
std::string description_of(const fs::path& path, const std::string& name) {
  std::ifstream in(path);
  std::string line;
  if (!std::getline(in, line) || line.empty() || line[0] != '#') return "";
  size_t b = line.find_first_not_of("# \t");
  if (b == std::string::npos) return "";
  line = line.substr(b);
  const std::string stem = fs::path(name).filename().string();
  if (line.rfind(stem + ":", 0) == 0) line = line.substr(stem.size() + 1);
  b = line.find_first_not_of(" \t");
  line = b == std::string::npos ? "" : line.substr(b);
  while (!line.empty() && (line.back() == ' ' || line.back() == '\r')) line.pop_back();
  return line;
}

// Every recipes/**/*.yaml, sorted by name.
std::vector<Recipe> shipped_recipes(const fs::path& dir) {
  std::vector<Recipe> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    if (!it->is_regular_file(ec) || it->path().extension() != ".yaml") continue;
    std::string name = it->path().lexically_relative(dir).replace_extension().string();
    out.push_back({name, it->path(), description_of(it->path(), name)});
  }
  if (ec) runtime_error("cannot list {}: {}", dir.string(), ec.message());
  std::sort(out.begin(), out.end(),
            [](const Recipe& a, const Recipe& b) { return a.name < b.name; });
  return out;
}

int run_ls() {
  const fs::path dir = recipes_dir();
  std::vector<Recipe> recipes = shipped_recipes(dir);
  size_t width = 0;
  for (const Recipe& r : recipes) width = std::max(width, r.name.size());
  for (const Recipe& r : recipes)
    std::printf("%-*s  %s\n", int(width), r.name.c_str(),
                r.description.empty() ? "(no description)" : r.description.c_str());
  std::printf("\n%zu recipe%s in %s. Copy one to edit: fdtrain cp NAME DEST\n", recipes.size(),
              recipes.size() == 1 ? "" : "s", dir.string().c_str());
  return 0;
}

int run_cp(std::string name, const std::string& dest, bool overwrite) {
  const fs::path dir = recipes_dir();
  std::vector<Recipe> recipes = shipped_recipes(dir);
  if (name.size() > 5 && name.compare(name.size() - 5, 5, ".yaml") == 0)
    name.resize(name.size() - 5);
  auto it =
      std::find_if(recipes.begin(), recipes.end(), [&](const Recipe& r) { return r.name == name; });
  if (it == recipes.end()) {
    std::vector<std::string> names;
    for (const Recipe& r : recipes) names.push_back(r.name);
    std::string near = nearest(name, names);
    usage_error("unknown recipe '{}'{}; the shipped recipes are: {} (fdtrain ls describes them)",
                name, near.empty() ? "" : fmt::format(" (did you mean '{}'?)", near),
                fmt::join(names, ", "));
  }
  std::error_code ec;
  fs::path out = dest;
  if (fs::is_directory(out, ec)) out /= fs::path(it->name).filename().string() + ".yaml";
  if (fs::exists(out, ec) && !overwrite)
    usage_error("{} already exists; pass --overwrite to replace it, or choose another DEST",
                out.string());
  if (!out.parent_path().empty() && !fs::is_directory(out.parent_path(), ec))
    usage_error("cannot write {}: directory {} does not exist", out.string(),
                out.parent_path().string());
  fs::copy_file(it->path, out, fs::copy_options::overwrite_existing, ec);
  if (ec) runtime_error("cannot copy {} to {}: {}", it->path.string(), out.string(), ec.message());
  std::printf("copied %s to %s\n", it->name.c_str(), out.string().c_str());
  std::fflush(stdout);  // before any note on stderr

  // The copy's includes are looked for next to it, above it and in the working
  // directory; say so when they (or the files it names) are not found from here.
  config::LoadResult check = config::try_load_recipe(out.string());
  if (!check.ok()) {
    std::fprintf(stderr, "fdtrain: note: %s does not validate from here yet:\n",
                 out.string().c_str());
    bool includes = false;
    for (const std::string& e : check.errors) {
      std::fprintf(stderr, "  %s\n", e.c_str());
      includes = includes || e.find("included file") != std::string::npos;
    }
    if (includes)
      std::fprintf(stderr,
                   "fdtrain: note: relative includes (configs/...) are looked for next to the "
                   "recipe, in the directories above it and in the working directory: run from "
                   "%s, or copy its configs/ next to the recipe\n",
                   dir.parent_path().string().c_str());
  }
  return 0;
}

}  // namespace

void add_catalog_commands(CLI::App& app, std::vector<Subcommand>* out) {
  CLI::App* ls = app.add_subcommand("ls", "list the shipped recipes with a description of each");
  out->push_back({ls, [] { return run_ls(); }});

  struct CpOptions {
    std::string name, dest;
    bool overwrite = false;
  };
  auto cp_opts = std::make_shared<CpOptions>();
  CLI::App* cp = app.add_subcommand("cp", "copy a shipped recipe to edit it");
  cp->add_option("name", cp_opts->name, "recipe name, as fdtrain ls lists it")->required();
  cp->add_option("dest", cp_opts->dest, "file to write, or a directory to write NAME.yaml into")
      ->required();
  cp->add_flag("--overwrite", cp_opts->overwrite, "replace an existing DEST");
  out->push_back(
      {cp, [cp_opts] { return run_cp(cp_opts->name, cp_opts->dest, cp_opts->overwrite); }});

  auto markdown = std::make_shared<bool>(false);
  CLI::App* schema = app.add_subcommand(
      "schema", "print every recipe key with its type, default, allowed values and meaning");
  schema->add_flag("--markdown", *markdown, "as Markdown (docs/RECIPES.md is this output)");
  out->push_back({schema, [markdown] {
                    std::fputs((*markdown ? config::format_reference_markdown()
                                          : config::format_reference_text())
                                   .c_str(),
                               stdout);
                    return 0;
                  }});
}

}  // namespace fd::cli
