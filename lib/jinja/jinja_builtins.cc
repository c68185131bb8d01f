// Filters, tests, methods and global functions of the Jinja interpreter, and
// its conversions of values to text, each as @huggingface/jinja 0.5.11 has
// them (jinja_interpreter.h). Each kind of builtin is a table from its name to
// its handler (kTests, kFunctions, kFilters). Where the JavaScript's result
// depends on something we do not reproduce (function source text, locale
// collation), the construct is refused with an Error.
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
// Tests: `x is name`, `x is name(arg)`; found by name in kTests.

namespace {

using TestFn = bool (*)(Interpreter& in, const std::string& name, const Value& v, const Value* arg,
                        Pos pos);

bool test_odd_even(Interpreter& in, const std::string& n, const Value& v, const Value*, Pos pos) {
  if (v.kind() != Kind::kInt) in.fail(pos, "cannot test " + n + " on " + Interpreter::type_name(v));
  const double r = std::fmod(VA::num(v), 2);
  return n == "odd" ? r != 0 : r == 0;
}

bool test_case(Interpreter&, const std::string& n, const Value& v, const Value*, Pos) {
  if (v.kind() != Kind::kString) return false;
  const std::string& s = str_of(v);
  return s == (n == "lower" ? text::to_lower(s) : text::to_upper(s));
}

bool test_equal(Interpreter& in, const std::string& n, const Value& v, const Value* arg, Pos pos) {
  if (arg == nullptr) in.fail(pos, "the test '" + n + "' needs a value to compare with");
  return in.strict_equal(v, *arg, pos);
}

// A test of the operand's kind alone.
template <bool (*kOf)(const Value&)>
bool test_kind(Interpreter&, const std::string&, const Value& v, const Value*, Pos) {
  return kOf(v);
}

bool is_boolean(const Value& v) { return v.kind() == Kind::kBool; }
bool is_callable(const Value& v) { return v.kind() == Kind::kFunction; }
bool is_false(const Value& v) { return v.kind() == Kind::kBool && !VA::flag(v); }
bool is_true(const Value& v) { return v.kind() == Kind::kBool && VA::flag(v); }
bool is_none(const Value& v) { return v.kind() == Kind::kNone; }
bool is_integer(const Value& v) { return v.kind() == Kind::kInt; }
bool is_iterable(const Value& v) {
  return (v.kind() == Kind::kArray && !VA::flag(v)) || v.kind() == Kind::kString;
}
bool is_mapping(const Value& v) { return v.kind() == Kind::kObject; }
bool is_sequence(const Value& v) {
  return v.kind() == Kind::kArray || v.kind() == Kind::kObject || v.kind() == Kind::kString;
}
bool is_defined(const Value& v) { return v.kind() != Kind::kUndefined; }
bool is_undefined(const Value& v) { return v.kind() == Kind::kUndefined; }

constexpr std::pair<std::string_view, TestFn> kTests[] = {{"boolean", test_kind<is_boolean>},
                                                          {"callable", test_kind<is_callable>},
                                                          {"odd", test_odd_even},
                                                          {"even", test_odd_even},
                                                          {"false", test_kind<is_false>},
                                                          {"true", test_kind<is_true>},
                                                          {"none", test_kind<is_none>},
                                                          {"string", test_kind<is_str>},
                                                          {"number", test_kind<is_number>},
                                                          {"integer", test_kind<is_integer>},
                                                          {"iterable", test_kind<is_iterable>},
                                                          {"mapping", test_kind<is_mapping>},
                                                          {"sequence", test_kind<is_sequence>},
                                                          {"lower", test_case},
                                                          {"upper", test_case},
                                                          {"defined", test_kind<is_defined>},
                                                          {"undefined", test_kind<is_undefined>},
                                                          {"equalto", test_equal},
                                                          {"eq", test_equal}};

TestFn find_test(std::string_view name) {
  for (const auto& [n, fn] : kTests)
    if (n == name) return fn;
  return nullptr;
}

}  // namespace

bool Interpreter::has_test(const std::string& name) const { return find_test(name) != nullptr; }

bool Interpreter::run_test(const std::string& n, const Value& v, const Value* arg, Pos pos) {
  const TestFn test = find_test(n);
  if (test == nullptr) fail(pos, "unknown test '" + n + "'");
  return test(*this, n, v, arg, pos);
}

// ---------------------------------------------------------------------------
// Methods and functions: the builtin function values (globals such as range, and methods bound
// to their string or object), dispatched through kFunctions by their Builtin.

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

// One call of a builtin function, as the handlers see it.
struct FunctionCall {
  Interpreter& in;
  Builtin builtin;
  const Value& self;  // the string or object of a method
  Args& args;
  Pos pos;

