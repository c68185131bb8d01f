#include "lib/ops/blas_setup.h"

#include <cblas.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <vector>

namespace fd::ops {
namespace {

bool is_generic_kernel(const std::string& name) {
  for (const char* g : {"Prescott", "Core2", "Katmai", "Coppermine", "Northwood", "Penryn",
                        "Dunnington", "Atom", "Nehalem", "Banias", "Generic"}) {
    if (name == g) return true;
  }
  return false;
}

const char* best_kernel_for_this_cpu() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return nullptr;
}

}  // namespace

std::string blas_kernel_name() {
  const char* n = openblas_get_corename();
  return n ? n : "unknown";
}

void select_blas_kernel(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;    // the user decided
  if (std::getenv("FDTRAIN_BLAS_REEXEC") != nullptr) {  // already re-executed once
    unsetenv("FDTRAIN_BLAS_REEXEC");                      // not for our child processes
    return;
  }
  if (!is_generic_kernel(blas_kernel_name())) return;
  const char* best = best_kernel_for_this_cpu();
  if (best == nullptr) return;
  setenv("OPENBLAS_CORETYPE", best, 1);
  setenv("FDTRAIN_BLAS_REEXEC", "1", 1);
  execv("/proc/self/exe", argv);
  // exec failed (no /proc?): carry on with the generic kernels.
}

void set_blas_threads(int threads) { openblas_set_num_threads(threads); }

}  // namespace fd::ops
