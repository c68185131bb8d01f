// Statements and expressions of the Jinja interpreter (jinja_interpreter.h).
#include "lib/jinja/jinja_interpreter.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "lib/jinja/jinja_text.h"

namespace fd::jinja {

using Kind = Value::Kind;
using VA = ValueAccess;

namespace {

// Frames of eval/exec before a template is refused as nested too deeply
// (macro recursion), per RenderOptions::max_depth.
constexpr int kFramesPerDepth = 8;

struct DepthGuard {
  DepthGuard(int& depth, int limit, Interpreter& in, Pos pos) : depth_(depth) {
    if (++depth_ > limit) {
      --depth_;
      in.fail(pos, "the template nests too deeply (macro recursion?)");
    }
  }
  ~DepthGuard() { --depth_; }
  int& depth_;
};

bool is_number(const Value& v) { return v.kind() == Kind::kInt || v.kind() == Kind::kFloat; }
bool is_numeric_like(const Value& v) { return is_number(v) || v.kind() == Kind::kBool; }
double numeric(const Value& v) {
  return v.kind() == Kind::kBool ? (VA::flag(v) ? 1 : 0) : VA::num(v);
}
bool is_container(const Value& v) {
  return v.kind() == Kind::kObject || v.kind() == Kind::kNamespace;
}

}  // namespace

// JavaScript's `**` is V8's port of fdlibm's pow, which rounds some results
// differently from the C library's. Here only results that are exact in
// both (fdlibm returns representable integer powers exactly) or that fdlibm
// computes directly (y = 0, 1, -1, 2, 0.5); the rest is refused.
double Interpreter::js_pow(double a, double b, Pos pos) const {
  if (std::isnan(b)) return b;
  if (b == 0) return 1;
  if (b == 1) return a;
  if (b == -1) return 1 / a;
  if (b == 2) return a * a;
  if (b == 0.5) return std::isinf(a) ? HUGE_VAL : std::sqrt(a + 0);
  if (std::isfinite(a) && std::isfinite(b) && b == std::trunc(b) && std::fabs(b) <= 2048) {
    int k = 0;
    const double m = std::frexp(a, &k);
    if (std::fabs(m) == 0.5) {  // a = +-2^(k-1): exact while in range
      const double e = (k - 1) * b;
      if (e >= -1074 && e <= 1023) {
        const double sign = m < 0 && std::fmod(b, 2) != 0 ? -1 : 1;
        return std::ldexp(sign, static_cast<int>(e));
      }
    } else if (a == std::trunc(a) && b > 0) {
      double r = 1;
      bool exact = true;
      for (int i = 0; i < static_cast<int>(b) && exact; ++i) {
        r *= a;
        exact = std::fabs(r) <= 9007199254740992.0;
      }
      if (exact) return r;
    }
  }
  fail(pos, "unsupported: this ** (JavaScript's pow rounds it differently from C's)");
}

Value* Scope::own(int32_t slot) {
  if (root != nullptr) return &(*root)[static_cast<size_t>(slot)];
  for (auto& [s, v] : vars)
    if (s == slot) return &v;
  return nullptr;
}

void Scope::set(int32_t slot, Value v) {
  if (Value* p = own(slot)) {
    *p = std::move(v);
  } else {
    vars.emplace_back(slot, std::move(v));
  }
}

Interpreter::Interpreter(const Template::Program& program, const RenderOptions& options)
    : program_(program), options_(options) {}

Interpreter::~Interpreter() {
  // Namespaces are the only mutable values, so the only way to a reference
  // cycle (ns.self = ns): empty them all.
  for (auto& p : namespaces_) static_cast<ObjectData*>(p.get())->entries.clear();
}

void Interpreter::fail(Pos pos, const std::string& reason) const {
  throw Error(program_.name, pos.line, pos.column, reason, false);
}

void Interpreter::step(Pos pos, int64_t n) {
  steps_ += n;
  if (steps_ > options_.max_steps)
    fail(pos,
         "the template runs too long (more than " + std::to_string(options_.max_steps) + " steps)");
}

void Interpreter::check_size(Pos pos, size_t bytes) const {
  if (static_cast<int64_t>(bytes) > options_.max_output_bytes)
    fail(pos, "the template makes a string longer than " +
                  std::to_string(options_.max_output_bytes) + " bytes");
}

Value Interpreter::make_namespace(ObjectData entries) {
  auto data = std::make_shared<ObjectData>();
  data->entries = std::move(entries.entries);
  data->reindex();
  namespaces_.push_back(data);
  return VA::make(Kind::kNamespace, false, 0, std::move(data), 1);
}

bool Interpreter::truthy(const Value& v, Truth of) {
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
      return !VA::str(v).text.empty();
    case Kind::kArray:
      return of == Truth::kRaw || !VA::arr(v).items.empty();
    case Kind::kObject:
      return of == Truth::kRaw || !VA::obj(v).entries.empty();
    case Kind::kNamespace:
    case Kind::kFunction:
      return true;
  }
  return false;
}