  Value slice(size_t b, size_t e) const {
    TextBuilder tb;
    tb.append_slice(VA::str(self), b, e);
    return make_string(tb.take());
  }
};

Value fn_raise_exception(FunctionCall& c) {
  std::string message;
  if (!c.args.empty() && !c.args[0].is_undefined() && c.args[0].kind() != Kind::kNone) {
    TextBuilder tb;
    c.in.append_raw(tb, c.args[0], c.pos);
    message = std::move(tb.text);
  }
  throw Error(c.in.template_name(), c.pos.line, c.pos.column, std::move(message), true);
}

Value fn_range(FunctionCall& c) {
  // range(start, stop, step) on the JavaScript numbers.
  const Args& args = c.args;
  for (size_t i = 0; i < std::min<size_t>(args.size(), 3); ++i)
    if (!is_number(args[i]) && !(i == 2 && args[i].is_undefined()))
      c.in.fail(c.pos, std::string("unsupported: range() of ") + Interpreter::type_name(args[i]));
  if (args.empty()) c.in.fail(c.pos, "unsupported: range() without arguments");
  double start = 0, stop = VA::num(args[0]), stride = 1;
  if (args.size() >= 2) start = VA::num(args[0]), stop = VA::num(args[1]);
  if (args.size() >= 3 && !args[2].is_undefined()) stride = VA::num(args[2]);
  if (stride == 0) c.in.fail(c.pos, "range() step must not be zero");
  std::vector<Value> out;
  auto add = [&](double i) {
    c.in.step(c.pos);
    out.push_back(i == std::floor(i) && std::isfinite(i) ? make_int(i) : make_float(i));
  };
  if (stride > 0) {
    for (double i = start; i < stop; i += stride) add(i);
  } else {
    for (double i = start; i > stop; i += stride) add(i);
  }
  return make_array(std::move(out));
}

Value fn_strftime_now(FunctionCall& c) {
  if (c.args.empty() || !is_str(c.args[0]))
    c.in.fail(c.pos, "strftime_now() needs a format string");
  const int64_t fixed = c.in.options().now_unix_seconds;
  const std::time_t now = fixed >= 0 ? static_cast<std::time_t>(fixed) : std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  static const char* kShort[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                 "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  static const char* kLong[] = {"January",   "February", "March",    "April",
                                "May",       "June",     "July",     "August",
                                "September", "October",  "November", "December"};
  auto pad2 = [](int n) { return (n < 10 ? "0" : "") + std::to_string(n); };
  const std::string& format = str_of(c.args[0]);
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] == '%' && i + 1 < format.size()) {
      std::string r;
      bool known = true;
      switch (format[i + 1]) {
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

Value fn_namespace(FunctionCall& c) {
  Args& args = c.args;
  ObjectData kw = pop_kwargs(args);
  if (args.size() > 1)
    c.in.fail(c.pos, "namespace() takes at most 1 positional argument, got " +
                         std::to_string(args.size()));
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
          c.in.fail(c.pos, "namespace() takes an object or a list of [key, value] pairs");
        if (!is_str(kv[0])) c.in.fail(c.pos, "namespace() keys must be strings");
        entries.set(str_of(kv[0]), kv[1]);
      }
    } else {
      c.in.fail(c.pos, std::string("namespace(): '") + Interpreter::type_name(src) +
                           "' object is not iterable");
    }
  }
  for (const auto& [k, v] : kw.entries) entries.set(k, v);
  return c.in.make_namespace(std::move(entries));
}

Value fn_str_upper(FunctionCall& c) { return str_value(text::to_upper(str_of(c.self))); }
Value fn_str_lower(FunctionCall& c) { return str_value(text::to_lower(str_of(c.self))); }
Value fn_str_title(FunctionCall& c) { return str_value(title_case(str_of(c.self))); }
Value fn_str_capitalize(FunctionCall& c) { return str_value(capitalize(str_of(c.self))); }

Value fn_str_strip(FunctionCall& c) {
  // The JavaScript ignores the characters argument: all whitespace goes.
  const std::string& s = str_of(c.self);
  const size_t b = text::trim_start(s);
  return c.slice(b, std::max(b, text::trim_end(s)));
}
Value fn_str_lstrip(FunctionCall& c) {
  return c.slice(text::trim_start(str_of(c.self)), str_of(c.self).size());
}
Value fn_str_rstrip(FunctionCall& c) { return c.slice(0, text::trim_end(str_of(c.self))); }

