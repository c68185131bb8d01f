#include "lib/config/tree.h"

#include <fmt/format.h>
#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/yaml.h>

#include <unordered_map>

#include "lib/base/check.h"

namespace fd::config {

std::string Location::str() const {
  if (!override.empty()) return fmt::format("override '{}'", override);
  if (file.empty()) return "<default>";
  if (line <= 0) return file;
  return fmt::format("{}:{}:{}", file, line, col);
}

Node::Node() = default;
Node::Node(const Node&) = default;
Node::Node(Node&&) noexcept = default;
Node& Node::operator=(const Node&) = default;
Node& Node::operator=(Node&&) noexcept = default;
Node::~Node() = default;

const Node* Node::find(std::string_view key) const {
  for (const auto& [k, v] : entries) {
    if (k == key) return &v;
  }
  return nullptr;
}

Node* Node::find(std::string_view key) {
  return const_cast<Node*>(static_cast<const Node*>(this)->find(key));
}

const Location& Node::key_loc(std::string_view key) const {
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].first == key) return key_locs[i];
  }
  FD_CHECK(false, "key_loc of a missing key {}", key);
  return loc;
}

void Node::set(const std::string& key, Node value, Location kloc) {
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].first == key) {
      entries[i].second = std::move(value);
      key_locs[i] = std::move(kloc);
      return;
    }
  }
  entries.emplace_back(key, std::move(value));
  key_locs.push_back(std::move(kloc));
}

bool Node::erase(std::string_view key) {
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].first == key) {
      entries.erase(entries.begin() + static_cast<std::ptrdiff_t>(i));
      key_locs.erase(key_locs.begin() + static_cast<std::ptrdiff_t>(i));
      return true;
    }
  }
  return false;
}

std::string Node::describe() const {
  switch (kind) {
    case Kind::kNull:
      return "null";
    case Kind::kList:
      return "a list";
    case Kind::kMap:
      return "a map";
    case Kind::kScalar:
      return fmt::format("'{}'", scalar);
  }
  return "?";
}

namespace {

// A recipe is a few hundred values, a few levels deep. YAML aliases copy
// their anchor's whole tree into ours, so a short text can expand to billions
// of values ("billion laughs"), or, with an alias inside its own anchor, to an
// infinite tree: both are refused at these bounds rather than expanded.
constexpr size_t kMaxNodes = 100'000;
constexpr int kMaxDepth = 100;

// Converts yaml-cpp nodes, counting them against the bounds above.
struct Converter {
  const std::string& file;
  std::vector<std::string>* errors;
  size_t nodes = 0;
  bool too_big = false;  // a bound was hit (reported once); the tree is unusable

  // `fallback` is used when yaml-cpp gives no mark (an empty value such as
  // "key:" has none).
  Node convert(const YAML::Node& y, const Location& fallback, int depth);
};

Node Converter::convert(const YAML::Node& y, const Location& fallback, int depth) {
  Node n;
  const YAML::Mark m = y.Mark();
  n.loc = m.is_null() ? fallback : Location::in_file(file, m.line + 1, m.column + 1);
  if (too_big) return n;
  if (++nodes > kMaxNodes || depth > kMaxDepth) {
    too_big = true;
    errors->push_back(fmt::format(
        "{}: YAML error: the document {} (aliases '*name' that repeat large or "
        "self-referencing anchors?); write the recipe out without them",
        n.loc.str(),
        depth > kMaxDepth ? fmt::format("nests values more than {} levels deep", kMaxDepth)
                          : fmt::format("expands to more than {} values", kMaxNodes)));
    return n;
  }
  switch (y.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      n.kind = Node::Kind::kNull;
      break;
    case YAML::NodeType::Scalar:
      n.kind = Node::Kind::kScalar;
      n.scalar = y.Scalar();
      n.quoted = y.Tag() == "!";  // yaml-cpp tags quoted scalars "!", plain ones "?"
      break;
    case YAML::NodeType::Sequence:
      n.kind = Node::Kind::kList;
      for (const auto& item : y) n.items.push_back(convert(item, n.loc, depth + 1));
      break;
    case YAML::NodeType::Map: {
      n.kind = Node::Kind::kMap;
      std::unordered_map<std::string, size_t> seen;  // key -> index: linear in the map's size
      for (const auto& kv : y) {
        const YAML::Mark km = kv.first.Mark();
        Location kloc = km.is_null() ? n.loc : Location::in_file(file, km.line + 1, km.column + 1);
        if (!kv.first.IsScalar()) {
          errors->push_back(fmt::format("{}: map keys must be plain names, got {}", kloc.str(),
                                        kv.first.IsMap() ? "a map" : "a list"));
          continue;
        }
        const std::string key = kv.first.Scalar();
        if (auto [it, inserted] = seen.emplace(key, n.entries.size()); !inserted) {
          errors->push_back(fmt::format("{}: {}: duplicate key (first set at {})", kloc.str(), key,
                                        n.key_locs[it->second].str()));
          continue;
        }
        Node value = convert(kv.second, kloc, depth + 1);
        n.entries.emplace_back(key, std::move(value));
        n.key_locs.push_back(std::move(kloc));
      }
      break;
    }
  }
  return n;
}

// The 1-based column of the first tab in the indentation of line `line`
// (1-based) of `text`, or 0 when its indentation has none. yaml-cpp reports
// such a tab as "illegal map value" or "illegal tab when looking for
// indentation", at that line.
int tab_in_indentation(std::string_view text, int line) {
  size_t start = 0;
  for (int l = 1; l < line; ++l) {
    start = text.find('\n', start);
    if (start == std::string_view::npos) return 0;
    ++start;
  }
  for (size_t i = start; i < text.size() && (text[i] == ' ' || text[i] == '\t'); ++i) {
    if (text[i] == '\t') return int(i - start) + 1;
  }
  return 0;
}

void relocate(Node* n, const Location& loc) {
  n->loc = loc;
  for (auto& item : n->items) relocate(&item, loc);
  for (auto& [k, v] : n->entries) relocate(&v, loc);
  for (auto& kl : n->key_locs) kl = loc;
}

}  // namespace

