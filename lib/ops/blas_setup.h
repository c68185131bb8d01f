// BLAS kernel selection and threading for the CPU backend.
//
// Debian's OpenBLAS is built with DYNAMIC_ARCH and picks its GEMM kernels
// from the CPU model at load time. On CPUs it does not know (new models, and
// most virtual machines, which report a generic "Intel Xeon Processor") it
// falls back to the generic Prescott (SSE3) kernels, 2-5x slower than the
// AVX2/AVX-512 ones the CPU supports. The choice can only be made before the
// library loads, through OPENBLAS_CORETYPE, so select_blas_kernel() sets it
// and re-executes the program once. A user's own OPENBLAS_CORETYPE is respected.
#pragma once

#include <string>

namespace fd::ops {

// Call first thing in main(). Returns normally when nothing needs to change;
// otherwise re-executes the program (never returns) with OPENBLAS_CORETYPE set.
void select_blas_kernel(char** argv);

// OpenBLAS's name for the kernel family in use ("SkylakeX", "Haswell", ...).
std::string blas_kernel_name();

// Threads BLAS may use in this process (one per rank by default).
void set_blas_threads(int threads);

}  // namespace fd::ops
