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

TEST(Crc32c, MaskIsTfRecords) {
  // ((crc >> 15) | (crc << 17)) + 0xa282ead8, modulo 2^32.
  EXPECT_EQ(mask_crc32c(0u), 0xa282ead8u);
  EXPECT_EQ(mask_crc32c(0x00008000u), 0xa282ead9u);
  EXPECT_EQ(mask_crc32c(0xe3069283u), ((0xe3069283u >> 15) | (0xe3069283u << 17)) + 0xa282ead8u);
}

}  // namespace
}  // namespace fd
