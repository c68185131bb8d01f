// lib/jinja (namespace fd::jinja): the template language, on lib/base alone. This header is
// its whole interface; the jinja_*.h headers are internal to lib/jinja.
//
// Jinja chat templates, rendered byte for byte as Hugging Face's JavaScript
// interpreter @huggingface/jinja 0.5.11 renders them (the `chat_template` of a
// tokenizer_config.json; tests/jinja/jinja_test.cc compares every rendering with
// it), with provenance: a string can carry tags on byte ranges, and the
// rendering says which output bytes came from which tagged string.
//
// Where @huggingface/jinja differs from Python's Jinja2 (tests/jinja/
// README.md lists what we found), this follows the JavaScript: `lstrip('\n')`
// strips all whitespace, `tojson` writes `1.0` as `1`, `==` is JavaScript's
// loose equality. A construct it cannot render exactly as the JavaScript does
// is refused with an Error naming it and its line:column, never approximated.
//
// Provenance: Value::string(s, tag) tags a whole string. Concatenation (`+`,
// `~`, `join`, output) keeps tags; slicing, indexing, `trim`, `strip`,
// `lstrip`, `rstrip` and `split` keep the tags of the bytes that survive (a
// tagged range cut down to nothing becomes a zero-length marker where it was
// cut); operations that rewrite characters (`upper`, `replace`, `tojson`,
// `indent`, formatting a number) drop them. Comparisons ignore tags.
//
//   Value ctx = Value::object();
//   Value msgs = Value::array();
//   msgs.push_back(Value::object().set("role", Value::string("assistant"))
//                      .set("content", Value::string(text, /*tag=*/0)));
//   ctx.set("messages", msgs).set("add_generation_prompt", Value::boolean(false));
//   Rendered r = Template::parse(source, "chat_template").render(ctx);
//   // r.spans: where message 0's content (what survived of it) is in r.text
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "lib/base/error.h"

namespace fd::jinja {

// Bytes [begin, end) of a string came from a string tagged `tag` (>= 0).
// begin == end marks where a tagged string that became empty was.
struct Span {
  int64_t begin = 0;
  int64_t end = 0;
  int32_t tag = -1;
  bool operator==(const Span&) const = default;
};

// A rendering: the text, and the tagged spans in it, sorted by begin, adjacent
// spans with the same tag merged.
struct Rendered {
  std::string text;
  std::vector<Span> spans;
};

// A template value. Copies are cheap (strings, arrays and objects are shared
// and never changed once built; the builders copy on write when shared), and
// a render never changes its context, so threads may share one.
// Numbers are JavaScript numbers (doubles), integer or float as
// @huggingface/jinja tells them apart. Strings are UTF-8; where JavaScript
// counts UTF-16 code units (`length`, `s[i]`), so does this.
class Value {
 public:
  enum class Kind : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kArray,      // also tuples, `(a, b)`
    kObject,     // insertion-ordered string keys
    kNamespace,  // namespace(), made while rendering
    kFunction,   // builtins, macros, bound methods, made while rendering
  };

