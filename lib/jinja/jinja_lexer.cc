#include "lib/jinja/jinja_lexer.h"

#include <algorithm>
#include <utility>

#include "lib/jinja/jinja_text.h"

namespace fd::jinja {

const char* token_type_name(TokenType t) {
  switch (t) {
    case TokenType::kText:
      return "text";
    case TokenType::kNumericLiteral:
      return "number";
    case TokenType::kStringLiteral:
      return "string";
    case TokenType::kIdentifier:
      return "identifier";
    case TokenType::kEquals:
      return "'='";
    case TokenType::kOpenParen:
      return "'('";
    case TokenType::kCloseParen:
      return "')'";
    case TokenType::kOpenStatement:
      return "'{%'";
    case TokenType::kCloseStatement:
      return "'%}'";
    case TokenType::kOpenExpression:
      return "'{{'";
    case TokenType::kCloseExpression:
      return "'}}'";
    case TokenType::kOpenSquareBracket:
      return "'['";
    case TokenType::kCloseSquareBracket:
      return "']'";
    case TokenType::kOpenCurlyBracket:
      return "'{'";
    case TokenType::kCloseCurlyBracket:
      return "'}'";
    case TokenType::kComma:
      return "','";
    case TokenType::kDot:
      return "'.'";
    case TokenType::kColon:
      return "':'";
    case TokenType::kPipe:
      return "'|'";
    case TokenType::kAdditive:
      return "additive operator";
    case TokenType::kMultiplicative:
      return "multiplicative operator";
    case TokenType::kExponent:
      return "'**'";
    case TokenType::kComparison:
      return "comparison operator";
    case TokenType::kUnary:
      return "unary operator";
    case TokenType::kComment:
      return "comment";
  }
  return "token";
}

SourceLines::SourceLines(std::string_view source) : source_(source) {
  line_starts_.push_back(0);
  for (size_t i = 0; i < source.size(); ++i)
    if (source[i] == '\n') line_starts_.push_back(static_cast<uint32_t>(i + 1));
}

void SourceLines::locate(uint32_t offset, int32_t& line, int32_t& column) const {
  offset = std::min<uint32_t>(offset, static_cast<uint32_t>(source_.size()));
  const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset) - 1;
  line = static_cast<int32_t>(it - line_starts_.begin()) + 1;
  column = 1;
  for (size_t i = *it; i < offset;) {
    text::next_code_point(source_, i);
    ++column;
  }
}

namespace {

// Text with, for each byte, its offset in the original source (one more
// entry for the end).
struct Mapped {
  std::string text;
  std::vector<uint32_t> at;