Value fn_str_startswith_endswith(FunctionCall& c) {
  const bool starts = c.builtin == Builtin::kStrStartswith;
  const char* name = starts ? "startswith" : "endswith";
  if (c.args.empty()) c.in.fail(c.pos, std::string(name) + "() requires at least one argument");
  const std::string& s = str_of(c.self);
  auto test = [&](const std::string& p) { return starts ? s.starts_with(p) : s.ends_with(p); };
  if (is_str(c.args[0])) return Value::boolean(test(str_of(c.args[0])));
  if (c.args[0].kind() == Kind::kArray) {
    for (const Value& item : VA::arr(c.args[0]).items) {
      if (!is_str(item)) c.in.fail(c.pos, std::string(name) + "() tuple elements must be strings");
      if (test(str_of(item))) return Value::boolean(true);
    }
    return Value::boolean(false);
  }
  c.in.fail(c.pos, std::string(name) + "() argument must be a string or tuple of strings");
}

Value fn_str_split(FunctionCall& c) {
  const Args& args = c.args;
  const Value sep = args.size() > 0 ? args[0] : Value::none();
  if (!is_str(sep) && sep.kind() != Kind::kNone)
    c.in.fail(c.pos, "split(): the separator must be a string or none");
  const Value maxsplit = args.size() > 1 ? args[1] : make_int(-1);
  if (maxsplit.kind() != Kind::kInt) c.in.fail(c.pos, "split(): maxsplit must be an integer");
  const double max = VA::num(maxsplit);
  const std::string& s = str_of(c.self);
  std::vector<Value> out;
  if (sep.kind() == Kind::kNone) {
    size_t i = text::trim_start(s);
    while (i < s.size()) {
      size_t end = i;
      while (end < s.size() && text::space_at(s, end) == 0) {
        text::next_code_point(s, end);
      }
      if (max != -1 && static_cast<double>(out.size()) >= max) {
        out.push_back(c.slice(i, s.size()));
        break;
      }
      out.push_back(c.slice(i, end));
      i = end;
      while (size_t n = text::space_at(s, i)) i += n;
    }
  } else {
    const std::string& p = str_of(sep);
    if (p.empty()) c.in.fail(c.pos, "split(): empty separator");
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
    for (const auto& [b, e] : pieces) out.push_back(c.slice(b, e));
  }
  c.in.step(c.pos, static_cast<int64_t>(out.size()));
  return make_array(std::move(out));
}

Value fn_str_replace(FunctionCall& c) {
  const Args& args = c.args;
  if (args.size() < 2) c.in.fail(c.pos, "replace() requires at least two arguments");
  if (!is_str(args[0]) || !is_str(args[1])) c.in.fail(c.pos, "replace() arguments must be strings");
  Value count = Value::none();
  if (args.size() > 2) {
    if (args[2].kind() == Kind::kObject && VA::flag(args[2])) {
      const Value* n = VA::obj(args[2]).find("count");
      if (n != nullptr) count = *n;
    } else {
      count = args[2];
    }
  }
  if (count.kind() != Kind::kInt && count.kind() != Kind::kNone)
    c.in.fail(c.pos, "replace(): count must be an integer or none");
  const double n = count.kind() == Kind::kInt ? VA::num(count) : -1;
  std::string r = replace_all(str_of(c.self), str_of(args[0]), str_of(args[1]), n);
  c.in.check_size(c.pos, r.size());
  return str_value(std::move(r));
}

Value fn_obj_get(FunctionCall& c) {
  const Args& args = c.args;
  if (args.empty() || !is_str(args[0]))
    c.in.fail(c.pos, std::string("get(): the key must be a string, got ") +
                         (args.empty() ? "nothing" : Interpreter::type_name(args[0])));
  if (const Value* v = VA::obj(c.self).find(str_of(args[0]))) return *v;
  return args.size() > 1 ? args[1] : Value::none();
}

Value fn_obj_items(FunctionCall& c) {
  std::vector<Value> out;
  for (const auto& [k, v] : VA::obj(c.self).entries) out.push_back(make_array({str_value(k), v}));
  c.in.step(c.pos, static_cast<int64_t>(out.size()));
  return make_array(std::move(out));
}

Value fn_obj_keys(FunctionCall& c) {
  std::vector<Value> out;
  for (const auto& [k, v] : VA::obj(c.self).entries) out.push_back(str_value(k));
  return make_array(std::move(out));
}

Value fn_obj_values(FunctionCall& c) {
  std::vector<Value> out;
  for (const auto& [k, v] : VA::obj(c.self).entries) out.push_back(v);
  return make_array(std::move(out));
}

