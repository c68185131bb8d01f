// The process set-up of process.h, forwarded to lib/ops and lib/dist.
#include "lib/engine/process.h"

#include <malloc.h>

#include "lib/dist/init.h"
#include "lib/ops/blas_setup.h"

namespace fd::engine {

void start_process(char** argv) {
  // Blocks of 256 KiB and more come straight from mmap and go back to the system when freed, at
  // a fixed threshold: glibc's default threshold rises to the largest block ever freed (up to
  // 32 MiB), after which such blocks live in the heap, where memory freed in the middle stays
  // resident. A fixed one keeps a rank's resident memory what its blocks in use are, which the
  // estimate predicts (process_memory.h).
  mallopt(M_MMAP_THRESHOLD, 256 << 10);
  ops::select_blas_kernel(argv);
}

void set_compute_threads(int threads) { ops::set_blas_threads(threads); }

int launcher_rank() { return dist::launcher_rank(); }

dist::FaultSpec injected_fault() { return dist::fault_from_env(); }

std::unique_ptr<dist::Communicator> join_job(int* argc, char*** argv, double timeout_s) {
  return dist::init(argc, argv, timeout_s, /*exit_guard=*/true);
}

void leave_job() { dist::finalize(); }

}  // namespace fd::engine
