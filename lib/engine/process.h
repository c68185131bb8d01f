// Setting up this process for fdtrain: the one entry point through which the
// CLI (apps/fdtrain) reaches the process-wide machinery below the engine.
//
//   int main(int argc, char** argv) {
//     fd::engine::start_process(argv);        // first: may re-execute the program
//     ...
//     auto comm = fd::engine::join_job(&argc, &argv, r.dist.timeout_s);
//     ...                                     // train on *comm
//     comm.reset();
//     fd::engine::leave_job();                // also on the error path, after the message
//   }
//
// start_process picks the CPU backend's BLAS kernels (lib/ops/blas_setup.h:
// OpenBLAS reads OPENBLAS_CORETYPE only when it loads, so the program is
// re-executed once with it set). join_job starts MPI under an MPI launcher
// (else a local world of one) with dist.timeout_s bounding MPI_Init,
// MPI_Finalize and, through the exit guard, a rank stopped after it finished
// (lib/dist/init.h). leave_job finalizes MPI if it was started; a rank that
// fails while its peers still wait must end the job with
// Communicator::abort() instead. Not thread-safe; call from main's thread.
#pragma once

#include <memory>

#include "lib/dist/communicator.h"
#include "lib/dist/fault.h"

namespace fd::engine {

// Call first thing in main(). Returns normally, or re-executes the program
// with the BLAS kernels set (never returns).
void start_process(char** argv);

// Threads the CPU backend's BLAS may use in this process (eval, generate:
// --threads; a training rank uses one).
void set_compute_threads(int threads);

// This process's rank as its MPI launcher announces it, known before
// join_job(); -1 when there is no launcher.
int launcher_rank();

// The fault this process is asked to inject (FDTRAIN_FAULT, for tests of
// failing ranks; lib/dist/fault.h); kNone when unset. A malformed value is a
// usage fd::Error.
dist::FaultSpec injected_fault();

// The job's communicator: MPI when launched by an MPI launcher with more than
// one rank (or FDTRAIN_FORCE_MPI=1), else local. `timeout_s` is the recipe's
// dist.timeout_s. Once per process; the fdtrain binary's exit guard is armed.
std::unique_ptr<dist::Communicator> join_job(int* argc, char*** argv, double timeout_s);

// MPI_Finalize if join_job() started MPI and it is not yet finalized; else
// nothing. Destroy the communicator first.
void leave_job();

}  // namespace fd::engine