Value fn_obj_dictsort(FunctionCall& c) {
  ObjectData kw;
  Args positional;
  for (Value& a : c.args) {
    if (a.kind() == Kind::kObject && VA::flag(a)) {
      kw.entries = VA::obj(a).entries;
      kw.reindex();
    } else {
      positional.push_back(std::move(a));
    }
  }
  const Value* cs = arg_or(positional, 0, kw, "case_sensitive");
  if (cs != nullptr && cs->kind() != Kind::kBool)
    c.in.fail(c.pos, "dictsort(): case_sensitive must be a boolean");
  const Value* by = arg_or(positional, 1, kw, "by");
  if (by != nullptr && !is_str(*by)) c.in.fail(c.pos, "dictsort(): by must be a string");
  const std::string by_s = by != nullptr ? str_of(*by) : "key";
  if (by_s != "key" && by_s != "value")
    c.in.fail(c.pos, "dictsort(): by must be either 'key' or 'value'");
  const Value* rev = arg_or(positional, 2, kw, "reverse");
  if (rev != nullptr && rev->kind() != Kind::kBool)
    c.in.fail(c.pos, "dictsort(): reverse must be a boolean");
  const bool case_sensitive = cs != nullptr && VA::flag(*cs);
  const bool reverse = rev != nullptr && VA::flag(*rev);
  std::vector<Value> items;
  for (const auto& [k, v] : VA::obj(c.self).entries) items.push_back(make_array({str_value(k), v}));
  const size_t index = by_s == "key" ? 0 : 1;
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    const int r = compare_values(c.in, VA::arr(a).items[index], VA::arr(b).items[index],
                                 case_sensitive, c.pos);
    return reverse ? r > 0 : r < 0;
  });
  return make_array(std::move(items));
}

// Every builtin but kMacro, in the order of the enum: its receiver (kUndefined: a global, in the
// root scope under its name; kString, kObject: a method of such values) and its name.
struct Function {
  Builtin builtin;
  Kind receiver;
  std::string_view name;
  Value (*run)(FunctionCall&);
};
constexpr Function kFunctions[] = {
    {Builtin::kRaiseException, Kind::kUndefined, "raise_exception", fn_raise_exception},
    {Builtin::kRange, Kind::kUndefined, "range", fn_range},
    {Builtin::kStrftimeNow, Kind::kUndefined, "strftime_now", fn_strftime_now},
    {Builtin::kNamespace, Kind::kUndefined, "namespace", fn_namespace},
    {Builtin::kStrUpper, Kind::kString, "upper", fn_str_upper},
    {Builtin::kStrLower, Kind::kString, "lower", fn_str_lower},
    {Builtin::kStrStrip, Kind::kString, "strip", fn_str_strip},
    {Builtin::kStrTitle, Kind::kString, "title", fn_str_title},
    {Builtin::kStrCapitalize, Kind::kString, "capitalize", fn_str_capitalize},
    {Builtin::kStrRstrip, Kind::kString, "rstrip", fn_str_rstrip},
    {Builtin::kStrLstrip, Kind::kString, "lstrip", fn_str_lstrip},
    {Builtin::kStrStartswith, Kind::kString, "startswith", fn_str_startswith_endswith},
    {Builtin::kStrEndswith, Kind::kString, "endswith", fn_str_startswith_endswith},
    {Builtin::kStrSplit, Kind::kString, "split", fn_str_split},
    {Builtin::kStrReplace, Kind::kString, "replace", fn_str_replace},
    {Builtin::kObjGet, Kind::kObject, "get", fn_obj_get},
    {Builtin::kObjItems, Kind::kObject, "items", fn_obj_items},
    {Builtin::kObjKeys, Kind::kObject, "keys", fn_obj_keys},
    {Builtin::kObjValues, Kind::kObject, "values", fn_obj_values},
    {Builtin::kObjDictsort, Kind::kObject, "dictsort", fn_obj_dictsort},
};
constexpr bool in_enum_order() {
  for (size_t i = 0; i < std::size(kFunctions); ++i)
    if (kFunctions[i].builtin != static_cast<Builtin>(i)) return false;
  return std::size(kFunctions) == static_cast<size_t>(Builtin::kMacro);
}
static_assert(in_enum_order(), "kFunctions: one entry per Builtin but kMacro, in enum order");

}  // namespace

Value Interpreter::builtin_property(const Value& v, std::string_view name) {
  switch (v.kind()) {
    case Kind::kString:
      if (name == "length") return make_int(static_cast<double>(text::utf16_length(str_of(v))));
      break;
    case Kind::kArray:
      if (name == "length") return make_int(static_cast<double>(VA::arr(v).items.size()));
      return Value();
    case Kind::kObject:
      break;
    default:
      return Value();
  }
  for (const Function& f : kFunctions)
    if (f.receiver == v.kind() && f.name == name)
      return make_function(FunctionData{f.builtin, v, nullptr});
  return Value();
}

Value Interpreter::call_function(const Value& fn, Args args, Scope& scope, Pos pos) {
  const FunctionData& f = VA::fn(fn);
  if (f.builtin == Builtin::kMacro) return call_macro(*f.macro, std::move(args), scope, pos);
  FunctionCall call{*this, f.builtin, f.self, args, pos};
  return kFunctions[static_cast<size_t>(f.builtin)].run(call);
}

