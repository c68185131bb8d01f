// Filters, tests, methods and global functions of the Jinja interpreter, and
// its conversions of values to text, each as @huggingface/jinja 0.5.11 has
// them (jinja_interpreter.h). Where the JavaScript's result depends on
// something we do not reproduce (function source text, locale collation),
// the construct is refused with an Error.
#include <algorithm>
#include <cmath>
#include <ctime>
#include <limits>

#include "lib/jinja/jinja_interpreter.h"
#include "lib/jinja/jinja_text.h"

namespace fd::jinja {

using Kind = Value::Kind;
using VA = ValueAccess;

namespace {

bool is_number(const Value& v) { return v.kind() == Kind::kInt || v.kind() == Kind::kFloat; }
bool is_numeric_like(const Value& v) { return is_number(v) || v.kind() == Kind::kBool; }
bool is_container(const Value& v) {
  return v.kind() == Kind::kObject || v.kind() == Kind::kNamespace;
}
bool is_str(const Value& v) { return v.kind() == Kind::kString; }
const std::string& str_of(const Value& v) { return VA::str(v).text; }

// JavaScript's truthiness of v.value (not __bool__): arrays and objects are
// truthy even when empty; none is undefined underneath.
bool raw_truthy(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return VA::flag(v);
    case Kind::kInt:
    case Kind::kFloat:
      return VA::num(v) != 0 && !std::isnan(VA::num(v));
    case Kind::kString:
      return !str_of(v).empty();
    default:
      return true;
  }
}

Value str_value(std::string s) { return make_string(StrData{std::move(s), {}}); }

// The value at `path` ("a.b.0") in item, as @huggingface/jinja's getAttributeValue.
Value attribute_path(const Value& item, const std::string& path) {
  Value v = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (is_container(v)) {
      const Value* e = VA::obj(v).find(part);
      v = e != nullptr ? *e : Value();
    } else if (v.kind() == Kind::kArray) {
      const double idx = text::parse_int(part);
      const auto& items = VA::arr(v).items;
      if (std::isnan(idx) || idx < 0 || idx >= static_cast<double>(items.size())) return Value();
      v = items[static_cast<size_t>(idx)];
    } else {
      return Value();
    }
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

// Byte offsets where a UTF-16-safe empty pattern matches (code point bounds).
std::vector<size_t> code_point_bounds(std::string_view s) {
  std::vector<size_t> b;
  for (size_t i = 0; i < s.size();) {
    b.push_back(i);
    text::next_code_point(s, i);
  }
  b.push_back(s.size());
  return b;
}

}  // namespace

const Value& builtin_function(Builtin b) {
  static const std::vector<Value> all = [] {
    std::vector<Value> v;
    for (int i = 0; i <= static_cast<int>(Builtin::kMacro); ++i)
      v.push_back(make_function(FunctionData{static_cast<Builtin>(i), Value(), nullptr}));
    return v;
  }();
  return all[static_cast<size_t>(b)];
}

// ---------------------------------------------------------------------------
// Conversions to text

void Interpreter::append_display(TextBuilder& out, const Value& v, Pos pos, int depth) {
  switch (v.kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      out.append("undefined");  // String(undefined): none is undefined underneath
      return;
    case Kind::kBool:
      out.append(VA::flag(v) ? "true" : "false");
      return;
    case Kind::kInt:
      out.append(text::number_to_string(VA::num(v)));
      return;
    case Kind::kFloat: {
      const double d = VA::num(v);
      if (d == 0 && std::signbit(d)) {
        out.append("-0.0");
      } else if (std::isfinite(d) && d == std::floor(d)) {
        out.append(text::number_to_fixed1(d));
      } else {
        out.append(text::number_to_string(d));
      }
      return;
    }
    case Kind::kString:
      out.append(VA::str(v));
      return;
    case Kind::kArray:
    case Kind::kObject:
    case Kind::kNamespace: {
      JsonOptions o;
      o.undefined_is_null = false;
      std::string s;
      append_json(s, v, o, pos, depth);
      out.append(s);
      return;
    }
    case Kind::kFunction:
      fail(pos, "unsupported: printing a function (JavaScript prints its source code)");
  }
}

void Interpreter::append_raw(TextBuilder& out, const Value& v, Pos pos) {
  switch (v.kind()) {
    case Kind::kInt:
    case Kind::kFloat:
      out.append(text::number_to_string(VA::num(v)));
      return;
    case Kind::kArray: {
      // Array.prototype.toString: the elements' toString() joined by ",".
      bool first = true;
      for (const Value& item : VA::arr(v).items) {
        if (!first) out.append(",");
        first = false;
        TextBuilder tb;
        append_display(tb, item, pos, 1);
        out.append(tb.text);
      }
      return;
    }
    case Kind::kObject:
    case Kind::kNamespace:
      out.append("[object Map]");
      return;
    case Kind::kString:
      out.append(VA::str(v).text);
      return;
    default:
      append_display(out, v, pos);
  }
}

void Interpreter::append_json(std::string& out, const Value& v, const JsonOptions& o, Pos pos,
                              int depth) {
  if (depth > options_.max_depth) fail(pos, "a value nests too deeply to print (a cycle?)");
  switch (v.kind()) {
    case Kind::kNone:
      out += "null";
      return;
    case Kind::kUndefined:
      out += o.undefined_is_null ? "null" : "undefined";
      return;
    case Kind::kInt:
    case Kind::kFloat:
      out += std::isfinite(VA::num(v)) ? text::number_to_string(VA::num(v)) : "null";
      return;
    case Kind::kBool:
      out += VA::flag(v) ? "true" : "false";
      return;
    case Kind::kString:
      text::append_json_string(out, str_of(v), o.ensure_ascii);
      return;
    case Kind::kArray:
    case Kind::kObject:
    case Kind::kNamespace:
      if (VA::flag(v) && v.kind() != Kind::kNamespace)
        fail(pos, std::string("cannot convert to JSON: ") + type_name(v));
      break;
    case Kind::kFunction:
      fail(pos, std::string("cannot convert to JSON: ") + type_name(v));
  }
  if (o.indent < 0) fail(pos, "tojson: indent must not be negative");
  if (o.indent * (depth + 1) > static_cast<double>(options_.max_output_bytes))
    fail(pos, "tojson: the indentation makes the text too long");
  const std::string indent(static_cast<size_t>(o.indent), ' ');
  std::string base = "\n";
  for (int i = 0; i < depth; ++i) base += indent;
  const std::string child = base + indent;
  const bool pretty = o.indent > 0;
  const std::string item_sep = o.custom_separators ? o.item_sep : pretty ? "," : ", ";
  const std::string key_sep = o.custom_separators ? o.key_sep : ": ";
  if (v.kind() == Kind::kArray) {
    const auto& items = VA::arr(v).items;
    out += '[';
    if (pretty && !items.empty()) out += child;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) {
        out += item_sep;
        if (pretty) out += child;
      }
      append_json(out, items[i], o, pos, depth + 1);
      check_size(pos, out.size());
    }
    if (pretty && !items.empty()) out += base;
    out += ']';
    return;
  }
  const auto& entries = VA::obj(v).entries;
  out += '{';
  for (size_t i = 0; i < entries.size(); ++i) {
    if (i > 0) out += item_sep;
    if (pretty) out += child;
    text::append_json_string(out, entries[i].first, o.ensure_ascii);
    out += key_sep;
    append_json(out, entries[i].second, o, pos, depth + 1);
    check_size(pos, out.size());
  }
  if (pretty && !entries.empty()) out += base;
  out += '}';
}

