// CUDA builds load cuBLASLt on the first GEMM instead of linking it
// (kernels/cublaslt_lazy.cc): the library is found and its entry points resolve
// without a GPU, and the binaries do not load it at start.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "lib/base/error.h"
#include "lib/tensor/device.h"

namespace fd {
namespace {

TEST(BlasLibrary, LoadsOnDemandWithoutAGpu) {
  if (!cuda_built()) {
    EXPECT_THROW(cuda_blas_library(), Error);
    GTEST_SKIP() << cuda_unavailable_reason();
  }
  auto loaded = [] {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (std::getline(maps, line))
      if (line.find("libcublasLt") != std::string::npos) return true;
    return false;
  };
  EXPECT_FALSE(loaded()) << "cuBLASLt was loaded before any GEMM: the binary links it";
  const std::string name = cuda_blas_library();
  EXPECT_EQ(name.rfind("cuBLASLt ", 0), 0u) << name;
  EXPECT_NE(name.find("libcublasLt.so."), std::string::npos) << name;
  EXPECT_TRUE(loaded());
}

}  // namespace
}  // namespace fd
