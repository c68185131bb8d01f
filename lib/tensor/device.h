// Where a tensor's bytes live: the CPU, a CUDA device (CUDA builds: the
// kernels live in kernels/, and lib/ops dispatches to them by the tensor's
// device), or nowhere: the meta device.
//
// Meta (the counting device, like PyTorch's meta tensors): a tensor on it has
// a shape, a dtype and a memory category but no bytes. Its Storage reports
// every allocation and free to the MemoryAccountant exactly as a CPU Storage
// of the same size would, and every op allocates on it what its CPU
// implementation allocates and computes nothing, so running setup and a
// training step under DeviceScope(Device::meta()) measures their memory
// without doing the work (tensor.h says which accesses are allowed).
//
// New tensors go to the calling thread's default device (the CPU unless a
// DeviceScope says otherwise): the trainer opens a DeviceScope for the GPU
// around model construction and the training loop, so every op's outputs,
// gradients and optimizer state follow without each call site naming a
// device. Host staging buffers name Device::cpu() explicitly.
#pragma once

#include <string>

namespace fd {

enum class DeviceType { kCPU, kCUDA, kMeta };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;  // GPU ordinal; 0 for the CPU

  static Device cpu() { return {}; }
  static Device cuda(int index) { return {DeviceType::kCUDA, index}; }
  static Device meta() { return {DeviceType::kMeta, 0}; }
  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  bool is_meta() const { return type == DeviceType::kMeta; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  std::string str() const;  // "cpu", "cuda:0", "meta"
};

// The CUDA runtime. Defined in cuda/device.cc in CUDA builds and in
// cuda_stub.cc otherwise (no devices; init_cuda_device throws).

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
// "cuBLASLt 130100 (libcublasLt.so.13)": loads the GEMM library, which CUDA builds open on their
// first GEMM rather than at start (kernels/cublaslt_lazy.cc); needs no GPU. Throws fd::Error
// when the library cannot be loaded, or this binary was built without CUDA.
std::string cuda_blas_library();

// The GPU attention calls of this process by the kernels that ran them (kernels/kernels.h's
// attention_launches): all 0 without CUDA or before the first.
struct CudaAttentionLaunches {
  int64_t forward_tensor_cores = 0, forward_simt = 0;
  int64_t backward_tensor_cores = 0, backward_simt = 0;
};
CudaAttentionLaunches cuda_attention_launches();

// fp32 GEMMs on the GPU on TF32 tensor cores (the recipe's `tf32`), or exact
// fp32 (the default until called); nothing without CUDA.
void set_cuda_tf32(bool allow);

// Waits until the GPU has done all the work queued so far on its compute
// stream, so that a host clock read next includes it (--profile); nothing
// when no GPU was started (init_cuda_device) or without CUDA.
void cuda_synchronize();

// Times the GPU's work between start() and stop() on the compute stream with
// a pair of CUDA events (cudaEventElapsedTime): seconds() waits for stop.
// After init_cuda_device; an fd::Error without CUDA.
class DeviceTimer {
 public:
  DeviceTimer();
  ~DeviceTimer();
  DeviceTimer(const DeviceTimer&) = delete;
  DeviceTimer& operator=(const DeviceTimer&) = delete;
  void start();
  void stop();
  double seconds() const;

 private:
  void* start_ = nullptr;
  void* stop_ = nullptr;
};

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