Node parse_yaml(std::string_view text, const std::string& file, std::vector<std::string>* errors) {
  YAML::Node doc;
  try {
    doc = YAML::Load(std::string(text));
  } catch (const YAML::DeepRecursion& e) {
    // yaml-cpp's own parser stops at 500 levels ("bad file"): deeper than our bound anyway.
    const Location loc = e.mark.is_null()
                             ? Location::in_file(file)
                             : Location::in_file(file, e.mark.line + 1, e.mark.column + 1);
    errors->push_back(
        fmt::format("{}: nests values more than {} levels deep", loc.str(), kMaxDepth));
    return Node{};
  } catch (const YAML::ParserException& e) {
    if (!e.mark.is_null()) {
      if (int col = tab_in_indentation(text, e.mark.line + 1); col > 0) {
        errors->push_back(
            fmt::format("{}: YAML forbids tabs for indentation; indent this line with spaces",
                        Location::in_file(file, e.mark.line + 1, col).str()));
        return Node{};
      }
    }
    Location loc = e.mark.is_null() ? Location::in_file(file)
                                    : Location::in_file(file, e.mark.line + 1, e.mark.column + 1);
    errors->push_back(fmt::format("{}: YAML syntax error: {}", loc.str(), e.msg));
    return Node{};
  } catch (const YAML::Exception& e) {
    errors->push_back(fmt::format("{}: YAML error: {}", file, e.msg));
    return Node{};
  }
  Converter converter{file, errors};
  Node root = converter.convert(doc, Location::in_file(file, 1, 1), 0);
  return converter.too_big ? Node{} : root;
}

bool parse_override_value(std::string_view value, const std::string& text, Node* out,
                          std::string* error) {
  std::vector<std::string> errors;
  Node n = parse_yaml(value, "<override>", &errors);
  if (!errors.empty()) {
    // "<override>:1:5: YAML syntax error: ..." -> "YAML syntax error: ..."
    const std::string& e = errors.front();
    size_t pos = e.find(": ");
    *error = pos == std::string::npos ? e : e.substr(pos + 2);
    return false;
  }
  relocate(&n, Location::from_override(text));
  *out = std::move(n);
  return true;
}

void merge_into(Node* base, Node over) {
  if (!base->is_map() || !over.is_map()) {
    *base = std::move(over);
    return;
  }
  for (size_t i = 0; i < over.entries.size(); ++i) {
    auto& [key, value] = over.entries[i];
    Node* existing = base->find(key);
    if (existing != nullptr && existing->is_map() && value.is_map()) {
      merge_into(existing, std::move(value));
    } else {
      base->set(key, std::move(value), over.key_locs[i]);
    }
  }
}

}  // namespace fd::config