// ---------------------------------------------------------------------------
// Equality

bool Interpreter::strict_equal(const Value& a, const Value& b, Pos pos) {
  auto undef = [](const Value& v) { return v.kind() == Kind::kNone || v.is_undefined(); };
  if (a.kind() == Kind::kFunction || b.kind() == Kind::kFunction)
    fail(pos, "unsupported: comparing functions");
  if (undef(a) || undef(b)) return undef(a) && undef(b);
  if (is_number(a) && is_number(b)) return VA::num(a) == VA::num(b);
  if (a.kind() != b.kind()) {
    const bool ca = a.kind() == Kind::kArray || is_container(a);
    const bool cb = b.kind() == Kind::kArray || is_container(b);
    return ca && cb && VA::identity(a) == VA::identity(b);
  }
  switch (a.kind()) {
    case Kind::kBool:
      return VA::flag(a) == VA::flag(b);
    case Kind::kString:
      return str_of(a) == str_of(b);
    default:
      return VA::identity(a) == VA::identity(b);
  }
}

bool Interpreter::loose_equal(const Value& a, const Value& b, Pos pos) {
  auto undef = [](const Value& v) { return v.kind() == Kind::kNone || v.is_undefined(); };
  if (a.kind() == Kind::kFunction || b.kind() == Kind::kFunction)
    fail(pos, "unsupported: comparing functions");
  if (undef(a) || undef(b)) return undef(a) && undef(b);
  const bool ca = a.kind() == Kind::kArray || is_container(a);
  const bool cb = b.kind() == Kind::kArray || is_container(b);
  if (ca && cb) return VA::identity(a) == VA::identity(b);
  // A container against a primitive compares its string form.
  auto primitive = [&](const Value& v) {
    if (v.kind() != Kind::kArray && !is_container(v)) return v;
    TextBuilder tb;
    append_raw(tb, v, pos);
    return str_value(std::move(tb.text));
  };
  const Value x = primitive(a), y = primitive(b);
  if (x.kind() == Kind::kString && y.kind() == Kind::kString) return str_of(x) == str_of(y);
  auto to_number = [](const Value& v) {
    if (v.kind() == Kind::kString) return text::string_to_number(str_of(v));
    if (v.kind() == Kind::kBool) return VA::flag(v) ? 1.0 : 0.0;
    return VA::num(v);
  };
  if (x.kind() == Kind::kBool && y.kind() == Kind::kBool) return VA::flag(x) == VA::flag(y);
  return to_number(x) == to_number(y);
}

// ---------------------------------------------------------------------------
// Tests

namespace {
constexpr const char* kTests[] = {"boolean",  "callable",  "odd",      "even",   "false",
                                  "true",     "none",      "string",   "number", "integer",
                                  "iterable", "mapping",   "sequence", "lower",  "upper",
                                  "defined",  "undefined", "equalto",  "eq"};
}  // namespace

bool Interpreter::has_test(const std::string& name) const {
  for (const char* t : kTests)
    if (name == t) return true;
  return false;
}

