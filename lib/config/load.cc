// Reading recipe files: includes (top-level `include:` of base recipes, and a
// section given as the path of a fragment file), include-cycle detection and
// command-line overrides. The result is one tree, handed to build_recipe().
#include "lib/config/load.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include "lib/base/error.h"
#include "lib/base/input_file.h"
#include "lib/base/strings.h"
#include "lib/config/schema.h"
#include "lib/config/tree.h"

namespace fd::config {
namespace {

namespace fs = std::filesystem;

fs::path cwd() {
  std::error_code ec;
  fs::path p = fs::current_path(ec);
  return ec ? fs::path(".") : p;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool is_fragment_path(const Node& n) {
  return n.is_scalar() && (ends_with(n.scalar, ".yaml") || ends_with(n.scalar, ".yml"));
}

// How a found file is named in messages: relative to the working directory
// when it lies below it, else absolute.
std::string display_name(const fs::path& abs) {
  fs::path rel = abs.lexically_relative(cwd());
  if (!rel.empty() && *rel.begin() != "..") return rel.string();
  return abs.string();
}

class Loader {
 public:
  explicit Loader(std::vector<std::string>* errors) : errors_(errors) {}

  // Loads the recipe file `path`. Returns false when nothing further can be
  // checked (the file is missing or is not valid YAML).
  bool load_recipe_file(const std::string& path, Node* out) {
    std::error_code ec;
    if (!fs::exists(path, ec)) {
      errors_->push_back(fmt::format("{}: recipe file not found", path));
      return false;
    }
    if (fs::is_directory(path, ec)) {
      errors_->push_back(fmt::format("{}: is a directory, not a recipe file", path));
      return false;
    }
    size_t before = errors_->size();
    Node doc = parse_file(fs::absolute(path).lexically_normal(), path);
    if (errors_->size() > before && doc.is_null()) return false;
    if (!top_level_ok(doc)) return false;
    stack_.push_back({fs::weakly_canonical(path, ec), path});
    *out = resolve(std::move(doc), fs::absolute(path).parent_path(), "");
    stack_.pop_back();
    return true;
  }

  bool load_recipe_text(std::string_view text, const std::string& name, Node* out) {
    size_t before = errors_->size();
    Node doc = parse_yaml(text, name, errors_);
    if (errors_->size() > before && doc.is_null()) return false;
    if (!top_level_ok(doc)) return false;
    *out = resolve(std::move(doc), cwd(), "");
    return true;
  }

  void apply_overrides(Node* root, const std::vector<std::string>& overrides);

  const std::set<std::string>& broken_sections() const { return broken_; }

 private:
  struct Open {
    fs::path canonical;
    std::string shown;
  };

  // A recipe that is not a map cannot be checked further.
  bool top_level_ok(const Node& doc) {
    if (doc.is_map() || doc.is_null()) return true;
    errors_->push_back(
        fmt::format("{}: expected a map of recipe keys, got {}", doc.loc.str(), doc.describe()));
    return false;
  }

  void error(const Location& loc, std::string_view path, std::string_view what) {
    errors_->push_back(fmt::format("{}: {}: {}", loc.str(), path, what));
  }

  // Only a regular file of at most kMaxConfigFileBytes is read (a FIFO or
  // /dev/zero given as a recipe is refused, not read without end).
  Node parse_file(const fs::path& abs, const std::string& shown) {
    std::string text;
    try {
      text = read_input_file(abs.string(), "recipe");
    } catch (const Error& e) {
      std::string m = e.what();
      // read_input_file names the absolute path; the message names what the user wrote.
      if (const std::string a = "recipe " + abs.string() + ": "; m.rfind(a, 0) == 0)
        m = shown + ": " + m.substr(a.size());
      errors_->push_back(std::move(m));
      return Node{};
    }
    return parse_yaml(text, shown, errors_);
  }

  // Finds an included file: `rel` next to the including file, then in each
  // directory above that, then in the working directory.
  std::optional<fs::path> find(const std::string& rel, const fs::path& from_dir) {
    std::error_code ec;
    fs::path p(rel);
    if (p.is_absolute()) {
      // Whatever is there: parse_file says what it is when it is not a file.
      if (fs::exists(p, ec)) return p.lexically_normal();
      return std::nullopt;
    }
    for (fs::path dir = from_dir;; dir = dir.parent_path()) {
      fs::path candidate = (dir / p).lexically_normal();
      if (fs::is_regular_file(candidate, ec)) return candidate;
      if (dir == dir.parent_path() || dir.empty()) break;
    }
    fs::path candidate = (cwd() / p).lexically_normal();
    if (fs::is_regular_file(candidate, ec)) return candidate;
    return std::nullopt;
  }

  // Loads the file that `site` (a string node) names, for key `key` ("include"
  // or a section name). Returns false after reporting why it could not.
  bool include(const Node& site, const fs::path& from_dir, const std::string& key,
               const std::string& section, Node* out) {
    std::optional<fs::path> found = find(site.scalar, from_dir);
    if (!found) {
      error(site.loc, key,
            fmt::format("included file '{}' not found (looked in {}, the directories above it "
                        "and {})",
                        site.scalar, display_name(from_dir), cwd().string()));
      return false;
    }
    std::error_code ec;
    fs::path canonical = fs::weakly_canonical(*found, ec);
    std::string shown = display_name(*found);
    for (size_t i = 0; i < stack_.size(); ++i) {
      if (stack_[i].canonical == canonical) {
        std::string chain;
        for (size_t j = i; j < stack_.size(); ++j) chain += stack_[j].shown + " -> ";
        error(site.loc, key, fmt::format("include cycle: {}{}", chain, shown));
        return false;
      }
    }
    size_t before = errors_->size();
    Node doc = parse_file(*found, shown);
    if (errors_->size() > before && doc.is_null()) return false;
    stack_.push_back({canonical, shown});
    *out = resolve(std::move(doc), found->parent_path(), section);
    stack_.pop_back();
    return true;
  }

  // Resolves the includes of a loaded document (a recipe when section is "",
  // else a fragment of that section) and returns the merged map.
  Node resolve(Node doc, const fs::path& dir, const std::string& section) {
    if (doc.is_null()) {
      Location loc = doc.loc;
      doc = Node{};
      doc.kind = Node::Kind::kMap;
      doc.loc = loc;
    }
    if (!doc.is_map()) {
      errors_->push_back(fmt::format("{}: {}expected a map of {} keys, got {}", doc.loc.str(),
                                     section.empty() ? "" : section + ": ",
                                     section.empty() ? "recipe" : section, doc.describe()));
      if (!section.empty()) broken_.insert(section);
      Node empty;
      empty.kind = Node::Kind::kMap;
      empty.loc = doc.loc;
      return empty;
    }
    Node merged;
    merged.kind = Node::Kind::kMap;
    merged.loc = doc.loc;
    if (const Node* inc = doc.find("include")) {
      std::vector<const Node*> files;
      if (inc->is_scalar()) {
        files.push_back(inc);
      } else if (inc->is_list()) {
        for (const Node& item : inc->items) files.push_back(&item);
      } else if (!inc->is_null()) {
        error(inc->loc, "include",
              fmt::format("expected a file or a list of files, got {}", inc->describe()));
      }
      for (const Node* f : files) {
        Node base;
        if (!f->is_scalar()) {
          error(f->loc, "include", fmt::format("expected a file, got {}", f->describe()));
        } else if (include(*f, dir, "include", section, &base)) {
          merge_into(&merged, std::move(base));
        }
      }
      doc.erase("include");
    }
    if (section.empty()) {
      for (auto& [key, value] : doc.entries) {
        if (!is_section(key)) continue;
        if (value.is_map() && value.find("include") != nullptr) {
          // A section map with its own include: fragments merged under it.
          value = resolve(std::move(value), dir, key);
          continue;
        }
        if (!is_fragment_path(value)) continue;
        Node fragment;
        if (include(value, dir, key, key, &fragment)) {
          value = std::move(fragment);
        } else {
          broken_.insert(key);
          value = Node{};
        }
      }
    }
    const Location loc = doc.loc;
    merge_into(&merged, std::move(doc));
    merged.loc = loc;
    return merged;
  }

  std::vector<std::string>* errors_;
  std::vector<Open> stack_;       // files being loaded, outermost first
  std::set<std::string> broken_;  // sections whose include failed
};

void Loader::apply_overrides(Node* root, const std::vector<std::string>& overrides) {
  for (const std::string& text : overrides) {
    Location at = Location::from_override(text);
    const bool erase = !text.empty() && text[0] == '~';
    size_t eq = text.find('=');
    if (!erase && eq == std::string::npos) {
      errors_->push_back(fmt::format(
          "{}: expected key.path=value (to set a key) or ~key.path (to delete it)", at.str()));
      continue;
    }
    std::string path = erase ? text.substr(1) : text.substr(0, eq);
    while (!path.empty() && path.back() == ' ') path.pop_back();
    while (!path.empty() && path.front() == ' ') path.erase(0, 1);
    std::string bad = check_key_path(path);
    if (!bad.empty()) {
      errors_->push_back(fmt::format("{}: {}", at.str(), bad));
      continue;
    }
    std::vector<std::string> parts = split(path, '.');
    if (!root->is_map()) continue;
    // Walk to the parent of the last key, making maps where there are none.
    Node* node = root;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      Node* child = node->find(parts[i]);
      if (child == nullptr || !child->is_map()) {
        if (erase) {
          node = nullptr;
          break;
        }
        Node map;
        map.kind = Node::Kind::kMap;
        map.loc = at;
        node->set(parts[i], std::move(map), at);
        child = node->find(parts[i]);
      }
      node = child;
    }
    if (erase) {
      if (node != nullptr) node->erase(parts.back());
      continue;
    }
    Node value;
    std::string why;
    if (!parse_override_value(std::string_view(text).substr(eq + 1), text, &value, &why)) {
      errors_->push_back(fmt::format("{}: {}: {}", at.str(), path, why));
      continue;
    }
    if (parts.size() == 1 && is_section(path) && is_fragment_path(value)) {
      Node fragment;
      if (!include(value, cwd(), path, path, &fragment)) continue;
      value = std::move(fragment);
    }
    node->set(parts.back(), std::move(value), at);
  }
}

LoadResult finish(Loader& loader, bool loaded, Node root, const std::string& name,
                  const std::vector<std::string>& overrides, std::vector<std::string>* errors,
                  bool check_files = true) {
  LoadResult result;
  if (loaded) {
    loader.apply_overrides(&root, overrides);
    build_recipe(root, name, loader.broken_sections(), check_files, &result.recipe, errors,
                 &result.warnings);
  }
  result.errors = std::move(*errors);
  return result;
}

}  // namespace

LoadResult try_load_recipe(const std::string& path, const std::vector<std::string>& overrides) {
  std::vector<std::string> errors;
  Loader loader(&errors);
  Node root;
  bool loaded = loader.load_recipe_file(path, &root);
  return finish(loader, loaded, std::move(root), path, overrides, &errors);
}

LoadResult try_parse_recipe(std::string_view yaml, const std::string& name,
                            const std::vector<std::string>& overrides) {
  std::vector<std::string> errors;
  Loader loader(&errors);
  Node root;
  bool loaded = loader.load_recipe_text(yaml, name, &root);
  return finish(loader, loaded, std::move(root), name, overrides, &errors);
}

LoadResult try_parse_stored_recipe(std::string_view yaml, const std::string& name) {
  std::vector<std::string> errors;
  Loader loader(&errors);
  Node root;
  bool loaded = loader.load_recipe_text(yaml, name, &root);
  return finish(loader, loaded, std::move(root), name, {}, &errors, /*check_files=*/false);
}

Recipe load_recipe(const std::string& path, const std::vector<std::string>& overrides) {
  LoadResult result = try_load_recipe(path, overrides);
  if (!result.ok()) {
    throw Error(ErrorKind::kUsage, fmt::format("{}", fmt::join(result.errors, "\n")));
  }
  return std::move(result.recipe);
}

}  // namespace fd::config
