// TokenDecoder: a tokenizer.json "decoder", which turns the tokens of ids back
// into text.
//
// Supported, as Hugging Face's tokenizers define them: ByteLevel (byte-level
// tokens are stored as their bytes, see bpe.h, so this is concatenation and
// one replacement of invalid UTF-8 at the end), Metaspace, Replace (String
// pattern), ByteFallback (<0xNN> runs to bytes; a run that is not valid UTF-8
// becomes one U+FFFD per byte), Fuse, Strip and Sequence. Anything else is
// refused, naming its JSON path and type.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace fd::text {

class TokenDecoder {
 public:
  struct Step;

  static TokenDecoder from_json(const nlohmann::json& j, const std::string& where);

  TokenDecoder();
  TokenDecoder(TokenDecoder&&) noexcept;
  TokenDecoder& operator=(TokenDecoder&&) noexcept;
  ~TokenDecoder();

  // The text of `tokens` (consumed). Without a decoder Hugging Face joins the
  // tokens with spaces; so does this.
  std::string decode(std::vector<std::string> tokens) const;

 private:
  std::vector<std::unique_ptr<Step>> steps_;
  bool any_ = false;  // a decoder was given (null: join with spaces)
};

}  // namespace fd::text