// ---------------------------------------------------------------------------
// Filters: `x | name` (bare) or `x | name(...)` (called), found in kFilters by name and by the
// operand's kind; an object's other filters are its methods (items, get, ...). A name the table
// has not for this operand is "unknown <kind> filter" where the kind has filters, else "cannot
// apply".

namespace {

// One filter application, as the handlers see it.
struct FilterCall {
  Interpreter& in;
  const Value& operand;
  const Expr& filter;
  Scope& scope;
  Pos pos;

  const std::string& name() const { return filter.name; }
  Kind kind() const { return operand.kind(); }
  bool called() const { return filter.has_args; }
  // The arguments of name(...), evaluated: positional ones, and keyword ones.
  std::pair<Args, ObjectData> arguments() const { return in.eval_arguments(filter.kids, 1, scope); }
  [[noreturn]] void cannot() const {
    in.fail(pos, "cannot apply filter '" + name() + "' to " + Interpreter::type_name(operand));
  }
};

Value json_of(FilterCall& c, const Interpreter::JsonOptions& o) {
  std::string s;
  c.in.append_json(s, c.operand, o, c.pos, 0);
  return str_value(std::move(s));
}

Value join_with(FilterCall& c, const std::string& sep) {
  TextBuilder tb;
  if (c.kind() == Kind::kString) {
    const std::string& s = str_of(c.operand);
    bool first = true;
    for (size_t i = 0; i < s.size();) {
      const size_t b = i;
      text::next_code_point(s, i);
      if (!first) tb.append(sep);
      first = false;
      tb.append_slice(VA::str(c.operand), b, i);
    }
  } else {
    bool first = true;
    for (const Value& item : VA::arr(c.operand).items) {
      if (!first) tb.append(sep);
      first = false;
      if (item.kind() == Kind::kNone || item.is_undefined()) continue;
      if (is_str(item)) {
        tb.append(VA::str(item));
      } else {
        c.in.append_raw(tb, item, c.pos);
      }
      c.in.check_size(c.pos, tb.text.size());
    }
  }
  c.in.check_size(c.pos, tb.text.size());
  return make_string(tb.take());
}

Value indent_by(FilterCall& c, double width, bool first, bool blank) {
  if (width < 0 || std::isinf(width)) c.in.fail(c.pos, "indent(): invalid width");
  if (std::isnan(width)) width = 0;
  if (width > static_cast<double>(c.in.options().max_output_bytes))
    c.in.fail(c.pos, "indent(): the width is too large");
  const std::string pad(static_cast<size_t>(width), ' ');
  const std::string& s = str_of(c.operand);
  std::string out;
  size_t start = 0;
  for (size_t line = 0;; ++line) {
    const size_t nl = s.find('\n', start);
    const size_t end = nl == std::string::npos ? s.size() : nl;
    if (!((!first && line == 0) || (!blank && end == start))) out += pad;
    out.append(s, start, end - start);
    c.in.check_size(c.pos, out.size());
    if (nl == std::string::npos) break;
    out += '\n';
    start = nl + 1;
  }
  return str_value(std::move(out));
}

Value sorted(FilterCall& c, bool reverse, bool case_sensitive, const Value* attribute) {
  std::vector<Value> items = VA::arr(c.operand).items;
  std::string path;
  if (attribute != nullptr) {
    TextBuilder tb;
    c.in.append_raw(tb, *attribute, c.pos);
    path = tb.text;
  }
  auto key = [&](const Value& v) { return attribute ? attribute_path(v, path) : v; };
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    const int r = compare_values(c.in, key(a), key(b), case_sensitive, c.pos);
    return reverse ? r > 0 : r < 0;
  });
  return make_array(std::move(items));
}

Value filter_safe(FilterCall& c) { return c.operand; }
Value filter_list(FilterCall& c) { return c.operand; }

