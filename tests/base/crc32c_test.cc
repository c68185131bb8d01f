// CRC-32C against published check values (RFC 3720 appendix B.4 and the
// "123456789" check value of the Castagnoli polynomial) and TFRecord masking.
#include "lib/base/crc32c.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace fd {
namespace {

TEST(Crc32c, KnownVectors) {
  EXPECT_EQ(crc32c("123456789", 9), 0xe3069283u);
  EXPECT_EQ(crc32c("", 0), 0x00000000u);
  std::vector<unsigned char> zeros(32, 0x00), ones(32, 0xff), inc(32), dec(32);
  for (int i = 0; i < 32; ++i) {
    inc[size_t(i)] = static_cast<unsigned char>(i);
    dec[size_t(i)] = static_cast<unsigned char>(31 - i);
  }
  // RFC 3720 (iSCSI), B.4.
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8a9136aau);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62a8ab43u);
  EXPECT_EQ(crc32c(inc.data(), inc.size()), 0x46dd794eu);
  EXPECT_EQ(crc32c(dec.data(), dec.size()), 0x113fdb5cu);
}

TEST(Crc32c, ContinuesAcrossPieces) {
  const std::string s = "The quick brown fox jumps over the lazy dog";
  const uint32_t whole = crc32c(s.data(), s.size());
  EXPECT_EQ(crc32c(s.data() + 10, s.size() - 10, crc32c(s.data(), 10)), whole);
  EXPECT_NE(crc32c(s.data(), s.size() - 1), whole);
}

// The CRC of a + b from the two CRCs and b's length: every split of buffers of several lengths
// (empty parts included), and a long run of zeros (the length's high bits) against the bytes.
TEST(Crc32c, CombineEqualsTheCrcOfTheConcatenation) {
  std::vector<unsigned char> data(3000);
  uint32_t x = 12345;
  for (unsigned char& c : data)
    c = static_cast<unsigned char>((x = x * 1103515245u + 12345u) >> 24);
  for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(64), size_t(3000)})
    for (size_t cut = 0; cut <= n; cut += (n < 80 ? 1 : 97)) {
      const uint32_t a = crc32c(data.data(), cut), b = crc32c(data.data() + cut, n - cut);
      EXPECT_EQ(crc32c_combine(a, b, n - cut), crc32c(data.data(), n)) << n << " " << cut;
    }
  std::vector<unsigned char> zeros(size_t(5) << 20, 0);  // 5 MiB: bits 20 and 22 of the length
  const uint32_t head = crc32c("head", 4);
  EXPECT_EQ(crc32c_combine(head, crc32c(zeros.data(), zeros.size()), zeros.size()),
            crc32c(zeros.data(), zeros.size(), head));
  EXPECT_NE(crc32c_combine(head, 0, 1), crc32c_combine(head, 0, 2));
}

// Every length and alignment (the 8-byte hardware path and its byte tail)
// against the definition, one bit at a time.
TEST(Crc32c, EveryLengthAndAlignmentMatchesTheBitwiseDefinition) {
  auto bitwise = [](const unsigned char* p, size_t n) {
    uint32_t c = ~0u;
    for (size_t i = 0; i < n; ++i) {
      c ^= p[i];
      for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    }
    return ~c;
  };
  std::vector<unsigned char> buf(300);
  uint32_t x = 12345;
  for (auto& b : buf) b = static_cast<unsigned char>((x = x * 1103515245u + 12345u) >> 16);
  for (size_t off = 0; off < 9; ++off)
    for (size_t n = 0; n + off <= buf.size(); n += (n < 40 ? 1 : 37))
      ASSERT_EQ(crc32c(buf.data() + off, n), bitwise(buf.data() + off, n)) << off << " " << n;
}

TEST(Crc32c, MaskIsTfRecords) {
  // ((crc >> 15) | (crc << 17)) + 0xa282ead8, modulo 2^32.
  EXPECT_EQ(mask_crc32c(0u), 0xa282ead8u);
  EXPECT_EQ(mask_crc32c(0x00008000u), 0xa282ead9u);
  EXPECT_EQ(mask_crc32c(0xe3069283u), ((0xe3069283u >> 15) | (0xe3069283u << 17)) + 0xa282ead8u);
}

}  // namespace
}  // namespace fd
