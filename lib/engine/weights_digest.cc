#include "lib/engine/weights_digest.h"

#include <bit>

#include "lib/base/sha256.h"

namespace fd::engine {

std::string weights_sha256(const nn::Decoder& model) {
  static_assert(std::endian::native == std::endian::little, "digest assumes little-endian hosts");
  Sha256 sha;
  for (const nn::Parameter* p : model.parameters()) {
    std::vector<float> v = p->value.to_vector();
    sha.update(v.data(), v.size() * sizeof(float));
  }
  return sha.hex_digest();
}

}  // namespace fd::engine
