// Internal to lib/config: a YAML document as a tree that remembers, for every
// key and value, where it was written. yaml-cpp's nodes are converted into
// this tree once; includes, overrides and validation all work on it.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fd::config {

// A source location: a file position, an override, or nothing (a default).
struct Location {
  std::string file;      // path as given or as resolved; "" for none
  int line = 0;          // 1-based; 0 = the whole file
  int col = 0;           // 1-based
  std::string override;  // the override text "k=v" when set from the command line

  static Location in_file(std::string file, int line = 0, int col = 0) {
    return {std::move(file), line, col, {}};
  }
  static Location from_override(std::string text) { return {{}, 0, 0, std::move(text)}; }

  // "file:line:col", "file", "override 'k=v'" or "<default>".
  std::string str() const;
};

struct Node {
  enum class Kind { kNull, kScalar, kList, kMap };

  Kind kind = Kind::kNull;
  Location loc;
  std::string scalar;       // kScalar: the text, quotes removed
  bool quoted = false;      // kScalar: written in quotes (so never a number/bool/null)
  std::vector<Node> items;  // kList
  // kMap: (key, value) in document order; key_locs[i] is where key i is written.
  std::vector<std::pair<std::string, Node>> entries;
  std::vector<Location> key_locs;  // parallel to entries

  // Defined in tree.cc, where Node is complete: clang 14 with libstdc++ 12
  // rejects the implicit ones (std::pair<std::string, Node> of an incomplete Node).
  Node();
  Node(const Node&);
  Node(Node&&) noexcept;
  Node& operator=(const Node&);
  Node& operator=(Node&&) noexcept;
  ~Node();

  bool is_null() const { return kind == Kind::kNull; }
  bool is_scalar() const { return kind == Kind::kScalar; }
  bool is_list() const { return kind == Kind::kList; }
  bool is_map() const { return kind == Kind::kMap; }

  // kMap: the value of `key`, or nullptr.
  const Node* find(std::string_view key) const;
  Node* find(std::string_view key);
  // kMap: the location of `key` itself (valid when find(key) != nullptr).
  const Location& key_loc(std::string_view key) const;
  // kMap: sets key to value (replacing in place, or appending).
  void set(const std::string& key, Node value, Location key_loc);
  // kMap: removes key; returns whether it was present.
  bool erase(std::string_view key);

  // "a map", "a list", "'text'" or "null": for "expected X, got Y" messages.
  std::string describe() const;
};

// Parses YAML text into a tree. Locations name `file`. Throws nothing: a
// syntax error is appended to errors ("file:line:col: YAML syntax error: ...")
// and a null node returned. Duplicate map keys are errors too.
Node parse_yaml(std::string_view text, const std::string& file, std::vector<std::string>* errors);

// Parses override value text (a YAML scalar or flow list/map); every node's
// location is the override `text`. Returns false and fills *error on bad YAML.
bool parse_override_value(std::string_view value, const std::string& text, Node* out,
                          std::string* error);

// Merges `over` onto `base`: maps merge key by key (recursively); anything
// else in `over` replaces what base had.
void merge_into(Node* base, Node over);

}  // namespace fd::config
