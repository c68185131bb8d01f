// jinja::Value (jinja.h): makers, builders, readers, from_json; the tagged
// text builder (jinja_value_data.h).
#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "lib/base/check.h"
#include "lib/jinja/jinja.h"
#include "lib/jinja/jinja_value_data.h"

namespace fd::jinja {

using Kind = Value::Kind;

const Value* ObjectData::find(std::string_view key) const {
  if (!index.empty()) {
    const auto it = index.find(std::string(key));
    return it == index.end() ? nullptr : &entries[it->second].second;
  }
  for (const auto& [k, v] : entries)
    if (k == key) return &v;
  return nullptr;
}

Value* ObjectData::find(std::string_view key) {
  return const_cast<Value*>(static_cast<const ObjectData*>(this)->find(key));
}

void ObjectData::set(std::string_view key, Value v) {
  if (Value* existing = find(key)) {
    *existing = std::move(v);
    return;
  }
  entries.emplace_back(std::string(key), std::move(v));
  if (!index.empty()) {
    index.emplace(entries.back().first, entries.size() - 1);
  } else if (entries.size() >= kIndexFrom) {
    reindex();
  }
}

void ObjectData::reindex() {
  index.clear();
  if (entries.size() < kIndexFrom) return;
  for (size_t i = 0; i < entries.size(); ++i) index.emplace(entries[i].first, i);
}

Value make_int(double d) { return ValueAccess::make(Kind::kInt, false, d, nullptr); }
Value make_float(double d) { return ValueAccess::make(Kind::kFloat, false, d, nullptr); }
Value make_string(StrData s) {
  return ValueAccess::make(Kind::kString, false, 0, std::make_shared<StrData>(std::move(s)));
}
Value make_array(std::vector<Value> items, bool tuple) {
  int depth = 0;
  for (const Value& v : items) depth = std::max(depth, v.depth());
  return ValueAccess::make(Kind::kArray, tuple, 0,
                           std::make_shared<ArrayData>(ArrayData{std::move(items)}), depth + 1);
}
Value make_object(ObjectData o, bool kwargs) {
  int depth = 0;
  for (const auto& [k, v] : o.entries) depth = std::max(depth, v.depth());
  auto data = std::make_shared<ObjectData>();
  data->entries = std::move(o.entries);
  data->reindex();
  return ValueAccess::make(Kind::kObject, kwargs, 0, std::move(data), depth + 1);
}
Value make_function(FunctionData f) {
  return ValueAccess::make(Kind::kFunction, false, 0, std::make_shared<FunctionData>(std::move(f)));
}

Value Value::none() { return ValueAccess::make(Kind::kNone, false, 0, nullptr); }
Value Value::boolean(bool b) { return ValueAccess::make(Kind::kBool, b, 0, nullptr); }
Value Value::integer(int64_t i) { return make_int(static_cast<double>(i)); }
Value Value::real(double d) { return make_float(d); }
Value Value::string(std::string s, int32_t tag) {
  StrData d{std::move(s), {}};
  if (tag >= 0) d.tags.push_back(Span{0, static_cast<int64_t>(d.text.size()), tag});
  return make_string(std::move(d));
}
Value Value::array() { return make_array({}); }
Value Value::object() { return make_object({}); }

Value& Value::push_back(Value v) {
  FD_CHECK(kind_ == Kind::kArray, "jinja::Value::push_back on a non-array");
  if (ptr_.use_count() > 1)
    ptr_ = std::make_shared<ArrayData>(*static_cast<const ArrayData*>(ptr_.get()));
  depth_ = static_cast<uint16_t>(std::max<int>(depth_, std::min(v.depth() + 1, kMaxTrackedDepth)));
  static_cast<ArrayData*>(ptr_.get())->items.push_back(std::move(v));
  return *this;
}

Value& Value::set(std::string_view key, Value v) {
  FD_CHECK(kind_ == Kind::kObject, "jinja::Value::set on a non-object");
  if (ptr_.use_count() > 1)
    ptr_ = std::make_shared<ObjectData>(*static_cast<const ObjectData*>(ptr_.get()));
  // A replaced entry may have been the deepest: the depth stays an upper bound.
  depth_ = static_cast<uint16_t>(std::max<int>(depth_, std::min(v.depth() + 1, kMaxTrackedDepth)));
  static_cast<ObjectData*>(ptr_.get())->set(key, std::move(v));
  return *this;
}

bool Value::as_bool() const {
  FD_CHECK(kind_ == Kind::kBool);
  return flag_;
}
double Value::as_number() const {
  FD_CHECK(kind_ == Kind::kInt || kind_ == Kind::kFloat);
  return num_;
}
const std::string& Value::str() const {
  FD_CHECK(kind_ == Kind::kString);
  return ValueAccess::str(*this).text;
}
const std::vector<Span>& Value::tags() const {
  FD_CHECK(kind_ == Kind::kString);
  return ValueAccess::str(*this).tags;
}
size_t Value::size() const {
  FD_CHECK(kind_ == Kind::kArray || kind_ == Kind::kObject);
  return kind_ == Kind::kArray ? ValueAccess::arr(*this).items.size()
                               : ValueAccess::obj(*this).entries.size();
}
const Value& Value::at(size_t i) const {
  FD_CHECK(kind_ == Kind::kArray);
  const auto& items = ValueAccess::arr(*this).items;
  FD_CHECK(i < items.size());
  return items[i];
}
const Value* Value::find(std::string_view key) const {
  FD_CHECK(kind_ == Kind::kObject);
  return ValueAccess::obj(*this).find(key);
}

namespace {

// An array index as JavaScript's property order knows it: "0" or a
// canonical decimal below 2^32 - 1.
bool is_array_index(const std::string& k, uint64_t& n) {
  if (k.empty() || k.size() > 10 || (k.size() > 1 && k[0] == '0')) return false;
  n = 0;
  for (const char c : k) {
    if (c < '0' || c > '9') return false;
    n = n * 10 + static_cast<uint64_t>(c - '0');
  }
  return n < 4294967295ull;
}

Value convert(const nlohmann::ordered_json& j, int depth) {
  // As deep as a render accepts values (RenderOptions::max_depth).
  if (depth >= RenderOptions{}.max_depth) {
    throw fd::Error(ErrorKind::kUsage,
                    fmt::format("jinja: JSON nested deeper than {} levels, more than a template "
                                "value may be",
                                RenderOptions{}.max_depth));
  }
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return make_int(static_cast<double>(j.get<int64_t>()));
    case nlohmann::ordered_json::value_t::number_unsigned:
      return make_int(static_cast<double>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: {
      const double d = j.get<double>();
      return std::isfinite(d) && d == std::floor(d) ? make_int(d) : make_float(d);
    }
    case nlohmann::ordered_json::value_t::string:
      return Value::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(convert(e, depth + 1));
      return make_array(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      std::vector<std::pair<uint64_t, const std::string*>> indices;
      std::vector<const std::string*> others;
      for (const auto& [k, v] : j.items()) {
        uint64_t n = 0;
        if (is_array_index(k, n)) {
          indices.emplace_back(n, &k);
        } else {
          others.push_back(&k);
        }
      }
      std::sort(indices.begin(), indices.end());
      ObjectData o;
      for (const auto& [n, k] : indices) o.set(*k, convert(j.at(*k), depth + 1));
      for (const std::string* k : others) o.set(*k, convert(j.at(*k), depth + 1));
      return make_object(std::move(o));
    }
    default:
      throw fd::Error(ErrorKind::kUsage, "jinja: binary JSON values have no template value");
  }
}

}  // namespace

Value Value::from_json(const nlohmann::ordered_json& j) { return convert(j, 0); }

std::string Value::inexact_number(const nlohmann::ordered_json& j) {
  using T = nlohmann::ordered_json::value_t;
  switch (j.type()) {
    case T::number_integer: {
      const int64_t v = j.get<int64_t>();
      return v > int64_t{1} << 53 || v < -(int64_t{1} << 53) ? fmt::format(": {}", j.dump()) : "";
    }
    case T::number_unsigned:
      return j.get<uint64_t>() > uint64_t{1} << 53 ? fmt::format(": {}", j.dump()) : "";
    case T::number_float: {
      // A number beyond what int64/uint64 hold parses as a double: an integer written out
      // (123456789012345678901234567890) cannot be told from 1.2345678901234568e29.
      const double d = j.get<double>();
      return std::isfinite(d) && std::fabs(d) >= 0x1p64 ? fmt::format(": {}", j.dump()) : "";
    }
    case T::array:
      for (size_t i = 0; i < j.size(); ++i)
        if (std::string at = inexact_number(j[i]); !at.empty()) return fmt::format("[{}]{}", i, at);
      return "";
    case T::object:
      for (const auto& [key, value] : j.items())
        if (std::string at = inexact_number(value); !at.empty())
          return fmt::format(".{}{}", key, at);
      return "";
    default:
      return "";
  }
}

void TextBuilder::add_tag(Span span) {
  if (!tags.empty()) {
    Span& last = tags.back();
    if (last.tag == span.tag && last.end >= span.begin) {
      last.end = std::max(last.end, span.end);
      return;
    }
  }
  tags.push_back(span);
}

void TextBuilder::append_slice(const StrData& s, size_t b, size_t e) {
  const auto base = static_cast<int64_t>(text.size());
  const auto sb = static_cast<int64_t>(b), se = static_cast<int64_t>(e);
  text.append(s.text, b, e - b);
  for (const Span& r : s.tags) {
    if (r.begin > se) break;
    if (r.begin == r.end) {
      if (sb <= r.begin) add_tag({base + r.begin - sb, base + r.begin - sb, r.tag});
      continue;
    }
    const int64_t ib = std::max(r.begin, sb), ie = std::min(r.end, se);
    if (ib < ie) {
      add_tag({base + ib - sb, base + ie - sb, r.tag});
    } else if (sb == se && r.begin <= sb && sb <= r.end) {
      add_tag({base, base, r.tag});
    }
  }
}

void TextBuilder::reset(const Mark& m) {
  text.resize(m.text_size);
  tags.resize(m.tag_count);
  if (m.tag_count > 0) tags.back() = m.last;
}

Error::Error(std::string name, int32_t line, int32_t column, std::string reason, bool raised)
    : fd::Error(ErrorKind::kUsage,
                name + ":" + std::to_string(line) + ":" + std::to_string(column) + ": " + reason),
      reason_(std::move(reason)),
      line_(line),
      column_(column),
      raised_(raised) {}

}  // namespace fd::jinja
