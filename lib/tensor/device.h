// Where a tensor's bytes live: the CPU, or a CUDA device (builds with
// FDTRAIN_HAVE_CUDA; the kernels live in kernels/, and lib/ops dispatches to
// them by the tensor's device).
//
// New tensors go to the calling thread's default device (the CPU unless a
// DeviceScope says otherwise): the trainer opens a DeviceScope for the GPU
// around model construction and the training loop, so every op's outputs,
// gradients and optimizer state follow without each call site naming a
// device. Host staging buffers name Device::cpu() explicitly.
#pragma once

#include <string>

namespace fd {

enum class DeviceType { kCPU, kCUDA };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;  // GPU ordinal; 0 for the CPU

  static Device cpu() { return {}; }
  static Device cuda(int index) { return {DeviceType::kCUDA, index}; }
  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  std::string str() const;  // "cpu", "cuda:0"
};

// True when this binary was built with the CUDA backend.
bool cuda_built();
// Devices usable now: 0 when built without CUDA, without a driver or a GPU.
int cuda_device_count();
// Why cuda_device_count() is 0, for error messages ("" when it is not).
std::string cuda_unavailable_reason();
// Makes GPU `index` this process's device (creates its streams). Throws
// fd::Error with a clear message when there is no such device.
void init_cuda_device(int index);
// "cuda:0 (NVIDIA H200 (sm_90, 139.8 GiB))" after init_cuda_device.
std::string cuda_device_name();

// The calling thread's device for new tensors.
Device default_device();

// Sets the thread's default device for its lifetime, then restores the previous one.
class DeviceScope {
 public:
  explicit DeviceScope(Device d);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  Device previous_;
};

}  // namespace fd
