#include "lib/ops/cuda/gpu.h"

#include "lib/base/check.h"

namespace fd::ops::gpu {

void expect_cuda(const Tensor& t, const char* op, const char* what) {
  FD_CHECK(!t.defined() || t.is_cuda(), "{}: {} is on {} but the op runs on the GPU", op, what,
           t.defined() ? t.device().str() : "");
}

Tensor device_ids(const Tensor& ids, int64_t hi, const char* op, bool allow_ignore,
                  int ignore_index) {
  FD_CHECK(ids.dtype() == DType::kI32, "{}: ids must be i32, got {}", op, dtype_name(ids.dtype()));
  if (ids.is_cuda()) return ids;
  const int32_t* id = ids.data<int32_t>();
  for (int64_t i = 0, n = ids.numel(); i < n; ++i) {
    if (allow_ignore && id[i] == ignore_index) continue;
    FD_CHECK(id[i] >= 0 && id[i] < hi, "{}: id {} at position {} outside [0, {})", op, id[i], i,
             hi);
  }
  return ids.to_device(default_device().is_cuda() ? default_device()
                                                  : Device::cuda(kernels::current_device()));
}

}  // namespace fd::ops::gpu
