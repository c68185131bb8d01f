// The Jinja lexer (jinja.h), as @huggingface/jinja's: the source is first
// rewritten as text (one trailing newline dropped; lstrip_blocks and
// trim_blocks applied as its regexes do, over the whole source; transformers'
// {% generation %} tags removed), then cut into tokens. Tokens remember their
// offset in the original source, for line:column in errors.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lib/jinja/jinja.h"

namespace fd::jinja {

enum class TokenType : uint8_t {
  kText,
  kNumericLiteral,
  kStringLiteral,
  kIdentifier,
  kEquals,
  kOpenParen,
  kCloseParen,
  kOpenStatement,
  kCloseStatement,
  kOpenExpression,
  kCloseExpression,
  kOpenSquareBracket,
  kCloseSquareBracket,
  kOpenCurlyBracket,
  kCloseCurlyBracket,
  kComma,
  kDot,
  kColon,
  kPipe,
  kAdditive,        // + - ~
  kMultiplicative,  // * / // %
  kExponent,        // **
  kComparison,      // < > <= >= == !=
  kUnary,           // a sign not followed by a number
  kComment,
};

const char* token_type_name(TokenType t);

struct Token {
  TokenType type;
  std::string value;
  uint32_t offset;  // in the original source
};

// Line and column (1-based; columns count code points) of byte offsets.
class SourceLines {
 public:
  explicit SourceLines(std::string_view source);
  void locate(uint32_t offset, int32_t& line, int32_t& column) const;

 private:
  std::string_view source_;
  std::vector<uint32_t> line_starts_;
};

// Throws jinja::Error (named `name`, positioned through `lines`).
std::vector<Token> tokenize(std::string_view source, const TemplateOptions& options,
                            const std::string& name, const SourceLines& lines);

}  // namespace fd::jinja
