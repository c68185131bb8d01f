// Where a tensor's bytes live. Only kCPU exists in the CPU build; kCUDA
// tensors are created by the CUDA backend (kernels/), which lib/ops dispatches to.
#pragma once

#include <string>

namespace fd {

enum class DeviceType { kCPU, kCUDA };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;  // GPU ordinal; 0 for the CPU

  static Device cpu() { return {}; }
  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  std::string str() const;
};

}  // namespace fd
