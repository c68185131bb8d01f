#include "lib/dist/init.h"

#include <mpi.h>

#include <cstdlib>
#include <string>

#include "lib/base/check.h"
#include "lib/base/error.h"
#include "lib/dist/local_communicator.h"
#include "lib/dist/mpi_communicator.h"

namespace fd::dist {
namespace {

bool g_initialised = false;

// Which MPI world the environment announces: > 1 means "use mpi".
bool launched_with_mpi_world() {
  const char* force = std::getenv("FDTRAIN_FORCE_MPI");
  if (force != nullptr && std::string(force) == "1") return true;
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    if (const char* v = std::getenv(var)) return std::atoi(v) > 1;
  }
  return std::getenv("PMIX_RANK") != nullptr;
}

std::string thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return std::to_string(level);
}

}  // namespace

std::unique_ptr<Communicator> init(int* argc, char*** argv) {
  FD_CHECK(!g_initialised, "dist::init() called twice");
  g_initialised = true;
  if (!launched_with_mpi_world()) return std::make_unique<LocalCommunicator>();

  int provided = MPI_THREAD_SINGLE;
  if (int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided); rc != MPI_SUCCESS) {
    runtime_error("MPI_Init_thread failed (code {}); check the MPI installation and launcher", rc);
  }
  if (provided < MPI_THREAD_MULTIPLE) {
    MPI_Finalize();
    runtime_error(
        "the MPI library provides only {}, but fdtrain's communication thread needs "
        "MPI_THREAD_MULTIPLE; use an MPI built with thread support (Open MPI >= 3 is)",
        thread_level_name(provided));
  }
  FD_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  return std::make_unique<MpiCommunicator>();
}

void finalize() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin) return;
  detail::shutdown_live_communicators();
  MPI_Finalize();
}

}  // namespace fd::dist
