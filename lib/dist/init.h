// init() / finalize(): the process's communicator.
//
// init() picks the backend from the environment:
//   - "mpi" when launched by an MPI launcher with a world of more than one
//     rank (OMPI_COMM_WORLD_SIZE or PMI_SIZE > 1; or PMIX_RANK set without a
//     size variable), or when FDTRAIN_FORCE_MPI=1 (an MPI world of any size);
//   - "local" (world 1, MPI never initialised) otherwise.
// The mpi backend initialises MPI with MPI_THREAD_MULTIPLE (a clear fd::Error
// if the library does not provide it) and sets MPI_ERRORS_RETURN on
// MPI_COMM_WORLD so that every MPI failure reaches our checks.
//
// Call init() once, early in main; destroy the communicator and then call
// finalize() at exit (finalize() also shuts down a communicator still alive).
// A rank that fails after init() must end the job with Communicator::abort()
// rather than return from main while its peers wait. Not thread-safe.
#pragma once

#include <memory>

#include "lib/dist/communicator.h"

namespace fd::dist {

// `timeout_s` (the recipe's dist.timeout_s) bounds every wait on other ranks
// from the start: MPI initialisation (a rank that does not complete it within
// timeout_s ends the job with a message), the communicator's collectives,
// and MPI_Finalize. With `exit_guard` (the fdtrain binary; not for a library
// inside someone else's process), an MPI rank forks a small guard process
// before MPI_Init that SIGKILLs the rank if it is stopped for timeout_s once
// it has reached finalize(), when no peer is left to notice (init.cc).
std::unique_ptr<Communicator> init(int* argc, char*** argv, double timeout_s = 600.0,
                                   bool exit_guard = false);
// MPI_Finalize if MPI was initialised (and not yet finalised); else nothing.
void finalize();

// This process's rank as an MPI launcher announces it in the environment
// (OMPI_COMM_WORLD_RANK, PMIX_RANK), known before init(); -1 when no launcher
// says.
int launcher_rank();

}  // namespace fd::dist