  Value() = default;  // undefined
  static Value undefined() { return Value(); }
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value real(double d);  // a float, even when integral (prints as "2.0")
  // A string; tag >= 0 tags all of it (also when empty: a zero-length marker).
  static Value string(std::string s, int32_t tag = -1);
  static Value array();
  static Value object();
  // JSON as JavaScript's JSON.parse and @huggingface/jinja see it: integral
  // numbers (1 and 1.0) are integers, object keys that are array indices
  // ("0", "17") come first in ascending order, then the others in order.
  // Strings are untagged.
  static Value from_json(const nlohmann::ordered_json& j);
  // The first number of `j` (depth first, in order) that from_json would change: an
  // integer beyond +-2^53, which a double holds inexactly (9007199254740993 would render as
  // 9007199254740992, as in @huggingface/jinja; Python's Jinja would keep it), or any number
  // of magnitude 2^64 or more (parsed as a double, 123456789012345678901234567890 cannot be
  // told from 1.2345678901234568e29). Returned as "PATH: VALUE",
  // PATH as `.key[2].name` ("" when every number is exact). Callers refuse such data and
  // ask for the number as a string.
  static std::string inexact_number(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  // How deep arrays and objects nest in this value: 0 for a scalar or a
  // string, 1 + the deepest element's for an array or object, 1 for a
  // namespace (mutable: its entries are not counted, and the interpreter keeps
  // every namespace alive, and empties it, until the render ends). Saturates
  // at kMaxTrackedDepth. A render refuses a value deeper than
  // RenderOptions::max_depth, so no walk over a value (printing, tojson,
  // destruction) recurses deeper than that.
  int depth() const { return depth_; }
  static constexpr int kMaxTrackedDepth = 65535;
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_array() const { return kind_ == Kind::kArray; }
  bool is_object() const { return kind_ == Kind::kObject; }

  // Builders. push_back: arrays only; set: objects only (an existing key
  // keeps its place). Both return *this. A misuse is an FD_CHECK.
  Value& push_back(Value v);
  Value& set(std::string_view key, Value v);

  // Readers. Each checks the kind (FD_CHECK).
  bool as_bool() const;
  double as_number() const;                       // int or float
  const std::string& str() const;                 // string
  const std::vector<Span>& tags() const;          // string: its tagged ranges
  size_t size() const;                            // array elements or object entries
  const Value& at(size_t i) const;                // array element
  const Value* find(std::string_view key) const;  // object entry or nullptr

 private:
  friend struct ValueAccess;
  Kind kind_ = Kind::kUndefined;
  bool flag_ = false;   // bool: the value; array: a tuple; object: keyword arguments
  uint16_t depth_ = 0;  // depth()
  double num_ = 0;
  std::shared_ptr<void> ptr_;  // StrData, ArrayData, ObjectData (objects, namespaces), FunctionData
};

// Parse options. @huggingface/jinja's Template always sets both, as
// transformers' apply_chat_template does for Python's Jinja2.
struct TemplateOptions {
  bool trim_blocks = true;    // drop the first newline after a block tag
  bool lstrip_blocks = true;  // drop spaces and tabs before a block tag on its line
};

// Render options: bounds that turn a runaway template into an Error.
struct RenderOptions {
  int64_t max_output_bytes = int64_t{64} << 20;  // any string, the output included
  int64_t max_steps = 10'000'000;  // statements, loop iterations and list elements made
  // Nesting: of macro calls, of expressions and statements being run (8
  // frames a level), and of values (Value::depth(): a template that builds a
  // list or dict nested deeper fails where it builds it).
  int32_t max_depth = 256;
  // strftime_now()'s clock: seconds since the epoch, or -1 for the current
  // time. Both take the local time zone, as JavaScript's Date does.
  int64_t now_unix_seconds = -1;
};

// What a parse or render throws: an fd::Error (kUsage) whose message is
// "NAME:LINE:COL: REASON". reason() is REASON alone; for raise_exception("m")
// raised() is true and reason() is the template's own message "m".
class Error : public fd::Error {
 public:
  Error(std::string name, int32_t line, int32_t column, std::string reason, bool raised);
  const std::string& reason() const { return reason_; }
  bool raised() const { return raised_; }
  int32_t line() const { return line_; }
  int32_t column() const { return column_; }

 private:
  std::string reason_;
  int32_t line_, column_;
  bool raised_;
};

class Template {
 public:
  // Parses `source` once. Throws jinja::Error for a syntax error, an
  // unsupported statement ("NAME:LINE:COL: unsupported statement 'extends'")
  // or a test @huggingface/jinja does not have ("unsupported test 'frob'"). A
  // filter it does not have ("unsupported filter 'reject(...)'") fails where it
  // runs, as there. Lines and columns count from 1; columns count code points.
  static Template parse(std::string_view source, std::string_view name,
                        TemplateOptions options = {});

  // Renders with the variables of `context` (an object; undefined: none).
  // Thread-safe: many threads may render one Template at once. Throws
  // jinja::Error at the position of the failing expression: raise_exception,
  // a filter, test or method the value's type lacks, a type error where the
  // JavaScript throws, a construct we refuse because we would render it
  // differently ("unsupported: ..."), or a bound in `options` passed.
  Rendered render(const Value& context, const RenderOptions& options = {}) const;

  const std::string& name() const;

  // Whether the template names `variable` anywhere as a variable (not as an attribute,
  // `x.variable`): a context variable it never names cannot change a rendering.
  bool names_variable(std::string_view variable) const;

  struct Program;  // the parsed template (lib/jinja/jinja_ast.h)

 private:
  Template() = default;
  std::shared_ptr<const Program> program_;
};

}  // namespace fd::jinja
