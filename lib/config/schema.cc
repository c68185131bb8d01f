// The recipe schema and its validation. Every reader below reports a problem
// and carries on, so one pass finds all of a recipe's errors. Cross-field
// rules run only on fields that were themselves valid, so one mistake gives
// one message.
#include "lib/config/schema.h"

#include <fmt/format.h>
#include <glob.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <utility>

#include "lib/base/error.h"
#include "lib/base/file_type.h"
#include "lib/base/strings.h"
#include "lib/config/model_dir.h"
#include "lib/config/reference.h"
#include "lib/nn/config/hf_config.h"

namespace fd::config {
namespace {

namespace fs = std::filesystem;

struct Section {
  std::string name;
  std::vector<std::string> keys;
};

// The sections and their keys, from the recipe reference (reference.h): a
// key is accepted exactly when it is documented.
const std::vector<Section>& sections() {
  static const std::vector<Section> s = [] {
    std::vector<Section> out;
    for (const SectionDoc& sec : section_reference()) {
      Section section{sec.name, {}};
      for (const KeyDoc& k : key_reference()) {
        if (k.path.size() > sec.name.size() + 1 && k.path.rfind(sec.name + ".", 0) == 0) {
          // A nested key (zero.offload_optimizer.device) makes its map a key of the section.
          std::string key = k.path.substr(sec.name.size() + 1);
          key = key.substr(0, key.find('.'));
          if (std::find(section.keys.begin(), section.keys.end(), key) == section.keys.end())
            section.keys.push_back(std::move(key));
        }
      }
      out.push_back(std::move(section));
    }
    return out;
  }();
  return s;
}

const Section* find_section(std::string_view name) {
  for (const auto& s : sections()) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

// threads: a bound on BLAS threads per rank, to catch a typo (OpenBLAS would
// silently use fewer, the number it was built for).
constexpr int kMaxThreads = 1024;

std::string unknown_key(std::string_view path, std::string_view key,
                        const std::vector<std::string>& known) {
  std::string near = nearest(key, known);
  if (near.empty()) return fmt::format("{}: unknown key", path);
  return fmt::format("{}: unknown key; did you mean '{}'?", path, near);
}

std::string join_path(std::string_view a, std::string_view b) {
  return a.empty() ? std::string(b) : fmt::format("{}.{}", a, b);
}

// A numeric range; message() renders it as "must be >= 1", "must be in [0, 1)".
struct Range {
  std::optional<double> lo, hi;
  bool lo_open = false, hi_open = false;

  bool contains(double v) const {
    if (lo && (lo_open ? v <= *lo : v < *lo)) return false;
    if (hi && (hi_open ? v >= *hi : v > *hi)) return false;
    return true;
  }
  std::string message() const {
    if (lo && hi) {
      return fmt::format("must be in {}{}, {}{}", lo_open ? '(' : '[', *lo, *hi,
                         hi_open ? ')' : ']');
    }
    if (lo) return fmt::format("must be {} {}", lo_open ? ">" : ">=", *lo);
    if (hi) return fmt::format("must be {} {}", hi_open ? "<" : "<=", *hi);
    return "";
  }
};
Range at_least(double v) { return {v, std::nullopt, false, false}; }
Range above(double v) { return {v, std::nullopt, true, false}; }
Range closed(double a, double b) { return {a, b, false, false}; }
Range half_open(double a, double b) { return {a, b, false, true}; }

// A number read from a scalar: its value, or why there is none. A number
// too large for its type is not a type error: it is out of range, and is
// checked against the key's range as +-infinity (so `stage: 1e400` says
// "must be in [0, 3]"). A double too small in magnitude (1e-400) underflows.
template <typename T>
struct Parsed {
  enum class Status { kOk, kNotANumber, kOverflow, kUnderflow };
  Status status = Status::kNotANumber;
  T value{};
  bool negative = false;  // kOverflow: below the type's lowest value

  bool ok() const { return status == Status::kOk; }
  bool out_of_range() const { return status == Status::kOverflow || status == Status::kUnderflow; }
  // The value to check against a key's Range: +-infinity past the type's limits.
  double for_range() const {
    if (status == Status::kOverflow) return negative ? -HUGE_VAL : HUGE_VAL;
    return static_cast<double>(value);
  }
};

Parsed<int64_t> parse_int(std::string_view s) {
  Parsed<int64_t> r;
  if (!s.empty() && s[0] == '+') s.remove_prefix(1);
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), r.value);
  if (s.empty() || p != s.data() + s.size()) return r;
  if (ec == std::errc::result_out_of_range) {
    r.status = Parsed<int64_t>::Status::kOverflow;
    r.negative = s[0] == '-';
  } else if (ec == std::errc()) {
    r.status = Parsed<int64_t>::Status::kOk;
  }
  return r;
}

Parsed<double> parse_double(std::string_view s) {
  Parsed<double> r;
  if (!s.empty() && s[0] == '+') s.remove_prefix(1);
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), r.value);
  if (s.empty() || p != s.data() + s.size()) return r;
  if (ec == std::errc::result_out_of_range) {
    // from_chars says only "out of range": strtod tells overflow from underflow.
    const double v = std::strtod(std::string(s).c_str(), nullptr);
    r.status =
        std::isinf(v) ? Parsed<double>::Status::kOverflow : Parsed<double>::Status::kUnderflow;
    r.negative = std::signbit(v);
    r.value = std::isinf(v) ? 0.0 : v;
  } else if (ec == std::errc() && std::isfinite(r.value)) {
    r.status = Parsed<double>::Status::kOk;
  }
  return r;
}

