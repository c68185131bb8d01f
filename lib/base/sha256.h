// SHA-256 (FIPS 180-4), incremental. Used for summary.json's weights_sha256.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace fd {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t size);
  // Finishes the digest; the object must not be updated afterwards.
  std::array<uint8_t, 32> digest();
  // Lower-case hex of digest().
  std::string hex_digest();

 private:
  void compress(const uint8_t* block);
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

}  // namespace fd
