#include "lib/text/added_tokens.h"

#include <utf8proc.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "lib/base/error.h"
#include "lib/text/tokenizer.h"
#include "lib/text/utf8.h"

namespace fd::text {

using json = nlohmann::json;

namespace {

// The character ending at text[end) / starting at text[begin].
char32_t char_before(std::string_view text, size_t end) {
  size_t b = end - 1;
  while (b > 0 && (static_cast<unsigned char>(text[b]) & 0xC0) == 0x80) --b;
  const size_t n = utf8_sequence_length(text, b);
  return n == 0 ? U'\uFFFD' : utf8_decode(text.data() + b, n);
}

size_t char_length_before(std::string_view text, size_t end) {
  size_t b = end - 1;
  while (b > 0 && (static_cast<unsigned char>(text[b]) & 0xC0) == 0x80) --b;
  return end - b;
}

char32_t char_at(std::string_view text, size_t begin) {
  const size_t n = utf8_sequence_length(text, begin);
  return n == 0 ? U'\uFFFD' : utf8_decode(text.data() + begin, n);
}

// Rust's char::is_whitespace: the White_Space property.
bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// Rust's char::is_alphanumeric: Alphabetic or Numeric (general categories L*, Nl, Nd, No, and
// the Other_Alphabetic marks, which utf8proc does not expose; letters and numbers cover the
// words single_word tokens are used with).
bool is_word_char(char32_t c) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  switch (cat) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

}  // namespace

void AddedTokens::Trie::add(std::string_view s, int32_t token_index) {
  if (token.empty()) {
    token.push_back(-1);
    std::fill(std::begin(root), std::end(root), -1);
  }
  empty = false;
  int32_t node = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const auto byte = static_cast<unsigned char>(s[i]);
    int32_t child;
    if (node == 0) {
      child = root[byte];
    } else {
      const auto it = edges.find((uint64_t(node) << 8) | byte);
      child = it == edges.end() ? -1 : it->second;
    }
    if (child < 0) {
      child = int32_t(token.size());
      token.push_back(-1);
      if (node == 0) {
        root[byte] = child;
      } else {
        edges[(uint64_t(node) << 8) | byte] = child;
      }
    }
    node = child;
  }
  // Two tokens with one spelling: the first listed wins, as in a Hugging Face map built in order.
  if (token[size_t(node)] < 0) token[size_t(node)] = token_index;
}

AddedTokens AddedTokens::from_json(const json& list, const TextNormalizer& normalizer,
                                   const std::string& where) {
  AddedTokens a;
  if (list.is_null()) return a;
  if (!list.is_array()) usage_error("{}: must be a list", where);
  for (size_t i = 0; i < list.size(); ++i) {
    const json& t = list[i];
    const std::string at = fmt::format("{}[{}]", where, i);
    if (!t.is_object() || !t.contains("content") || !t["content"].is_string() ||
        !t.contains("id") || !t["id"].is_number_integer()) {
      usage_error("{}: an added token needs \"id\" (a non-negative integer) and \"content\" (a "
                  "string)",
                  at);
    }
    AddedToken tok;
    tok.content = t["content"].get<std::string>();
    const std::optional<int64_t> id = json_token_id(t["id"]);
    if (!id) {
      usage_error("{}: the added token \"{}\" has the id {}, outside the ids a tokenizer may "
                  "use ([0, {})): the file is damaged",
                  at, tok.content, t["id"].dump(), kMaxTokenIds);
    }
    tok.id = int32_t(*id);
    if (tok.content.empty()) usage_error("{}: the token's content is empty", at);
    auto flag = [&](const char* key, bool fallback) {
      const auto it = t.find(key);
      if (it == t.end() || it->is_null()) return fallback;
      if (!it->is_boolean()) usage_error("{}.{}: must be true or false", at, key);
      return it->get<bool>();
    };
    tok.special = flag("special", false);
    tok.lstrip = flag("lstrip", false);
    tok.rstrip = flag("rstrip", false);
    tok.single_word = flag("single_word", false);
    tok.normalized = flag("normalized", !tok.special);
    a.by_id_.emplace(tok.id, a.tokens_.size());
    a.by_content_.emplace(tok.content, a.tokens_.size());
    a.tokens_.push_back(std::move(tok));
  }
  for (size_t i = 0; i < a.tokens_.size(); ++i) {
    const AddedToken& tok = a.tokens_[i];
    if (tok.normalized && !normalizer.identity()) {
      const std::string n = normalizer.apply(tok.content);
      if (!n.empty()) a.normalized_.add(n, int32_t(i));
    } else if (tok.normalized) {
      a.normalized_.add(tok.content, int32_t(i));
    } else {
      a.raw_.add(tok.content, int32_t(i));
    }
  }
  return a;
}

const AddedToken* AddedTokens::find_id(int32_t id) const {
  const auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

const AddedToken* AddedTokens::find_content(std::string_view content) const {
  const auto it = by_content_.find(std::string(content));
  return it == by_content_.end() ? nullptr : &tokens_[it->second];
}

void AddedTokens::split(const Trie& trie, std::string_view text,
                        std::vector<TextPiece>& out) const {
  const size_t n = text.size();
  if (trie.empty) {
    if (n > 0) out.push_back({-1, 0, uint32_t(n)});
    return;
  }
  size_t start = 0;  // the text not yet emitted begins here
  size_t i = 0;
  while (i < n) {
    // The longest token starting at i.
    int32_t node = trie.root[static_cast<unsigned char>(text[i])];
    int32_t best = -1;
    size_t best_end = 0;
    for (size_t j = i + 1; node >= 0; ++j) {
      if (trie.token[size_t(node)] >= 0) {
        best = trie.token[size_t(node)];
        best_end = j;
      }
      if (j >= n) break;
      const auto it = trie.edges.find((uint64_t(node) << 8) | static_cast<unsigned char>(text[j]));
      node = it == trie.edges.end() ? -1 : it->second;
    }
    if (best < 0) {
      ++i;
      continue;
    }
    const AddedToken& tok = tokens_[size_t(best)];
    size_t b = i, e = best_end;
    if (tok.single_word) {
      const bool left_ok = b == 0 || !is_word_char(char_before(text, b));
      const bool right_ok = e == n || !is_word_char(char_at(text, e));
      if (!left_ok || !right_ok) {
        i = e;  // Hugging Face's matcher has consumed it: matching resumes after it
        continue;
      }
    }
    if (tok.lstrip) {
      while (b > start && is_white_space(char_before(text, b))) b -= char_length_before(text, b);
    }
    if (tok.rstrip) {
      while (e < n && is_white_space(char_at(text, e))) {
        const size_t len = utf8_sequence_length(text, e);
        e += len == 0 ? 1 : len;
      }
    }
    if (start < b) out.push_back({-1, uint32_t(start), uint32_t(b)});
    out.push_back({tok.id, uint32_t(b), uint32_t(e)});
    start = e;
    i = e;
  }
  if (start < n) out.push_back({-1, uint32_t(start), uint32_t(n)});
}

}  // namespace fd::text