const char* Interpreter::type_name(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return "UndefinedValue";
    case Kind::kNone:
      return "NullValue";
    case Kind::kBool:
      return "BooleanValue";
    case Kind::kInt:
      return "IntegerValue";
    case Kind::kFloat:
      return "FloatValue";
    case Kind::kString:
      return "StringValue";
    case Kind::kArray:
      return VA::flag(v) ? "TupleValue" : "ArrayValue";
    case Kind::kObject:
      return VA::flag(v) ? "KeywordArgumentsValue" : "ObjectValue";
    case Kind::kNamespace:
      return "NamespaceValue";
    case Kind::kFunction:
      return "FunctionValue";
  }
  return "?";
}

Rendered Interpreter::run(const Value& context) {
  root_.assign(program_.symbols.size(), Value());
  root_[kSlotTrue] = Value::boolean(true);
  root_[kSlotFalse] = Value::boolean(false);
  root_[kSlotNone] = Value::none();
  root_[kSlotTrueTitle] = Value::boolean(true);
  root_[kSlotFalseTitle] = Value::boolean(false);
  root_[kSlotNoneTitle] = Value::none();
  root_[kSlotRaiseException] = builtin_function(Builtin::kRaiseException);
  root_[kSlotRange] = builtin_function(Builtin::kRange);
  root_[kSlotStrftimeNow] = builtin_function(Builtin::kStrftimeNow);
  root_[kSlotNamespace] = builtin_function(Builtin::kNamespace);
  if (!context.is_undefined()) {
    if (!context.is_object())
      fail(Pos{1, 1},
           std::string("the render context must be an object, not ") + type_name(context));
    for (const auto& [key, value] : VA::obj(context).entries) {
      // The JavaScript declares context variables next to its globals.
      if (key == "namespace" || key == "true" || key == "false" || key == "none" || key == "True" ||
          key == "False" || key == "None" || key == "raise_exception" || key == "range" ||
          key == "strftime_now")
        fail(Pos{1, 1}, "the context variable '" + key + "' is a global (already declared)");
      const auto it = program_.slot_of.find(key);
      if (it != program_.slot_of.end()) root_[static_cast<size_t>(it->second)] = value;
    }
  }
  Scope root;
  root.root = &root_;
  TextBuilder out;
  try {
    exec(program_.body, root, out);
  } catch (const BreakSignal& b) {
    fail(b.pos, "{% break %} outside of a loop");
  } catch (const ContinueSignal& c) {
    fail(c.pos, "{% continue %} outside of a loop");
  }
  return Rendered{std::move(out.text), std::move(out.tags)};
}

Value Interpreter::lookup(int32_t slot, Scope& scope) {
  if (slot == kSlotNamespace && scope.root == nullptr) {
    // Every scope has its own `namespace`.
    if (Value* v = scope.own(slot)) return *v;
    return builtin_function(Builtin::kNamespace);
  }
  for (Scope* s = &scope; s != nullptr; s = s->parent)
    if (Value* v = s->own(slot)) return *v;
  return Value();
}

void Interpreter::exec(const std::vector<std::unique_ptr<Stmt>>& body, Scope& scope,
                       TextBuilder& out) {
  for (const auto& s : body) exec_one(*s, scope, out);
}

