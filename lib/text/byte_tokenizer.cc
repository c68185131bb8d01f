#include "lib/text/byte_tokenizer.h"

namespace fd::text {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  out.reserve(ids.size());
  for (int32_t id : ids) {
    if (id >= 0 && id < kVocabSize) {
      out.push_back(static_cast<char>(static_cast<unsigned char>(id)));
    } else {
      out += "\xEF\xBF\xBD";
    }
  }
  return out;
}

}  // namespace fd::text
