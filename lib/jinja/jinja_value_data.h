// What a jinja::Value points to, and the builder of tagged text (jinja.h).
// Internal to lib/jinja/jinja_*.cc.
//
// A tagged string is its bytes and its tagged ranges (sorted by begin, same
// tags never adjacent: merged). Arrays and objects are immutable once shared;
// a namespace is the one mutable container, so it is the only way to a cycle:
// the interpreter empties every namespace it made when a render ends.
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "lib/jinja/jinja.h"

namespace fd::jinja {

struct StrData {
  std::string text;
  std::vector<Span> tags;
};

struct ArrayData {
  std::vector<Value> items;
};

// Objects, keyword arguments and namespaces: entries in insertion order, and
// a hash index once there are many.
struct ObjectData {
  std::vector<std::pair<std::string, Value>> entries;
  std::unordered_map<std::string, size_t> index;  // key -> entry, once there are kIndexFrom

  static constexpr size_t kIndexFrom = 12;
  ObjectData() = default;
  ObjectData(const ObjectData& o) : entries(o.entries) { reindex(); }
  ObjectData& operator=(const ObjectData&) = delete;

  const Value* find(std::string_view key) const;
  Value* find(std::string_view key);
  // Sets key (an existing one keeps its place).
  void set(std::string_view key, Value v);
  void reindex();
};

struct Stmt;

enum class Builtin : uint8_t {
  kRaiseException,
  kRange,
  kStrftimeNow,
  kNamespace,
  kStrUpper,
  kStrLower,
  kStrStrip,
  kStrTitle,
  kStrCapitalize,
  kStrRstrip,
  kStrLstrip,
  kStrStartswith,
  kStrEndswith,
  kStrSplit,
  kStrReplace,
  kObjGet,
  kObjItems,
  kObjKeys,
  kObjValues,
  kObjDictsort,
  kMacro,
};

struct FunctionData {
  Builtin builtin;
  Value self;                   // the string or object a method belongs to
  const Stmt* macro = nullptr;  // kMacro
};

// Reaches into Value for the interpreter.
struct ValueAccess {
  static Value make(Value::Kind kind, bool flag, double num, std::shared_ptr<void> ptr,
                    int depth = 0) {
    Value v;
    v.kind_ = kind;
    v.flag_ = flag;
    v.depth_ = static_cast<uint16_t>(std::min(depth, Value::kMaxTrackedDepth));
    v.num_ = num;
    v.ptr_ = std::move(ptr);
    return v;
  }
  static double num(const Value& v) { return v.num_; }
  static bool flag(const Value& v) { return v.flag_; }
  static const void* identity(const Value& v) { return v.ptr_.get(); }
  static const StrData& str(const Value& v) { return *static_cast<const StrData*>(v.ptr_.get()); }
  static const ArrayData& arr(const Value& v) {
    return *static_cast<const ArrayData*>(v.ptr_.get());
  }
  static const ObjectData& obj(const Value& v) {
    return *static_cast<const ObjectData*>(v.ptr_.get());
  }
  static ObjectData& ns(const Value& v) { return *static_cast<ObjectData*>(v.ptr_.get()); }
  static const FunctionData& fn(const Value& v) {
    return *static_cast<const FunctionData*>(v.ptr_.get());
  }
  static std::shared_ptr<void> ptr(const Value& v) { return v.ptr_; }
};

// Value makers for the interpreter.
Value make_int(double d);
Value make_float(double d);
Value make_string(StrData s);
Value make_array(std::vector<Value> items, bool tuple = false);
Value make_object(ObjectData o, bool kwargs = false);
Value make_function(FunctionData f);

// Text with tagged ranges, built left to right: the render output, and every
// string a template builds.
class TextBuilder {
 public:
  std::string text;
  std::vector<Span> tags;

  void append(std::string_view plain) { text.append(plain); }
  void append(const StrData& s) { append_slice(s, 0, s.text.size()); }
  // Appends s.text[b, e) with the tags of those bytes; a tagged range that
  // touches an empty slice leaves a marker.
  void append_slice(const StrData& s, size_t b, size_t e);
  void add_tag(Span span);

  struct Mark {
    size_t text_size, tag_count;
    Span last;
  };
  Mark mark() const { return {text.size(), tags.size(), tags.empty() ? Span{} : tags.back()}; }
  void reset(const Mark& m);
  StrData take() { return StrData{std::move(text), std::move(tags)}; }
};

}  // namespace fd::jinja