Value Interpreter::render_block(const std::vector<std::unique_ptr<Stmt>>& body, Scope& scope) {
  TextBuilder b;
  exec(body, scope, b);
  return make_string(b.take());
}

void Interpreter::exec_one(const Stmt& s, Scope& scope, TextBuilder& out) {
  DepthGuard guard(depth_, options_.max_depth * kFramesPerDepth, *this, s.pos);
  step(s.pos);
  switch (s.kind) {
    case StmtKind::kText:
      out.append(VA::str(s.text).text);
      break;
    case StmtKind::kOutput: {
      const Value v = eval(*s.expr, scope);
      if (v.kind() == Kind::kNone || v.kind() == Kind::kUndefined) break;
      if (v.kind() == Kind::kString) {
        out.append(VA::str(v));
      } else {
        append_display(out, v, s.expr->pos);
      }
      break;
    }
    case StmtKind::kIf:
      exec(truthy(eval(*s.expr, scope)) ? s.body : s.alt, scope, out);
      break;
    case StmtKind::kFor:
      exec_for(s, scope, out);
      break;
    case StmtKind::kSet:
      exec_set(s, scope);
      break;
    case StmtKind::kMacro: {
      FunctionData f{Builtin::kMacro, Value(), &s};
      scope.set(s.slot, make_function(std::move(f)));
      break;
    }
    case StmtKind::kBreak:
      throw BreakSignal{s.pos};
    case StmtKind::kContinue:
      throw ContinueSignal{s.pos};
    case StmtKind::kFilterBlock: {
      const Value body = render_block(s.body, scope);
      const Value v = apply_filter(body, *s.expr, scope);
      if (v.kind() == Kind::kNone || v.kind() == Kind::kUndefined) break;
      if (v.kind() == Kind::kString) {
        out.append(VA::str(v));
      } else {
        append_display(out, v, s.pos);
      }
      break;
    }
    case StmtKind::kComment:
      break;
  }
  check_size(s.pos, out.text.size());
}

void Interpreter::exec_set(const Stmt& s, Scope& scope) {
  const Value rhs = s.expr ? eval(*s.expr, scope) : render_block(s.body, scope);
  const Expr& target = *s.target;
  switch (target.kind) {
    case ExprKind::kIdentifier:
      scope.set(target.slot, rhs);
      return;
    case ExprKind::kTuple: {
      if (rhs.kind() != Kind::kArray)
        fail(target.pos, std::string("cannot unpack non-iterable type in set: ") + type_name(rhs));
      const auto& items = VA::arr(rhs).items;
      if (items.size() != target.kids.size())
        fail(target.pos, std::string("too ") +
                             (target.kids.size() > items.size() ? "few" : "many") +
                             " items to unpack in set");
      for (size_t i = 0; i < items.size(); ++i) {
        if (target.kids[i]->kind != ExprKind::kIdentifier)
          fail(target.kids[i]->pos, "cannot unpack to a non-name in set");
        scope.set(target.kids[i]->slot, items[i]);
      }
      return;
    }
    case ExprKind::kMember: {
      const Value object = eval(*target.kids[0], scope);
      if (object.kind() != Kind::kNamespace)
        fail(target.pos, "cannot assign an attribute of a non-namespace object");
      if (target.computed || target.literal.kind() != Kind::kString)
        fail(target.pos, "cannot assign to a member that is not a name");
      VA::ns(object).set(VA::str(target.literal).text, rhs);
      return;
    }
    default:
      fail(target.pos, "invalid left-hand side of an assignment");
  }
}