std::optional<bool> parse_bool(std::string_view s) {
  for (auto t : {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"}) {
    if (s == t) return true;
  }
  for (auto f : {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"}) {
    if (s == f) return false;
  }
  return std::nullopt;
}

// A YAML value as JSON: maps and lists as such, an unquoted scalar as a boolean, null or
// number when it reads as one (as every other recipe value does), else a string.
nlohmann::ordered_json node_json(const Node& n) {
  switch (n.kind) {
    case Node::Kind::kNull:
      return nullptr;
    case Node::Kind::kList: {
      nlohmann::ordered_json a = nlohmann::ordered_json::array();
      for (const Node& item : n.items) a.push_back(node_json(item));
      return a;
    }
    case Node::Kind::kMap: {
      nlohmann::ordered_json o = nlohmann::ordered_json::object();
      for (const auto& [key, value] : n.entries) o[key] = node_json(value);
      return o;
    }
    case Node::Kind::kScalar:
      break;
  }
  if (n.quoted) return n.scalar;
  if (n.scalar == "null" || n.scalar == "~" || n.scalar == "Null" || n.scalar == "NULL")
    return nullptr;
  if (std::optional<bool> b = parse_bool(n.scalar)) return *b;
  if (Parsed<int64_t> i = parse_int(n.scalar); i.ok()) return i.value;
  if (Parsed<double> d = parse_double(n.scalar); d.ok()) return d.value;
  return n.scalar;
}

std::string current_dir() {
  std::error_code ec;
  fs::path p = fs::current_path(ec);
  return ec ? std::string(".") : p.string();
}

class Builder {
 public:
  Builder(const std::string& recipe_file, Recipe* r, std::vector<std::string>* errors,
          std::vector<std::string>* warnings, const std::set<std::string>& broken_sections,
          bool check_files)
      : file_(recipe_file),
        r_(r),
        errors_(errors),
        warnings_(warnings),
        bad_(broken_sections),
        check_files_(check_files) {}

  void build(const Node& root);

 private:
  // --- reporting ---------------------------------------------------------------
  void error(const std::string& loc, std::string_view path, std::string_view what) {
    errors_->push_back(fmt::format("{}: {}: {}", loc, path, what));
    bad_.insert(std::string(path));
  }
  void error(const Location& loc, std::string_view path, std::string_view what) {
    error(loc.str(), path, what);
  }
  void warning(const std::string& loc, std::string_view path, std::string_view what) {
    warnings_->push_back(fmt::format("{}: {}: {}", loc, path, what));
  }
  // True when a value at `path` or below it was reported bad.
  bool bad(std::string_view path) const {
    for (const auto& b : bad_) {
      if (b == path || (b.size() > path.size() && b.compare(0, path.size(), path) == 0 &&
                        (b[path.size()] == '.' || b[path.size()] == '['))) {
        return true;
      }
    }
    return false;
  }
  // Where `path` was set, or the recipe file when it was left at its default.
  std::string loc_of(std::string_view path) const {
    auto it = r_->sources.by_key.find(path);
    return it == r_->sources.by_key.end() ? file_ : it->second;
  }
  bool is_set(std::string_view path) const { return r_->sources.by_key.contains(path); }
  void record(const std::string& path, const Location& loc) {
    r_->sources.by_key[path] = loc.str();
  }

  // --- structure ---------------------------------------------------------------
  void check_keys(const Node& map, std::string_view path, const std::vector<std::string>& known) {
    for (size_t i = 0; i < map.entries.size(); ++i) {
      const std::string& key = map.entries[i].first;
      if (std::find(known.begin(), known.end(), key) == known.end()) {
        std::string full = join_path(path, key);
        errors_->push_back(
            fmt::format("{}: {}", map.key_locs[i].str(), unknown_key(full, key, known)));
        bad_.insert(full);
      }
    }
  }

  // The map of section `name`, or nullptr when the recipe has none (or it is
  // null, or not a map: an error). Records the section's location and reports
  // unknown keys.
  const Node* section(const Node& root, const std::string& name) {
    const Node* n = root.find(name);
    if (n == nullptr) return nullptr;
    record(name, root.key_loc(name));
    if (n->is_null()) return nullptr;
    if (!n->is_map()) {
      error(n->loc, name,
            fmt::format("expected a map of {} keys (or the path of a .yaml fragment), got {}", name,
                        n->describe()));
      return nullptr;
    }
    check_keys(*n, name, find_section(name)->keys);
    return n;
  }

  // The value of `key` in `map` (nullptr when absent); records its location.
  const Node* field(const Node* map, std::string_view sec, const std::string& key,
                    std::string* path) {
    *path = join_path(sec, key);
    if (map == nullptr) return nullptr;
    const Node* n = map->find(key);
    if (n != nullptr) record(*path, n->loc);
    return n;
  }

  // --- typed readers: true when the key was present and valid --------------------
  bool scalar_or_error(const Node& n, const std::string& path, std::string_view expected) {
    if (n.is_scalar()) return true;
    error(n.loc, path, fmt::format("expected {}, got {}", expected, n.describe()));
    return false;
  }

  bool get_int64(const Node* map, std::string_view sec, const std::string& key, int64_t* out,
                 Range range, int64_t max = INT64_MAX) {
    std::string path;
    const Node* n = field(map, sec, key, &path);
    if (n == nullptr || !scalar_or_error(*n, path, "an integer")) return false;
    Parsed<int64_t> v = parse_int(n->scalar);
    if (!v.ok() && !v.out_of_range()) {
      error(n->loc, path, fmt::format("expected an integer, got {}", n->describe()));
      return false;
    }
    if (!range.contains(v.for_range())) {
      error(n->loc, path, fmt::format("{}, got {}", range.message(), n->scalar));
      return false;
    }
    if (v.out_of_range()) {
      error(n->loc, path,
            fmt::format("{} is out of range for an integer (at most {})", n->scalar, max));
      return false;
    }
    if (v.value > max) {
      error(n->loc, path, fmt::format("must be <= {}, got {}", max, n->scalar));
      return false;
    }
    *out = v.value;
    return true;
  }

  bool get_int(const Node* map, std::string_view sec, const std::string& key, int* out,
               Range range) {
    int64_t v = 0;
    if (!get_int64(map, sec, key, &v, range, INT_MAX)) return false;
    *out = static_cast<int>(v);
    return true;
  }

  bool number(const Node& n, const std::string& path, Range range, double* out) {
    if (!scalar_or_error(n, path, "a number")) return false;
    Parsed<double> v = parse_double(n.scalar);
    if (!v.ok() && !v.out_of_range()) {
      error(n.loc, path, fmt::format("expected a number, got {}", n.describe()));
      return false;
    }
    if (v.status == Parsed<double>::Status::kUnderflow) {  // not 0, though it would read as 0
      error(n.loc, path,
            fmt::format("{} is out of range for a number (the smallest magnitude above 0 is "
                        "4.9e-324)",
                        n.scalar));
      return false;
    }
    if (!range.contains(v.for_range())) {
      error(n.loc, path, fmt::format("{}, got {}", range.message(), n.scalar));
      return false;
    }
    if (v.status == Parsed<double>::Status::kOverflow) {
      error(
          n.loc, path,
          fmt::format("{} is out of range for a number (at most 1.8e308 in magnitude)", n.scalar));
      return false;
    }
    *out = v.value;
    return true;
  }

  bool get_double(const Node* map, std::string_view sec, const std::string& key, double* out,
                  Range range) {
    std::string path;
    const Node* n = field(map, sec, key, &path);
    return n != nullptr && number(*n, path, range, out);
  }

  bool get_bool(const Node* map, std::string_view sec, const std::string& key, bool* out) {
    std::string path;
    const Node* n = field(map, sec, key, &path);
    if (n == nullptr || !scalar_or_error(*n, path, "true or false")) return false;
    std::optional<bool> v = parse_bool(n->scalar);
    if (!v) {
      error(n->loc, path, fmt::format("expected true or false, got {}", n->describe()));
      return false;
    }
    *out = *v;
    return true;
  }

  bool get_string(const Node* map, std::string_view sec, const std::string& key, std::string* out) {
    std::string path;
    const Node* n = field(map, sec, key, &path);
    if (n == nullptr) return false;
    if (n->is_null()) {  // "key:" or "key: null" is the empty string
      out->clear();
      return true;
    }
    if (!scalar_or_error(*n, path, "a string")) return false;
    *out = n->scalar;
    return true;
  }

  template <typename E>
  bool get_enum(const Node* map, std::string_view sec, const std::string& key,
                const std::vector<E>& values, E* out) {
    std::string path;
    const Node* n = field(map, sec, key, &path);
    if (n == nullptr) return false;
    std::vector<std::string> names;
    for (E v : values) names.emplace_back(to_string(v));
    std::string one_of = fmt::format("one of {}", fmt::join(names, ", "));
    if (!scalar_or_error(*n, path, one_of)) return false;
    for (E v : values) {
      if (n->scalar == to_string(v)) {
        *out = v;
        return true;
      }
    }
    std::string near = nearest(n->scalar, names);
    error(n->loc, path,
          fmt::format("expected {}, got {}{}", one_of, n->describe(),
                      near.empty() ? "" : fmt::format("; did you mean '{}'?", near)));
    return false;
  }

  // A path or list of paths/globs, expanded. Records "path[i]" per file.
  bool get_files(const Node* map, std::string_view sec, const std::string& key,
                 std::vector<std::string>* out) {
    std::string path;
    const Node* n = field(map, sec, key, &path);
    if (n == nullptr) return false;
    std::vector<const Node*> patterns;
    if (n->is_scalar()) {
      patterns.push_back(n);
    } else if (n->is_list()) {
      for (const Node& item : n->items) patterns.push_back(&item);
    } else if (n->is_null()) {
      out->clear();
      return true;
    } else {
      error(n->loc, path, fmt::format("expected a path or a list of paths, got {}", n->describe()));
      return false;
    }
    std::vector<std::string> files;
    bool ok = true;
    for (const Node* p : patterns) {
      if (!p->is_scalar()) {
        error(p->loc, path, fmt::format("expected a path, got {}", p->describe()));
        ok = false;
        continue;
      }
      std::string why;
      std::vector<std::string> matches =
          check_files_ ? expand(p->scalar, &why) : std::vector<std::string>{p->scalar};
      if (!why.empty()) {
        error(p->loc, path, why);
        ok = false;
        continue;
      }
      for (auto& m : matches) {
        if (std::find(files.begin(), files.end(), m) != files.end()) continue;
        record(fmt::format("{}[{}]", path, files.size()), p->loc);
        files.push_back(std::move(m));
      }
    }
    if (!ok) return false;
    *out = std::move(files);
    return true;
  }

  // Expands one path or glob into existing regular files; sets *why on failure.
  static std::vector<std::string> expand(const std::string& pattern, std::string* why) {
    std::vector<std::string> out;
    if (pattern.empty()) {
      *why = "expected a path, got ''";
      return out;
    }
    const std::string type = describe_file_type(pattern);
    if (type == "a regular file") return {pattern};
    if (type == "a directory") {
      *why = fmt::format(
          "'{}' is a directory, not a regular file; name the files in it (e.g. "
          "'{}/*')",
          pattern, pattern);
      return out;
    }
    if (!type.empty()) {
      *why = fmt::format("'{}' is {}, not a regular file; name text or token files", pattern, type);
      return out;
    }
    std::string skipped;  // the first match that is not a regular file
    glob_t g{};
    if (glob(pattern.c_str(), GLOB_TILDE, nullptr, &g) == 0) {
      for (size_t i = 0; i < g.gl_pathc; ++i) {
        const std::string match = g.gl_pathv[i];
        if (describe_file_type(match) == "a regular file") {
          out.push_back(match);
        } else if (skipped.empty()) {
          skipped = match;
        }
      }
    }
    globfree(&g);
    std::sort(out.begin(), out.end());
    if (out.empty() && !skipped.empty()) {
      *why = fmt::format("'{}' matches no regular file ('{}' is {}); name text or token files",
                         pattern, skipped, describe_file_type(skipped));
    } else if (out.empty()) {
      *why =
          fmt::format("no file matches '{}'; check the path (relative paths are resolved from {})",
                      pattern, current_dir());
    }
    return out;
  }

  // A list of block indices >= 0, sorted and unique, each < model.n_layer.
  bool index_list(const Node& n, const std::string& path, std::vector<int>* out) {
    std::vector<int> v;
    bool ok = true;
    for (const Node& item : n.items) {
      Parsed<int64_t> i = item.is_scalar() ? parse_int(item.scalar) : Parsed<int64_t>{};
      if (!i.ok() && !i.out_of_range()) {
        error(item.loc, path, fmt::format("expected a block index, got {}", item.describe()));
        ok = false;
      } else if (i.for_range() < 0) {
        error(item.loc, path, fmt::format("must be >= 0, got {}", item.scalar));
        ok = false;
      } else if (!bad("model.n_layer") && i.for_range() >= r_->model.n_layer) {
        error(item.loc, path,
              fmt::format("block {} does not exist (model.n_layer = {}, so blocks are 0..{})",
                          i.ok() ? fmt::format("{}", i.value) : item.scalar, r_->model.n_layer,
                          r_->model.n_layer - 1));
        ok = false;
      } else if (i.out_of_range()) {  // model.n_layer is itself bad: nothing to compare with
        ok = false;
      } else {
        v.push_back(static_cast<int>(i.value));
      }
    }
    if (!ok) return false;
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    *out = std::move(v);
    return true;
  }

  std::vector<int> all_blocks(int every) const {
    std::vector<int> v;
    for (int i = 0; i < r_->model.n_layer; i += every) v.push_back(i);
    return v;
  }

  // --- sections ------------------------------------------------------------------
  void model(const Node& root);
  void quantize(const Node* model_section);
  void llama_family(const Node* model_section);
  void model_directory();
  void data(const Node& root);
  void batch(const Node& root);
  void optimizer(const Node& root);
  void schedule(const Node& root);
  void loss_scale(const Node& root);
  void zero(const Node& root);
  void offload(const Node* zero, const std::string& key, const std::vector<OffloadDevice>& devices,
               OffloadOptions* out);
  void dist(const Node& root);
  void parallel(const Node& root);
  void lora(const Node& root);
  void objective(const Node& root);
  void activation_checkpointing(const Node& root);
  void checkpoint(const Node& root);
  void logging(const Node& root);
  void top_level(const Node& root);
  void cross_checks();
  void offload_checks();
  void reduce_checks();
  void pipeline_checks();
  void tensor_checks();
  void zeropp_checks();
  void sequence_checks();
  void quantize_checks();
  void objective_checks();
  void reference_matches(const ModelOptions& reference);

  // model.n_layer is the model's: valid, and (from a Hugging Face directory) read from it.
  bool n_layer_known() const {
    return !bad("model.n_layer") && !bad("model.init_from") && !(model_from_dir_ && bad("model"));
  }

  const std::string& file_;
  Recipe* r_;
  std::vector<std::string>* errors_;
  std::vector<std::string>* warnings_;
  std::set<std::string> bad_;    // key paths reported bad
  bool check_files_;             // the files the recipe names must exist
  bool model_from_dir_ = false;  // model.init_from is a Hugging Face model directory
  // That directory's quantization_config (transformers' bitsandbytes 4-bit), when it has one.
  std::optional<HfQuantization> dir_quantization_;
};

void Builder::build(const Node& root) {
  if (!root.is_map()) {
    errors_->push_back(
        fmt::format("{}: expected a map of recipe keys, got {}", root.loc.str(), root.describe()));
    return;
  }
  check_keys(root, "", top_level_keys());
  model(root);  // first: later sections check block indices against n_layer
  data(root);
  batch(root);
  optimizer(root);
  schedule(root);
  loss_scale(root);
  zero(root);
  dist(root);
  parallel(root);
  lora(root);
  objective(root);
  activation_checkpointing(root);
  checkpoint(root);
  logging(root);
  top_level(root);
  cross_checks();
}

void Builder::model(const Node& root) {
  const Node* s = section(root, "model");
  auto& m = r_->model;
  get_enum(s, "model", "arch",
           std::vector<Arch>{Arch::kGpt2, Arch::kLlama, Arch::kMistral, Arch::kQwen2, Arch::kQwen3},
           &m.arch);
  get_int(s, "model", "n_layer", &m.n_layer, at_least(1));
  get_int(s, "model", "n_head", &m.n_head, at_least(1));
  get_int(s, "model", "d_model", &m.d_model, at_least(1));
  get_int(s, "model", "vocab_size", &m.vocab_size, at_least(1));
  get_int(s, "model", "max_seq_len", &m.max_seq_len, at_least(1));
  get_string(s, "model", "init_from", &m.init_from);
  quantize(s);
  std::error_code ec;
  model_from_dir_ = check_files_ && !m.init_from.empty() && !bad("model.init_from") &&
                    std::filesystem::is_directory(m.init_from, ec);
  llama_family(s);
  if (check_files_ && !m.init_from.empty() && !bad("model.init_from")) {
    if (!std::filesystem::exists(m.init_from, ec))
      error(loc_of("model.init_from"), "model.init_from",
            fmt::format("no such file or directory '{}'; give a Hugging Face model directory "
                        "(config.json + model.safetensors), an fdtrain export (fdtrain ckpt "
                        "export) or a Hugging Face GPT-2 model.safetensors",
                        m.init_from));
    else if (std::filesystem::is_directory(m.init_from, ec))
      model_directory();
  }
}

// model.init_from is a Hugging Face model directory: its config.json decides
// the model section. Keys the recipe sets anyway must say the same.
void Builder::model_directory() {
  auto& m = r_->model;
  const std::string dir = m.init_from;
  ModelOptions d;
  try {
    ModelDirectory read = read_model_directory(dir);
    d = read.model;
    dir_quantization_ = read.quantization;
  } catch (const Error& e) {
    error(loc_of("model.init_from"), "model.init_from", e.what());
    return;
  }
  auto num = [](double v) { return fmt::format("{}", v); };
  auto yes = [](bool v) { return std::string(v ? "true" : "false"); };
  const std::pair<const char*, std::pair<std::string, std::string>> keys[] = {
      {"arch", {std::string(to_string(m.arch)), std::string(to_string(d.arch))}},
      {"n_layer", {num(m.n_layer), num(d.n_layer)}},
      {"n_head", {num(m.n_head), num(d.n_head)}},
      {"d_model", {num(m.d_model), num(d.d_model)}},
      {"vocab_size", {num(m.vocab_size), num(d.vocab_size)}},
      {"max_seq_len", {num(m.max_seq_len), num(d.max_seq_len)}},
      {"n_kv_head", {num(m.n_kv_head), num(d.n_kv_head)}},
      {"head_dim", {num(m.head_dim), num(d.head_dim)}},
      {"d_ff", {num(m.d_ff), num(d.d_ff)}},
      {"norm_eps", {num(m.norm_eps), num(d.norm_eps)}},
      {"rope_theta", {num(m.rope_theta), num(d.rope_theta)}},
      {"rope_scaling",
       {std::string(to_string(m.rope_scaling)), std::string(to_string(d.rope_scaling))}},
      {"rope_factor", {num(m.rope_factor), num(d.rope_factor)}},
      {"rope_low_freq_factor", {num(m.rope_low_freq_factor), num(d.rope_low_freq_factor)}},
      {"rope_high_freq_factor", {num(m.rope_high_freq_factor), num(d.rope_high_freq_factor)}},
      {"rope_original_max_seq_len",
       {num(m.rope_original_max_seq_len), num(d.rope_original_max_seq_len)}},
      {"tie_embeddings", {yes(m.tie_embeddings), yes(d.tie_embeddings)}},
      {"attention_bias", {yes(m.attention_bias), yes(d.attention_bias)}},
      {"mlp_bias", {yes(m.mlp_bias), yes(d.mlp_bias)}},
      {"qk_norm", {yes(m.qk_norm), yes(d.qk_norm)}},
  };
  bool agree = true;
  for (const auto& [key, values] : keys) {
    const std::string path = std::string("model.") + key;
    if (!is_set(path) || bad(path) || values.first == values.second) continue;
    error(loc_of(path), path,
          fmt::format("is {} but {}/config.json says {}; leave it out: a Hugging Face directory "
                      "in model.init_from decides the model",
                      values.first, dir, values.second));
    agree = false;
  }
  if (!agree) return;
  d.init_from = m.init_from;
  d.quantize = m.quantize;  // the recipe's, checked against the directory's by quantize_checks()
  m = d;
}

// model.quantize: absent or null (the base in the compute dtype), or a map whose keys default
// to bitsandbytes'. A map with a bad value still turns quantization on, so that the checks
// that depend on it (quantize_checks) do not report a second, misleading problem.
void Builder::quantize(const Node* s) {
  std::string path;
  const Node* n = field(s, "model", "quantize", &path);
  if (n == nullptr || n->is_null()) return;
  if (!n->is_map()) {
    error(n->loc, path,
          fmt::format("expected a map ({{type: nf4 | fp4, block_size: N, double_quant: true | "
                      "false}}) or null, got {}",
                      n->describe()));
    return;
  }
  std::vector<std::string> keys;
  for (const KeyDoc& k : key_reference())
    if (k.path.rfind(path + ".", 0) == 0) keys.push_back(k.path.substr(path.size() + 1));
  check_keys(*n, path, keys);
  QuantizeOptions q;
  get_enum(n, path, "type", std::vector<QuantTypeName>{QuantTypeName::kNf4, QuantTypeName::kFp4},
           &q.type);
  int block_size = q.block_size;
  if (get_int(n, path, "block_size", &block_size, Range{})) {
    if (std::find(kQuantBlockSizes.begin(), kQuantBlockSizes.end(), block_size) ==
        kQuantBlockSizes.end())
      error(loc_of(path + ".block_size"), path + ".block_size",
            fmt::format("{} is not a block size of bitsandbytes' 4-bit kernels; use one of {} "
                        "(64 is bitsandbytes' and QLoRA's default)",
                        block_size, fmt::join(kQuantBlockSizes, ", ")));
    else
      q.block_size = block_size;
  }
  get_bool(n, path, "double_quant", &q.double_quant);
  r_->model.quantize = q;
}

// The Llama family's keys: refused for gpt2 (whose shape the five keys
// above fix), read and then completed with the family's defaults otherwise.
void Builder::llama_family(const Node* s) {
  auto& m = r_->model;
  static const char* const kKeys[] = {"n_kv_head",
                                      "head_dim",
                                      "d_ff",
                                      "norm_eps",
                                      "rope_theta",
                                      "rope_scaling",
                                      "rope_factor",
                                      "rope_low_freq_factor",
                                      "rope_high_freq_factor",
                                      "rope_original_max_seq_len",
                                      "tie_embeddings",
                                      "attention_bias",
                                      "mlp_bias",
                                      "qk_norm"};
  if (bad("model.arch")) return;
  // From a model directory the keys are read whatever model.arch says: the
  // directory's config.json decides, and model_directory() compares.
  if (m.arch == Arch::kGpt2 && !model_from_dir_) {
    for (const char* k : kKeys) {
      std::string path;
      if (const Node* n = field(s, "model", k, &path))
        error(n->loc, path,
              fmt::format("is a setting of the Llama family (model.arch llama, mistral, qwen2, "
                          "qwen3); a gpt2 model's shape is n_layer, n_head, d_model, vocab_size "
                          "and max_seq_len (MLP 4 x d_model, LayerNorm, tied head)"));
    }
    return;
  }
  const bool qwen = m.arch == Arch::kQwen2 || m.arch == Arch::kQwen3;
  m.n_kv_head = 0;
  m.head_dim = 0;
  m.norm_eps = qwen ? 1e-6 : 1e-5;
  m.rope_theta = qwen ? 1e6 : 10000.0;
  get_int(s, "model", "n_kv_head", &m.n_kv_head, at_least(1));
  get_int(s, "model", "head_dim", &m.head_dim, at_least(2));
  if (!model_from_dir_ && (s == nullptr || s->find("d_ff") == nullptr))
    error(s == nullptr ? file_ : loc_of("model"), "model.d_ff",
          fmt::format("required for model.arch {}: the MLP's inner width (intermediate_size in "
                      "a Hugging Face config.json)",
                      to_string(m.arch)));
  else
    get_int(s, "model", "d_ff", &m.d_ff, at_least(1));
  get_double(s, "model", "norm_eps", &m.norm_eps, above(0));
  get_double(s, "model", "rope_theta", &m.rope_theta, above(0));
  get_enum(s, "model", "rope_scaling",
           std::vector<RopeScalingName>{RopeScalingName::kNone, RopeScalingName::kLinear,
                                        RopeScalingName::kLlama3},
           &m.rope_scaling);
  get_double(s, "model", "rope_factor", &m.rope_factor, above(0));
  get_double(s, "model", "rope_low_freq_factor", &m.rope_low_freq_factor, above(0));
  get_double(s, "model", "rope_high_freq_factor", &m.rope_high_freq_factor, above(0));
  get_int(s, "model", "rope_original_max_seq_len", &m.rope_original_max_seq_len, at_least(0));
  get_bool(s, "model", "tie_embeddings", &m.tie_embeddings);
  m.attention_bias = m.arch == Arch::kQwen2;
  m.qk_norm = m.arch == Arch::kQwen3;
  get_bool(s, "model", "attention_bias", &m.attention_bias);
  get_bool(s, "model", "qk_norm", &m.qk_norm);
  get_bool(s, "model", "mlp_bias", &m.mlp_bias);
  if (m.mlp_bias && m.arch != Arch::kLlama)
    error(loc_of("model.mlp_bias"), "model.mlp_bias",
          fmt::format("{} models have no MLP biases (only llama's config has mlp_bias)",
                      to_string(m.arch)));
  if (m.arch == Arch::kQwen2 && !m.attention_bias)
    error(loc_of("model.attention_bias"), "model.attention_bias",
          "qwen2 models always have q/k/v biases; use model.arch llama for a model without them");
  if (m.arch == Arch::kQwen3 && !m.qk_norm)
    error(loc_of("model.qk_norm"), "model.qk_norm",
          "qwen3 models always normalise q and k; use model.arch qwen2 or llama for a model "
          "without q/k norm");
  if (m.n_kv_head == 0 && !bad("model.n_head")) m.n_kv_head = m.n_head;
  if (m.head_dim == 0 && !bad("model.n_head") && !bad("model.d_model"))
    m.head_dim = m.d_model / m.n_head;
}

void Builder::data(const Node& root) {
  const Node* s = section(root, "data");
  auto& d = r_->data;
  get_enum(s, "data", "format",
           std::vector<DataFormat>{DataFormat::kText, DataFormat::kTokens, DataFormat::kChat,
                                   DataFormat::kInstruct, DataFormat::kPreference},
           &d.format);
  if (bad("data")) {
    // Reported already: a failed include or a misspelt key in the section.
  } else if (s == nullptr || s->find("train") == nullptr) {
    error(s == nullptr ? file_ : loc_of("data"), "data.train", "required key is missing");
  } else if (get_files(s, "data", "train", &d.train) && d.train.empty()) {
    error(loc_of("data.train"), "data.train", "must name at least one file");
  }
  get_files(s, "data", "val", &d.val);
  get_double(s, "data", "val_fraction", &d.val_fraction, closed(0, 0.5));
  get_int(s, "data", "seq_len", &d.seq_len, at_least(1));
  if (get_string(s, "data", "tokenizer", &d.tokenizer) && !d.tokenizer.empty() &&
      d.format == DataFormat::kTokens && !bad("data.format")) {
    error(loc_of("data.tokenizer"), "data.tokenizer",
          "a tokenizer reads text; data.format tokens files are already tokens (remove "
          "data.tokenizer, or set data.format: text)");
  }
  get_string(s, "data", "chat_template", &d.chat_template);
  {
    std::string path;
    const Node* n = field(s, "data", "template_vars", &path);
    if (n != nullptr && n->is_map()) {
      try {
        d.template_vars = n->entries.empty() ? "" : node_json(*n).dump();
      } catch (const nlohmann::json::exception&) {  // a string that is not UTF-8
        error(n->loc, path, "holds text that is not valid UTF-8");
      }
    } else if (n != nullptr && !n->is_null()) {
      error(n->loc, path,
            fmt::format("expected a map of template variables (as apply_chat_template(**kwargs) "
                        "takes them, e.g. {{enable_thinking: false}}), got {}",
                        n->describe()));
    }
  }
  get_bool(s, "data", "train_on_prompt", &d.train_on_prompt);
  get_bool(s, "data", "packing", &d.packing);
  get_enum(s, "data", "packing_order",
           std::vector<PackingOrderName>{PackingOrderName::kBestFit, PackingOrderName::kFirstCome},
           &d.packing_order);
  get_enum(s, "data", "truncation",
           std::vector<TruncationName>{TruncationName::kError, TruncationName::kRight,
                                       TruncationName::kLeft},
           &d.truncation);
  get_enum(s, "data", "on_bad_record",
           std::vector<BadRecordName>{BadRecordName::kError, BadRecordName::kSkip},
           &d.on_bad_record);
  get_int(s, "data", "max_length", &d.max_length, at_least(0));
  if (d.max_length == 1 && !bad("data.max_length"))
    error(loc_of("data.max_length"), "data.max_length",
          "must be >= 2 (a prompt token and an answer token), or 0 for data.seq_len / 2 + 1");
  for (auto [key, out] :
       {std::pair{"messages_field", &d.messages_field},
        std::pair{"instruction_field", &d.instruction_field},
        std::pair{"input_field", &d.input_field}, std::pair{"output_field", &d.output_field},
        std::pair{"text_field", &d.text_field}}) {
    const std::string path = std::string("data.") + key;
    if (get_string(s, "data", key, out) && out->empty())
      error(loc_of(path), path, "must name a JSON key");
  }
  if (bad("data.format")) return;
  // Keys that mean something only for some formats: a value other than the default is
  // refused elsewhere (a resolved recipe, as checkpoints store it, names every key).
  const bool chat_like = d.format == DataFormat::kChat || d.format == DataFormat::kInstruct;
  const bool preference = d.format == DataFormat::kPreference;
  const DataOptions defaults;
  auto only_for = [&](const char* key, bool non_default, bool ok, const char* which) {
    const std::string path = std::string("data.") + key;
    if (is_set(path) && non_default && !ok && !bad(path)) {
      error(loc_of(path), path,
            fmt::format("applies to {}; data.format is {}", which, to_string(d.format)));
    }
  };
  const char* examples =
      "fine-tuning examples (data.format chat, instruct or preference, or text with "
      "data.packing)";
  // Keys of example data that preference pairs have no use for, each with the reason.
  auto not_for_preference = [&](const char* key, bool non_default, const char* why) {
    const std::string path = std::string("data.") + key;
    if (preference && is_set(path) && non_default && !bad(path))
      error(loc_of(path), path, fmt::format("does not apply to data.format preference: {}", why));
  };
  not_for_preference("train_on_prompt", d.train_on_prompt,
                     "a pair's loss is on its answers (the objective decides whether the chosen "
                     "prompt is scored too, as ORPO does)");
  not_for_preference("truncation", d.truncation != defaults.truncation,
                     "each sequence keeps its first data.max_length tokens and a pair whose "
                     "prompt alone is that long is dropped, as TRL does; set data.max_length");
  only_for("chat_template", !d.chat_template.empty(), chat_like || preference,
           "data.format chat, instruct and preference");
  only_for("template_vars", !d.template_vars.empty(), chat_like || preference,
           "data.format chat, instruct and preference");
  if (!preference) {
    only_for("train_on_prompt", d.train_on_prompt, chat_like, "data.format chat and instruct");
  }
  only_for("max_length", d.max_length != defaults.max_length, preference, "data.format preference");
  if (preference && is_set("data.max_length") && !bad("data.max_length") && !bad("data.seq_len") &&
      2 * int64_t(d.max_length - 1) > d.seq_len) {
    error(loc_of("data.max_length"), "data.max_length",
          fmt::format("{} is too long for data.seq_len {}: a pair's chosen and rejected sequences "
                      "share one row of data.seq_len positions ({} each at most); raise "
                      "data.seq_len or lower data.max_length (at most data.seq_len / 2 + 1 = {})",
                      d.max_length, d.seq_len, d.max_length - 1, d.seq_len / 2 + 1));
  }
  // Resolved here, so that config.yaml and a checkpoint's recipe say the length the run used.
  if (preference && d.max_length == 0 && !bad("data.seq_len")) d.max_length = d.seq_len / 2 + 1;
  only_for("messages_field", d.messages_field != defaults.messages_field,
           d.format == DataFormat::kChat, "data.format chat");
  only_for("instruction_field", d.instruction_field != defaults.instruction_field,
           d.format == DataFormat::kInstruct, "data.format instruct");
  only_for("input_field", d.input_field != defaults.input_field, d.format == DataFormat::kInstruct,
           "data.format instruct");
  only_for("output_field", d.output_field != defaults.output_field,
           d.format == DataFormat::kInstruct, "data.format instruct");
  only_for("text_field", d.text_field != defaults.text_field, d.format == DataFormat::kText,
           "data.format text");
  only_for("packing", d.packing, d.format != DataFormat::kTokens,
           "data.format chat, instruct and text (token files are one stream)");
  if (is_set("data.packing_order") && d.packing_order != defaults.packing_order && !d.packing &&
      !bad("data.packing_order") && !bad("data.packing")) {
    error(loc_of("data.packing_order"), "data.packing_order",
          "applies to packed rows; set data.packing: true (or remove data.packing_order)");
  }
  if (!preference)
    only_for("truncation", d.truncation != defaults.truncation, d.examples(), examples);
  only_for("on_bad_record", d.on_bad_record != defaults.on_bad_record, d.examples(), examples);
  if ((chat_like || preference || d.packing) && d.tokenizer.empty() && !bad("data.tokenizer") &&
      !bad("data.packing")) {
    error(s == nullptr ? file_ : loc_of("data"), "data.tokenizer",
          fmt::format("data.format {}{} needs the model's tokenizer: set data.tokenizer to a "
                      "directory with tokenizer.json (a Hugging Face model directory)",
                      to_string(d.format),
                      d.packing && !chat_like && !preference ? " with data.packing" : ""));
  }
}

void Builder::batch(const Node& root) {
  const Node* s = section(root, "batch");
  auto& b = r_->batch;
  get_int(s, "batch", "micro", &b.micro, at_least(1));
  get_int(s, "batch", "accumulation", &b.accumulation, at_least(1));
  get_int(s, "batch", "global", &b.global, at_least(0));
}

void Builder::optimizer(const Node& root) {
  const Node* s = section(root, "optimizer");
  auto& o = r_->optimizer;
  get_enum(s, "optimizer", "name", std::vector<OptimizerName>{OptimizerName::kAdamW}, &o.name);
  get_double(s, "optimizer", "lr", &o.lr, above(0));
  std::string path;
  if (const Node* n = field(s, "optimizer", "betas", &path)) {
    if (!n->is_list() || n->items.size() != 2) {
      error(
          n->loc, path,
          fmt::format("expected a list of two numbers [beta1, beta2], got {}",
                      n->is_list() ? fmt::format("a list of {}", n->items.size()) : n->describe()));
    } else {
      std::array<double, 2> betas{};
      bool ok = number(n->items[0], path, half_open(0, 1), &betas[0]);
      ok = number(n->items[1], path, half_open(0, 1), &betas[1]) && ok;
      if (ok) o.betas = betas;
    }
  }
  get_double(s, "optimizer", "eps", &o.eps, above(0));
  get_double(s, "optimizer", "weight_decay", &o.weight_decay, at_least(0));
  get_double(s, "optimizer", "grad_clip", &o.grad_clip, at_least(0));
}

void Builder::schedule(const Node& root) {
  const Node* s = section(root, "schedule");
  auto& sc = r_->schedule;
  get_enum(s, "schedule", "name",
           std::vector<ScheduleName>{ScheduleName::kConstant, ScheduleName::kCosine}, &sc.name);
  get_int(s, "schedule", "warmup_steps", &sc.warmup_steps, at_least(0));
  get_double(s, "schedule", "min_lr", &sc.min_lr, at_least(0));
}

void Builder::loss_scale(const Node& root) {
  const Node* s = section(root, "loss_scale");
  auto& l = r_->loss_scale;
  get_double(s, "loss_scale", "loss_scale", &l.loss_scale, at_least(0));
  get_int(s, "loss_scale", "initial_scale_power", &l.initial_scale_power, closed(0, 126));
  get_int(s, "loss_scale", "loss_scale_window", &l.loss_scale_window, at_least(1));
  get_int(s, "loss_scale", "hysteresis", &l.hysteresis, at_least(1));
  get_bool(s, "loss_scale", "consecutive_hysteresis", &l.consecutive_hysteresis);
  get_double(s, "loss_scale", "min_loss_scale", &l.min_loss_scale, above(0));
}

void Builder::zero(const Node& root) {
  const Node* s = section(root, "zero");
  auto& z = r_->zero;
  get_int(s, "zero", "stage", &z.stage, closed(0, 3));
  get_bool(s, "zero", "overlap_comm", &z.overlap_comm);
  get_enum(s, "zero", "reduce_dtype",
           std::vector<Precision>{Precision::kFp32, Precision::kBf16, Precision::kFp16},
           &z.reduce_dtype);
  get_int(s, "zero", "reductions_in_flight", &z.reductions_in_flight, closed(1, 64));
  offload(s, "offload_optimizer",
          {OffloadDevice::kNone, OffloadDevice::kHost, OffloadDevice::kNvme}, &z.offload_optimizer);
  offload(s, "offload_params", {OffloadDevice::kNone, OffloadDevice::kNvme}, &z.offload_params);
  get_bool(s, "zero", "quantized_weights", &z.quantized_weights);
  get_bool(s, "zero", "hierarchical_partition", &z.hierarchical_partition);
  get_enum(
      s, "zero", "quantized_gradients",
      std::vector<GradientCodes>{GradientCodes::kNone, GradientCodes::kInt8, GradientCodes::kInt4},
      &z.quantized_gradients);
}

void Builder::offload(const Node* zero, const std::string& key,
                      const std::vector<OffloadDevice>& devices, OffloadOptions* out) {
  std::string path;
  const Node* n = field(zero, "zero", key, &path);
  if (n == nullptr || n->is_null()) return;
  if (!n->is_map()) {
    error(n->loc, path,
          fmt::format("expected a map ({}), got {}",
                      key == "offload_optimizer" ? "{device: none | nvme, path: DIR, buffer_mib: N}"
                                                 : "{device: none | nvme}",
                      n->describe()));
    return;
  }
  std::vector<std::string> keys;
  for (const KeyDoc& k : key_reference())
    if (k.path.rfind(path + ".", 0) == 0) keys.push_back(k.path.substr(path.size() + 1));
  check_keys(*n, path, keys);
  get_enum(n, path, "device", devices, &out->device);
  if (key == "offload_optimizer") {
    get_string(n, path, "path", &out->path);
    get_int(n, path, "buffer_mib", &out->buffer_mib, closed(1, 1 << 20));
  }
}

void Builder::dist(const Node& root) {
  const Node* s = section(root, "dist");
  get_double(s, "dist", "timeout_s", &r_->dist.timeout_s, above(0));
  get_bool(s, "dist", "hierarchical", &r_->dist.hierarchical);
}

void Builder::parallel(const Node& root) {
  const Node* s = section(root, "parallel");
  auto& p = r_->parallel;
  get_int(s, "parallel", "pipeline", &p.pipeline, at_least(1));
  get_int(s, "parallel", "tensor", &p.tensor, at_least(1));
  get_bool(s, "parallel", "sequence_parallel", &p.sequence_parallel);
  get_int(s, "parallel", "sequence", &p.sequence, at_least(1));
  get_enum(s, "parallel", "schedule",
           std::vector<PipelineSchedule>{PipelineSchedule::k1F1B, PipelineSchedule::kGPipe},
           &p.schedule);
  std::string path;
  const Node* n = field(s, "parallel", "partition", &path);
  if (n == nullptr) return;
  const char* expected =
      "expected parameters, uniform or a list of transformer blocks per stage ([3, 5])";
  if (n->is_scalar() && n->scalar == "parameters") {
    p.partition = PartitionName::kParameters;
    p.partition_blocks.clear();
  } else if (n->is_scalar() && n->scalar == "uniform") {
    p.partition = PartitionName::kUniform;
    p.partition_blocks.clear();
  } else if (n->is_list() && !n->items.empty()) {
    std::vector<int> blocks;
    bool ok = true;
    for (size_t i = 0; i < n->items.size(); ++i) {
      const Node& item = n->items[i];
      Parsed<int64_t> v = item.is_scalar() ? parse_int(item.scalar) : Parsed<int64_t>{};
      if (!v.ok() && !v.out_of_range()) {
        error(item.loc, path,
              fmt::format("stage {}: expected a number of transformer blocks, got {}", i,
                          item.describe()));
        ok = false;
      } else if (v.for_range() < 1) {
        error(item.loc, path,
              fmt::format("stage {} gets {} blocks; every stage needs at least one transformer "
                          "block (the embedding rides with the first stage, the final norm, head "
                          "and loss with the last)",
                          i, item.scalar));
        ok = false;
      } else if (v.out_of_range() || v.value > INT_MAX) {
        error(item.loc, path,
              fmt::format("stage {}: {} is out of range for an integer (at most {})", i,
                          item.scalar, INT_MAX));
        ok = false;
      } else {
        blocks.push_back(static_cast<int>(v.value));
      }
    }
    if (ok) {
      p.partition = PartitionName::kList;
      p.partition_blocks = std::move(blocks);
    }
  } else if (n->is_scalar()) {
    std::string near = nearest(n->scalar, {"parameters", "uniform"});
    error(n->loc, path,
          fmt::format("{}, got {}{}", expected, n->describe(),
                      near.empty() ? "" : fmt::format("; did you mean '{}'?", near)));
  } else {
    error(n->loc, path, fmt::format("{}, got {}", expected, n->is_list() ? "[]" : n->describe()));
  }
}

void Builder::lora(const Node& root) {
  const Node* s = section(root, "lora");
  if (s == nullptr) {
    if (root.find("lora") == nullptr || root.find("lora")->is_null()) r_->lora.reset();
    return;
  }
  LoraOptions l;
  if (s->find("r") == nullptr) {
    if (!bad("lora")) error(loc_of("lora"), "lora.r", "required key is missing");
  } else {
    get_int(s, "lora", "r", &l.r, at_least(1));
  }
  l.alpha = l.r;
  get_double(s, "lora", "alpha", &l.alpha, above(0));
  get_double(s, "lora", "dropout", &l.dropout, half_open(0, 1));
  get_string(s, "lora", "adapter", &l.adapter);
  if (check_files_ && !l.adapter.empty() && !bad("lora.adapter") &&
      !std::filesystem::exists(std::filesystem::path(l.adapter) / "adapter_config.json")) {
    error(loc_of("lora.adapter"), "lora.adapter",
          fmt::format("'{}' is not a PEFT adapter directory (no adapter_config.json); give a "
                      "directory written by `fdtrain ckpt export --lora-adapter` or by PEFT",
                      l.adapter));
  }
  const bool gpt2 = bad("model.arch") || r_->model.arch == Arch::kGpt2;
  const std::vector<std::string> kLoraTargets =
      nn::lora_target_names(config::decoder_config(r_->model).family);
  if (!gpt2) l.targets = {"q_proj", "v_proj"};  // PEFT's default for the Llama family
  std::string path;
  if (const Node* n = field(s, "lora", "targets", &path)) {
    if (!n->is_list() || n->items.empty()) {
      error(n->loc, path,
            fmt::format("expected a non-empty list of layer names ({}), got {}",
                        fmt::join(kLoraTargets, ", "), n->is_list() ? "[]" : n->describe()));
    } else {
      std::vector<std::string> targets;
      for (const Node& t : n->items) {
        if (t.is_scalar() &&
            std::find(kLoraTargets.begin(), kLoraTargets.end(), t.scalar) != kLoraTargets.end()) {
          if (std::find(targets.begin(), targets.end(), t.scalar) == targets.end()) {
            targets.push_back(t.scalar);
          }
          continue;
        }
        if (t.is_scalar() && (t.scalar == "lm_head" || t.scalar == "embed_tokens" ||
                              t.scalar == "wte" || t.scalar == "wpe")) {
          error(t.loc, path,
                fmt::format("{} cannot get adapters: LoRA goes on the blocks' linear layers ({}); "
                            "the embedding and the head stay frozen",
                            t.scalar, fmt::join(kLoraTargets, ", ")));
          continue;
        }
        std::string near = t.is_scalar() ? nearest(t.scalar, kLoraTargets) : "";
        error(t.loc, path,
              fmt::format("a {} model has no layer {}; expected one of {}{}",
                          to_string(r_->model.arch), t.describe(), fmt::join(kLoraTargets, ", "),
                          near.empty() ? "" : fmt::format("; did you mean '{}'?", near)));
      }
      if (!bad(path)) l.targets = std::move(targets);
    }
  }
  if (const Node* n = field(s, "lora", "layers", &path)) {
    if (n->is_scalar() && n->scalar == "all") {
      l.layers.clear();
    } else if (n->is_list() && !n->items.empty()) {
      index_list(*n, path, &l.layers);
    } else {
      error(n->loc, path,
            fmt::format("expected 'all' or a non-empty list of block indices, got {}",
                        n->is_list() ? "[]" : n->describe()));
    }
  }
  r_->lora = std::move(l);
}

void Builder::activation_checkpointing(const Node& root) {
  const Node* s = section(root, "activation_checkpointing");
  std::string path;
  const Node* n = field(s, "activation_checkpointing", "layers", &path);
  if (n == nullptr) return;
  auto& layers = r_->activation_checkpointing.layers;
  const char* expected = "expected none, all, a list of block indices or {every: k}";
  if (n->is_scalar() && n->scalar == "none") {
    layers.clear();
  } else if (n->is_scalar() && n->scalar == "all") {
    layers = all_blocks(1);
  } else if (n->is_list()) {
    index_list(*n, path, &layers);
  } else if (n->is_map()) {
    check_keys(*n, path, {"every"});
    int every = 1;
    if (n->find("every") == nullptr) {
      error(n->loc, path + ".every", "required key is missing");
    } else if (get_int(n, path, "every", &every, at_least(1))) {
      layers = all_blocks(every);
    }
  } else {
    error(n->loc, path, fmt::format("{}, got {}", expected, n->describe()));
  }
}

void Builder::checkpoint(const Node& root) {
  const Node* s = section(root, "checkpoint");
  get_int(s, "checkpoint", "every", &r_->checkpoint.every, at_least(0));
  get_int(s, "checkpoint", "keep_last", &r_->checkpoint.keep_last, at_least(1));
  get_bool(s, "checkpoint", "at_end", &r_->checkpoint.at_end);
  get_bool(s, "checkpoint", "async", &r_->checkpoint.async);
}

void Builder::logging(const Node& root) {
  const Node* s = section(root, "logging");
  auto& l = r_->logging;
  get_int(s, "logging", "every", &l.every, at_least(1));
  get_int(s, "logging", "eval_every", &l.eval_every, at_least(0));
  get_int(s, "logging", "eval_batches", &l.eval_batches, at_least(1));
  get_int(s, "logging", "sample_tokens", &l.sample_tokens, at_least(0));
  get_string(s, "logging", "sample_prompt", &l.sample_prompt);
  get_double(s, "logging", "sample_temperature", &l.sample_temperature, above(0));
  get_int(s, "logging", "sample_top_k", &l.sample_top_k, at_least(0));
}

void Builder::top_level(const Node& root) {
  get_enum(&root, "", "precision",
           std::vector<Precision>{Precision::kFp32, Precision::kBf16, Precision::kFp16},
           &r_->precision);
  get_enum(&root, "", "device", std::vector<DeviceName>{DeviceName::kCpu, DeviceName::kCuda},
           &r_->device);
  get_bool(&root, "", "tf32", &r_->tf32);
  get_int(&root, "", "threads", &r_->threads, closed(1, kMaxThreads));
  get_int64(&root, "", "seed", &r_->seed, at_least(0));
  if (root.find("steps") == nullptr) {
    error(file_, "steps", "required key is missing");
  } else {
    get_int64(&root, "", "steps", &r_->steps, at_least(1));
  }
  get_double(&root, "", "max_loss", &r_->max_loss, at_least(0.0));
  // A preference objective's loss has its own scale (IPO starts at (1 / (2 beta))^2, the robust
  // loss grows as label_smoothing nears 0.5): only a non-finite loss ends such a run unless the
  // recipe sets a threshold (resolved here, so config.yaml says 0).
  if (r_->objective && !is_set("max_loss")) r_->max_loss = 0.0;
}

void Builder::cross_checks() {
  const auto& m = r_->model;
  const bool gpt2 = !bad("model.arch") && m.arch == Arch::kGpt2;
  if (!gpt2 && !bad("model.arch") && !bad("model.n_head") && !bad("model.n_kv_head") &&
      m.n_kv_head > 0 && m.n_head % m.n_kv_head != 0)
    error(loc_of("model.n_kv_head"), "model.n_kv_head",
          fmt::format("{} does not divide model.n_head ({}); each key/value head serves the "
                      "same number of query heads",
                      m.n_kv_head, m.n_head));
  if (!gpt2 && !bad("model.arch") && !bad("model.head_dim") && !bad("model.n_head") &&
      !bad("model.d_model") && (m.head_dim < 2 || m.head_dim % 2 != 0)) {
    const std::string at = is_set("model.head_dim") ? "model.head_dim" : "model.d_model";
    error(loc_of(at), at,
          fmt::format("head_dim is {} (d_model / n_head unless model.head_dim is set); RoPE "
                      "rotates pairs, so it must be even and >= 2",
                      m.head_dim));
  }
  if (!gpt2 && !bad("model.arch") && m.rope_scaling == RopeScalingName::kLlama3) {
    if (m.rope_original_max_seq_len < 1)
      error(loc_of(is_set("model.rope_original_max_seq_len") ? "model.rope_original_max_seq_len"
                                                             : "model.rope_scaling"),
            "model.rope_original_max_seq_len",
            "llama3 RoPE scaling needs the context the model was trained at before scaling "
            "(original_max_position_embeddings)");
    if (!(m.rope_high_freq_factor > m.rope_low_freq_factor))
      error(loc_of("model.rope_high_freq_factor"), "model.rope_high_freq_factor",
            fmt::format("must be above model.rope_low_freq_factor ({}), got {}",
                        m.rope_low_freq_factor, m.rope_high_freq_factor));
  }
  if (gpt2 && !bad("model.d_model") && !bad("model.n_head") && m.d_model % m.n_head != 0) {
    std::string at = is_set("model.d_model") ? "model.d_model" : "model.n_head";
    error(loc_of(at), at,
          fmt::format("model.d_model ({}) must be divisible by model.n_head ({})", m.d_model,
                      m.n_head));
  }
  const auto& d = r_->data;
  if (!bad("data.seq_len") && !bad("model.max_seq_len") && d.seq_len > m.max_seq_len) {
    if (is_set("data.seq_len")) {
      error(loc_of("data.seq_len"), "data.seq_len",
            fmt::format("{} is longer than the model's context (model.max_seq_len = {})", d.seq_len,
                        m.max_seq_len));
    } else {
      error(loc_of("model.max_seq_len"), "model.max_seq_len",
            fmt::format("{} is shorter than data.seq_len ({} by default); set data.seq_len",
                        m.max_seq_len, d.seq_len));
    }
  }
  if (!bad("data.format") && !bad("logging.sample_prompt") && d.format == DataFormat::kTokens &&
      !r_->logging.sample_prompt.empty()) {
    error(loc_of("logging.sample_prompt"), "logging.sample_prompt",
          "a text prompt needs data.format text (fdtrain has no tokenizer for token files); "
          "remove the prompt to sample from <|endoftext|>");
  }
  if (!bad("data.format") && !bad("model.vocab_size") && d.format == DataFormat::kText &&
      d.tokenizer.empty() && m.vocab_size < 256) {
    error(loc_of("model.vocab_size"), "model.vocab_size",
          fmt::format("data.format text needs vocab_size >= 256 (one token per byte), got {}",
                      m.vocab_size));
  }
  const auto& b = r_->batch;
  if (!bad("batch") && b.global != 0 && b.global % (b.micro * b.accumulation) != 0) {
    error(loc_of("batch.global"), "batch.global",
          fmt::format("{} is not a multiple of batch.micro * batch.accumulation ({} * {} = {})",
                      b.global, b.micro, b.accumulation, b.micro * b.accumulation));
  }
  const auto& s = r_->schedule;
  if (s.name == ScheduleName::kCosine && !bad("schedule") && !bad("optimizer.lr") &&
      s.min_lr > r_->optimizer.lr) {
    error(loc_of("schedule.min_lr"), "schedule.min_lr",
          fmt::format("{} is above optimizer.lr ({}); cosine decays from lr down to min_lr",
                      s.min_lr, r_->optimizer.lr));
  }
  offload_checks();
  reduce_checks();
  pipeline_checks();
  tensor_checks();
  sequence_checks();
  zeropp_checks();
  quantize_checks();
  objective_checks();
  // Warnings: valid, but probably not what was meant.
  if (!bad("schedule.warmup_steps") && !bad("steps") && s.warmup_steps > r_->steps) {
    warning(loc_of("schedule.warmup_steps"), "schedule.warmup_steps",
            fmt::format("{} is more than steps ({}): the learning rate never reaches its peak",
                        s.warmup_steps, r_->steps));
  }
}

void Builder::offload_checks() {
  const auto& z = r_->zero;
  for (const char* key : {"zero.offload_optimizer", "zero.offload_params"}) {
    const bool optimizer = std::string_view(key) == "zero.offload_optimizer";
    const OffloadOptions& o = optimizer ? z.offload_optimizer : z.offload_params;
    if (bad(key)) continue;
    const std::string dev = fmt::format("{}.device", key), path = fmt::format("{}.path", key),
                      buffer = fmt::format("{}.buffer_mib", key);
    // Set to a value that would do nothing (the resolved recipe prints the defaults).
    if (o.device != OffloadDevice::kNvme && !o.path.empty())
      error(loc_of(path), path,
            fmt::format("is only used with device: nvme (device is {}); remove it",
                        to_string(o.device)));
    if (o.device == OffloadDevice::kNone && o.buffer_mib != OffloadOptions{}.buffer_mib)
      error(loc_of(buffer), buffer,
            "is only used when the optimizer state is offloaded (device "
            "is none); remove it");
    if (optimizer && o.device == OffloadDevice::kNvme) {
      if (o.path.empty()) {
        error(loc_of(is_set(path) ? path : dev), path,
              "required with device: nvme: an existing directory on a fast local disk; each "
              "rank keeps one file there (fdtrain estimate says how large)");
      } else if (check_files_) {
        std::error_code ec;
        if (!std::filesystem::exists(o.path, ec))
          error(loc_of(path), path,
                fmt::format("{} does not exist; create the directory (on a fast local disk) "
                            "first",
                            o.path));
        else if (!std::filesystem::is_directory(o.path, ec))
          error(loc_of(path), path,
                fmt::format("{} is {}, not a directory", o.path, describe_file_type(o.path)));
      }
    }
    if (o.device == OffloadDevice::kHost && r_->device == DeviceName::kCpu)
      error(loc_of(dev), dev,
            "host on a cpu run: the optimizer state already lives in host memory, which is the "
            "default placement (device: none); use nvme to move it out of memory");
    if (!optimizer && o.device == OffloadDevice::kNvme && r_->device == DeviceName::kCuda)
      error(loc_of(dev), dev,
            "parameter offload of a GPU run is not supported yet (each gather would need its "
            "partition copied to the GPU first); offload the optimizer state alone "
            "(zero.offload_optimizer.device: host or nvme)");
    if (!optimizer && o.device != OffloadDevice::kNone && !bad("zero.stage") && z.stage < 3)
      error(loc_of(dev), dev,
            fmt::format("parameters are partitioned only by ZeRO stage 3; at stage {} every "
                        "rank holds all of them, so there is no partition to offload: set "
                        "zero.stage: 3, or remove zero.offload_params",
                        z.stage));
    else if (!optimizer && o.device == OffloadDevice::kNvme &&
             z.offload_optimizer.device != OffloadDevice::kNvme && !bad("zero.offload_optimizer"))
      error(loc_of(dev), dev,
            "the parameters are offloaded into the optimizer's file (each step rewrites them "
            "from their fp32 master copy, which must not stay in memory either): set "
            "zero.offload_optimizer.device: nvme and its path too");
  }
  // An asynchronous save stages the saved state in memory; ZeRO-Infinity's is in its file, and
  // is saved as it streams from there (resolved here, so config.yaml says false).
  if (!bad("zero.offload_optimizer") && z.offload_optimizer.device == OffloadDevice::kNvme &&
      r_->checkpoint.async) {
    if (is_set("checkpoint.async") && !bad("checkpoint.async"))
      error(loc_of("checkpoint.async"), "checkpoint.async",
            "true cannot stage the optimizer state of zero.offload_optimizer.device: nvme in "
            "memory (keeping it out of memory is what the offload is for); its checkpoints are "
            "written as the state streams from its file: set checkpoint.async: false");
    else
      r_->checkpoint.async = false;
  }
}

// zero.reduce_dtype against precision; reductions_in_flight against overlap_comm.
void Builder::reduce_checks() {
  const auto& z = r_->zero;
  if (!bad("zero.reduce_dtype") && !bad("precision") && z.reduce_dtype != Precision::kFp32 &&
      z.reduce_dtype != r_->precision) {
    const std::string want(to_string(z.reduce_dtype)), have(to_string(r_->precision));
    error(loc_of("zero.reduce_dtype"), "zero.reduce_dtype",
          r_->precision == Precision::kFp32
              ? fmt::format("{} does not match precision ({}): fp32 gradients are reduced in "
                            "fp32; use fp32 (or set precision: {})",
                            want, have, want)
              : fmt::format("{} does not match precision ({}): gradients are reduced in fp32 "
                            "(fp32 staging, the default) or in the 16-bit dtype they are "
                            "computed in; use fp32 or {}",
                            want, have, have));
  }
  if (!bad("zero.reductions_in_flight") && !bad("zero.overlap_comm") && !z.overlap_comm &&
      z.reductions_in_flight != ZeroOptions{}.reductions_in_flight)
    error(loc_of("zero.reductions_in_flight"), "zero.reductions_in_flight",
          "is only used with zero.overlap_comm: true (without overlap every reduction completes "
          "before the next is launched); remove it");
}

// parallel against the model and ZeRO. The world size is not known here:
// check_world_size() (recipe.h) checks that the stages divide it.
void Builder::pipeline_checks() {
  const ParallelOptions& p = r_->parallel;
  if (bad("parallel.pipeline")) return;
  const int n_layer = r_->model.n_layer;
  bool too_many_stages = false;
  if (n_layer_known() && p.pipeline > n_layer) {
    too_many_stages = true;
    error(loc_of("parallel.pipeline"), "parallel.pipeline",
          fmt::format("{} stages but the model has {} transformer block(s) (model.n_layer); "
                      "each stage needs at least one block (the embedding rides with the first "
                      "stage, the final norm, head and loss with the last): set "
                      "parallel.pipeline to at most {}",
                      p.pipeline, n_layer, n_layer));
  }
  if (!bad("parallel.partition") && p.partition == PartitionName::kList) {
    const int stages = static_cast<int>(p.partition_blocks.size());
    int64_t sum = 0;
    for (int b : p.partition_blocks) sum += b;
    if (stages != p.pipeline) {
      error(loc_of("parallel.partition"), "parallel.partition",
            fmt::format("lists {} stage(s) but parallel.pipeline is {}; give one block count "
                        "per stage",
                        stages, p.pipeline));
    } else if (!too_many_stages && n_layer_known() && sum != n_layer) {
      error(loc_of("parallel.partition"), "parallel.partition",
            fmt::format("the blocks per stage sum to {} but the model has {} "
                        "(model.n_layer); every transformer block belongs to exactly one "
                        "stage",
                        sum, n_layer));
    }
  }
  if (!bad("zero.stage")) {
    const bool offload =
        !bad("zero.offload_params") && r_->zero.offload_params.device != OffloadDevice::kNone;
    if (const std::string why = zero_stage_refusal(p, r_->zero.stage, offload); !why.empty())
      error(loc_of(is_set("zero.stage") ? "zero.stage" : "parallel.pipeline"), "zero.stage", why);
  }
  // A warning: valid, but the pipeline would stand mostly idle.
  if (p.pipeline > 1 && !bad("batch.accumulation") && r_->batch.accumulation < p.pipeline) {
    const int m = r_->batch.accumulation;
    warning(loc_of(is_set("batch.accumulation") ? "batch.accumulation" : "parallel.pipeline"),
            "batch.accumulation",
            fmt::format("{} micro-batch(es) per step through {} pipeline stages: each stage "
                        "idles {:.0f}% of the step ((P-1)/(M+P-1)); the pipeline's micro-batches "
                        "are batch.accumulation's, so raise it (>= 4 x parallel.pipeline keeps "
                        "the idle time under 20%)",
                        m, p.pipeline, 100.0 * (p.pipeline - 1) / double(m + p.pipeline - 1)));
  }
}

// parallel.tensor against the model (Megatron's splits: nn::tensor_parallel_refusal) and the
// features tensor parallelism does not combine with yet. The world size is not known here:
// check_world_size() checks that pipeline x tensor divides it.
void Builder::tensor_checks() {
  const int T = r_->parallel.tensor;
  if (r_->parallel.sequence_parallel && !bad("parallel.sequence_parallel") &&
      !bad("parallel.tensor") && T <= 1)
    error(loc_of("parallel.sequence_parallel"), "parallel.sequence_parallel",
          "splits the sequence over the tensor-parallel ranks, and parallel.tensor is 1: set "
          "parallel.tensor to 2 or more, or remove sequence_parallel");
  if (bad("parallel.tensor") || T <= 1) return;
  if (r_->parallel.sequence_parallel && !bad("data.seq_len") && r_->data.seq_len % T != 0)
    error(loc_of("parallel.sequence_parallel"), "parallel.sequence_parallel",
          fmt::format("splits each sequence of data.seq_len {} tokens over the {} "
                      "tensor-parallel ranks, which do not divide it ({} % {} = {}): set "
                      "data.seq_len to a multiple of {}",
                      r_->data.seq_len, T, r_->data.seq_len, T, r_->data.seq_len % T, T));
  const std::string at = loc_of("parallel.tensor");
  auto refuse = [&](const std::string& what) { error(at, "parallel.tensor", what); };
  if (!bad("model") && !bad("model.init_from")) {
    const std::string why = nn::tensor_parallel_refusal(decoder_config(r_->model), T);
    if (!why.empty())
      refuse(
          fmt::format("{}: the model's heads, MLP width and vocabulary split over the "
                      "tensor-parallel ranks; set parallel.tensor to a divisor of the query "
                      "heads ({}) and of the MLP's width",
                      why, r_->model.n_head));
  }
  if (r_->device == DeviceName::kCuda && !bad("device"))
    refuse(
        "with device: cuda: tensor parallelism runs on the CPU backend only so far (its "
        "collectives and sharded ops have no CUDA path yet); use device: cpu");
  // QLoRA: each rank keeps the whole weight's 4-bit blocks of its slices, so the slices must
  // hold whole blocks.
  if (r_->model.quantize && !bad("model.quantize") && !bad("model") && !bad("model.init_from")) {
    const nn::DecoderConfig c = decoder_config(r_->model);
    if (nn::tensor_parallel_refusal(c, T).empty()) {
      const std::string why =
          nn::quantized_tensor_parallel_refusal(c, T, r_->model.quantize->block_size);
      if (!why.empty())
        error(loc_of(is_set("model.quantize.block_size") ? "model.quantize.block_size"
                                                         : "parallel.tensor"),
              "model.quantize.block_size",
              fmt::format("with parallel.tensor {}: {}; change model.quantize.block_size or "
                          "lower parallel.tensor",
                          T, why));
    }
  }
}

// ZeRO++ (zero.quantized_weights, hierarchical_partition, quantized_gradients) and
// dist.hierarchical against the stage and the device. The hosts are known only at start:
// dist::HierarchicalCommunicator refuses a placement it cannot split by host.
void Builder::zeropp_checks() {
  const ZeroOptions& z = r_->zero;
  const bool cuda = r_->device == DeviceName::kCuda && !bad("device");
  struct Switch {
    const char* key;
    bool on;
    const char* what;
  };
  const Switch switches[] = {
      {"zero.quantized_weights", z.quantized_weights, "quantizes stage 3's parameter gathers"},
      {"zero.hierarchical_partition", z.hierarchical_partition,
       "keeps a copy of stage 3's gathered parameters partitioned inside each host"},
      {"zero.quantized_gradients", z.quantized_gradients != GradientCodes::kNone,
       "quantizes stage 3's gradient reduce-scatter"},
  };
  for (const Switch& w : switches) {
    if (!w.on || bad(w.key)) continue;
    if (!bad("zero.stage") && z.stage != 3)
      error(loc_of(w.key), w.key,
            fmt::format("is ZeRO++, which {}: it needs zero.stage: 3 (zero.stage is {}); set "
                        "zero.stage: 3 or remove {}",
                        w.what, z.stage, w.key));
    if (cuda)
      error(loc_of(w.key), w.key,
            "with device: cuda: ZeRO++ runs on the CPU backend (MPI) only so far (its codes "
            "are encoded and summed on the host); use device: cpu or remove it");
  }
  if (z.hierarchical_partition && !bad("zero.hierarchical_partition") &&
      !bad("zero.offload_params") && z.offload_params.device != OffloadDevice::kNone)
    error(loc_of("zero.hierarchical_partition"), "zero.hierarchical_partition",
          "with zero.offload_params: hpZ keeps 1/L of the gathered parameters in memory, which "
          "parameter offload exists to avoid; use one of them");
  if (z.quantized_gradients != GradientCodes::kNone && !bad("zero.quantized_gradients") &&
      !bad("zero.reduce_dtype") && z.reduce_dtype != Precision::kFp32)
    error(loc_of("zero.reduce_dtype"), "zero.reduce_dtype",
          fmt::format("{} with zero.quantized_gradients: the quantized reduction sums its decoded "
                      "codes in fp32 whatever the dtype; remove zero.reduce_dtype (or "
                      "zero.quantized_gradients)",
                      to_string(z.reduce_dtype)));
  if (r_->dist.hierarchical && !bad("dist.hierarchical") && cuda)
    error(loc_of("dist.hierarchical"), "dist.hierarchical",
          "with device: cuda: NCCL already runs its collectives by host (rings and trees over "
          "NVLink inside a node, the network across); the setting is for the CPU backend (MPI): "
          "remove it");
}

// parallel.sequence (DeepSpeed-Ulysses) against the sequence length and the heads, and the
// features it does not combine with yet. The world size: check_world_size().
void Builder::sequence_checks() {
  const int S = r_->parallel.sequence;
  if (bad("parallel.sequence") || S <= 1) return;
  const std::string at = loc_of("parallel.sequence");
  auto refuse = [&](const std::string& what) { error(at, "parallel.sequence", what); };
  if (!bad("data.seq_len") && r_->data.seq_len % S != 0)
    refuse(
        fmt::format("splits each sequence of data.seq_len {} tokens over {} ranks, which do "
                    "not divide it ({} % {} = {}): set data.seq_len to a multiple of {}",
                    r_->data.seq_len, S, r_->data.seq_len, S, r_->data.seq_len % S, S));
  const int T = bad("parallel.tensor") ? 1 : r_->parallel.tensor;
  if (!bad("model") && !bad("model.init_from")) {
    const nn::DecoderConfig c = decoder_config(r_->model);
    if (nn::tensor_parallel_refusal(c, T).empty()) {
      const std::string why = nn::ulysses_refusal(c, T, S);
      if (!why.empty())
        refuse(
            fmt::format("{}: attention's heads are exchanged over the sequence-parallel "
                        "ranks; set parallel.sequence to a divisor of them",
                        why));
    }
  }
  if (r_->parallel.sequence_parallel && !bad("parallel.sequence_parallel"))
    refuse(
        "with parallel.sequence_parallel: Ulysses and Megatron's sequence parallelism both "
        "split the sequence; use one of them");
  if (r_->device == DeviceName::kCuda && !bad("device"))
    refuse(
        "with device: cuda: Ulysses runs on the CPU backend only so far (its all-to-all "
        "exchanges have no CUDA path in the model yet); use device: cpu");
}

// objective: absent or null (next-token loss), or a map; the keys an objective ignores are
// refused when set, as current TRL ignores them (docs/OBJECTIVES.md).
void Builder::objective(const Node& root) {
  const Node* s = section(root, "objective");
  if (s == nullptr) {
    r_->objective.reset();
    return;
  }
  ObjectiveOptions o;
  if (s->find("name") == nullptr) {
    if (!bad("objective"))
      error(loc_of("objective"), "objective.name", "required key is missing (dpo, simpo or orpo)");
  } else {
    get_enum(s, "objective", "name",
             std::vector<ObjectiveName>{ObjectiveName::kDpo, ObjectiveName::kSimpo,
                                        ObjectiveName::kOrpo},
             &o.name);
  }
  get_enum(s, "objective", "loss_type",
           std::vector<DpoLossName>{DpoLossName::kSigmoid, DpoLossName::kIpo, DpoLossName::kHinge,
                                    DpoLossName::kRobust},
           &o.loss_type);
  get_double(s, "objective", "beta", &o.beta, above(0));
  get_double(s, "objective", "label_smoothing", &o.label_smoothing, half_open(0, 0.5));
  get_double(s, "objective", "gamma", &o.gamma, Range{});
  get_double(s, "objective", "cpo_alpha", &o.cpo_alpha, at_least(0));
  get_string(s, "objective", "reference", &o.reference);
  r_->objective = o;
  if (bad("objective.name")) return;
  // Keys that the chosen objective would ignore, set to something else than their default (a
  // resolved recipe, as config.yaml and checkpoints store it, names every key).
  const std::string name(to_string(o.name));
  const ObjectiveOptions defaults;
  auto only = [&](const char* key, bool non_default, bool used, const std::string& why) {
    const std::string path = std::string("objective.") + key;
    if (is_set(path) && !bad(path) && non_default && !used)
      error(loc_of(path), path, fmt::format("is not used by objective.name {}: {}", name, why));
  };
  const bool dpo = o.name == ObjectiveName::kDpo, simpo = o.name == ObjectiveName::kSimpo;
  only("loss_type", o.loss_type != defaults.loss_type, dpo, "it picks DPO's loss; remove it");
  only("label_smoothing", o.label_smoothing != defaults.label_smoothing,
       (dpo && o.loss_type == DpoLossName::kRobust) || simpo,
       "current TRL uses it only in DPO's robust loss and in SimPO (cDPO's smoothed sigmoid is "
       "gone); remove it, or use loss_type: robust");
  only("gamma", o.gamma != defaults.gamma, simpo, "it is SimPO's target margin; remove it");
  only("cpo_alpha", o.cpo_alpha != defaults.cpo_alpha, simpo,
       "it weighs SimPO's NLL term; remove it");
  only("reference", !o.reference.empty(), dpo,
       "only DPO compares with a reference model (SimPO and ORPO are reference-free); remove it");
  if (dpo && !o.reference.empty() && check_files_ && !bad("objective.reference")) {
    std::error_code ec;
    if (!std::filesystem::is_directory(o.reference, ec)) {
      error(loc_of("objective.reference"), "objective.reference",
            fmt::format("'{}' is not a directory; give a Hugging Face model directory "
                        "(config.json + model.safetensors) of the policy's architecture",
                        o.reference));
      return;
    }
    try {
      const ModelDirectory ref = read_model_directory(o.reference);
      if (!bad("model")) reference_matches(ref.model);
    } catch (const Error& e) {
      error(loc_of("objective.reference"), "objective.reference", e.what());
    }
  }
}

// A reference directory is the policy's twin: its architecture, shape and vocabulary.
void Builder::reference_matches(const ModelOptions& ref) {
  const ModelOptions& m = r_->model;
  auto yes = [](bool v) { return std::string(v ? "true" : "false"); };
  auto num = [](double v) { return fmt::format("{}", v); };
  const std::pair<const char*, std::pair<std::string, std::string>> keys[] = {
      {"arch", {std::string(to_string(m.arch)), std::string(to_string(ref.arch))}},
      {"vocab_size", {std::to_string(m.vocab_size), std::to_string(ref.vocab_size)}},
      {"n_layer", {std::to_string(m.n_layer), std::to_string(ref.n_layer)}},
      {"d_model", {std::to_string(m.d_model), std::to_string(ref.d_model)}},
      {"n_head", {std::to_string(m.n_head), std::to_string(ref.n_head)}},
      {"n_kv_head", {std::to_string(m.n_kv_head), std::to_string(ref.n_kv_head)}},
      {"head_dim", {std::to_string(m.head_dim), std::to_string(ref.head_dim)}},
      {"d_ff", {std::to_string(m.d_ff), std::to_string(ref.d_ff)}},
      {"tie_embeddings", {yes(m.tie_embeddings), yes(ref.tie_embeddings)}},
      {"attention_bias", {yes(m.attention_bias), yes(ref.attention_bias)}},
      {"mlp_bias", {yes(m.mlp_bias), yes(ref.mlp_bias)}},
      {"qk_norm", {yes(m.qk_norm), yes(ref.qk_norm)}},
      {"norm_eps", {num(m.norm_eps), num(ref.norm_eps)}},
      {"rope_theta", {num(m.rope_theta), num(ref.rope_theta)}},
      {"rope_scaling",
       {std::string(to_string(m.rope_scaling)), std::string(to_string(ref.rope_scaling))}},
      {"rope_factor", {num(m.rope_factor), num(ref.rope_factor)}},
      {"rope_low_freq_factor", {num(m.rope_low_freq_factor), num(ref.rope_low_freq_factor)}},
      {"rope_high_freq_factor", {num(m.rope_high_freq_factor), num(ref.rope_high_freq_factor)}},
      {"rope_original_max_seq_len",
       {num(m.rope_original_max_seq_len), num(ref.rope_original_max_seq_len)}},
  };
  for (const auto& [key, values] : keys) {
    if (values.first == values.second) continue;
    error(loc_of("objective.reference"), "objective.reference",
          fmt::format("{} is a model with {} {}, the policy has {}: a reference must be the "
                      "policy's architecture with the same vocabulary and shape (it is computed "
                      "by the policy's own model with the reference's weights)",
                      r_->objective->reference, key, values.second, values.first));
    return;
  }
}

// The objective against the data and the device.
void Builder::objective_checks() {
  const bool preference = r_->data.format == DataFormat::kPreference;
  if (r_->objective && !preference && !bad("data.format") && !bad("objective"))
    error(loc_of("objective"), "objective",
          fmt::format("needs pairs to compare: set data.format: preference (prompt, chosen, "
                      "rejected records), or remove the objective section to train on "
                      "next-token loss (data.format is {})",
                      to_string(r_->data.format)));
  if (!r_->objective && preference && !bad("data.format"))
    error(loc_of("data.format"), "data.format",
          "preference data trains a preference objective: add an objective section "
          "(objective: {name: dpo}, say; docs/OBJECTIVES.md)");
  if (r_->objective && r_->device == DeviceName::kCuda && !bad("device"))
    error(loc_of("device"), "device",
          "cuda with an objective section: preference training runs on the CPU backend only "
          "so far (the per-token log-probability head has no CUDA kernel yet); use device: cpu");
}

// model.quantize (QLoRA) against lora, parameter offload and the device, and a 4-bit
// model.init_from directory against model.quantize.
void Builder::quantize_checks() {
  const std::optional<QuantizeOptions>& q = r_->model.quantize;
  const bool no_lora = !r_->lora && !bad("lora");
  const bool dir_4bit = dir_quantization_ && !bad("model.init_from");
  const std::string dir = r_->model.init_from;
  if (dir_4bit && no_lora) {
    error(loc_of("model.init_from"), "model.init_from",
          fmt::format("{} is a 4-bit (bitsandbytes) model directory: its base can only be "
                      "trained with LoRA adapters over it (QLoRA); add a lora section "
                      "(lora: {{r: 16}}, say)",
                      dir));
  } else if (q && no_lora && !bad("model.quantize")) {
    error(loc_of("model.quantize"), "model.quantize",
          "the 4-bit base is frozen: QLoRA trains adapters over it; add a lora section "
          "(lora: {r: 16}, say) or remove model.quantize");
  }
  if (dir_4bit && !q && !bad("model.quantize")) {
    const HfQuantization& h = *dir_quantization_;
    error(loc_of("model.init_from"), "model.init_from",
          fmt::format("{} is a 4-bit (bitsandbytes) model directory: its weights are used as "
                      "stored, in 4 bits, so the recipe must say so: add to the model section "
                      "`quantize: {{type: {}, double_quant: {}}}` (as its config.json's "
                      "quantization_config says; block_size is the weights' own, checked when "
                      "they are loaded)",
                      dir, to_string(h.type), h.double_quant ? "true" : "false"));
  }
  if (dir_4bit && q) {
    const HfQuantization& h = *dir_quantization_;
    auto disagree = [&](const char* key, const std::string& ours, const char* theirs_key,
                        const std::string& theirs) {
      const std::string path = std::string("model.quantize.") + key;
      if (ours == theirs || bad(path)) return;
      error(loc_of(is_set(path) ? path : "model.quantize"), path,
            fmt::format("is {} but {}/config.json's quantization_config says {} {}: a 4-bit "
                        "directory's weights are used as stored, never re-quantized; set "
                        "{}: {}",
                        ours, dir, theirs_key, theirs, key, theirs));
    };
    disagree("type", std::string(to_string(q->type)), "bnb_4bit_quant_type",
             std::string(to_string(h.type)));
    disagree("double_quant", q->double_quant ? "true" : "false", "bnb_4bit_use_double_quant",
             h.double_quant ? "true" : "false");
  }
  if (!q || bad("model.quantize")) return;
  const auto& op = r_->zero.offload_params;
  if (!bad("zero.offload_params") && op.device != OffloadDevice::kNone)
    error(loc_of("zero.offload_params.device"), "zero.offload_params.device",
          fmt::format("{} with model.quantize: parameter offload of a 4-bit base is not "
                      "supported; the base in 4 bits is small enough to keep resident (about "
                      "a quarter of its bf16 size; fdtrain estimate says how large), and only "
                      "the adapters train: remove zero.offload_params and, to save memory, "
                      "offload the adapters' optimizer state (zero.offload_optimizer), which "
                      "is supported",
                      to_string(op.device)));
}

}  // namespace

const std::vector<std::string>& top_level_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> out;
    for (const KeyDoc& k : key_reference()) {
      std::string top = k.path.substr(0, k.path.find('.'));
      if (std::find(out.begin(), out.end(), top) == out.end()) out.push_back(top);
    }
    return out;
  }();
  return keys;
}

