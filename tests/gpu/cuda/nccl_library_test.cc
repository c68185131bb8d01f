// CUDA builds load NCCL on the first GPU collective instead of linking it
// (lib/dist/cuda/nccl_lazy.cc): the process has not mapped it before, the first
// call finds it and resolves its entry points without a GPU, and a library that
// cannot be loaded is one message naming it and what to do.
#include <gtest/gtest.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "lib/base/error.h"
#include "lib/dist/nccl_communicator.h"

namespace fd::dist {
namespace {

bool nccl_mapped() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find("libnccl") != std::string::npos) return true;
  return false;
}

// Death-test style (a child process): the library is loaded once per process.
TEST(NcclLibraryDeathTest, AMissingLibraryIsOneMessage) {
  EXPECT_EXIT(
      {
        ::setenv("FDTRAIN_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", 1);
        try {
          nccl_version();
        } catch (const Error& e) {
          std::fprintf(stderr, "%s\n", e.what());
          std::exit(3);
        }
        std::exit(0);
      },
      ::testing::ExitedWithCode(3),
      "NCCL: cannot load /nonexistent/libnccl.so.2 \\(FDTRAIN_NCCL_LIBRARY\\).*unset it");
}

// In a fresh process (the threadsafe death-test style re-executes the test binary): an earlier
// test of the same binary (NcclOneRank, on a GPU machine) may have loaded NCCL in this one.
TEST(NcclLibraryDeathTest, LoadsOnTheFirstCallWithoutAGpu) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        if (std::getenv("FDTRAIN_NCCL_LIBRARY") != nullptr) std::exit(4);
        if (nccl_mapped()) {
          std::fprintf(stderr, "NCCL was mapped before any NCCL call: the binary links it\n");
          std::exit(5);
        }
        const std::string version = nccl_version();
        if (!nccl_mapped()) std::exit(6);
        // The library found may be newer than the headers fdtrain was built with (a GPU
        // machine's own NCCL), never older than their major version.
        std::fprintf(stderr, "loaded NCCL %s (built with %d.%d.%d)\n", version.c_str(), NCCL_MAJOR,
                     NCCL_MINOR, NCCL_PATCH);
        std::exit(version.rfind(std::to_string(NCCL_MAJOR) + ".", 0) == 0 ? 3 : 7);
      },
      ::testing::ExitedWithCode(3), "loaded NCCL [0-9]+\\.[0-9]+\\.[0-9]+");
}

}  // namespace
}  // namespace fd::dist