void Interpreter::exec_for(const Stmt& s, Scope& scope, TextBuilder& out) {
  Scope loop_scope;
  loop_scope.parent = &scope;
  const Expr* test = nullptr;
  Value iterable;
  if (s.expr->kind == ExprKind::kSelect) {
    iterable = eval(*s.expr->kids[0], loop_scope);
    test = s.expr->kids[1].get();
  } else {
    iterable = eval(*s.expr, loop_scope);
  }
  if (iterable.kind() == Kind::kObject) {
    std::vector<Value> keys;
    for (const auto& [k, v] : VA::obj(iterable).entries) keys.push_back(Value::string(k));
    iterable = make_array(std::move(keys));
  } else if (iterable.kind() != Kind::kArray) {
    fail(s.expr->pos,
         std::string("expected an iterable or object in a for loop, got ") + type_name(iterable));
  }
  const Expr& target = *s.target;
  auto bind = [&](Scope& into, const Value& item) {
    if (target.kind == ExprKind::kIdentifier) {
      into.set(target.slot, item);
      return;
    }
    const auto& parts = VA::arr(item).items;
    for (size_t j = 0; j < target.kids.size(); ++j) {
      if (target.kids[j]->kind != ExprKind::kIdentifier)
        fail(target.kids[j]->pos, "cannot unpack to a non-name");
      into.set(target.kids[j]->slot, parts[j]);
    }
  };
  const auto& all = VA::arr(iterable).items;
  std::vector<const Value*> items;
  items.reserve(all.size());
  for (const Value& item : all) {
    step(s.pos);
    if (target.kind == ExprKind::kTuple) {
      if (item.kind() != Kind::kArray || VA::flag(item))
        fail(target.pos, std::string("cannot unpack non-iterable type: ") + type_name(item));
      const size_t n = VA::arr(item).items.size();
      if (n != target.kids.size())
        fail(target.pos,
             std::string("too ") + (target.kids.size() > n ? "few" : "many") + " items to unpack");
    }
    if (test != nullptr) {
      Scope item_scope;
      item_scope.parent = &loop_scope;
      bind(item_scope, item);
      if (!truthy(eval(*test, item_scope))) continue;
    }
    items.push_back(&item);
  }
  bool none = true;
  const auto n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    step(s.pos);
    ObjectData loop;
    loop.entries.reserve(9);
    loop.entries.emplace_back("index", make_int(static_cast<double>(i + 1)));
    loop.entries.emplace_back("index0", make_int(static_cast<double>(i)));
    loop.entries.emplace_back("revindex", make_int(static_cast<double>(n - i)));
    loop.entries.emplace_back("revindex0", make_int(static_cast<double>(n - i - 1)));
    loop.entries.emplace_back("first", Value::boolean(i == 0));
    loop.entries.emplace_back("last", Value::boolean(i == n - 1));
    loop.entries.emplace_back("length", make_int(static_cast<double>(n)));
    loop.entries.emplace_back("previtem", i > 0 ? *items[static_cast<size_t>(i - 1)] : Value());
    loop.entries.emplace_back("nextitem", i < n - 1 ? *items[static_cast<size_t>(i + 1)] : Value());
    loop_scope.set(kSlotLoop, make_object(std::move(loop)));
    bind(loop_scope, *items[static_cast<size_t>(i)]);
    // An iteration ended by break or continue leaves no output (the
    // JavaScript builds each iteration's text apart and drops it).
    const TextBuilder::Mark mark = out.mark();
    try {
      exec(s.body, loop_scope, out);
    } catch (const ContinueSignal&) {
      out.reset(mark);
      continue;
    } catch (const BreakSignal&) {
      out.reset(mark);
      break;
    }
    none = false;
  }
  if (none) exec(s.alt, loop_scope, out);
}

Value Interpreter::eval(const Expr& e, Scope& scope) {
  DepthGuard guard(depth_, options_.max_depth * kFramesPerDepth, *this, e.pos);
  Value v = eval_expr(e, scope);
  // Every value a template makes passes here, so a value is refused the moment it nests one
  // level too deep: never deeper than what printing, tojson and its destructor recurse over.
  if (v.depth() > options_.max_depth) {
    fail(e.pos, "the template builds a value nested deeper than " +
                    std::to_string(options_.max_depth) +
                    " levels (lists or dicts inside each other)");
  }
  return v;
}

