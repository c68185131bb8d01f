// AddedTokens: a tokenizer.json's "added_tokens" (special tokens such as
// <|eot_id|>, and tokens added to a vocabulary), which are found in the text
// before anything else touches it, as Hugging Face's AddedVocabulary does.
//
// Matching is leftmost-longest over the token strings (a byte trie). Tokens
// with normalized: false are matched in the raw text, the others in the
// normalized text (split_normalized). lstrip / rstrip extend a match over the
// white space on its left / right; a single_word token matches only where
// neither neighbour is a word character.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "lib/text/text_normalizer.h"

namespace fd::text {

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

// A piece of text: an added token (id >= 0) or plain text (id < 0), bytes [begin, end).
struct TextPiece {
  int32_t id;
  uint32_t begin, end;
};

class AddedTokens {
 public:
  // From the "added_tokens" list of a tokenizer.json; the normalizer gives the
  // normalized spelling of tokens with normalized: true.
  static AddedTokens from_json(const nlohmann::json& list, const TextNormalizer& normalizer,
                               const std::string& where);

  const std::vector<AddedToken>& tokens() const { return tokens_; }
  const AddedToken* find_id(int32_t id) const;
  const AddedToken* find_content(std::string_view content) const;

  // Cuts `text` into added tokens and the text between them (appended to out).
  void split_raw(std::string_view text, std::vector<TextPiece>& out) const {
    split(raw_, text, out);
  }
  void split_normalized(std::string_view text, std::vector<TextPiece>& out) const {
    split(normalized_, text, out);
  }

 private:
  // A byte trie; node 0 is the root. Root edges in a table, the rest in a map.
  struct Trie {
    std::vector<int32_t> token;  // by node: the index into tokens_ ending there, or -1
    int32_t root[256];
    std::unordered_map<uint64_t, int32_t> edges;  // (node << 8 | byte) -> node
    bool empty = true;
    void add(std::string_view s, int32_t token_index);
  };
  void split(const Trie& trie, std::string_view text, std::vector<TextPiece>& out) const;

  std::vector<AddedToken> tokens_;
  std::unordered_map<int32_t, size_t> by_id_;
  std::unordered_map<std::string, size_t> by_content_;
  Trie raw_, normalized_;
};

}  // namespace fd::text
