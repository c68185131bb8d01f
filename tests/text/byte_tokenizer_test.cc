#include "lib/text/byte_tokenizer.h"

#include <gtest/gtest.h>

namespace fd::text {
namespace {

TEST(ByteTokenizer, RoundTripsEveryByte) {
  ByteTokenizer tok;
  EXPECT_EQ(tok.vocab_size(), 256);
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(char(i));
  std::vector<int32_t> ids = tok.encode(all);
  ASSERT_EQ(ids.size(), 256u);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(ids[i], i);
  EXPECT_EQ(tok.decode(ids), all);
}

TEST(ByteTokenizer, NonAsciiIsBytesNotCodePoints) {
  ByteTokenizer tok;
  std::string text = "h\xC3\xA9llo \xE2\x82\xAC";  // "héllo €" in UTF-8
  std::vector<int32_t> ids = tok.encode(text);
  EXPECT_EQ(ids, (std::vector<int32_t>{'h', 0xC3, 0xA9, 'l', 'l', 'o', ' ', 0xE2, 0x82, 0xAC}));
  EXPECT_EQ(tok.decode(ids), text);
  EXPECT_TRUE(tok.encode("").empty());
}

TEST(ByteTokenizer, OutOfRangeIdsDecodeToReplacementCharacter) {
  ByteTokenizer tok;
  EXPECT_EQ(tok.decode(std::vector<int32_t>{'a', 256, -1, 'b'}),
            "a\xEF\xBF\xBD\xEF\xBF\xBD"
            "b");
}

}  // namespace
}  // namespace fd::text