Value filter_tojson(FilterCall& c) {
  Interpreter::JsonOptions o;
  if (!c.called()) return json_of(c, o);
  auto [positional, kw] = c.arguments();
  if (const Value* v = kw.find("indent")) {
    if (v->kind() != Kind::kInt && v->kind() != Kind::kNone)
      c.in.fail(c.pos, "tojson: indent must be an integer");
    if (v->kind() == Kind::kInt) o.indent = std::isnan(VA::num(*v)) ? 0 : VA::num(*v);
  }
  if (const Value* v = kw.find("ensure_ascii")) {
    if (v->kind() != Kind::kBool) c.in.fail(c.pos, "tojson: ensure_ascii must be a boolean");
    o.ensure_ascii = VA::flag(*v);
  }
  if (const Value* v = kw.find("sort_keys")) {
    if (v->kind() != Kind::kBool) c.in.fail(c.pos, "tojson: sort_keys must be a boolean");
    if (VA::flag(*v))
      c.in.fail(c.pos,
                "unsupported: tojson(sort_keys=true) (JavaScript sorts by locale collation)");
  }
  if (const Value* v = kw.find("separators")) {
    if (v->kind() == Kind::kArray) {
      const auto& items = VA::arr(*v).items;
      if (items.size() != 2 || !is_str(items[0]) || !is_str(items[1]))
        c.in.fail(c.pos, "tojson: separators must be a tuple of two strings");
      o.custom_separators = true;
      o.item_sep = str_of(items[0]);
      o.key_sep = str_of(items[1]);
    } else if (v->kind() != Kind::kNone) {
      c.in.fail(c.pos, "tojson: separators must be a tuple of two strings");
    }
  }
  return json_of(c, o);
}

Value filter_first_last(FilterCall& c) {
  const auto& items = VA::arr(c.operand).items;
  if (items.empty())
    c.in.fail(c.pos, "unsupported: '" + c.name() + "' of an empty list (undefined in JavaScript)");
  return c.name() == "first" ? items.front() : items.back();
}

Value filter_length(FilterCall& c) {
  switch (c.kind()) {
    case Kind::kString:
      return make_int(static_cast<double>(text::utf16_length(str_of(c.operand))));
    case Kind::kObject:
      return make_int(static_cast<double>(VA::obj(c.operand).entries.size()));
    default:
      return make_int(static_cast<double>(VA::arr(c.operand).items.size()));
  }
}

Value filter_reverse(FilterCall& c) {
  const auto& items = VA::arr(c.operand).items;
  return make_array(std::vector<Value>(items.rbegin(), items.rend()));
}

Value filter_sort(FilterCall& c) {
  if (!c.called()) return sorted(c, false, false, nullptr);
  auto [positional, kw] = c.arguments();
  const Value* rev = arg_or(positional, 0, kw, "reverse");
  if (rev != nullptr && rev->kind() != Kind::kBool)
    c.in.fail(c.pos, "sort: reverse must be a boolean");
  const Value* cs = arg_or(positional, 1, kw, "case_sensitive");
  if (cs != nullptr && cs->kind() != Kind::kBool)
    c.in.fail(c.pos, "sort: case_sensitive must be a boolean");
  const Value* attr = arg_or(positional, 2, kw, "attribute");
  if (attr != nullptr && attr->kind() == Kind::kNone) attr = nullptr;
  if (attr != nullptr && !is_str(*attr) && attr->kind() != Kind::kInt)
    c.in.fail(c.pos, "sort: attribute must be a string, integer or none");
  return sorted(c, rev != nullptr && VA::flag(*rev), cs != nullptr && VA::flag(*cs), attr);
}

Value filter_join(FilterCall& c) {
  if (!c.called()) return c.kind() == Kind::kString ? c.operand : join_with(c, "");
  if (c.kind() != Kind::kString && c.kind() != Kind::kArray) c.cannot();
  auto [positional, kw] = c.arguments();
  const Value* sep = arg_or(positional, 0, kw, "separator");
  if (sep != nullptr && !is_str(*sep)) c.in.fail(c.pos, "join: the separator must be a string");
  return join_with(c, sep != nullptr ? str_of(*sep) : "");
}

Value filter_string(FilterCall& c) {
  if (c.kind() == Kind::kString) return c.operand;
  // An array prints as JSON with undefined kept, a number as {{ }} prints it.
  TextBuilder tb;
  c.in.append_display(tb, c.operand, c.pos);
  return str_value(std::move(tb.text));
}

Value filter_unique(FilterCall& c) {
  std::vector<Value> out;
  for (const Value& item : VA::arr(c.operand).items) {
    if (item.kind() == Kind::kFunction) c.in.fail(c.pos, "unsupported: unique of functions");
    bool seen = false;
    for (const Value& o : out) {
      const bool both_nan =
          is_number(o) && is_number(item) && std::isnan(VA::num(o)) && std::isnan(VA::num(item));
      if (both_nan || c.in.strict_equal(o, item, c.pos)) {
        seen = true;
        break;
      }
    }
    if (!seen) out.push_back(item);
    c.in.step(c.pos, static_cast<int64_t>(out.size()));
  }
  return make_array(std::move(out));
}

// upper, lower, title, capitalize and trim are the string's methods (trim is strip).
Value filter_string_method(FilterCall& c) {
  const std::string_view method = c.name() == "trim" ? "strip" : std::string_view(c.name());
  return c.in.call_function(c.in.builtin_property(c.operand, method), {}, c.scope, c.pos);
}

