// TextNormalizer: a tokenizer.json "normalizer", applied to the text between
// added tokens before pre-tokenization.
//
// Supported, as Hugging Face's tokenizers define them: NFC, NFD, NFKC, NFKD
// (through utf8proc, Unicode's own composition tables), Prepend (adds a string
// in front of a non-empty text: SentencePiece's "▁"), Replace with a String
// pattern (a literal) or a Regex pattern, and Sequence of these. Anything else
// is refused by from_json, naming its JSON path and type.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace fd::text {

class TextNormalizer {
 public:
  // From the "normalizer" value of a tokenizer.json (null: the identity).
  // `where` is the JSON path for messages ("tokenizer.json: normalizer").
  static TextNormalizer from_json(const nlohmann::json& j, const std::string& where);

  TextNormalizer();
  TextNormalizer(TextNormalizer&&) noexcept;
  TextNormalizer& operator=(TextNormalizer&&) noexcept;
  ~TextNormalizer();

  bool identity() const { return steps_.empty(); }
  // The normalized `text` (valid UTF-8) into out (replaced). continuation: the
  // text continues text normalized before (a long document cut in pieces), so
  // Prepend, which marks the start of a text, is skipped.
  void apply(std::string_view text, std::string& out, bool continuation = false) const;
  std::string apply(std::string_view text) const {
    std::string out;
    apply(text, out);
    return out;
  }

  struct Step;

 private:
  std::vector<std::unique_ptr<Step>> steps_;
};

}  // namespace fd::text
