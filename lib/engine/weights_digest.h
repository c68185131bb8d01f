// weights_sha256: a layout-independent fingerprint of a model's weights.
//
// SHA-256 over every trainable parameter as little-endian fp32, in canonical
// name order (Decoder::parameters()). Flat-buffer padding, segment layout, dtype
// of storage beyond the fp32 value, and (later) how parameters are sharded
// across ranks do not enter it: the same weights give the same digest.
#pragma once

#include <string>

#include "lib/nn/decoder.h"

namespace fd::engine {

std::string weights_sha256(const nn::Decoder& model);

}  // namespace fd::engine