Value Interpreter::eval_expr(const Expr& e, Scope& scope) {
  switch (e.kind) {
    case ExprKind::kLiteral:
      return e.literal;
    case ExprKind::kIdentifier:
      return lookup(e.slot, scope);
    case ExprKind::kArray:
    case ExprKind::kTuple: {
      step(e.pos, static_cast<int64_t>(e.kids.size()));
      std::vector<Value> items;
      items.reserve(e.kids.size());
      for (const auto& k : e.kids) items.push_back(eval(*k, scope));
      return make_array(std::move(items), e.kind == ExprKind::kTuple);
    }
    case ExprKind::kObject: {
      ObjectData o;
      for (size_t i = 0; i + 1 < e.kids.size(); i += 2) {
        const Value key = eval(*e.kids[i], scope);
        if (key.kind() != Kind::kString)
          fail(e.kids[i]->pos, std::string("object keys must be strings, got ") + type_name(key));
        o.set(VA::str(key).text, eval(*e.kids[i + 1], scope));
      }
      return make_object(std::move(o));
    }
    case ExprKind::kMember:
      return eval_member(e, scope);
    case ExprKind::kCall:
      return eval_call(e, scope);
    case ExprKind::kFilter:
      return apply_filter(eval(*e.kids[0], scope), e, scope);
    case ExprKind::kTest: {
      const Value operand = eval(*e.kids[0], scope);
      if (!has_test(e.name)) fail(e.pos, "unknown test '" + e.name + "'");
      const bool r = run_test(e.name, operand, nullptr, e.pos);
      return Value::boolean(e.negate ? !r : r);
    }
    case ExprKind::kUnary: {
      const Value arg = eval(*e.kids[0], scope);
      if (e.op == Op::kNot) return Value::boolean(!truthy(arg));
      if (!is_numeric_like(arg))
        fail(e.pos, std::string("unknown operator '") + op_name(e.op) + "' for " + type_name(arg));
      const double r = (e.op == Op::kNeg ? -1.0 : 1.0) * numeric(arg);
      return arg.kind() == Kind::kFloat ? make_float(r) : make_int(r);
    }
    case ExprKind::kBinary:
      return eval_binary(e, scope);
    case ExprKind::kTernary:
      return truthy(eval(*e.kids[0], scope)) ? eval(*e.kids[1], scope) : eval(*e.kids[2], scope);
    case ExprKind::kSelect:
      if (!truthy(eval(*e.kids[1], scope))) return Value();
      return eval(*e.kids[0], scope);
    case ExprKind::kSlice:
    case ExprKind::kKwarg:
    case ExprKind::kSpread:
    case ExprKind::kKwSpread:
      break;
  }
  fail(e.pos, "unexpected expression here");
}

Value Interpreter::eval_member(const Expr& e, Scope& scope) {
  const Value object = eval(*e.kids[0], scope);
  Value property;
  if (e.computed) {
    if (e.kids[1]->kind == ExprKind::kSlice) return eval_slice(object, *e.kids[1], scope, e.pos);
    property = eval(*e.kids[1], scope);
  } else {
    property = e.literal;
  }
  if (is_container(object)) {
    if (property.kind() != Kind::kString)
      fail(e.pos,
           std::string("cannot access a property with a non-string: got ") + type_name(property));
    const std::string& key = VA::str(property).text;
    if (const Value* v = VA::obj(object).find(key)) return *v;
    if (object.kind() == Kind::kObject) return builtin_property(object, key);
    return Value();
  }
  if (object.kind() == Kind::kArray || object.kind() == Kind::kString) {
    if (property.kind() == Kind::kInt) {
      double d = VA::num(property);
      if (std::isnan(d)) d = 0;
      if (std::isinf(d)) return Value();
      const auto idx = static_cast<int64_t>(std::trunc(d));
      if (object.kind() == Kind::kArray) {
        const auto& items = VA::arr(object).items;
        const auto n = static_cast<int64_t>(items.size());
        const int64_t k = idx < 0 ? idx + n : idx;
        if (k < 0 || k >= n) return Value();
        return items[static_cast<size_t>(k)];
      }
      const StrData& s = VA::str(object);
      size_t b = 0, en = 0;
      const int r = text::utf16_at(s.text, idx, b, en);
      if (r == 0) return Value();
      if (r == 2)
        fail(e.pos,
             "unsupported: indexing into half of a character outside the BMP "
             "(a UTF-16 surrogate pair)");
      TextBuilder tb;
      tb.append_slice(s, b, en);
      return make_string(tb.take());
    }
    if (property.kind() == Kind::kString) return builtin_property(object, VA::str(property).text);
    fail(e.pos, std::string("cannot access a property with a non-string/non-number: got ") +
                    type_name(property));
  }
  if (property.kind() != Kind::kString)
    fail(e.pos,
         std::string("cannot access a property with a non-string: got ") + type_name(property));
  return Value();
}

