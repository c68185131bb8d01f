// The CUDA runtime behind device.h (CUDA builds).
#include "lib/tensor/device.h"

#include <fmt/format.h>

#include "kernels/kernels.h"
#include "lib/base/error.h"

namespace fd {

bool cuda_built() { return true; }

int cuda_device_count() { return kernels::device_count(); }

std::string cuda_unavailable_reason() { return kernels::no_device_reason(); }

void init_cuda_device(int index) {
  const int n = kernels::device_count();
  if (n == 0)
    runtime_error("device: cuda requested, but no GPU is usable: {}", kernels::no_device_reason());
  if (index < 0 || index >= n)
    runtime_error("GPU {} requested, but this machine has {} (ordinals 0-{})", index, n, n - 1);
  try {
    kernels::init_device(index);
  } catch (const kernels::Error& e) {
    runtime_error("could not start GPU {}: {}", index, e.what());
  }
}

std::string cuda_blas_library() {
  try {
    return kernels::blas_library();
  } catch (const kernels::Error& e) {
    runtime_error("{}", e.what());
  }
}

CudaAttentionLaunches cuda_attention_launches() {
  const kernels::AttentionLaunches l = kernels::attention_launches();
  return {l.forward_tensor_cores, l.forward_simt, l.backward_tensor_cores, l.backward_simt};
}

void set_cuda_tf32(bool allow) { kernels::set_tf32(allow); }

void cuda_synchronize() {
  if (kernels::current_device() >= 0) kernels::synchronize();
}

DeviceTimer::DeviceTimer() {
  try {
    start_ = kernels::timing_event_create();
    stop_ = kernels::timing_event_create();
  } catch (const kernels::Error& e) {
    kernels::event_destroy(start_);
    runtime_error("GPU timer: {}", e.what());
  }
}

DeviceTimer::~DeviceTimer() {
  try {
    kernels::event_destroy(start_);
    kernels::event_destroy(stop_);
  } catch (const kernels::Error&) {  // a destructor does not throw: the events are lost
  }
}

void DeviceTimer::start() { kernels::event_record(start_, kernels::compute_stream()); }
void DeviceTimer::stop() { kernels::event_record(stop_, kernels::compute_stream()); }
double DeviceTimer::seconds() const { return kernels::event_elapsed_ms(start_, stop_) / 1e3; }

std::string cuda_device_name() {
  return fmt::format("cuda:{} ({})", kernels::current_device(), kernels::device_name());
}

}  // namespace fd
