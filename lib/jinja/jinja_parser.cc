// The Jinja parser (jinja_ast.h): @huggingface/jinja's grammar and precedence
// (lowest first): `a if c else b`, or, and, not, comparisons and `in`, + - ~,
// * / // %, **, `is` tests, | filters, unary signs, calls and members,
// primaries. Its quirks are kept (a test binds tighter than *; a missing
// comma between arguments is accepted); statements it does not know, and
// {% call %} blocks, are refused with their position.
#include <cmath>
#include <cstdlib>
#include <unordered_map>
#include <utility>

#include "lib/jinja/jinja_ast.h"
#include "lib/jinja/jinja_lexer.h"
#include "lib/jinja/jinja_value_data.h"

namespace fd::jinja {

const char* op_name(Op op) {
  switch (op) {
    case Op::kAnd:
      return "and";
    case Op::kOr:
      return "or";
    case Op::kNot:
      return "not";
    case Op::kEq:
      return "==";
    case Op::kNe:
      return "!=";
    case Op::kLt:
      return "<";
    case Op::kGt:
      return ">";
    case Op::kLe:
      return "<=";
    case Op::kGe:
      return ">=";
    case Op::kIn:
      return "in";
    case Op::kNotIn:
      return "not in";
    case Op::kAdd:
      return "+";
    case Op::kSub:
      return "-";
    case Op::kConcat:
      return "~";
    case Op::kMul:
      return "*";
    case Op::kDiv:
      return "/";
    case Op::kFloorDiv:
      return "//";
    case Op::kMod:
      return "%";
    case Op::kPow:
      return "**";
    case Op::kNeg:
      return "-";
    case Op::kPos:
      return "+";
  }
  return "?";
}

namespace {

using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;

constexpr int kMaxParseDepth = 1024;  // parser frames: about 256 levels of nesting

// Filters @huggingface/jinja has for some type, without and with arguments;
// any other name fails whenever it runs there, so it is refused at parse.
bool known_filter(const std::string& name, bool with_args) {
  static constexpr const char* kPlain[] = {
      "safe",   "tojson", "list",  "first", "last",  "length",     "reverse", "sort",    "join",
      "string", "unique", "upper", "lower", "title", "capitalize", "trim",    "indent",  "int",
      "float",  "abs",    "items", "bool",  "get",   "keys",       "values",  "dictsort"};
  static constexpr const char* kCalled[] = {
      "tojson", "join",   "int",     "float", "default", "sort", "selectattr", "rejectattr",
      "map",    "indent", "replace", "get",   "items",   "keys", "values",     "dictsort"};
  if (with_args) {
    for (const char* f : kCalled)
      if (name == f) return true;
  } else {
    for (const char* f : kPlain)
      if (name == f) return true;
  }
  return false;
}

bool known_test(const std::string& name) {
  static constexpr const char* kTests[] = {"boolean",  "callable",  "odd",      "even",   "false",
                                           "true",     "none",      "string",   "number", "integer",
                                           "iterable", "mapping",   "sequence", "lower",  "upper",
                                           "defined",  "undefined", "equalto",  "eq"};
  for (const char* t : kTests)
    if (name == t) return true;
  return false;
}

class Parser {
 public:
  Parser(std::vector<Token> tokens, Template::Program& program, const SourceLines& lines)
      : t_(std::move(tokens)), prog_(program), lines_(lines) {
    for (const char* g : {"true", "false", "none", "True", "False", "None", "raise_exception",
                          "range", "strftime_now", "namespace", "loop"})
      slot(g);
  }

  void run() {
    while (cur_ < t_.size()) prog_.body.push_back(parse_any());
  }

