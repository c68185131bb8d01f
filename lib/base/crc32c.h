// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as used by TFRecord
// framing (TensorBoard event files) and many storage formats.
//
//   crc32c("123456789") == 0xe3069283
//
// With SSE4.2 (chosen at run time) 8 bytes per instruction, else a table, a
// byte at a time; the same values either way (tests/base).
#pragma once

#include <cstddef>
#include <cstdint>

namespace fd {

// CRC-32C of `size` bytes at `data`. `crc` continues a previous value, so
// crc32c(b, crc32c(a)) == crc32c(a + b).
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

// The CRC-32C of a + b from crc32c(a), crc32c(b) and b's length alone (no pass over the bytes):
// a file's CRC from the CRCs of its parts, in O(log len_b).
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

// TFRecord's masked form of a CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
// (A CRC stored beside the data it covers is masked so that a CRC of data that
// itself holds CRCs stays well distributed.)
uint32_t mask_crc32c(uint32_t crc);

}  // namespace fd