bool is_section(std::string_view key) { return find_section(key) != nullptr; }

std::string check_key_path(std::string_view key_path) {
  std::vector<std::string> parts = split(key_path, '.');
  const std::string& top = parts[0];
  const auto& tops = top_level_keys();
  if (std::find(tops.begin(), tops.end(), top) == tops.end()) {
    return unknown_key(top, top, tops);
  }
  if (parts.size() == 1) return "";
  const Section* s = find_section(top);
  if (s == nullptr) {
    return fmt::format("{}: unknown key ({} takes a value, not keys)", key_path, top);
  }
  std::string path = join_path(top, parts[1]);
  if (std::find(s->keys.begin(), s->keys.end(), parts[1]) == s->keys.end()) {
    return unknown_key(path, parts[1], s->keys);
  }
  if (parts.size() == 2) return "";
  // Nested keys: activation_checkpointing.layers.every, and the maps whose keys the reference
  // documents (zero.offload_optimizer.device).
  std::vector<std::string> nested;
  if (path == "activation_checkpointing.layers") nested.push_back("every");
  for (const KeyDoc& k : key_reference())
    if (k.path.rfind(path + ".", 0) == 0) nested.push_back(k.path.substr(path.size() + 1));
  if (path == "data.template_vars") return "";  // the template's variables: any names
  if (nested.empty())
    return fmt::format("{}: unknown key ({} takes a value, not keys)", key_path, path);
  if (std::find(nested.begin(), nested.end(), parts[2]) == nested.end())
    return unknown_key(join_path(path, parts[2]), parts[2], nested);
  if (parts.size() == 3) return "";
  const std::string leaf = join_path(path, parts[2]);
  return fmt::format("{}: unknown key ({} takes a value, not keys)", key_path, leaf);
}

void build_recipe(const Node& root, const std::string& recipe_file,
                  const std::set<std::string>& broken_sections, bool check_files, Recipe* recipe,
                  std::vector<std::string>* errors, std::vector<std::string>* warnings) {
  Builder builder(recipe_file, recipe, errors, warnings, broken_sections, check_files);
  builder.build(root);
}

}  // namespace fd::config
