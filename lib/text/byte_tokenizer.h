// ByteTokenizer: every byte is one token (vocabulary of 256).
//
// The tokenizer behind data.format: text. It is lossless for any byte
// string, UTF-8 or not: decode(encode(s)) == s.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace fd::text {

class ByteTokenizer {
 public:
  static constexpr int kVocabSize = 256;

  int vocab_size() const { return kVocabSize; }
  // One token per byte, the byte's unsigned value.
  std::vector<int32_t> encode(std::string_view text) const;
  // The bytes back; an id outside [0, 256) (a model with a larger
  // vocabulary can sample one) becomes U+FFFD, the replacement character.
  std::string decode(std::span<const int32_t> ids) const;
};

}  // namespace fd::text
