#include "lib/tensor/device.h"

#include <fmt/format.h>

namespace fd {
namespace {
thread_local Device t_default_device;
}  // namespace

std::string Device::str() const {
  switch (type) {
    case DeviceType::kCPU:
      return "cpu";
    case DeviceType::kCUDA:
      return fmt::format("cuda:{}", index);
    case DeviceType::kMeta:
      return "meta";
  }
  return "?";
}

Device default_device() { return t_default_device; }

DeviceScope::DeviceScope(Device d) : previous_(t_default_device) { t_default_device = d; }
DeviceScope::~DeviceScope() { t_default_device = previous_; }

}  // namespace fd
