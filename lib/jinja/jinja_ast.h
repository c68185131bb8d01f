// The parsed template (jinja.h): expressions and statements as
// @huggingface/jinja's parser builds them, with positions for errors and
// variable names resolved to slots. Internal to lib/jinja/jinja_*.cc.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "lib/jinja/jinja.h"

namespace fd::jinja {

struct Pos {
  int32_t line = 0;
  int32_t column = 0;
};

enum class ExprKind : uint8_t {
  kLiteral,     // literal: an int, float or string Value
  kIdentifier,  // name, slot
  kArray,       // kids: elements
  kTuple,       // kids: elements
  kObject,      // kids: key, value, key, value...
  kMember,      // kids[0]: object; computed: kids[1] (an expression or kSlice), else literal
  kSlice,       // kids: start, stop, step (each may be null)
  kCall,        // kids[0]: callee, kids[1..]: arguments
  kFilter,      // kids[0]: operand (null in a filter block), kids[1..]: arguments; name
  kTest,        // kids[0]: operand; name; negate
  kUnary,       // op (kNot, kNeg, kPos); kids[0]
  kBinary,      // op; kids[0], kids[1]
  kTernary,     // kids: condition, if true, if false
  kSelect,      // `a if c` without else: kids: a, c
  kKwarg,       // name=kids[0]
  kSpread,      // *kids[0]
  kKwSpread,    // **kids[0]
};

enum class Op : uint8_t {
  kAnd,
  kOr,
  kNot,
  kEq,
  kNe,
  kLt,
  kGt,
  kLe,
  kGe,
  kIn,
  kNotIn,
  kAdd,
  kSub,
  kConcat,
  kMul,
  kDiv,
  kFloorDiv,
  kMod,
  kPow,
  kNeg,
  kPos,
};

const char* op_name(Op op);

struct Expr {
  ExprKind kind;
  Op op = Op::kAnd;
  bool computed = false;  // kMember: obj[...]
  bool negate = false;    // kTest: `is not`
  bool has_args = false;  // kFilter: name(...)
  int32_t slot = -1;      // kIdentifier
  Pos pos;
  Value literal;           // kLiteral; kMember with a dot: the property (string or int)
  std::string name;        // kIdentifier, kFilter, kTest, kKwarg
  std::string bad_filter;  // kFilter: not a name or name(...): the error to raise when run
  std::vector<std::unique_ptr<Expr>> kids;
};

enum class StmtKind : uint8_t {
  kText,    // text
  kOutput,  // {{ expr }}
  kIf,      // expr; body; alt
  kFor,     // target; expr (maybe kSelect: the loop filter); body; alt (else)
  kSet,     // target; expr, or body for {% set x %}...{% endset %}
  kMacro,   // name, slot, params; body
  kBreak,
  kContinue,
  kFilterBlock,  // expr: a kFilter without operand; body
  kComment,
};

struct Param {
  std::string name;
  int32_t slot;
  std::unique_ptr<Expr> default_value;  // may be null
};

struct Stmt {
  StmtKind kind;
  Pos pos;
  Value text;
  std::unique_ptr<Expr> expr;
  std::unique_ptr<Expr> target;
  std::vector<std::unique_ptr<Stmt>> body, alt;
  std::string name;
  int32_t slot = -1;
  std::vector<Param> params;
};

// The slots of the globals, in this order, in every Program.
enum GlobalSlot : int32_t {
  kSlotTrue,
  kSlotFalse,
  kSlotNone,
  kSlotTrueTitle,
  kSlotFalseTitle,
  kSlotNoneTitle,
  kSlotRaiseException,
  kSlotRange,
  kSlotStrftimeNow,
  kSlotNamespace,
  kSlotLoop,
  kGlobalSlots,
};

struct Template::Program {
  std::string name;
  std::vector<std::unique_ptr<Stmt>> body;
  std::vector<std::string> symbols;  // slot -> name
  std::unordered_map<std::string, int32_t> slot_of;
};

// Parses (jinja_parser.cc); throws jinja::Error.
std::shared_ptr<const Template::Program> parse_program(std::string_view source,
                                                       std::string_view name,
                                                       const TemplateOptions& options);

}  // namespace fd::jinja