Value filter_indent(FilterCall& c) {
  if (!c.called()) return indent_by(c, 4, false, false);
  auto [positional, kw] = c.arguments();
  const Value* width = arg_or(positional, 0, kw, "width");
  if (width != nullptr && width->kind() != Kind::kInt)
    c.in.fail(c.pos, "indent: width must be a number");
  const Value* first = arg_or(positional, 1, kw, "first");
  const Value* blank = arg_or(positional, 2, kw, "blank");
  using Truth = Interpreter::Truth;
  return indent_by(c, width != nullptr ? VA::num(*width) : 4,
                   first != nullptr && Interpreter::truthy(*first, Truth::kRaw),
                   blank != nullptr && Interpreter::truthy(*blank, Truth::kRaw));
}

// int and float: bare, a number rounds down (int) or stays (float); called, a number is kept
// as it is and text that does not parse gives the default.
Value filter_int_float(FilterCall& c) {
  const bool is_int = c.name() == "int";
  const auto [positional, kw] = c.called() ? c.arguments() : std::pair<Args, ObjectData>();
  const Value* d = arg_or(positional, 0, kw, "default");
  const Value dflt = d != nullptr ? *d : is_int ? make_int(0) : make_float(0);
  auto make = [&](double v) { return is_int ? make_int(v) : make_float(v); };
  switch (c.kind()) {
    case Kind::kString: {
      const double v =
          is_int ? text::parse_int(str_of(c.operand)) : text::parse_float(str_of(c.operand));
      return std::isnan(v) ? dflt : make(v);
    }
    case Kind::kInt:
    case Kind::kFloat:
      if (c.called()) return c.operand;
      return is_int ? make_int(std::floor(VA::num(c.operand))) : make_float(VA::num(c.operand));
    case Kind::kBool:
      return make(VA::flag(c.operand) ? 1 : 0);
    default:
      c.cannot();
  }
}

Value filter_abs(FilterCall& c) {
  const double v = std::fabs(VA::num(c.operand));
  return c.kind() == Kind::kInt ? make_int(v) : make_float(v);
}

Value filter_bool(FilterCall& c) { return c.operand; }

Value filter_default(FilterCall& c) {
  auto [positional, kw] = c.arguments();
  const Value dflt = positional.empty() ? str_value("") : positional[0];
  const Value* flag = arg_or(positional, 1, kw, "boolean");
  if (flag != nullptr && flag->kind() != Kind::kBool)
    c.in.fail(c.pos, "default: the boolean flag must be a boolean");
  const bool boolean = flag != nullptr && VA::flag(*flag);
  if (c.operand.is_undefined() || (boolean && !Interpreter::truthy(c.operand))) return dflt;
  return c.operand;
}

Value filter_select_reject(FilterCall& c) {
  const bool select = c.name() == "selectattr";
  const auto& kids = c.filter.kids;
  const auto& items = VA::arr(c.operand).items;
  for (const Value& item : items)
    if (!is_container(item))
      c.in.fail(c.pos, "'" + c.name() + "' can only be applied to a list of objects");
  for (size_t i = 1; i < kids.size(); ++i)
    if (kids[i]->kind != ExprKind::kLiteral || !is_str(kids[i]->literal))
      c.in.fail(kids[i]->pos, "the arguments of '" + c.name() + "' must be string literals");
  std::vector<Value> args;
  for (size_t i = 1; i < kids.size(); ++i) args.push_back(kids[i]->literal);
  if (args.size() > 1 && !c.in.has_test(str_of(args[1])))
    c.in.fail(c.pos, "unknown test '" + str_of(args[1]) + "'");
  std::vector<Value> out;
  for (const Value& item : items) {
    c.in.step(c.pos);
    if (args.empty()) c.in.fail(c.pos, "'" + c.name() + "' needs an attribute name");
    const Value* a = VA::obj(item).find(str_of(args[0]));
    bool r = false;
    if (a != nullptr) {
      r = args.size() > 1
              ? c.in.run_test(str_of(args[1]), *a, args.size() > 2 ? &args[2] : nullptr, c.pos)
              : Interpreter::truthy(*a);
    }
    if (r == select) out.push_back(item);
  }
  return make_array(std::move(out));
}

Value filter_map(FilterCall& c) {
  auto [positional, kw] = c.arguments();
  const Value* attr = kw.find("attribute");
  if (attr == nullptr)
    c.in.fail(c.pos, "unsupported: map without attribute= (not in @huggingface/jinja)");
  if (!is_str(*attr)) c.in.fail(c.pos, "map: attribute must be a string");
  const Value* dflt = kw.find("default");
  std::vector<Value> out;
  for (const Value& item : VA::arr(c.operand).items) {
    c.in.step(c.pos);
    if (!is_container(item)) c.in.fail(c.pos, "map: the items must be objects");
    Value v = attribute_path(item, str_of(*attr));
    if (v.is_undefined() && dflt != nullptr) v = *dflt;
    out.push_back(std::move(v));
  }
  return make_array(std::move(out));
}