Value Interpreter::eval_slice(const Value& object, const Expr& slice, Scope& scope, Pos pos) {
  if (object.kind() != Kind::kArray && object.kind() != Kind::kString)
    fail(pos, "a slice needs an array or a string");
  double part[3];
  bool given[3];
  const char* names[3] = {"start", "stop", "step"};
  for (int i = 0; i < 3; ++i) {
    const Value v = slice.kids[i] ? eval(*slice.kids[i], scope) : Value();
    given[i] = v.kind() == Kind::kInt;
    if (!given[i] && !v.is_undefined())
      fail(pos, std::string("slice ") + names[i] + " must be an integer or undefined");
    part[i] = given[i] ? VA::num(v) : 0;
    if (given[i] && std::isnan(part[i])) fail(pos, "unsupported: a slice bound that is NaN");
    part[i] = std::clamp(part[i], -9007199254740992.0, 9007199254740992.0);
  }
  // Code point offsets of a string (the JavaScript slices Array.from(s)).
  std::vector<size_t> offsets;
  int64_t len = 0;
  if (object.kind() == Kind::kArray) {
    len = static_cast<int64_t>(VA::arr(object).items.size());
  } else {
    const std::string& t = VA::str(object).text;
    offsets.reserve(t.size() + 1);
    for (size_t i = 0; i < t.size();) {
      offsets.push_back(i);
      text::next_code_point(t, i);
    }
    offsets.push_back(t.size());
    len = static_cast<int64_t>(offsets.size()) - 1;
  }
  const auto stride = given[2] ? static_cast<int64_t>(part[2]) : 1;
  int64_t start, stop;
  const auto sv = static_cast<int64_t>(part[0]), ev = static_cast<int64_t>(part[1]);
  if (stride >= 0) {
    start = !given[0] ? 0 : sv < 0 ? std::max<int64_t>(len + sv, 0) : std::min(sv, len);
    stop = !given[1] ? len : ev < 0 ? std::max<int64_t>(len + ev, 0) : std::min(ev, len);
  } else {
    start = !given[0] ? len - 1 : sv < 0 ? std::max<int64_t>(len + sv, -1) : std::min(sv, len - 1);
    stop = !given[1] ? -1 : ev < -1 ? std::max<int64_t>(len + ev, -1) : std::min(ev, len - 1);
  }
  const int64_t dir = stride > 0 ? 1 : stride < 0 ? -1 : 0;
  if (object.kind() == Kind::kArray) {
    const auto& items = VA::arr(object).items;
    std::vector<Value> out;
    for (int64_t i = start; dir * i < dir * stop; i += stride)
      out.push_back(items[static_cast<size_t>(i)]);
    step(pos, static_cast<int64_t>(out.size()));
    return make_array(std::move(out));
  }
  const StrData& s = VA::str(object);
  TextBuilder tb;
  if (stride == 1) {
    const int64_t b = std::clamp<int64_t>(start, 0, len);
    tb.append_slice(s, offsets[static_cast<size_t>(b)],
                    offsets[static_cast<size_t>(std::max(b, std::min(stop, len)))]);
  } else {
    for (int64_t i = start; dir * i < dir * stop; i += stride)
      tb.append_slice(s, offsets[static_cast<size_t>(i)], offsets[static_cast<size_t>(i) + 1]);
  }
  return make_string(tb.take());
}