bool Interpreter::run_test(const std::string& n, const Value& v, const Value* arg, Pos pos) {
  const Kind k = v.kind();
  if (n == "boolean") return k == Kind::kBool;
  if (n == "callable") return k == Kind::kFunction;
  if (n == "odd" || n == "even") {
    if (k != Kind::kInt) fail(pos, "cannot test " + n + " on " + type_name(v));
    const double r = std::fmod(VA::num(v), 2);
    return n == "odd" ? r != 0 : r == 0;
  }
  if (n == "false") return k == Kind::kBool && !VA::flag(v);
  if (n == "true") return k == Kind::kBool && VA::flag(v);
  if (n == "none") return k == Kind::kNone;
  if (n == "string") return k == Kind::kString;
  if (n == "number") return is_number(v);
  if (n == "integer") return k == Kind::kInt;
  if (n == "iterable") return (k == Kind::kArray && !VA::flag(v)) || k == Kind::kString;
  if (n == "mapping") return k == Kind::kObject;
  if (n == "sequence") return k == Kind::kArray || k == Kind::kObject || k == Kind::kString;
  if (n == "lower" || n == "upper") {
    if (k != Kind::kString) return false;
    const std::string& s = str_of(v);
    return s == (n == "lower" ? text::to_lower(s) : text::to_upper(s));
  }
  if (n == "defined") return k != Kind::kUndefined;
  if (n == "undefined") return k == Kind::kUndefined;
  if (n == "equalto" || n == "eq") {
    if (arg == nullptr) fail(pos, "the test '" + n + "' needs a value to compare with");
    return strict_equal(v, *arg, pos);
  }
  fail(pos, "unknown test '" + n + "'");
}

// ---------------------------------------------------------------------------
// Methods and functions

Value Interpreter::builtin_property(const Value& v, std::string_view name) {
  auto method = [&](Builtin b) { return make_function(FunctionData{b, v, nullptr}); };
  if (v.kind() == Kind::kString) {
    if (name == "length") return make_int(static_cast<double>(text::utf16_length(str_of(v))));
    static const std::pair<const char*, Builtin> kMethods[] = {
        {"upper", Builtin::kStrUpper},           {"lower", Builtin::kStrLower},
        {"strip", Builtin::kStrStrip},           {"title", Builtin::kStrTitle},
        {"capitalize", Builtin::kStrCapitalize}, {"rstrip", Builtin::kStrRstrip},
        {"lstrip", Builtin::kStrLstrip},         {"startswith", Builtin::kStrStartswith},
        {"endswith", Builtin::kStrEndswith},     {"split", Builtin::kStrSplit},
        {"replace", Builtin::kStrReplace}};
    for (const auto& [n, b] : kMethods)
      if (name == n) return method(b);
    return Value();
  }
  if (v.kind() == Kind::kArray) {
    if (name == "length") return make_int(static_cast<double>(VA::arr(v).items.size()));
    return Value();
  }
  if (v.kind() == Kind::kObject) {
    if (name == "get") return method(Builtin::kObjGet);
    if (name == "items") return method(Builtin::kObjItems);
    if (name == "keys") return method(Builtin::kObjKeys);
    if (name == "values") return method(Builtin::kObjValues);
    if (name == "dictsort") return method(Builtin::kObjDictsort);
  }
  return Value();
}

namespace {

// compareRuntimeValues of @huggingface/jinja (sort, dictsort): -1, 0, 1.
int compare_values(Interpreter& in, const Value& a, const Value& b, bool case_sensitive, Pos pos) {
  const Kind ka = a.kind(), kb = b.kind();
  if (ka == Kind::kNone && kb == Kind::kNone) return 0;
  if (ka == Kind::kNone || kb == Kind::kNone)
    in.fail(pos, std::string("cannot compare ") + Interpreter::type_name(a) + " with " +
                     Interpreter::type_name(b));
  if (ka == Kind::kUndefined && kb == Kind::kUndefined) return 0;
  if (ka == Kind::kUndefined || kb == Kind::kUndefined)
    in.fail(pos, std::string("cannot compare ") + Interpreter::type_name(a) + " with " +
                     Interpreter::type_name(b));
  if (is_numeric_like(a) && is_numeric_like(b)) {
    const double x = ka == Kind::kBool ? VA::flag(a) : VA::num(a);
    const double y = kb == Kind::kBool ? VA::flag(b) : VA::num(b);
    if (std::isnan(x) || std::isnan(y)) in.fail(pos, "unsupported: sorting NaN");
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (std::string_view(Interpreter::type_name(a)) != Interpreter::type_name(b))
    in.fail(pos, std::string("cannot compare different types: ") + Interpreter::type_name(a) +
                     " and " + Interpreter::type_name(b));
  if (ka != Kind::kString)
    in.fail(pos, std::string("cannot compare type: ") + Interpreter::type_name(a));
  if (case_sensitive) return text::compare_utf16(str_of(a), str_of(b));
  return text::compare_utf16(text::to_lower(str_of(a)), text::to_lower(str_of(b)));
}

// The keyword arguments object at the end of args, if any (removed).
ObjectData pop_kwargs(Args& args) {
  ObjectData kw;
  if (!args.empty() && args.back().kind() == Kind::kObject && VA::flag(args.back())) {
    kw.entries = VA::obj(args.back()).entries;
    kw.reindex();
    args.pop_back();
  }
  return kw;
}

const Value* arg_or(const Args& args, size_t i, const ObjectData& kw, const char* name) {
  if (i < args.size()) return &args[i];
  return kw.find(name);
}

std::string title_case(const std::string& s) {
  // /\b\w/g with ASCII \w: a word character after a non-word one.
  auto word = [](unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  };
  std::string out = s;
  for (size_t i = 0; i < out.size(); ++i) {
    const auto c = static_cast<unsigned char>(out[i]);
    if (word(c) && (i == 0 || !word(static_cast<unsigned char>(out[i - 1]))) && c >= 'a' &&
        c <= 'z')
      out[i] = static_cast<char>(c - 32);
  }
  return out;
}

std::string capitalize(const std::string& s) {
  if (s.empty()) return s;
  size_t i = 0;
  const uint32_t cp = text::next_code_point(s, i);
  if (cp >= 0x10000) return s;  // charAt(0) is half a surrogate pair: unchanged
  return text::to_upper(s.substr(0, i)) + s.substr(i);
}

// @huggingface/jinja's replace(): count null or negative: all; count 0: none.
std::string replace_all(const std::string& s, const std::string& from, const std::string& to,
                        double count) {
  double remaining = std::isnan(count) ? 0 : count < 0 ? HUGE_VAL : count;
  if (count == 0) return s;
  std::string out;
  if (from.empty()) {
    const std::vector<size_t> b = code_point_bounds(s);
    for (size_t i = 0; i < b.size(); ++i) {
      if (remaining > 0) {
        out += to;
        --remaining;
      }
      if (i + 1 < b.size()) out.append(s, b[i], b[i + 1] - b[i]);
    }
    return out;
  }
  size_t pos = 0;
  while (true) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string::npos || remaining <= 0) break;
    out.append(s, pos, hit - pos);
    out += to;
    --remaining;
    pos = hit + from.size();
  }
  out.append(s, pos, std::string::npos);
  return out;
}

}  // namespace