Value filter_replace(FilterCall& c) {
  auto [positional, kw] = c.arguments();
  positional.push_back(make_object(std::move(kw), /*kwargs=*/true));
  return c.in.call_function(c.in.builtin_property(c.operand, "replace"), std::move(positional),
                            c.scope, c.pos);
}

// Sets of operand kinds.
constexpr uint32_t kinds(std::initializer_list<Kind> ks) {
  uint32_t m = 0;
  for (Kind k : ks) m |= 1u << static_cast<unsigned>(k);
  return m;
}
constexpr uint32_t kAnyKind = ~0u;
constexpr uint32_t kArrays = kinds({Kind::kArray});
constexpr uint32_t kStrings = kinds({Kind::kString});
constexpr uint32_t kNumbers = kinds({Kind::kInt, Kind::kFloat});
constexpr uint32_t kBools = kinds({Kind::kBool});
constexpr uint32_t kObjects = kinds({Kind::kObject});

struct Filter {
  std::string_view name;
  uint32_t bare;    // the operand kinds `x | name` applies to
  uint32_t called;  // the operand kinds `x | name(...)` applies to (the handler may refuse)
  Value (*run)(FilterCall&);
};
constexpr Filter kFilters[] = {
    {"safe", kAnyKind, 0, filter_safe},
    {"tojson", kAnyKind, kAnyKind, filter_tojson},
    {"list", kArrays, 0, filter_list},
    {"first", kArrays, 0, filter_first_last},
    {"last", kArrays, 0, filter_first_last},
    {"length", kArrays | kStrings | kObjects, 0, filter_length},
    {"reverse", kArrays, 0, filter_reverse},
    {"sort", kArrays, kArrays, filter_sort},
    {"join", kArrays | kStrings, kAnyKind, filter_join},
    {"string", kArrays | kStrings | kNumbers | kBools, 0, filter_string},
    {"unique", kArrays, 0, filter_unique},
    {"upper", kStrings, 0, filter_string_method},
    {"lower", kStrings, 0, filter_string_method},
    {"title", kStrings, 0, filter_string_method},
    {"capitalize", kStrings, 0, filter_string_method},
    {"trim", kStrings, 0, filter_string_method},
    {"indent", kStrings, kStrings, filter_indent},
    {"int", kStrings | kNumbers | kBools, kAnyKind, filter_int_float},
    {"float", kStrings | kNumbers | kBools, kAnyKind, filter_int_float},
    {"abs", kNumbers, 0, filter_abs},
    {"bool", kBools, 0, filter_bool},
    {"default", 0, kAnyKind, filter_default},
    {"selectattr", 0, kArrays, filter_select_reject},
    {"rejectattr", 0, kArrays, filter_select_reject},
    {"map", 0, kArrays, filter_map},
    {"replace", 0, kStrings, filter_replace},
};

// The kind's name in "unknown <kind> filter", or null where it has no filters of its own.
const char* filter_kind_name(Kind k, bool called) {
  switch (k) {
    case Kind::kArray:
      return "array";
    case Kind::kString:
      return "string";
    case Kind::kObject:
      return "object";
    case Kind::kInt:
    case Kind::kFloat:
      return called ? nullptr : "number";
    case Kind::kBool:
      return called ? nullptr : "boolean";
    default:
      return nullptr;
  }
}

}  // namespace

Value Interpreter::apply_filter(const Value& operand, const Expr& filter, Scope& scope) {
  const Pos pos = filter.pos;
  const std::string& name = filter.name;
  if (!filter.bad_filter.empty()) fail(pos, filter.bad_filter);
  FilterCall call{*this, operand, filter, scope, pos};
  const uint32_t kind_bit = 1u << static_cast<unsigned>(operand.kind());
  for (const Filter& f : kFilters)
    if (f.name == name && ((filter.has_args ? f.called : f.bare) & kind_bit) != 0)
      return f.run(call);
  if (operand.kind() == Kind::kObject) {
    const Value m = builtin_property(operand, name);
    if (m.kind() == Kind::kFunction) {
      if (!filter.has_args) return call_function(m, {}, scope, pos);
      auto [positional, kw] = eval_arguments(filter.kids, 1, scope);
      if (!kw.entries.empty()) positional.push_back(make_object(std::move(kw), /*kwargs=*/true));
      return call_function(m, std::move(positional), scope, pos);
    }
  }
  if (const char* kind = filter_kind_name(operand.kind(), filter.has_args))
    fail(pos, "unknown " + std::string(kind) + " filter '" + name + "'");
  call.cannot();
}

}  // namespace fd::jinja