 private:
  // --- tokens ---
  bool is(TokenType a) const { return cur_ < t_.size() && t_[cur_].type == a; }
  bool is_ident(std::string_view name, size_t ahead = 0) const {
    return cur_ + ahead < t_.size() && t_[cur_ + ahead].type == TokenType::kIdentifier &&
           t_[cur_ + ahead].value == name;
  }
  bool is_statement(std::initializer_list<std::string_view> names) const {
    if (!(cur_ + 1 < t_.size() && t_[cur_].type == TokenType::kOpenStatement &&
          t_[cur_ + 1].type == TokenType::kIdentifier))
      return false;
    for (const std::string_view n : names)
      if (t_[cur_ + 1].value == n) return true;
    return false;
  }
  Pos pos_of(size_t i) const {
    Pos p;
    const uint32_t off = i < t_.size() ? t_[i].offset : (t_.empty() ? 0 : t_.back().offset);
    lines_.locate(off, p.line, p.column);
    return p;
  }
  Pos here() const { return pos_of(cur_); }
  [[noreturn]] void fail(Pos p, const std::string& reason) const {
    throw Error(prog_.name, p.line, p.column, reason, false);
  }
  [[noreturn]] void fail_here(const std::string& expected) const {
    if (cur_ >= t_.size()) fail(here(), "unexpected end of template: expected " + expected);
    fail(here(), "expected " + expected + ", got " + describe(t_[cur_]));
  }
  static std::string describe(const Token& tok) {
    switch (tok.type) {
      case TokenType::kIdentifier:
        return "'" + tok.value + "'";
      case TokenType::kStringLiteral:
        return "a string";
      case TokenType::kText:
        return "text";
      case TokenType::kNumericLiteral:
        return "'" + tok.value + "'";
      case TokenType::kComment:
        return "a comment";
      default:
        return token_type_name(tok.type);
    }
  }
  const Token& expect(TokenType type) {
    if (!is(type)) fail_here(token_type_name(type));
    return t_[cur_++];
  }
  void expect_ident(std::string_view name) {
    if (!is_ident(name)) fail_here("'" + std::string(name) + "'");
    ++cur_;
  }
  int32_t slot(const std::string& name) {
    const auto it = prog_.slot_of.find(name);
    if (it != prog_.slot_of.end()) return it->second;
    const auto s = static_cast<int32_t>(prog_.symbols.size());
    prog_.symbols.push_back(name);
    prog_.slot_of.emplace(name, s);
    return s;
  }

  struct Depth {
    explicit Depth(Parser& p) : p_(p) {
      if (++p_.depth_ > kMaxParseDepth) p_.fail(p_.here(), "the template is nested too deeply");
    }
    ~Depth() { --p_.depth_; }
    Parser& p_;
  };
  // A left-deep chain (a + b + c ..., x|f|g ..., a.b.c ...) is built by a loop,
  // not by recursion, but the tree it makes is as tall as the chain is long, and
  // evaluating and destroying a tree recurse once per level: each link counts
  // as a level of nesting, so no tree is taller than kMaxParseDepth.
  struct Chain {
    explicit Chain(Parser& p) : p_(p) {}
    ~Chain() { p_.depth_ -= links_; }
    void link() {
      ++links_;
      if (++p_.depth_ > kMaxParseDepth) p_.fail(p_.here(), "the template is nested too deeply");
    }
    Parser& p_;
    int links_ = 0;
  };

  static ExprPtr node(ExprKind kind, Pos pos) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->pos = pos;
    return e;
  }

  // --- statements ---
  StmtPtr parse_any();
  StmtPtr parse_statement();
  StmtPtr parse_set(Pos pos);
  StmtPtr parse_if(Pos pos);
  StmtPtr parse_for(Pos pos);
  StmtPtr parse_macro(Pos pos);
  StmtPtr parse_filter_block(Pos pos);
  void parse_body(std::vector<StmtPtr>& body, std::initializer_list<std::string_view> until,
                  const char* block, Pos open);

  // --- expressions ---
  ExprPtr parse_expression_sequence(bool primary);
  ExprPtr parse_expression();
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_comparison();
  ExprPtr parse_additive();
  ExprPtr parse_multiplicative();
  ExprPtr parse_power();
  ExprPtr parse_test();
  ExprPtr parse_filter();
  ExprPtr parse_unary_sign();
  ExprPtr parse_call_member();
  ExprPtr parse_call(ExprPtr callee);
  std::vector<ExprPtr> parse_args(bool parameters);
  ExprPtr parse_member_args();
  ExprPtr parse_member(ExprPtr object);
  ExprPtr parse_primary();

