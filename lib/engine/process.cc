// The process set-up of process.h, forwarded to lib/ops and lib/dist.
#include "lib/engine/process.h"

#include "lib/dist/init.h"
#include "lib/ops/blas_setup.h"

namespace fd::engine {

void start_process(char** argv) { ops::select_blas_kernel(argv); }

void set_compute_threads(int threads) { ops::set_blas_threads(threads); }

int launcher_rank() { return dist::launcher_rank(); }

dist::FaultSpec injected_fault() { return dist::fault_from_env(); }

std::unique_ptr<dist::Communicator> join_job(int* argc, char*** argv, double timeout_s) {
  return dist::init(argc, argv, timeout_s, /*exit_guard=*/true);
}

void leave_job() { dist::finalize(); }

}  // namespace fd::engine
