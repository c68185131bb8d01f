// The Jinja interpreter (jinja.h): runs a parsed template as @huggingface/jinja's
// Interpreter does. jinja_interpreter.cc has statements and expressions,
// jinja_builtins.cc the filters, tests, methods and global functions, and the
// conversions to text (printing, `~`, tojson). Internal to lib/jinja/jinja_*.cc.
//
// Scopes are as in the JavaScript: the root holds the context and the
// globals; a for loop makes one scope (its filter a scope per item); a macro
// call makes one whose parent is the caller's scope; `if` makes none. Every
// scope has its own `namespace`. Text goes into one TextBuilder; a block set,
// a filter block and a macro build into their own.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lib/jinja/jinja.h"
#include "lib/jinja/jinja_ast.h"
#include "lib/jinja/jinja_value_data.h"

namespace fd::jinja {

struct Scope {
  Scope* parent = nullptr;
  std::vector<std::pair<int32_t, Value>> vars;  // not the root
  std::vector<Value>* root = nullptr;           // the root: every slot

  Value* own(int32_t slot);
  void set(int32_t slot, Value v);
};

// A {% break %} / {% continue %} on its way to the loop.
struct BreakSignal {
  Pos pos;
};
struct ContinueSignal {
  Pos pos;
};

// The arguments of a call as the JavaScript passes them: positional values,
// then keyword arguments as one last object (flagged kwargs) if any.
using Args = std::vector<Value>;

class Interpreter {
 public:
  Interpreter(const Template::Program& program, const RenderOptions& options);
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  Rendered run(const Value& context);

  // --- used by jinja_builtins.cc ---
  [[noreturn]] void fail(Pos pos, const std::string& reason) const;
  void step(Pos pos, int64_t n = 1);
  void check_size(Pos pos, size_t bytes) const;
  const RenderOptions& options() const { return options_; }
  const std::string& template_name() const { return program_.name; }
  Value make_namespace(ObjectData entries);

  // JavaScript's truthiness: of the value (kBool, its __bool__: empty arrays and objects are
  // false), or of what it holds underneath (kRaw, v.value: arrays and objects are true even when
  // empty, none is undefined), which the indent filter's flags see.
  enum class Truth { kBool, kRaw };
  static bool truthy(const Value& v, Truth of = Truth::kBool);
  // The value's type name in @huggingface/jinja ("StringValue", ...).
  static const char* type_name(const Value& v);

  // RuntimeValue.toString(): what {{ v }} prints (not for none/undefined).
  void append_display(TextBuilder& out, const Value& v, Pos pos, int depth = 0);
  // String(v.value): what `~`, `+` with a string, join and raise_exception see.
  void append_raw(TextBuilder& out, const Value& v, Pos pos);
  // toJSON(v): tojson, and printing arrays and objects.
  struct JsonOptions {
    double indent = 0;  // 0: none
    bool ensure_ascii = false;
    bool custom_separators = false;
    std::string item_sep, key_sep;
    bool undefined_is_null = true;
  };
  void append_json(std::string& out, const Value& v, const JsonOptions& o, Pos pos, int depth);

  // Equality as JavaScript's == and === on the values.
  bool loose_equal(const Value& a, const Value& b, Pos pos);
  bool strict_equal(const Value& a, const Value& b, Pos pos);

  Value apply_filter(const Value& operand, const Expr& filter, Scope& scope);
  bool run_test(const std::string& name, const Value& operand, const Value* arg, Pos pos);
  bool has_test(const std::string& name) const;
  Value call_function(const Value& fn, Args args, Scope& scope, Pos pos);
  // The builtin property `name` of v (a method, or length), or undefined.
  Value builtin_property(const Value& v, std::string_view name);

  Value eval(const Expr& e, Scope& scope);
  void exec(const std::vector<std::unique_ptr<Stmt>>& body, Scope& scope, TextBuilder& out);
  Value render_block(const std::vector<std::unique_ptr<Stmt>>& body, Scope& scope);
  std::pair<Args, ObjectData> eval_arguments(const std::vector<std::unique_ptr<Expr>>& args,
                                             size_t first, Scope& scope);

 private:
  void exec_one(const Stmt& s, Scope& scope, TextBuilder& out);
  void exec_for(const Stmt& s, Scope& scope, TextBuilder& out);
  void exec_set(const Stmt& s, Scope& scope);
  Value eval_expr(const Expr& e, Scope& scope);  // eval() without its depth checks
  Value lookup(int32_t slot, Scope& scope);
  Value eval_member(const Expr& e, Scope& scope);
  Value eval_slice(const Value& object, const Expr& slice, Scope& scope, Pos pos);
  Value eval_binary(const Expr& e, Scope& scope);
  Value eval_call(const Expr& e, Scope& scope);
  Value call_macro(const Stmt& macro, Args args, Scope& caller, Pos pos);
  double js_pow(double a, double b, Pos pos) const;

  const Template::Program& program_;
  const RenderOptions& options_;
  std::vector<Value> root_;
  int64_t steps_ = 0;
  int depth_ = 0;
  int macro_depth_ = 0;
  std::vector<std::shared_ptr<void>> namespaces_;  // emptied at the end (cycles)
};

// The builtin function values (raise_exception, range, ...).
const Value& builtin_function(Builtin b);

}  // namespace fd::jinja
