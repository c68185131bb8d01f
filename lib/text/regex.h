// Regex: the pre-tokenizers' regular expressions (Hugging Face `Split` patterns
// and the GPT-2 ByteLevel pattern), compiled with PCRE2's JIT.
//
// Why PCRE2: Hugging Face's tokenizers run these patterns with Oniguruma; they
// need Unicode properties (\p{L}, \p{N}), case-insensitive groups and the
// look-ahead of `\s+(?!\S)`, which std::regex cannot express. PCRE2 (Debian's
// libpcre2-8) has the same Perl syntax, Unicode properties and a JIT that
// matches these patterns at hundreds of MB/s, so the regex is not the
// tokenizer's bottleneck (BPE is).
//
// Oniguruma's Unicode \s, \d and \w differ from PCRE2's (\s: the White_Space
// property, which includes U+0085 but not U+180E; \w: letters, marks, decimal
// digits and connector punctuation), so compile() rewrites those escapes into
// explicit classes with Oniguruma's meaning before PCRE2 sees the pattern.
// Word boundaries (\b, \B) and \S/\D/\W inside a character class are refused.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace fd::text {

class Regex {
 public:
  // Per-thread match state (match data, JIT stack). Not shared between threads.
  class Matcher;

  // Compiles an Oniguruma-syntax `pattern`. `where` names it in errors (the
  // JSON path of a tokenizer.json). Throws fd::Error (kUsage) for a pattern
  // PCRE2 rejects or one using a construct above that is refused.
  static Regex compile(std::string_view pattern, const std::string& where);
  // A pattern matching `literal` exactly.
  static Regex literal(std::string_view literal, const std::string& where);

  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;
  ~Regex();

  // Calls on_match(begin, end) for each successive non-overlapping match in
  // `text` (valid UTF-8), leftmost first, as Oniguruma's find_iter does: an
  // empty match advances by one character. `text` must outlive the call.
  template <typename F>
  void for_each_match(std::string_view text, Matcher& m, F&& on_match) const {
    size_t pos = 0;
    size_t begin, end;
    while (pos <= text.size() && next_match(text, pos, m, &begin, &end)) {
      on_match(begin, end);
      pos = end > begin ? end : next_char(text, end);
    }
  }

  const std::string& pattern() const { return pattern_; }

 private:
  struct Code;
  Regex() = default;
  bool next_match(std::string_view text, size_t from, Matcher& m, size_t* begin,
                  size_t* end) const;
  static size_t next_char(std::string_view text, size_t i);

  std::string pattern_;  // as given (before the rewrite), for messages
  std::string where_;
  std::unique_ptr<Code> code_;
};

class Regex::Matcher {
 public:
  Matcher();
  Matcher(const Matcher&) = delete;
  Matcher& operator=(const Matcher&) = delete;
  ~Matcher();

 private:
  friend class Regex;
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace fd::text
