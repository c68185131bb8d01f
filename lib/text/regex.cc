#include "lib/text/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "lib/base/error.h"
#include "lib/text/utf8.h"

namespace fd::text {
namespace {

// Oniguruma's Unicode classes, as PCRE2 class contents.
constexpr std::string_view kSpace =
    "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";
constexpr std::string_view kWord = "\\p{L}\\p{M}\\p{Nd}\\p{Pc}";
constexpr std::string_view kDigit = "\\p{Nd}";

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

// The pattern with \s \S \d \D \w \W spelled out with Oniguruma's meaning.
std::string rewrite(std::string_view p, const std::string& where) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[++i];
      std::string_view cls;
      bool negated = false;
      switch (e) {
        case 's': cls = kSpace; break;
        case 'S': cls = kSpace; negated = true; break;
        case 'd': cls = kDigit; break;
        case 'D': cls = kDigit; negated = true; break;
        case 'w': cls = kWord; break;
        case 'W': cls = kWord; negated = true; break;
        case 'b':
        case 'B':
          if (!in_class) {
            usage_error("{}: the pattern \"{}\" uses the word boundary \\{}, which fdtrain does not "
                        "support in tokenizer patterns",
                        where, p, e);
          }
          break;
        default: break;
      }
      if (cls.empty()) {
        out.push_back('\\');
        out.push_back(e);
        continue;
      }
      if (in_class) {
        if (negated) {
          usage_error("{}: the pattern \"{}\" uses \\{} inside a character class, which fdtrain "
                      "does not support in tokenizer patterns",
                      where, p, e);
        }
        out.append(cls);
      } else {
        out.append(negated ? "[^" : "[");
        out.append(cls);
        out.push_back(']');
      }
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out.push_back(c);
      // A ']' right after '[' or '[^' is a literal, not the end of the class.
      if (i + 1 < p.size() && p[i + 1] == '^') out.push_back(p[++i]);
      if (i + 1 < p.size() && p[i + 1] == ']') out.push_back(p[++i]);
      continue;
    }
    if (c == '[' && in_class && i + 1 < p.size() && p[i + 1] == ':') {
      // A POSIX class [:alpha:] inside a class: copy it whole.
      const size_t close = p.find(":]", i + 2);
      if (close != std::string_view::npos) {
        out.append(p.substr(i, close + 2 - i));
        i = close + 1;
        continue;
      }
    }
    if (c == ']' && in_class) in_class = false;
    out.push_back(c);
  }
  return out;
}

}  // namespace

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

struct Regex::Matcher::State {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  ~State() {
    pcre2_match_data_free(data);
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
  }
};

Regex::Matcher::Matcher() : state_(std::make_unique<State>()) {
  state_->data = pcre2_match_data_create(1, nullptr);
  state_->context = pcre2_match_context_create(nullptr);
  // Long runs of one class (a 100 kB line of spaces) need more than PCRE2's
  // default 32 kB JIT stack for the look-ahead patterns.
  state_->stack = pcre2_jit_stack_create(32 << 10, 8 << 20, nullptr);
  if (state_->data == nullptr || state_->context == nullptr || state_->stack == nullptr)
    throw std::bad_alloc();
  pcre2_jit_stack_assign(state_->context, nullptr, state_->stack);
}

Regex::Matcher::~Matcher() = default;

Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;
Regex::~Regex() = default;

Regex Regex::compile(std::string_view pattern, const std::string& where) {
  Regex r;
  r.pattern_ = std::string(pattern);
  r.where_ = where;
  const std::string translated = rewrite(pattern, where);
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()),
                                   translated.size(), PCRE2_UTF | PCRE2_UCP, &error, &offset,
                                   nullptr);
  if (code == nullptr) {
    usage_error("{}: the pattern \"{}\" does not compile: {} (at offset {} of \"{}\")", where,
                pattern, pcre2_message(error), offset, translated);
  }
  r.code_ = std::make_unique<Code>();
  r.code_->code = code;
  // Without the JIT (a platform PCRE2 lacks it for) matching still works, interpreted.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return r;
}

Regex Regex::literal(std::string_view literal, const std::string& where) {
  std::string quoted;
  for (const char c : literal) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))) {
      quoted += fmt::format("\\x{{{:x}}}", u);
    } else {
      quoted.push_back(c);
    }
  }
  Regex r = compile(quoted, where);
  r.pattern_ = std::string(literal);
  return r;
}

size_t Regex::next_char(std::string_view text, size_t i) {
  if (i >= text.size()) return i + 1;
  const size_t n = utf8_sequence_length(text, i);
  return i + (n == 0 ? 1 : n);
}

bool Regex::next_match(std::string_view text, size_t from, Matcher& m, size_t* begin,
                       size_t* end) const {
  if (from > text.size()) return false;
  const int rc = pcre2_match(code_->code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(),
                             from, PCRE2_NO_UTF_CHECK, m.state_->data, m.state_->context);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    runtime_error("{}: matching the pattern \"{}\" failed: {}", where_, pattern_,
                  pcre2_message(rc));
  }
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.state_->data);
  *begin = ov[0];
  *end = ov[1];
  return true;
}

}  // namespace fd::text