std::pair<Args, ObjectData> Interpreter::eval_arguments(
    const std::vector<std::unique_ptr<Expr>>& args, size_t first, Scope& scope) {
  Args positional;
  ObjectData kwargs;
  for (size_t i = first; i < args.size(); ++i) {
    const Expr& a = *args[i];
    if (a.kind == ExprKind::kSpread) {
      const Value v = eval(*a.kids[0], scope);
      if (v.kind() != Kind::kArray)
        fail(a.pos, std::string("cannot unpack a non-iterable: ") + type_name(v));
      for (const Value& item : VA::arr(v).items) positional.push_back(item);
    } else if (a.kind != ExprKind::kKwarg && a.kind != ExprKind::kKwSpread) {
      positional.push_back(eval(a, scope));
    }
  }
  for (size_t i = first; i < args.size(); ++i) {
    const Expr& a = *args[i];
    auto add = [&](const std::string& key, Value v) {
      if (kwargs.find(key) != nullptr)
        fail(a.pos, "got multiple values for keyword argument '" + key + "'");
      kwargs.set(key, std::move(v));
    };
    if (a.kind == ExprKind::kKwarg) {
      add(a.name, eval(*a.kids[0], scope));
    } else if (a.kind == ExprKind::kKwSpread) {
      const Value v = eval(*a.kids[0], scope);
      if (v.kind() != Kind::kObject)
        fail(a.pos, std::string("the argument after ** must be a mapping, not ") + type_name(v));
      for (const auto& [k, val] : VA::obj(v).entries) add(k, val);
    }
  }
  return {std::move(positional), std::move(kwargs)};
}

Value Interpreter::eval_call(const Expr& e, Scope& scope) {
  auto [args, kwargs] = eval_arguments(e.kids, 1, scope);
  if (!kwargs.entries.empty()) args.push_back(make_object(std::move(kwargs), /*kwargs=*/true));
  const Value fn = eval(*e.kids[0], scope);
  if (fn.kind() != Kind::kFunction)
    fail(e.pos, std::string("cannot call something that is not a function: got ") + type_name(fn));
  return call_function(fn, std::move(args), scope, e.pos);
}

Value Interpreter::call_macro(const Stmt& macro, Args args, Scope& caller, Pos pos) {
  DepthGuard guard(macro_depth_, options_.max_depth, *this, pos);
  Scope scope;
  scope.parent = &caller;
  ObjectData kwargs;
  if (!args.empty() && args.back().kind() == Kind::kObject && VA::flag(args.back())) {
    kwargs.entries = VA::obj(args.back()).entries;
    args.pop_back();
  }
  std::vector<const Param*> pending;
  for (size_t i = 0; i < macro.params.size(); ++i) {
    const Param& p = macro.params[i];
    Value v;
    bool bound = false;
    if (i < args.size()) {
      v = args[i];
      bound = true;
    } else {
      for (auto it = kwargs.entries.begin(); it != kwargs.entries.end(); ++it) {
        if (it->first != p.name) continue;
        v = std::move(it->second);
        bound = true;
        kwargs.entries.erase(it);
        break;
      }
    }
    if (!bound && p.default_value) pending.push_back(&p);
    scope.set(p.slot, std::move(v));
  }
  if (!kwargs.entries.empty())
    fail(pos, "macro '" + macro.name + "' takes no keyword argument '" +
                  kwargs.entries.front().first + "'");
  if (args.size() > macro.params.size())
    fail(pos, "macro '" + macro.name + "' takes not more than " +
                  std::to_string(macro.params.size()) + " argument(s)");
  for (const Param* p : pending) scope.set(p->slot, eval(*p->default_value, scope));
  return render_block(macro.body, scope);
}