  void push(char c, uint32_t offset) {
    text += c;
    at.push_back(offset);
  }
};

bool is_line_terminator_end(const std::string& t, size_t i) {
  // t[i] is the last byte of a JavaScript LineTerminator (\n \r U+2028 U+2029).
  const auto c = static_cast<unsigned char>(t[i]);
  if (c == '\n' || c == '\r') return true;
  return (c == 0xA8 || c == 0xA9) && i >= 2 && static_cast<unsigned char>(t[i - 2]) == 0xE2 &&
         static_cast<unsigned char>(t[i - 1]) == 0x80;
}

// /^[ \t]*({[#%-])/gm -> "$1"
Mapped lstrip_blocks(const Mapped& in) {
  Mapped out;
  const std::string& t = in.text;
  bool line_start = true;
  for (size_t i = 0; i < t.size();) {
    if (line_start) {
      size_t j = i;
      while (j < t.size() && (t[j] == ' ' || t[j] == '\t')) ++j;
      if (j + 1 < t.size() && t[j] == '{' &&
          (t[j + 1] == '#' || t[j + 1] == '%' || t[j + 1] == '-'))
        i = j;
      line_start = false;
    }
    out.push(t[i], in.at[i]);
    line_start = is_line_terminator_end(t, i);
    ++i;
  }
  out.at.push_back(in.at.back());
  return out;
}

// /([#%-]})\n/g -> "$1"
Mapped trim_blocks(const Mapped& in) {
  Mapped out;
  const std::string& t = in.text;
  for (size_t i = 0; i < t.size();) {
    if (i + 2 < t.size() && (t[i] == '#' || t[i] == '%' || t[i] == '-') && t[i + 1] == '}' &&
        t[i + 2] == '\n') {
      out.push(t[i], in.at[i]);
      out.push(t[i + 1], in.at[i + 1]);
      i += 3;
      continue;
    }
    out.push(t[i], in.at[i]);
    ++i;
  }
  out.at.push_back(in.at.back());
  return out;
}

size_t skip_spaces(const std::string& t, size_t i) {
  while (size_t n = text::space_at(t, i)) i += n;
  return i;
}

// If a {%-? generation -?%} / endgeneration tag starts at t[i], returns the
// index after its %} and whether it has each '-'; else 0.
size_t generation_tag(const std::string& t, size_t i, bool& lstrip, bool& rstrip) {
  if (t.compare(i, 2, "{%") != 0) return 0;
  size_t j = i + 2;
  lstrip = j < t.size() && t[j] == '-';
  if (lstrip) ++j;
  j = skip_spaces(t, j);
  if (t.compare(j, 3, "end") == 0 && t.compare(j + 3, 10, "generation") == 0) j += 3;
  if (t.compare(j, 10, "generation") != 0) return 0;
  j = skip_spaces(t, j + 10);
  rstrip = j < t.size() && t[j] == '-';
  if (rstrip) ++j;
  if (t.compare(j, 2, "%}") != 0) return 0;
  return j + 2;
}

// /(\s*){%(-?)\s*(?:end)?generation\s*(-?)%}(\s*)/gs -> before (unless {%-)
// and after (unless -%}).
Mapped drop_generation_tags(const Mapped& in) {
  const std::string& t = in.text;
  if (t.find("generation") == std::string::npos) return in;
  Mapped out;
  size_t i = 0;
  while (i < t.size()) {
    const size_t ws_end = skip_spaces(t, i);
    bool lstrip = false, rstrip = false;
    const size_t tag_end = generation_tag(t, ws_end, lstrip, rstrip);
    if (tag_end == 0) {
      // No match from any position in [i, ws_end]: copy through ws_end.
      const size_t stop = std::max(ws_end, i + 1);
      for (; i < stop && i < t.size(); ++i) out.push(t[i], in.at[i]);
      continue;
    }
    if (!lstrip)
      for (size_t k = i; k < ws_end; ++k) out.push(t[k], in.at[k]);
    const size_t after_end = skip_spaces(t, tag_end);
    if (!rstrip)
      for (size_t k = tag_end; k < after_end; ++k) out.push(t[k], in.at[k]);
    i = after_end;
  }
  out.at.push_back(in.at.back());
  return out;
}

bool is_word(int c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}
bool is_digit(int c) { return c >= '0' && c <= '9'; }

struct Table {
  const char* seq;
  TokenType type;
};
constexpr Table kTable[] = {
    {"{%", TokenType::kOpenStatement},
    {"%}", TokenType::kCloseStatement},
    {"{{", TokenType::kOpenExpression},
    {"}}", TokenType::kCloseExpression},
    {"(", TokenType::kOpenParen},
    {")", TokenType::kCloseParen},
    {"{", TokenType::kOpenCurlyBracket},
    {"}", TokenType::kCloseCurlyBracket},
    {"[", TokenType::kOpenSquareBracket},
    {"]", TokenType::kCloseSquareBracket},
    {",", TokenType::kComma},
    {".", TokenType::kDot},
    {":", TokenType::kColon},
    {"|", TokenType::kPipe},
    {"<=", TokenType::kComparison},
    {">=", TokenType::kComparison},
    {"==", TokenType::kComparison},
    {"!=", TokenType::kComparison},
    {"<", TokenType::kComparison},
    {">", TokenType::kComparison},
    {"+", TokenType::kAdditive},
    {"-", TokenType::kAdditive},
    {"~", TokenType::kAdditive},
    {"**", TokenType::kExponent},
    {"*", TokenType::kMultiplicative},
    {"//", TokenType::kMultiplicative},
    {"/", TokenType::kMultiplicative},
    {"%", TokenType::kMultiplicative},
    {"=", TokenType::kEquals},
};

class Lexer {
 public:
  Lexer(Mapped src, const std::string& name, const SourceLines& lines)
      : src_(std::move(src)), s_(src_.text), name_(name), lines_(lines) {}