Value Interpreter::call_function(const Value& fn, Args args, Scope& scope, Pos pos) {
  const FunctionData& f = VA::fn(fn);
  const Value& self = f.self;
  auto slice = [&](size_t b, size_t e) {
    TextBuilder tb;
    tb.append_slice(VA::str(self), b, e);
    return make_string(tb.take());
  };
  switch (f.builtin) {
    case Builtin::kMacro:
      return call_macro(*f.macro, std::move(args), scope, pos);
    case Builtin::kRaiseException: {
      std::string message;
      if (!args.empty() && !args[0].is_undefined() && args[0].kind() != Kind::kNone) {
        TextBuilder tb;
        append_raw(tb, args[0], pos);
        message = std::move(tb.text);
      }
      throw Error(program_.name, pos.line, pos.column, std::move(message), true);
    }
    case Builtin::kRange: {
      // range(start, stop, step) on the JavaScript numbers.
      for (size_t i = 0; i < std::min<size_t>(args.size(), 3); ++i)
        if (!is_number(args[i]) && !(i == 2 && args[i].is_undefined()))
          fail(pos, std::string("unsupported: range() of ") + type_name(args[i]));
      if (args.empty()) fail(pos, "unsupported: range() without arguments");
      double start = 0, stop = VA::num(args[0]), stride = 1;
      if (args.size() >= 2) start = VA::num(args[0]), stop = VA::num(args[1]);
      if (args.size() >= 3 && !args[2].is_undefined()) stride = VA::num(args[2]);
      if (stride == 0) fail(pos, "range() step must not be zero");
      std::vector<Value> out;
      auto add = [&](double i) {
        step(pos);
        out.push_back(i == std::floor(i) && std::isfinite(i) ? make_int(i) : make_float(i));
      };
      if (stride > 0) {
        for (double i = start; i < stop; i += stride) add(i);
      } else {
        for (double i = start; i > stop; i += stride) add(i);
      }
      return make_array(std::move(out));
    }
    case Builtin::kStrftimeNow: {
      if (args.empty() || !is_str(args[0])) fail(pos, "strftime_now() needs a format string");
      const std::time_t now = options_.now_unix_seconds >= 0
                                  ? static_cast<std::time_t>(options_.now_unix_seconds)
                                  : std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      static const char* kShort[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                     "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
      static const char* kLong[] = {"January",   "February", "March",    "April",
                                    "May",       "June",     "July",     "August",
                                    "September", "October",  "November", "December"};
      auto pad2 = [](int n) { return (n < 10 ? "0" : "") + std::to_string(n); };
      const std::string& format = str_of(args[0]);
      std::string out;
      for (size_t i = 0; i < format.size(); ++i) {
        if (format[i] == '%' && i + 1 < format.size()) {
          const char c = format[i + 1];
          std::string r;
          bool known = true;
          switch (c) {
            case 'Y':
              r = std::to_string(tm.tm_year + 1900);
              break;
            case 'm':
              r = pad2(tm.tm_mon + 1);
              break;
            case 'd':
              r = pad2(tm.tm_mday);
              break;
            case 'b':
              r = kShort[tm.tm_mon];
              break;
            case 'B':
              r = kLong[tm.tm_mon];
              break;
            case 'H':
              r = pad2(tm.tm_hour);
              break;
            case 'M':
              r = pad2(tm.tm_min);
              break;
            case '%':
              r = "%";
              break;
            default:
              known = false;
          }
          if (known) {
            out += r;
            ++i;
            continue;
          }
        }
        out += format[i];
      }
      return str_value(std::move(out));
    }
    case Builtin::kNamespace: {
      ObjectData kw = pop_kwargs(args);
      if (args.size() > 1)
        fail(pos,
             "namespace() takes at most 1 positional argument, got " + std::to_string(args.size()));
      ObjectData entries;
      if (args.size() == 1) {
        const Value& src = args[0];
        if (src.kind() == Kind::kObject) {
          for (const auto& [k, v] : VA::obj(src).entries) entries.set(k, v);
        } else if (src.kind() == Kind::kArray) {
          for (const Value& pair : VA::arr(src).items) {
            std::vector<Value> kv;
            if (pair.kind() == Kind::kArray) {
              kv = VA::arr(pair).items;
            } else if (pair.kind() == Kind::kString) {
              const std::string& s = str_of(pair);
              for (size_t i = 0; i < s.size();) {
                const size_t b = i;
                text::next_code_point(s, i);
                kv.push_back(str_value(s.substr(b, i - b)));
              }
            }
            if (kv.size() != 2)
              fail(pos, "namespace() takes an object or a list of [key, value] pairs");
            if (!is_str(kv[0])) fail(pos, "namespace() keys must be strings");
            entries.set(str_of(kv[0]), kv[1]);
          }
        } else {
          fail(pos, std::string("namespace(): '") + type_name(src) + "' object is not iterable");
        }
      }
      for (const auto& [k, v] : kw.entries) entries.set(k, v);
      return make_namespace(std::move(entries));
    }
    case Builtin::kStrUpper:
      return str_value(text::to_upper(str_of(self)));
    case Builtin::kStrLower:
      return str_value(text::to_lower(str_of(self)));
    case Builtin::kStrTitle:
      return str_value(title_case(str_of(self)));
    case Builtin::kStrCapitalize:
      return str_value(capitalize(str_of(self)));
    case Builtin::kStrStrip: {
      // The JavaScript ignores the characters argument: all whitespace goes.
      const std::string& s = str_of(self);
      const size_t b = text::trim_start(s);
      return slice(b, std::max(b, text::trim_end(s)));
    }
    case Builtin::kStrLstrip:
      return slice(text::trim_start(str_of(self)), str_of(self).size());
    case Builtin::kStrRstrip:
      return slice(0, text::trim_end(str_of(self)));
    case Builtin::kStrStartswith:
    case Builtin::kStrEndswith: {
      const bool starts = f.builtin == Builtin::kStrStartswith;
      const char* name = starts ? "startswith" : "endswith";
      if (args.empty()) fail(pos, std::string(name) + "() requires at least one argument");
      const std::string& s = str_of(self);
      auto test = [&](const std::string& p) { return starts ? s.starts_with(p) : s.ends_with(p); };
      if (is_str(args[0])) return Value::boolean(test(str_of(args[0])));
      if (args[0].kind() == Kind::kArray) {
        for (const Value& item : VA::arr(args[0]).items) {
          if (!is_str(item)) fail(pos, std::string(name) + "() tuple elements must be strings");
          if (test(str_of(item))) return Value::boolean(true);
        }
        return Value::boolean(false);
      }
      fail(pos, std::string(name) + "() argument must be a string or tuple of strings");
    }
    case Builtin::kStrSplit: {
      const Value sep = args.size() > 0 ? args[0] : Value::none();
      if (!is_str(sep) && sep.kind() != Kind::kNone)
        fail(pos, "split(): the separator must be a string or none");
      const Value maxsplit = args.size() > 1 ? args[1] : make_int(-1);
      if (maxsplit.kind() != Kind::kInt) fail(pos, "split(): maxsplit must be an integer");
      const double max = VA::num(maxsplit);
      const std::string& s = str_of(self);
      std::vector<Value> out;
      if (sep.kind() == Kind::kNone) {
        size_t i = text::trim_start(s);
        while (i < s.size()) {
          size_t end = i;
          while (end < s.size() && text::space_at(s, end) == 0) {
            text::next_code_point(s, end);
          }
          if (max != -1 && static_cast<double>(out.size()) >= max) {
            out.push_back(slice(i, s.size()));
            break;
          }
          out.push_back(slice(i, end));
          i = end;
          while (size_t n = text::space_at(s, i)) i += n;
        }
      } else {
        const std::string& p = str_of(sep);
        if (p.empty()) fail(pos, "split(): empty separator");
        std::vector<std::pair<size_t, size_t>> pieces;
        size_t start = 0;
        while (true) {
          const size_t hit = s.find(p, start);
          if (hit == std::string::npos) break;
          pieces.emplace_back(start, hit);
          start = hit + p.size();
        }
        pieces.emplace_back(start, s.size());
        const auto n = static_cast<double>(pieces.size());
        if (max != -1 && n > max) {
          // result.push(result.splice(max).join(sep)); splice takes a negative
          // start from the end.
          double k = std::isnan(max) ? 0 : max < 0 ? std::max(n + max, 0.0) : std::min(max, n);
          const auto keep = static_cast<size_t>(k);
          const size_t rest = pieces[keep].first;
          pieces.resize(keep);
          pieces.emplace_back(rest, s.size());
        }
        for (const auto& [b, e] : pieces) out.push_back(slice(b, e));
      }
      step(pos, static_cast<int64_t>(out.size()));
      return make_array(std::move(out));
    }
    case Builtin::kStrReplace: {
      if (args.size() < 2) fail(pos, "replace() requires at least two arguments");
      if (!is_str(args[0]) || !is_str(args[1])) fail(pos, "replace() arguments must be strings");
      Value count = Value::none();
      if (args.size() > 2) {
        if (args[2].kind() == Kind::kObject && VA::flag(args[2])) {
          const Value* c = VA::obj(args[2]).find("count");
          if (c != nullptr) count = *c;
        } else {
          count = args[2];
        }
      }
      if (count.kind() != Kind::kInt && count.kind() != Kind::kNone)
        fail(pos, "replace(): count must be an integer or none");
      const double c = count.kind() == Kind::kInt ? VA::num(count) : -1;
      std::string r = replace_all(str_of(self), str_of(args[0]), str_of(args[1]), c);
      check_size(pos, r.size());
      return str_value(std::move(r));
    }
    case Builtin::kObjGet: {
      if (args.empty() || !is_str(args[0]))
        fail(pos, std::string("get(): the key must be a string, got ") +
                      (args.empty() ? "nothing" : type_name(args[0])));
      if (const Value* v = VA::obj(self).find(str_of(args[0]))) return *v;
      return args.size() > 1 ? args[1] : Value::none();
    }
    case Builtin::kObjItems: {
      std::vector<Value> out;
      for (const auto& [k, v] : VA::obj(self).entries) out.push_back(make_array({str_value(k), v}));
      step(pos, static_cast<int64_t>(out.size()));
      return make_array(std::move(out));
    }
    case Builtin::kObjKeys: {
      std::vector<Value> out;
      for (const auto& [k, v] : VA::obj(self).entries) out.push_back(str_value(k));
      return make_array(std::move(out));
    }
    case Builtin::kObjValues: {
      std::vector<Value> out;
      for (const auto& [k, v] : VA::obj(self).entries) out.push_back(v);
      return make_array(std::move(out));
    }
    case Builtin::kObjDictsort: {
      ObjectData kw;
      Args positional;
      for (Value& a : args) {
        if (a.kind() == Kind::kObject && VA::flag(a)) {
          kw.entries = VA::obj(a).entries;
          kw.reindex();
        } else {
          positional.push_back(std::move(a));
        }
      }
      const Value* cs = arg_or(positional, 0, kw, "case_sensitive");
      if (cs != nullptr && cs->kind() != Kind::kBool)
        fail(pos, "dictsort(): case_sensitive must be a boolean");
      const Value* by = arg_or(positional, 1, kw, "by");
      if (by != nullptr && !is_str(*by)) fail(pos, "dictsort(): by must be a string");
      const std::string by_s = by != nullptr ? str_of(*by) : "key";
      if (by_s != "key" && by_s != "value")
        fail(pos, "dictsort(): by must be either 'key' or 'value'");
      const Value* rev = arg_or(positional, 2, kw, "reverse");
      if (rev != nullptr && rev->kind() != Kind::kBool)
        fail(pos, "dictsort(): reverse must be a boolean");
      const bool case_sensitive = cs != nullptr && VA::flag(*cs);
      const bool reverse = rev != nullptr && VA::flag(*rev);
      std::vector<Value> items;
      for (const auto& [k, v] : VA::obj(self).entries)
        items.push_back(make_array({str_value(k), v}));
      const size_t index = by_s == "key" ? 0 : 1;
      std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
        const int c = compare_values(*this, VA::arr(a).items[index], VA::arr(b).items[index],
                                     case_sensitive, pos);
        return reverse ? c > 0 : c < 0;
      });
      return make_array(std::move(items));
    }
  }
  fail(pos, "unknown function");
}