  std::vector<Token> t_;
  Template::Program& prog_;
  const SourceLines& lines_;
  size_t cur_ = 0;
  int depth_ = 0;
};

void Parser::parse_body(std::vector<StmtPtr>& body, std::initializer_list<std::string_view> until,
                        const char* block, Pos open) {
  while (!is_statement(until)) {
    if (cur_ >= t_.size())
      fail(open, std::string("unclosed '") + block + "': no {% end" + block + " %}");
    body.push_back(parse_any());
  }
}

StmtPtr Parser::parse_any() {
  Depth depth(*this);
  if (cur_ >= t_.size()) fail_here("a statement");
  const Token& tok = t_[cur_];
  auto s = std::make_unique<Stmt>();
  s->pos = here();
  switch (tok.type) {
    case TokenType::kComment:
      ++cur_;
      s->kind = StmtKind::kComment;
      return s;
    case TokenType::kText:
      ++cur_;
      s->kind = StmtKind::kText;
      s->text = Value::string(tok.value);
      return s;
    case TokenType::kOpenStatement:
      return parse_statement();
    case TokenType::kOpenExpression: {
      ++cur_;
      s->kind = StmtKind::kOutput;
      s->expr = parse_expression();
      expect(TokenType::kCloseExpression);
      return s;
    }
    default:
      fail(here(), "unexpected " + describe(tok));
  }
}

StmtPtr Parser::parse_statement() {
  expect(TokenType::kOpenStatement);
  if (!is(TokenType::kIdentifier)) fail_here("a statement name");
  const Pos pos = here();
  const std::string name = t_[cur_].value;
  if (name == "set") {
    ++cur_;
    return parse_set(pos);
  }
  if (name == "if") {
    ++cur_;
    StmtPtr s = parse_if(pos);
    expect(TokenType::kOpenStatement);
    expect_ident("endif");
    expect(TokenType::kCloseStatement);
    return s;
  }
  if (name == "for") {
    ++cur_;
    StmtPtr s = parse_for(pos);
    expect(TokenType::kOpenStatement);
    expect_ident("endfor");
    expect(TokenType::kCloseStatement);
    return s;
  }
  if (name == "macro") {
    ++cur_;
    StmtPtr s = parse_macro(pos);
    expect(TokenType::kOpenStatement);
    expect_ident("endmacro");
    expect(TokenType::kCloseStatement);
    return s;
  }
  if (name == "break" || name == "continue") {
    ++cur_;
    expect(TokenType::kCloseStatement);
    auto s = std::make_unique<Stmt>();
    s->kind = name == "break" ? StmtKind::kBreak : StmtKind::kContinue;
    s->pos = pos;
    return s;
  }
  if (name == "filter") {
    ++cur_;
    return parse_filter_block(pos);
  }
  if (name.starts_with("end") || name == "else" || name == "elif")
    fail(pos, "unexpected '{% " + name + " %}'");
  fail(pos, "unsupported statement '" + name + "'");
}

StmtPtr Parser::parse_set(Pos pos) {
  auto s = std::make_unique<Stmt>();
  s->kind = StmtKind::kSet;
  s->pos = pos;
  s->target = parse_expression_sequence(false);
  if (is(TokenType::kEquals)) {
    ++cur_;
    s->expr = parse_expression_sequence(false);
  } else {
    expect(TokenType::kCloseStatement);
    parse_body(s->body, {"endset"}, "set", pos);
    expect(TokenType::kOpenStatement);
    expect_ident("endset");
  }
  expect(TokenType::kCloseStatement);
  return s;
}

StmtPtr Parser::parse_if(Pos pos) {
  Depth depth(*this);
  auto s = std::make_unique<Stmt>();
  s->kind = StmtKind::kIf;
  s->pos = pos;
  s->expr = parse_expression();
  expect(TokenType::kCloseStatement);
  parse_body(s->body, {"elif", "else", "endif"}, "if", pos);
  if (is_statement({"elif"})) {
    const Pos elif_pos = pos_of(cur_ + 1);
    cur_ += 2;
    s->alt.push_back(parse_if(elif_pos));
  } else if (is_statement({"else"})) {
    cur_ += 2;
    expect(TokenType::kCloseStatement);
    parse_body(s->alt, {"endif"}, "if", pos);
  }
  return s;
}

StmtPtr Parser::parse_for(Pos pos) {
  auto s = std::make_unique<Stmt>();
  s->kind = StmtKind::kFor;
  s->pos = pos;
  s->target = parse_expression_sequence(true);
  if (s->target->kind != ExprKind::kIdentifier && s->target->kind != ExprKind::kTuple)
    fail(s->target->pos, "expected a name or names for the loop variable");
  if (!is_ident("in")) fail_here("'in'");
  ++cur_;
  s->expr = parse_expression();
  expect(TokenType::kCloseStatement);
  parse_body(s->body, {"endfor", "else"}, "for", pos);
  if (is_statement({"else"})) {
    cur_ += 2;
    expect(TokenType::kCloseStatement);
    parse_body(s->alt, {"endfor"}, "for", pos);
  }
  return s;
}

// The first read of the variable `name` in `e` / `body`, or null.
const Expr* find_name(const Expr* e, std::string_view name) {
  if (e == nullptr) return nullptr;
  if (e->kind == ExprKind::kIdentifier && e->name == name) return e;
  for (const auto& k : e->kids)
    if (const Expr* f = find_name(k.get(), name)) return f;
  return nullptr;
}

const Expr* find_name(const std::vector<StmtPtr>& body, std::string_view name) {
  for (const auto& s : body) {
    for (const Expr* e : {s->expr.get(), s->target.get()})
      if (const Expr* f = find_name(e, name)) return f;
    for (const auto& p : s->params)
      if (const Expr* f = find_name(p.default_value.get(), name)) return f;
    if (const Expr* e = find_name(s->body, name)) return e;
    if (const Expr* e = find_name(s->alt, name)) return e;
  }
  return nullptr;
}

StmtPtr Parser::parse_macro(Pos pos) {
  auto s = std::make_unique<Stmt>();
  s->kind = StmtKind::kMacro;
  s->pos = pos;
  ExprPtr name = parse_primary();
  if (name->kind != ExprKind::kIdentifier) fail(name->pos, "expected a name after 'macro'");
  s->name = name->name;
  s->slot = name->slot;
  for (ExprPtr& a : parse_args(true)) {
    Param p;
    if (a->kind == ExprKind::kIdentifier) {
      p.name = a->name;
    } else {
      p.name = a->name;
      p.default_value = std::move(a->kids[0]);
    }
    p.slot = slot(p.name);
    s->params.push_back(std::move(p));
  }
  expect(TokenType::kCloseStatement);
  parse_body(s->body, {"endmacro"}, "macro", pos);
  // @huggingface/jinja gives a macro that reads `varargs` or `kwargs` (and does
  // not declare them) the extra arguments; that is not implemented here.
  for (const char* special : {"varargs", "kwargs"}) {
    bool declared = false;
    const Expr* use = find_name(s->body, special);
    for (const auto& p : s->params) {
      declared = declared || p.name == special;
      if (use == nullptr) use = find_name(p.default_value.get(), special);
    }
    if (use != nullptr && !declared)
      fail(use->pos, std::string("unsupported: '") + special + "' in a macro");
  }
  return s;
}

StmtPtr Parser::parse_filter_block(Pos pos) {
  auto s = std::make_unique<Stmt>();
  s->kind = StmtKind::kFilterBlock;
  s->pos = pos;
  ExprPtr f = parse_primary();
  ExprPtr filter = node(ExprKind::kFilter, f->pos);
  filter->kids.push_back(nullptr);
  if (f->kind == ExprKind::kIdentifier && is(TokenType::kOpenParen)) {
    ExprPtr call = parse_call(std::move(f));
    if (call->kind == ExprKind::kCall && call->kids[0]->kind == ExprKind::kIdentifier) {
      filter->name = call->kids[0]->name;
      filter->has_args = true;
      for (size_t i = 1; i < call->kids.size(); ++i)
        filter->kids.push_back(std::move(call->kids[i]));
    } else {
      filter->bad_filter = "unsupported filter expression";
    }
  } else if (f->kind == ExprKind::kIdentifier) {
    filter->name = f->name;
  } else {
    filter->bad_filter = "unsupported filter expression";
  }
  // A filter @huggingface/jinja has for no type fails where it runs, as there (a template
  // that names one only on a path a conversation never takes still renders it).
  if (filter->bad_filter.empty() && !known_filter(filter->name, filter->has_args))
    filter->bad_filter = "unsupported filter '" + filter->name + "'";
  s->expr = std::move(filter);
  expect(TokenType::kCloseStatement);
  parse_body(s->body, {"endfilter"}, "filter", pos);
  expect(TokenType::kOpenStatement);
  expect_ident("endfilter");
  expect(TokenType::kCloseStatement);
  return s;
}

ExprPtr Parser::parse_expression_sequence(bool primary) {
  const Pos pos = here();
  ExprPtr first = primary ? parse_primary() : parse_expression();
  if (!is(TokenType::kComma)) return first;
  ExprPtr tuple = node(ExprKind::kTuple, pos);
  tuple->kids.push_back(std::move(first));
  while (true) {
    ++cur_;  // the comma
    tuple->kids.push_back(primary ? parse_primary() : parse_expression());
    if (!is(TokenType::kComma)) break;
  }
  return tuple;
}

ExprPtr Parser::parse_expression() {
  Depth depth(*this);
  ExprPtr a = parse_or();
  if (is_ident("if")) {
    const Pos pos = here();
    ++cur_;
    ExprPtr test = parse_or();
    if (is_ident("else")) {
      ++cur_;
      ExprPtr no = parse_expression();
      ExprPtr e = node(ExprKind::kTernary, pos);
      e->kids.push_back(std::move(test));
      e->kids.push_back(std::move(a));
      e->kids.push_back(std::move(no));
      return e;
    }
    ExprPtr e = node(ExprKind::kSelect, pos);
    e->kids.push_back(std::move(a));
    e->kids.push_back(std::move(test));
    return e;
  }
  return a;
}

ExprPtr Parser::parse_or() {
  ExprPtr left = parse_and();
  Chain chain(*this);
  while (is_ident("or")) {
    chain.link();
    ExprPtr e = node(ExprKind::kBinary, here());
    e->op = Op::kOr;
    ++cur_;
    e->kids.push_back(std::move(left));
    e->kids.push_back(parse_and());
    left = std::move(e);
  }
  return left;
}

ExprPtr Parser::parse_and() {
  ExprPtr left = parse_not();
  Chain chain(*this);
  while (is_ident("and")) {
    chain.link();
    ExprPtr e = node(ExprKind::kBinary, here());
    e->op = Op::kAnd;
    ++cur_;
    e->kids.push_back(std::move(left));
    e->kids.push_back(parse_not());
    left = std::move(e);
  }
  return left;
}

ExprPtr Parser::parse_not() {
  Depth depth(*this);
  ExprPtr right;
  // As @huggingface/jinja: `not a not b` is `not b`.
  while (is_ident("not")) {
    ExprPtr e = node(ExprKind::kUnary, here());
    e->op = Op::kNot;
    ++cur_;
    e->kids.push_back(parse_not());
    right = std::move(e);
  }
  return right ? std::move(right) : parse_comparison();
}

ExprPtr Parser::parse_comparison() {
  ExprPtr left = parse_additive();
  Chain chain(*this);
  while (true) {
    const Pos pos = here();
    Op op;
    if (is_ident("not") && is_ident("in", 1)) {
      op = Op::kNotIn;
      cur_ += 2;
    } else if (is_ident("in")) {
      op = Op::kIn;
      ++cur_;
    } else if (is(TokenType::kComparison)) {
      const std::string& v = t_[cur_++].value;
      op = v == "=="   ? Op::kEq
           : v == "!=" ? Op::kNe
           : v == "<"  ? Op::kLt
           : v == ">"  ? Op::kGt
           : v == "<=" ? Op::kLe
                       : Op::kGe;
    } else {
      break;
    }
    chain.link();
    ExprPtr e = node(ExprKind::kBinary, pos);
    e->op = op;
    e->kids.push_back(std::move(left));
    e->kids.push_back(parse_additive());
    left = std::move(e);
  }
  return left;
}

ExprPtr Parser::parse_additive() {
  ExprPtr left = parse_multiplicative();
  Chain chain(*this);
  while (is(TokenType::kAdditive)) {
    chain.link();
    ExprPtr e = node(ExprKind::kBinary, here());
    const std::string& v = t_[cur_++].value;
    e->op = v == "+" ? Op::kAdd : v == "-" ? Op::kSub : Op::kConcat;
    e->kids.push_back(std::move(left));
    e->kids.push_back(parse_multiplicative());
    left = std::move(e);
  }
  return left;
}

ExprPtr Parser::parse_multiplicative() {
  ExprPtr left = parse_power();
  Chain chain(*this);
  while (is(TokenType::kMultiplicative)) {
    chain.link();
    ExprPtr e = node(ExprKind::kBinary, here());
    const std::string& v = t_[cur_++].value;
    e->op = v == "*" ? Op::kMul : v == "/" ? Op::kDiv : v == "//" ? Op::kFloorDiv : Op::kMod;
    e->kids.push_back(std::move(left));
    e->kids.push_back(parse_power());
    left = std::move(e);
  }
  return left;
}

ExprPtr Parser::parse_power() {
  ExprPtr left = parse_test();
  Chain chain(*this);
  while (is(TokenType::kExponent)) {
    chain.link();
    ExprPtr e = node(ExprKind::kBinary, here());
    ++cur_;
    e->op = Op::kPow;
    e->kids.push_back(std::move(left));
    e->kids.push_back(parse_test());
    left = std::move(e);
  }
  return left;
}

ExprPtr Parser::parse_test() {
  ExprPtr operand = parse_filter();
  Chain chain(*this);
  while (is_ident("is")) {
    chain.link();
    ++cur_;
    const bool negate = is_ident("not");
    if (negate) ++cur_;
    ExprPtr name = parse_primary();
    if (name->kind != ExprKind::kIdentifier) fail(name->pos, "expected the name of a test");
    if (!known_test(name->name)) fail(name->pos, "unsupported test '" + name->name + "'");
    ExprPtr e = node(ExprKind::kTest, name->pos);
    e->negate = negate;
    e->name = name->name;
    e->kids.push_back(std::move(operand));
    operand = std::move(e);
  }
  return operand;
}

ExprPtr Parser::parse_filter() {
  ExprPtr operand = parse_unary_sign();
  Chain chain(*this);
  while (is(TokenType::kPipe)) {
    chain.link();
    ++cur_;
    ExprPtr f = parse_primary();
    if (f->kind != ExprKind::kIdentifier) fail(f->pos, "expected the name of a filter");
    ExprPtr e = node(ExprKind::kFilter, f->pos);
    e->name = f->name;
    e->kids.push_back(std::move(operand));
    if (is(TokenType::kOpenParen)) {
      ExprPtr call = parse_call(std::move(f));
      if (call->kind == ExprKind::kCall && call->kids[0]->kind == ExprKind::kIdentifier) {
        e->has_args = true;
        for (size_t i = 1; i < call->kids.size(); ++i) e->kids.push_back(std::move(call->kids[i]));
      } else {
        // `x | f(1).y` or `x | f(1)(2)`: @huggingface/jinja fails when it runs.
        e->bad_filter = "unsupported filter expression after '" + e->name + "'";
      }
    }
    // Unknown to @huggingface/jinja: an error where it runs, as there (Llama 3.1's template
    // filters builtin_tools with reject(), which only a conversation with them reaches).
    if (e->bad_filter.empty() && !known_filter(e->name, e->has_args))
      e->bad_filter = "unsupported filter '" + e->name + (e->has_args ? "(...)'" : "'");
    operand = std::move(e);
  }
  return operand;
}

ExprPtr Parser::parse_unary_sign() {
  Depth depth(*this);
  if ((is(TokenType::kUnary) || is(TokenType::kAdditive)) &&
      (t_[cur_].value == "-" || t_[cur_].value == "+")) {
    ExprPtr e = node(ExprKind::kUnary, here());
    e->op = t_[cur_++].value == "-" ? Op::kNeg : Op::kPos;
    e->kids.push_back(parse_unary_sign());
    return e;
  }
  return parse_call_member();
}

ExprPtr Parser::parse_call_member() {
  ExprPtr member = parse_member(parse_primary());
  if (is(TokenType::kOpenParen)) return parse_call(std::move(member));
  return member;
}

ExprPtr Parser::parse_call(ExprPtr callee) {
  Depth depth(*this);
  ExprPtr e = node(ExprKind::kCall, callee->pos);
  e->kids.push_back(std::move(callee));
  for (ExprPtr& a : parse_args(false)) e->kids.push_back(std::move(a));
  e = parse_member(std::move(e));
  if (is(TokenType::kOpenParen)) e = parse_call(std::move(e));
  return e;
}

std::vector<ExprPtr> Parser::parse_args(bool parameters) {
  expect(TokenType::kOpenParen);
  std::vector<ExprPtr> args;
  std::vector<std::string> names;
  bool saw_keyword = false, saw_spread = false;
  while (!is(TokenType::kCloseParen)) {
    if (cur_ >= t_.size()) fail_here("')'");
    const Pos pos = here();
    const bool kw_spread = is(TokenType::kExponent);
    const bool spread = is(TokenType::kMultiplicative) && t_[cur_].value == "*";
    if (parameters && (kw_spread || spread))
      fail(pos, "argument unpacking is not allowed in parameters");
    if (kw_spread) {
      ++cur_;
      ExprPtr e = node(ExprKind::kKwSpread, pos);
      e->kids.push_back(parse_expression());
      args.push_back(std::move(e));
      if (is(TokenType::kComma)) ++cur_;
      if (!is(TokenType::kCloseParen)) fail_here("')' after a '**' argument");
      break;
    }
    ExprPtr arg;
    if (spread) {
      if (saw_spread) fail(pos, "only one '*' argument is allowed");
      saw_spread = true;
      ++cur_;
      arg = node(ExprKind::kSpread, pos);
      arg->kids.push_back(parse_expression());
    } else {
      arg = parse_expression();
      if (is(TokenType::kEquals)) {
        ++cur_;
        if (arg->kind != ExprKind::kIdentifier)
          fail(arg->pos, parameters ? "expected a parameter name" : "expected a keyword name");
        ExprPtr kw = node(ExprKind::kKwarg, arg->pos);
        kw->name = arg->name;
        kw->kids.push_back(parse_expression());
        arg = std::move(kw);
      }
      if (parameters) {
        if (arg->kind != ExprKind::kIdentifier && arg->kind != ExprKind::kKwarg)
          fail(arg->pos, "expected a parameter name");
        for (const std::string& n : names)
          if (n == arg->name) fail(arg->pos, "duplicate parameter '" + n + "'");
        names.push_back(arg->name);
      }
      if (arg->kind == ExprKind::kKwarg) {
        saw_keyword = true;
      } else if (saw_keyword) {
        fail(arg->pos, parameters ? "a parameter without default follows one with a default"
                                  : "a positional argument follows a keyword argument");
      } else if (saw_spread) {
        fail(arg->pos, "a positional argument follows a '*' argument");
      }
    }
    args.push_back(std::move(arg));
    if (is(TokenType::kComma)) ++cur_;
  }
  expect(TokenType::kCloseParen);
  return args;
}

ExprPtr Parser::parse_member_args() {
  const Pos pos = here();
  std::vector<ExprPtr> parts;
  bool slice = false;
  while (!is(TokenType::kCloseSquareBracket)) {
    if (cur_ >= t_.size()) fail_here("']'");
    if (is(TokenType::kColon)) {
      parts.push_back(nullptr);
      ++cur_;
      slice = true;
    } else {
      parts.push_back(parse_expression());
      if (is(TokenType::kColon)) {
        ++cur_;
        slice = true;
      }
    }
  }
  if (parts.empty()) fail(pos, "expected an index or a slice inside '[]'");
  if (!slice) return std::move(parts[0]);
  if (parts.size() > 3) fail(pos, "a slice takes at most 3 parts");
  ExprPtr e = node(ExprKind::kSlice, pos);
  for (auto& p : parts) e->kids.push_back(std::move(p));
  while (e->kids.size() < 3) e->kids.push_back(nullptr);
  return e;
}

ExprPtr Parser::parse_member(ExprPtr object) {
  Chain chain(*this);
  while (is(TokenType::kDot) || is(TokenType::kOpenSquareBracket)) {
    chain.link();
    ExprPtr e = node(ExprKind::kMember, here());
    const bool computed = is(TokenType::kOpenSquareBracket);
    ++cur_;
    e->computed = computed;
    e->kids.push_back(std::move(object));
    if (computed) {
      e->kids.push_back(parse_member_args());
      expect(TokenType::kCloseSquareBracket);
    } else {
      ExprPtr prop = parse_primary();
      if (prop->kind == ExprKind::kIdentifier) {
        e->literal = Value::string(prop->name);
      } else if (prop->kind == ExprKind::kLiteral && prop->literal.kind() == Value::Kind::kInt) {
        e->literal = prop->literal;
      } else {
        fail(prop->pos, "expected a name or an integer after '.'");
      }
    }
    object = std::move(e);
  }
  return object;
}

ExprPtr Parser::parse_primary() {
  Depth depth(*this);
  if (cur_ >= t_.size()) fail_here("an expression");
  const Pos pos = here();
  const Token& tok = t_[cur_++];
  switch (tok.type) {
    case TokenType::kNumericLiteral: {
      ExprPtr e = node(ExprKind::kLiteral, pos);
      const double v = std::strtod(tok.value.c_str(), nullptr);
      e->literal = tok.value.find('.') != std::string::npos ? make_float(v) : make_int(v);
      return e;
    }
    case TokenType::kStringLiteral: {
      std::string v = tok.value;
      while (is(TokenType::kStringLiteral)) v += t_[cur_++].value;
      ExprPtr e = node(ExprKind::kLiteral, pos);
      e->literal = Value::string(std::move(v));
      return e;
    }
    case TokenType::kIdentifier: {
      ExprPtr e = node(ExprKind::kIdentifier, pos);
      e->name = tok.value;
      e->slot = slot(tok.value);
      return e;
    }
    case TokenType::kOpenParen: {
      ExprPtr e = parse_expression_sequence(false);
      expect(TokenType::kCloseParen);
      return e;
    }
    case TokenType::kOpenSquareBracket: {
      ExprPtr e = node(ExprKind::kArray, pos);
      while (!is(TokenType::kCloseSquareBracket)) {
        if (cur_ >= t_.size()) fail_here("']'");
        e->kids.push_back(parse_expression());
        if (is(TokenType::kComma)) ++cur_;
      }
      ++cur_;
      return e;
    }
    case TokenType::kOpenCurlyBracket: {
      ExprPtr e = node(ExprKind::kObject, pos);
      while (!is(TokenType::kCloseCurlyBracket)) {
        if (cur_ >= t_.size()) fail_here("'}'");
        e->kids.push_back(parse_expression());
        expect(TokenType::kColon);
        e->kids.push_back(parse_expression());
        if (is(TokenType::kComma)) ++cur_;
      }
      ++cur_;
      return e;
    }
    default:
      --cur_;
      fail_here("an expression");
  }
}

}  // namespace

std::shared_ptr<const Template::Program> parse_program(std::string_view source,
                                                       std::string_view name,
                                                       const TemplateOptions& options) {
  auto program = std::make_shared<Template::Program>();
  program->name = std::string(name);
  const SourceLines lines(source);
  std::vector<Token> tokens = tokenize(source, options, program->name, lines);
  Parser(std::move(tokens), *program, lines).run();
  return program;
}

}  // namespace fd::jinja
