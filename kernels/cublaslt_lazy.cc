// cuBLASLt, loaded on first use rather than at program start.
//
// libcublasLt is ~540 MB; linking it makes the dynamic loader map it and apply
// its ~400,000 relocations in every process: ~0.4 s and ~210 MB of resident
// memory before main(), in every fdtrain invocation, GPU or not (`fdtrain
// --version`, `estimate`, every CPU run and every test). So fd_kernels does not
// link it. This file defines the cuBLASLt entry points gemm.cu calls, with the
// signatures <cublasLt.h> declares (the compiler checks them against it); each
// forwards to the real function, which the first call resolves by dlopen()ing
// the library: first by its soname (LD_LIBRARY_PATH, the binary's RUNPATH,
// ldconfig's cache), then at the path it had when fdtrain was built. CPU-only
// runs never load it.
//
// A missing library is a kernels::Error naming the library, the loader's
// message and what to do, thrown from the first GEMM (init_device() has
// succeeded by then, so the machine has a GPU and a driver).
#include <cublasLt.h>
#include <dlfcn.h>

#include <cstdlib>
#include <string>

#include "kernels/kernels.h"

#ifndef FD_CUBLASLT_SONAME
#error "FD_CUBLASLT_SONAME (e.g. libcublasLt.so.13) is set by CMakeLists.txt"
#endif
#ifndef FD_CUBLASLT_PATH
#error "FD_CUBLASLT_PATH (the build machine's libcublasLt) is set by CMakeLists.txt"
#endif

namespace fd::kernels {
namespace {

// The library's handle; loads it on the first call (thread-safe: a function-local static).
void* library() {
  static void* handle = [] {
    void* h = dlopen(FD_CUBLASLT_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (h != nullptr) return h;
    const std::string by_name = dlerror();
    h = dlopen(FD_CUBLASLT_PATH, RTLD_NOW | RTLD_LOCAL);
    if (h != nullptr) return h;
    const char* ld_path = std::getenv("LD_LIBRARY_PATH");
    throw Error(
        std::string("cuBLASLt: cannot load ") + FD_CUBLASLT_SONAME +
        ": looked for it by name (LD_LIBRARY_PATH=" + (ld_path != nullptr ? ld_path : "(unset)") +
        ", the loader's cache: " + by_name + ") and at " + FD_CUBLASLT_PATH + " (" + dlerror() +
        "): install the CUDA toolkit's cuBLAS, or put the folder holding " + FD_CUBLASLT_SONAME +
        " on LD_LIBRARY_PATH");
  }();
  return handle;
}

// The real `name`, typed as the declaration `Fn` of <cublasLt.h>.
template <typename Fn>
Fn* resolve(const char* name) {
  void* symbol = dlsym(library(), name);
  if (symbol == nullptr) {
    throw Error(std::string("cuBLASLt: ") + FD_CUBLASLT_SONAME + " has no " + name +
                ": the library is older than the CUDA toolkit fdtrain was built with");
  }
  return reinterpret_cast<Fn*>(symbol);
}

}  // namespace
}  // namespace fd::kernels

// One forwarding definition per entry point fdtrain calls; each resolves once.
#define FD_CUBLASLT_FORWARD(name, params, args)                      \
  extern "C" cublasStatus_t name params {                            \
    static auto* real = fd::kernels::resolve<decltype(name)>(#name); \
    return real args;                                                \
  }

FD_CUBLASLT_FORWARD(cublasLtCreate, (cublasLtHandle_t * handle), (handle))
FD_CUBLASLT_FORWARD(cublasLtMatmulDescCreate,
                    (cublasLtMatmulDesc_t * desc, cublasComputeType_t compute,
                     cudaDataType_t scale),
                    (desc, compute, scale))
FD_CUBLASLT_FORWARD(cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t desc), (desc))
FD_CUBLASLT_FORWARD(cublasLtMatmulDescSetAttribute,
                    (cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                     const void* buf, size_t size),
                    (desc, attr, buf, size))
FD_CUBLASLT_FORWARD(cublasLtMatrixLayoutCreate,
                    (cublasLtMatrixLayout_t * layout, cudaDataType type, uint64_t rows,
                     uint64_t cols, int64_t ld),
                    (layout, type, rows, cols, ld))
FD_CUBLASLT_FORWARD(cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t layout), (layout))
FD_CUBLASLT_FORWARD(cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t * pref), (pref))
FD_CUBLASLT_FORWARD(cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t pref), (pref))
FD_CUBLASLT_FORWARD(cublasLtMatmulPreferenceSetAttribute,
                    (cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
                     const void* buf, size_t size),
                    (pref, attr, buf, size))
FD_CUBLASLT_FORWARD(cublasLtMatmulAlgoGetHeuristic,
                    (cublasLtHandle_t handle, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
                     cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                     cublasLtMatmulPreference_t pref, int requested,
                     cublasLtMatmulHeuristicResult_t heuristics[], int* returned),
                    (handle, op, a, b, c, d, pref, requested, heuristics, returned))
FD_CUBLASLT_FORWARD(cublasLtMatmul,
                    (cublasLtHandle_t handle, cublasLtMatmulDesc_t op, const void* alpha,
                     const void* A, cublasLtMatrixLayout_t a, const void* B,
                     cublasLtMatrixLayout_t b, const void* beta, const void* C,
                     cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t d,
                     const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes,
                     cudaStream_t stream),
                    (handle, op, alpha, A, a, B, b, beta, C, c, D, d, algo, workspace,
                     workspace_bytes, stream))
#undef FD_CUBLASLT_FORWARD

extern "C" size_t cublasLtGetVersion() {
  static auto* real = fd::kernels::resolve<decltype(cublasLtGetVersion)>("cublasLtGetVersion");
  return real();
}

// The status texts are only asked for after a cuBLASLt call returned an error, so the library is
// loaded by then; they still resolve through library() like the rest.
extern "C" const char* cublasLtGetStatusName(cublasStatus_t status) {
  static auto* real =
      fd::kernels::resolve<decltype(cublasLtGetStatusName)>("cublasLtGetStatusName");
  return real(status);
}
extern "C" const char* cublasLtGetStatusString(cublasStatus_t status) {
  static auto* real =
      fd::kernels::resolve<decltype(cublasLtGetStatusString)>("cublasLtGetStatusString");
  return real(status);
}

namespace fd::kernels {

std::string blas_library() {
  return "cuBLASLt " + std::to_string(cublasLtGetVersion()) + " (" + FD_CUBLASLT_SONAME + ")";
}

}  // namespace fd::kernels