// ---------------------------------------------------------------------------
// Filters

Value Interpreter::apply_filter(const Value& operand, const Expr& filter, Scope& scope) {
  const Pos pos = filter.pos;
  const std::string& name = filter.name;
  if (!filter.bad_filter.empty()) fail(pos, filter.bad_filter);
  const Kind k = operand.kind();
  auto unknown = [&](const char* what) -> Value {
    fail(pos, "unknown " + std::string(what) + " filter '" + name + "'");
  };
  auto cannot = [&]() -> Value {
    fail(pos, "cannot apply filter '" + name + "' to " + type_name(operand));
  };
  auto string_slice = [&](size_t b, size_t e) {
    TextBuilder tb;
    tb.append_slice(VA::str(operand), b, e);
    return make_string(tb.take());
  };
  auto join = [&](const std::string& sep) {
    TextBuilder tb;
    if (k == Kind::kString) {
      const std::string& s = str_of(operand);
      bool first = true;
      for (size_t i = 0; i < s.size();) {
        const size_t b = i;
        text::next_code_point(s, i);
        if (!first) tb.append(sep);
        first = false;
        tb.append_slice(VA::str(operand), b, i);
      }
    } else {
      bool first = true;
      for (const Value& item : VA::arr(operand).items) {
        if (!first) tb.append(sep);
        first = false;
        if (item.kind() == Kind::kNone || item.is_undefined()) continue;
        if (is_str(item)) {
          tb.append(VA::str(item));
        } else {
          append_raw(tb, item, pos);
        }
        check_size(pos, tb.text.size());
      }
    }
    check_size(pos, tb.text.size());
    return make_string(tb.take());
  };
  auto indent = [&](double width, bool first, bool blank) {
    if (width < 0 || std::isinf(width)) fail(pos, "indent(): invalid width");
    if (std::isnan(width)) width = 0;
    if (width > static_cast<double>(options_.max_output_bytes))
      fail(pos, "indent(): the width is too large");
    const std::string pad(static_cast<size_t>(width), ' ');
    const std::string& s = str_of(operand);
    std::string out;
    size_t start = 0;
    for (size_t line = 0;; ++line) {
      const size_t nl = s.find('\n', start);
      const size_t end = nl == std::string::npos ? s.size() : nl;
      if (!((!first && line == 0) || (!blank && end == start))) out += pad;
      out.append(s, start, end - start);
      check_size(pos, out.size());
      if (nl == std::string::npos) break;
      out += '\n';
      start = nl + 1;
    }
    return str_value(std::move(out));
  };
  auto sorted = [&](bool reverse, bool case_sensitive, const Value* attribute) {
    std::vector<Value> items = VA::arr(operand).items;
    std::string path;
    if (attribute != nullptr) {
      TextBuilder tb;
      append_raw(tb, *attribute, pos);
      path = tb.text;
    }
    auto key = [&](const Value& v) { return attribute ? attribute_path(v, path) : v; };
    std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
      const int c = compare_values(*this, key(a), key(b), case_sensitive, pos);
      return reverse ? c > 0 : c < 0;
    });
    return make_array(std::move(items));
  };
  auto json_of = [&](const JsonOptions& o) {
    std::string s;
    append_json(s, operand, o, pos, 0);
    return str_value(std::move(s));
  };

  if (!filter.has_args) {
    if (name == "safe") return operand;
    if (name == "tojson") return json_of(JsonOptions{});
    switch (k) {
      case Kind::kArray: {
        const auto& items = VA::arr(operand).items;
        if (name == "list") return operand;
        if (name == "first" || name == "last") {
          if (items.empty())
            fail(pos, "unsupported: '" + name + "' of an empty list (undefined in JavaScript)");
          return name == "first" ? items.front() : items.back();
        }
        if (name == "length") return make_int(static_cast<double>(items.size()));
        if (name == "reverse") return make_array(std::vector<Value>(items.rbegin(), items.rend()));
        if (name == "sort") return sorted(false, false, nullptr);
        if (name == "join") return join("");
        if (name == "string") {
          JsonOptions o;
          o.undefined_is_null = false;
          return json_of(o);
        }
        if (name == "unique") {
          std::vector<Value> out;
          for (const Value& item : items) {
            if (item.kind() == Kind::kFunction) fail(pos, "unsupported: unique of functions");
            bool seen = false;
            for (const Value& o : out) {
              const bool both_nan = is_number(o) && is_number(item) && std::isnan(VA::num(o)) &&
                                    std::isnan(VA::num(item));
              if (both_nan || strict_equal(o, item, pos)) {
                seen = true;
                break;
              }
            }
            if (!seen) out.push_back(item);
            step(pos, static_cast<int64_t>(out.size()));
          }
          return make_array(std::move(out));
        }
        return unknown("array");
      }
      case Kind::kString: {
        const std::string& s = str_of(operand);
        if (name == "length") return make_int(static_cast<double>(text::utf16_length(s)));
        if (name == "upper") return str_value(text::to_upper(s));
        if (name == "lower") return str_value(text::to_lower(s));
        if (name == "title") return str_value(title_case(s));
        if (name == "capitalize") return str_value(capitalize(s));
        if (name == "trim") {
          const size_t b = text::trim_start(s);
          return string_slice(b, std::max(b, text::trim_end(s)));
        }
        if (name == "indent") return indent(4, false, false);
        if (name == "join" || name == "string") return operand;
        if (name == "int") {
          const double v = text::parse_int(s);
          return make_int(std::isnan(v) ? 0 : v);
        }
        if (name == "float") {
          const double v = text::parse_float(s);
          return make_float(std::isnan(v) ? 0 : v);
        }
        return unknown("string");
      }
      case Kind::kInt:
      case Kind::kFloat: {
        const double v = VA::num(operand);
        if (name == "abs")
          return k == Kind::kInt ? make_int(std::fabs(v)) : make_float(std::fabs(v));
        if (name == "int") return make_int(std::floor(v));
        if (name == "float") return make_float(v);
        if (name == "string") {
          TextBuilder tb;
          append_display(tb, operand, pos);
          return str_value(std::move(tb.text));
        }
        return unknown("number");
      }
      case Kind::kObject: {
        if (name == "items")
          return call_function(builtin_property(operand, "items"), {}, scope, pos);
        if (name == "length") return make_int(static_cast<double>(VA::obj(operand).entries.size()));
        const Value m = builtin_property(operand, name);
        if (m.kind() == Kind::kFunction) return call_function(m, {}, scope, pos);
        return unknown("object");
      }
      case Kind::kBool: {
        const bool b = VA::flag(operand);
        if (name == "bool") return operand;
        if (name == "int") return make_int(b ? 1 : 0);
        if (name == "float") return make_float(b ? 1 : 0);
        if (name == "string") return str_value(b ? "true" : "false");
        return unknown("boolean");
      }
      default:
        return cannot();
    }
  }

  // name(...)
  if (name == "tojson") {
    auto [positional, kw] = eval_arguments(filter.kids, 1, scope);
    JsonOptions o;
    if (const Value* v = kw.find("indent")) {
      if (v->kind() != Kind::kInt && v->kind() != Kind::kNone)
        fail(pos, "tojson: indent must be an integer");
      if (v->kind() == Kind::kInt) o.indent = std::isnan(VA::num(*v)) ? 0 : VA::num(*v);
    }
    if (const Value* v = kw.find("ensure_ascii")) {
      if (v->kind() != Kind::kBool) fail(pos, "tojson: ensure_ascii must be a boolean");
      o.ensure_ascii = VA::flag(*v);
    }
    if (const Value* v = kw.find("sort_keys")) {
      if (v->kind() != Kind::kBool) fail(pos, "tojson: sort_keys must be a boolean");
      if (VA::flag(*v))
        fail(pos, "unsupported: tojson(sort_keys=true) (JavaScript sorts by locale collation)");
    }
    if (const Value* v = kw.find("separators")) {
      if (v->kind() == Kind::kArray) {
        const auto& items = VA::arr(*v).items;
        if (items.size() != 2 || !is_str(items[0]) || !is_str(items[1]))
          fail(pos, "tojson: separators must be a tuple of two strings");
        o.custom_separators = true;
        o.item_sep = str_of(items[0]);
        o.key_sep = str_of(items[1]);
      } else if (v->kind() != Kind::kNone) {
        fail(pos, "tojson: separators must be a tuple of two strings");
      }
    }
    return json_of(o);
  }
  if (name == "join") {
    if (k != Kind::kString && k != Kind::kArray) return cannot();
    auto [positional, kw] = eval_arguments(filter.kids, 1, scope);
    const Value* sep = arg_or(positional, 0, kw, "separator");
    if (sep != nullptr && !is_str(*sep)) fail(pos, "join: the separator must be a string");
    return join(sep != nullptr ? str_of(*sep) : "");
  }
  if (name == "int" || name == "float") {
    auto [positional, kw] = eval_arguments(filter.kids, 1, scope);
    const bool is_int = name == "int";
    const Value* d = arg_or(positional, 0, kw, "default");
    const Value dflt = d != nullptr ? *d : is_int ? make_int(0) : make_float(0);
    if (k == Kind::kString) {
      const double v =
          is_int ? text::parse_int(str_of(operand)) : text::parse_float(str_of(operand));
      if (std::isnan(v)) return dflt;
      return is_int ? make_int(v) : make_float(v);
    }
    if (is_number(operand)) return operand;
    if (k == Kind::kBool) {
      const double v = VA::flag(operand) ? 1 : 0;
      return is_int ? make_int(v) : make_float(v);
    }
    return cannot();
  }
  if (name == "default") {
    auto [positional, kw] = eval_arguments(filter.kids, 1, scope);
    const Value dflt = positional.empty() ? str_value("") : positional[0];
    const Value* flag = arg_or(positional, 1, kw, "boolean");
    if (flag != nullptr && flag->kind() != Kind::kBool)
      fail(pos, "default: the boolean flag must be a boolean");
    const bool boolean = flag != nullptr && VA::flag(*flag);
    if (operand.is_undefined() || (boolean && !truthy(operand))) return dflt;
    return operand;
  }
  if (k == Kind::kArray) {
    const auto& items = VA::arr(operand).items;
    if (name == "sort") {
      auto [positional, kw] = eval_arguments(filter.kids, 1, scope);
      const Value* rev = arg_or(positional, 0, kw, "reverse");
      if (rev != nullptr && rev->kind() != Kind::kBool)
        fail(pos, "sort: reverse must be a boolean");
      const Value* cs = arg_or(positional, 1, kw, "case_sensitive");
      if (cs != nullptr && cs->kind() != Kind::kBool)
        fail(pos, "sort: case_sensitive must be a boolean");
      const Value* attr = arg_or(positional, 2, kw, "attribute");
      if (attr != nullptr && attr->kind() == Kind::kNone) attr = nullptr;
      if (attr != nullptr && !is_str(*attr) && attr->kind() != Kind::kInt)
        fail(pos, "sort: attribute must be a string, integer or none");
      return sorted(rev != nullptr && VA::flag(*rev), cs != nullptr && VA::flag(*cs), attr);
    }
    if (name == "selectattr" || name == "rejectattr") {
      const bool select = name == "selectattr";
      for (const Value& item : items)
        if (!is_container(item))
          fail(pos, "'" + name + "' can only be applied to a list of objects");
      for (size_t i = 1; i < filter.kids.size(); ++i)
        if (filter.kids[i]->kind != ExprKind::kLiteral || !is_str(filter.kids[i]->literal))
          fail(filter.kids[i]->pos, "the arguments of '" + name + "' must be string literals");
      std::vector<Value> args;
      for (size_t i = 1; i < filter.kids.size(); ++i) args.push_back(filter.kids[i]->literal);
      if (args.size() > 1 && !has_test(str_of(args[1])))
        fail(pos, "unknown test '" + str_of(args[1]) + "'");
      std::vector<Value> out;
      for (const Value& item : items) {
        step(pos);
        if (args.empty()) fail(pos, "'" + name + "' needs an attribute name");
        const Value* a = VA::obj(item).find(str_of(args[0]));
        bool r = false;
        if (a != nullptr) {
          r = args.size() > 1
                  ? run_test(str_of(args[1]), *a, args.size() > 2 ? &args[2] : nullptr, pos)
                  : truthy(*a);
        }
        if (r == select) out.push_back(item);
      }
      return make_array(std::move(out));
    }
    if (name == "map") {
      auto [positional, kw] = eval_arguments(filter.kids, 1, scope);
      const Value* attr = kw.find("attribute");
      if (attr == nullptr)
        fail(pos, "unsupported: map without attribute= (not in @huggingface/jinja)");
      if (!is_str(*attr)) fail(pos, "map: attribute must be a string");
      const Value* dflt = kw.find("default");
      std::vector<Value> out;
      for (const Value& item : items) {
        step(pos);
        if (!is_container(item)) fail(pos, "map: the items must be objects");
        Value v = attribute_path(item, str_of(*attr));
        if (v.is_undefined() && dflt != nullptr) v = *dflt;
        out.push_back(std::move(v));
      }
      return make_array(std::move(out));
    }
    return unknown("array");
  }
  if (k == Kind::kString) {
    if (name == "indent") {
      auto [positional, kw] = eval_arguments(filter.kids, 1, scope);
      const Value* width = arg_or(positional, 0, kw, "width");
      if (width != nullptr && width->kind() != Kind::kInt)
        fail(pos, "indent: width must be a number");
      const Value* first = arg_or(positional, 1, kw, "first");
      const Value* blank = arg_or(positional, 2, kw, "blank");
      return indent(width != nullptr ? VA::num(*width) : 4, first != nullptr && raw_truthy(*first),
                    blank != nullptr && raw_truthy(*blank));
    }
    if (name == "replace") {
      auto [positional, kw] = eval_arguments(filter.kids, 1, scope);
      positional.push_back(make_object(std::move(kw), /*kwargs=*/true));
      return call_function(builtin_property(operand, "replace"), std::move(positional), scope, pos);
    }
    return unknown("string");
  }
  if (k == Kind::kObject) {
    const Value m = builtin_property(operand, name);
    if (m.kind() != Kind::kFunction) return unknown("object");
    auto [positional, kw] = eval_arguments(filter.kids, 1, scope);
    if (!kw.entries.empty()) positional.push_back(make_object(std::move(kw), /*kwargs=*/true));
    return call_function(m, std::move(positional), scope, pos);
  }
  return cannot();
}

}  // namespace fd::jinja
