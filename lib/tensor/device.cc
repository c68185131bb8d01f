#include "lib/tensor/device.h"

#include <fmt/format.h>

namespace fd {
std::string Device::str() const {
  return type == DeviceType::kCPU ? std::string("cpu") : fmt::format("cuda:{}", index);
}
}  // namespace fd