Value Interpreter::eval_binary(const Expr& e, Scope& scope) {
  const Value left = eval(*e.kids[0], scope);
  if (e.op == Op::kAnd) return truthy(left) ? eval(*e.kids[1], scope) : left;
  if (e.op == Op::kOr) return truthy(left) ? left : eval(*e.kids[1], scope);
  const Value right = eval(*e.kids[1], scope);
  const Op op = e.op;
  if (op == Op::kEq) return Value::boolean(loose_equal(left, right, e.pos));
  if (op == Op::kNe) return Value::boolean(!loose_equal(left, right, e.pos));

  auto concat = [&](bool keep_strings) {
    TextBuilder tb;
    for (const Value* v : {&left, &right}) {
      if (keep_strings && v->kind() == Kind::kString) {
        tb.append(VA::str(*v));
      } else {
        append_raw(tb, *v, e.pos);
      }
    }
    check_size(e.pos, tb.text.size());
    return make_string(tb.take());
  };

  if (left.is_undefined() || right.is_undefined()) {
    if (right.is_undefined() && (op == Op::kIn || op == Op::kNotIn))
      return Value::boolean(op == Op::kNotIn);
    fail(e.pos, std::string("cannot perform operation '") + op_name(op) + "' on undefined values");
  }
  if (left.kind() == Kind::kNone || right.kind() == Kind::kNone)
    fail(e.pos, std::string("cannot perform operation '") + op_name(op) + "' on none");
  if (op == Op::kConcat) return concat(true);
  if (op == Op::kPow && is_numeric_like(left) && is_numeric_like(right)) {
    const double a = numeric(left), b = numeric(right);
    if (a == 0 && b < 0) fail(e.pos, "0.0 cannot be raised to a negative power");
    const double r = js_pow(a, b, e.pos);
    if (!std::isfinite(r)) fail(e.pos, "the result of ** is not a finite real number");
    const bool is_float = left.kind() == Kind::kFloat || right.kind() == Kind::kFloat || b < 0;
    return is_float ? make_float(r) : make_int(r);
  }
  if (is_number(left) && is_number(right)) {
    const double a = VA::num(left), b = VA::num(right);
    const bool is_float = left.kind() == Kind::kFloat || right.kind() == Kind::kFloat;
    auto num = [&](double r) { return is_float ? make_float(r) : make_int(r); };
    switch (op) {
      case Op::kAdd:
        return num(a + b);
      case Op::kSub:
        return num(a - b);
      case Op::kMul:
        return num(a * b);
      case Op::kDiv:
        return make_float(a / b);
      case Op::kFloorDiv:
        return num(std::floor(a / b));
      case Op::kMod:
        return num(std::fmod(a, b));
      case Op::kLt:
        return Value::boolean(a < b);
      case Op::kGt:
        return Value::boolean(a > b);
      case Op::kGe:
        return Value::boolean(a >= b);
      case Op::kLe:
        return Value::boolean(a <= b);
      default:
        break;
    }
  } else if (left.kind() == Kind::kArray && right.kind() == Kind::kArray) {
    if (op == Op::kAdd) {
      const auto& a = VA::arr(left).items;
      const auto& b = VA::arr(right).items;
      step(e.pos, static_cast<int64_t>(a.size() + b.size()));
      std::vector<Value> items;
      items.reserve(a.size() + b.size());
      items.insert(items.end(), a.begin(), a.end());
      items.insert(items.end(), b.begin(), b.end());
      return make_array(std::move(items));
    }
  } else if (right.kind() == Kind::kArray) {
    if (op == Op::kIn || op == Op::kNotIn) {
      bool member = false;
      for (const Value& x : VA::arr(right).items) {
        if (strict_equal(x, left, e.pos)) {
          member = true;
          break;
        }
      }
      return Value::boolean(op == Op::kIn ? member : !member);
    }
  }
  if ((left.is_string() || right.is_string()) && op == Op::kAdd) return concat(true);
  if (left.is_string() && right.is_string() && (op == Op::kIn || op == Op::kNotIn)) {
    const bool found = VA::str(right).text.find(VA::str(left).text) != std::string::npos;
    return Value::boolean(op == Op::kIn ? found : !found);
  }
  if (left.is_string() && right.kind() == Kind::kObject && (op == Op::kIn || op == Op::kNotIn)) {
    const bool found = VA::obj(right).find(VA::str(left).text) != nullptr;
    return Value::boolean(op == Op::kIn ? found : !found);
  }
  fail(e.pos, std::string("unknown operator '") + op_name(op) + "' between " + type_name(left) +
                  " and " + type_name(right));
}

}  // namespace fd::jinja
