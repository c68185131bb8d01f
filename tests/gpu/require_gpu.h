// REQUIRE_GPU(): the first line of a GPU test. Skips the test, saying why, when
// no usable GPU is present; otherwise makes device 0 current (once per process).
#pragma once

#include <gtest/gtest.h>

#include "lib/tensor/device.h"

namespace fd::gpu_test {

inline bool gpu_ready() {
  static const bool ready = [] {
    if (cuda_device_count() == 0) return false;
    init_cuda_device(0);
    return true;
  }();
  return ready;
}

}  // namespace fd::gpu_test

#define REQUIRE_GPU()                  \
  if (!::fd::gpu_test::gpu_ready()) \
  GTEST_SKIP() << "no usable GPU: " << ::fd::cuda_unavailable_reason()