  std::vector<Token> run();

 private:
  int at(size_t i) const { return i < s_.size() ? static_cast<unsigned char>(s_[i]) : -1; }
  bool starts(size_t i, std::string_view seq) const { return s_.compare(i, seq.size(), seq) == 0; }
  [[noreturn]] void fail(size_t pos, const std::string& reason) const {
    int32_t line = 0, col = 0;
    lines_.locate(src_.at[std::min(pos, s_.size())], line, col);
    throw Error(name_, line, col, reason, false);
  }
  void push(TokenType type, std::string value, size_t pos) {
    tokens_.push_back(Token{type, std::move(value), src_.at[std::min(pos, s_.size())]});
  }
  TokenType last_type() const { return tokens_.back().type; }
  void strip_trailing_whitespace();
  std::string read_string(char quote);
  void read_escape(std::string& out, uint32_t& pending_high);

  Mapped src_;
  const std::string& s_;
  const std::string& name_;
  const SourceLines& lines_;
  std::vector<Token> tokens_;
  size_t pos_ = 0;
};

void Lexer::strip_trailing_whitespace() {
  if (tokens_.empty() || tokens_.back().type != TokenType::kText) return;
  std::string& v = tokens_.back().value;
  v.resize(text::trim_end(v));
  if (v.empty()) tokens_.pop_back();
}

void Lexer::read_escape(std::string& out, uint32_t& pending_high) {
  // s_[pos_] is the character after the backslash.
  const size_t esc_pos = pos_ - 1;
  const int c = at(pos_++);
  uint32_t unit = 0;
  if (c == 'x' || c == 'u') {
    const size_t len = c == 'x' ? 2 : 4;
    for (size_t k = 0; k < len; ++k) {
      const int h = at(pos_ + k);
      int d = h >= '0' && h <= '9'   ? h - '0'
              : h >= 'a' && h <= 'f' ? h - 'a' + 10
              : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                     : -1;
      if (d < 0) fail(esc_pos, "invalid hexadecimal escape sequence");
      unit = unit * 16 + static_cast<uint32_t>(d);
    }
    pos_ += len;
  } else {
    switch (c) {
      case 'n':
        unit = '\n';
        break;
      case 't':
        unit = '\t';
        break;
      case 'r':
        unit = '\r';
        break;
      case 'b':
        unit = '\b';
        break;
      case 'f':
        unit = '\f';
        break;
      case 'v':
        unit = '\v';
        break;
      case '\'':
        unit = '\'';
        break;
      case '"':
        unit = '"';
        break;
      case '\\':
        unit = '\\';
        break;
      default:
        fail(esc_pos, "unexpected escaped character");
    }
  }
  // UTF-16 units: a \u high surrogate must be followed at once by a \u low one.
  if (pending_high != 0) {
    if (unit < 0xDC00 || unit > 0xDFFF)
      fail(esc_pos, "unsupported: an unpaired surrogate escape in a string");
    text::append_utf8(out, 0x10000 + ((pending_high - 0xD800) << 10) + (unit - 0xDC00));
    pending_high = 0;
    return;
  }
  if (unit >= 0xD800 && unit <= 0xDBFF) {
    pending_high = unit;
    return;
  }
  if (unit >= 0xDC00 && unit <= 0xDFFF)
    fail(esc_pos, "unsupported: an unpaired surrogate escape in a string");
  text::append_utf8(out, unit);
}

std::string Lexer::read_string(char quote) {
  const size_t start = pos_ - 1;
  std::string out;
  uint32_t pending_high = 0;
  while (true) {
    if (pos_ >= s_.size()) fail(start, "unexpected end of input in a string literal");
    const char c = s_[pos_];
    if (c == quote) break;
    if (c == '\\') {
      ++pos_;
      if (pos_ >= s_.size()) fail(start, "unexpected end of input in a string literal");
      read_escape(out, pending_high);
      continue;
    }
    if (pending_high != 0) fail(pos_, "unsupported: an unpaired surrogate escape in a string");
    out += c;
    ++pos_;
    if (pos_ >= s_.size()) fail(start, "unexpected end of input in a string literal");
  }
  if (pending_high != 0) fail(pos_, "unsupported: an unpaired surrogate escape in a string");
  ++pos_;  // the closing quote
  return out;
}

std::vector<Token> Lexer::run() {
  int depth = 0;  // curly brackets open inside an expression
  while (pos_ < s_.size()) {
    const bool outside = tokens_.empty() || last_type() == TokenType::kCloseStatement ||
                         last_type() == TokenType::kCloseExpression ||
                         last_type() == TokenType::kComment;
    if (outside) {
      const size_t start = pos_;
      while (pos_ < s_.size() && !(s_[pos_] == '{' && (at(pos_ + 1) == '%' || at(pos_ + 1) == '{' ||
                                                       at(pos_ + 1) == '#')))
        ++pos_;
      if (pos_ > start) {
        push(TokenType::kText, s_.substr(start, pos_ - start), start);
        continue;
      }
    }

    if (starts(pos_, "{#")) {
      const size_t start = pos_;
      pos_ += 2;
      const bool strip_before = at(pos_) == '-';
      if (strip_before) ++pos_;
      const size_t body = pos_;
      while (!(at(pos_) == '#' && at(pos_ + 1) == '}')) {
        if (pos_ + 2 >= s_.size()) fail(start, "missing end of comment tag '#}'");
        ++pos_;
      }
      std::string comment = s_.substr(body, pos_ - body);
      const bool strip_after = !comment.empty() && comment.back() == '-';
      if (strip_after) comment.pop_back();
      if (strip_before) strip_trailing_whitespace();
      push(TokenType::kComment, std::move(comment), start);
      pos_ += 2;
      if (strip_after) pos_ = skip_spaces(s_, pos_);
      continue;
    }
    if (starts(pos_, "{%-")) {
      strip_trailing_whitespace();
      push(TokenType::kOpenStatement, "{%", pos_);
      pos_ += 3;
      continue;
    }
    if (starts(pos_, "{{-")) {
      strip_trailing_whitespace();
      push(TokenType::kOpenExpression, "{{", pos_);
      depth = 0;
      pos_ += 3;
      continue;
    }

    // Whitespace inside a tag; running into the end of the input is an error.
    while (size_t n = text::space_at(s_, pos_)) {
      pos_ += n;
      if (pos_ >= s_.size()) fail(pos_, "unexpected end of input inside a tag");
    }

    if (starts(pos_, "-%}")) {
      push(TokenType::kCloseStatement, "%}", pos_);
      pos_ = skip_spaces(s_, pos_ + 3);
      continue;
    }
    if (starts(pos_, "-}}")) {
      push(TokenType::kCloseExpression, "}}", pos_);
      pos_ = skip_spaces(s_, pos_ + 3);
      continue;
    }

    const int c = at(pos_);
    if (c == '-' || c == '+') {
      if (tokens_.empty() || last_type() == TokenType::kText)
        fail(pos_, std::string("unexpected character '") + static_cast<char>(c) + "'");
      const TokenType lt = last_type();
      const bool binary = lt == TokenType::kIdentifier || lt == TokenType::kNumericLiteral ||
                          lt == TokenType::kStringLiteral || lt == TokenType::kCloseParen ||
                          lt == TokenType::kCloseSquareBracket;
      if (!binary) {
        const size_t start = pos_++;
        std::string num;
        while (is_digit(at(pos_))) {
          num += s_[pos_++];
          if (pos_ >= s_.size()) fail(start, "unexpected end of input in a number");
        }
        if (!num.empty() && at(pos_) == '.' && is_digit(at(pos_ + 1))) {
          ++pos_;
          num += '.';
          while (is_digit(at(pos_))) {
            num += s_[pos_++];
            if (pos_ >= s_.size()) fail(start, "unexpected end of input in a number");
          }
        }
        const bool is_num = !num.empty();
        push(is_num ? TokenType::kNumericLiteral : TokenType::kUnary,
             std::string(1, static_cast<char>(c)) + num, start);
        continue;
      }
    }

    bool matched = false;
    for (const Table& entry : kTable) {
      const std::string_view seq(entry.seq);
      if (seq == "}}" && depth > 0) continue;
      if (!starts(pos_, seq)) continue;
      push(entry.type, std::string(seq), pos_);
      if (entry.type == TokenType::kOpenExpression) {
        depth = 0;
      } else if (entry.type == TokenType::kOpenCurlyBracket) {
        ++depth;
      } else if (entry.type == TokenType::kCloseCurlyBracket) {
        --depth;
      }
      pos_ += seq.size();
      matched = true;
      break;
    }
    if (matched) continue;

    if (c == '\'' || c == '"') {
      const size_t start = pos_++;
      std::string value = read_string(static_cast<char>(c));
      push(TokenType::kStringLiteral, std::move(value), start);
      continue;
    }
    if (is_digit(c)) {
      const size_t start = pos_;
      std::string num;
      while (is_digit(at(pos_))) {
        num += s_[pos_++];
        if (pos_ >= s_.size()) fail(start, "unexpected end of input in a number");
      }
      if ((tokens_.empty() || last_type() != TokenType::kDot) && at(pos_) == '.' &&
          is_digit(at(pos_ + 1))) {
        ++pos_;
        num += '.';
        while (is_digit(at(pos_))) {
          num += s_[pos_++];
          if (pos_ >= s_.size()) fail(start, "unexpected end of input in a number");
        }
      }
      push(TokenType::kNumericLiteral, std::move(num), start);
      continue;
    }
    if (is_word(c)) {
      const size_t start = pos_;
      while (is_word(at(pos_))) {
        ++pos_;
        if (pos_ >= s_.size()) fail(start, "unexpected end of input after a name");
      }
      push(TokenType::kIdentifier, s_.substr(start, pos_ - start), start);
      continue;
    }
    size_t end = pos_;
    text::next_code_point(s_, end);
    fail(pos_, "unexpected character '" + s_.substr(pos_, end - pos_) + "'");
  }
  return std::move(tokens_);
}

}  // namespace

std::vector<Token> tokenize(std::string_view source, const TemplateOptions& options,
                            const std::string& name, const SourceLines& lines) {
  for (size_t i = 0; i < source.size();) {
    const size_t start = i;
    if (text::next_code_point(source, i) == 0xFFFD &&
        !(i - start == 3 && source[start] == '\xEF')) {
      int32_t line = 0, col = 0;
      lines.locate(static_cast<uint32_t>(start), line, col);
      throw Error(name, line, col, "the template is not valid UTF-8", false);
    }
  }
  Mapped m;
  m.text.assign(source);
  m.at.resize(source.size() + 1);
  for (size_t i = 0; i <= source.size(); ++i) m.at[i] = static_cast<uint32_t>(i);
  if (!m.text.empty() && m.text.back() == '\n') {
    m.text.pop_back();
    m.at.erase(m.at.end() - 2);
  }
  if (options.lstrip_blocks) m = lstrip_blocks(m);
  if (options.trim_blocks) m = trim_blocks(m);
  m = drop_generation_tags(m);
  return Lexer(std::move(m), name, lines).run();
}

}  // namespace fd::jinja
