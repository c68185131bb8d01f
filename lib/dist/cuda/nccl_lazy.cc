// NCCL, loaded on the first GPU collective rather than at program start.
//
// libnccl is ~220 MB. Linked, the dynamic loader maps it and resolves its
// symbols in every process a CUDA build starts (each `fdtrain validate`, each
// CPU run, each test), though only a GPU run with more than one rank ever calls
// it. So fd_dist does not link it: this file defines the NCCL entry points
// nccl_communicator.cc calls, with the signatures <nccl.h> declares (the
// compiler checks them against it); each forwards to the real function, which
// the first call resolves by dlopen()ing the library: first by its soname
// (LD_LIBRARY_PATH, the binary's RUNPATH, ldconfig's cache), then at the path it
// had when fdtrain was built (FDTRAIN_NCCL_LIBRARY, when set, names the one
// library to load instead). kernels/cublaslt_lazy.cc does the same for
// cuBLASLt; the CUDA runtime is linked statically and loads the driver
// (libcuda) itself on the first CUDA call.
//
// A missing library is an fd::Error (kRuntime) naming the library, where it
// looked and what to do, thrown from the first NCCL call (a GPU run's
// NcclCommunicator, after the device is set up).
#include <dlfcn.h>
#include <nccl.h>

#include <cstdlib>
#include <string>

#include "lib/base/error.h"

#ifndef FD_NCCL_SONAME
#error "FD_NCCL_SONAME (e.g. libnccl.so.2) is set by CMakeLists.txt"
#endif
#ifndef FD_NCCL_PATH
#error "FD_NCCL_PATH (the build machine's libnccl) is set by CMakeLists.txt"
#endif

namespace fd::dist {
namespace {

// The library's handle; loads it on the first call (thread-safe: a function-local static).
void* nccl_library() {
  static void* handle = [] {
    // FDTRAIN_NCCL_LIBRARY: the library to load, and no other (a user's own NCCL build).
    if (const char* path = std::getenv("FDTRAIN_NCCL_LIBRARY"); path != nullptr && *path != 0) {
      void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
      if (h != nullptr) return h;
      runtime_error(
          "NCCL: cannot load {} (FDTRAIN_NCCL_LIBRARY): {}: set FDTRAIN_NCCL_LIBRARY to "
          "the path of {} or unset it",
          path, dlerror(), FD_NCCL_SONAME);
    }
    void* h = dlopen(FD_NCCL_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (h != nullptr) return h;
    const std::string by_name = dlerror();
    h = dlopen(FD_NCCL_PATH, RTLD_NOW | RTLD_LOCAL);
    if (h != nullptr) return h;
    const char* ld_path = std::getenv("LD_LIBRARY_PATH");
    runtime_error(
        "NCCL: cannot load {}: looked for it by name (LD_LIBRARY_PATH={}, the loader's "
        "cache: {}) and at {} ({}): a GPU run of more than one rank needs NCCL: "
        "install it (NVIDIA's libnccl2 package, or the nvidia-nccl Python wheel), or "
        "put the folder holding {} on LD_LIBRARY_PATH",
        FD_NCCL_SONAME, ld_path != nullptr ? ld_path : "(unset)", by_name, FD_NCCL_PATH, dlerror(),
        FD_NCCL_SONAME);
  }();
  return handle;
}

// The real `name`, typed as the declaration `Fn` of <nccl.h>.
template <typename Fn>
Fn* resolve_nccl(const char* name) {
  void* symbol = dlsym(nccl_library(), name);
  if (symbol == nullptr) {
    runtime_error(
        "NCCL: {} has no {}: the library is older than the NCCL fdtrain was built "
        "with ({}.{}.{})",
        FD_NCCL_SONAME, name, NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
  }
  return reinterpret_cast<Fn*>(symbol);
}

}  // namespace
}  // namespace fd::dist

// One forwarding definition per entry point fdtrain calls; each resolves once.
#define FD_NCCL_FORWARD(ret, name, params, args)                       \
  extern "C" ret name params {                                         \
    static auto* real = fd::dist::resolve_nccl<decltype(name)>(#name); \
    return real args;                                                  \
  }

FD_NCCL_FORWARD(ncclResult_t, ncclGetVersion, (int* version), (version))
FD_NCCL_FORWARD(ncclResult_t, ncclGetUniqueId, (ncclUniqueId * id), (id))
FD_NCCL_FORWARD(ncclResult_t, ncclCommInitRank,
                (ncclComm_t * comm, int nranks, ncclUniqueId id, int rank),
                (comm, nranks, id, rank))
FD_NCCL_FORWARD(ncclResult_t, ncclCommDestroy, (ncclComm_t comm), (comm))
FD_NCCL_FORWARD(ncclResult_t, ncclCommAbort, (ncclComm_t comm), (comm))
FD_NCCL_FORWARD(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t comm, ncclResult_t* error),
                (comm, error))
FD_NCCL_FORWARD(const char*, ncclGetErrorString, (ncclResult_t result), (result))
FD_NCCL_FORWARD(const char*, ncclGetLastError, (ncclComm_t comm), (comm))
FD_NCCL_FORWARD(ncclResult_t, ncclGroupStart, (), ())
FD_NCCL_FORWARD(ncclResult_t, ncclGroupEnd, (), ())
FD_NCCL_FORWARD(ncclResult_t, ncclAllReduce,
                (const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                 ncclComm_t comm, cudaStream_t stream),
                (send, recv, count, type, op, comm, stream))
FD_NCCL_FORWARD(ncclResult_t, ncclReduceScatter,
                (const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                 ncclComm_t comm, cudaStream_t stream),
                (send, recv, count, type, op, comm, stream))
FD_NCCL_FORWARD(ncclResult_t, ncclAllGather,
                (const void* send, void* recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                 cudaStream_t stream),
                (send, recv, count, type, comm, stream))
FD_NCCL_FORWARD(ncclResult_t, ncclBroadcast,
                (const void* send, void* recv, size_t count, ncclDataType_t type, int root,
                 ncclComm_t comm, cudaStream_t stream),
                (send, recv, count, type, root, comm, stream))
FD_NCCL_FORWARD(ncclResult_t, ncclSend,
                (const void* send, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                 cudaStream_t stream),
                (send, count, type, peer, comm, stream))
FD_NCCL_FORWARD(ncclResult_t, ncclRecv,
                (void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                 cudaStream_t stream),
                (recv, count, type, peer, comm, stream))
