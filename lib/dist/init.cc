#include "lib/dist/init.h"

#include <mpi.h>

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include "lib/base/check.h"
#include "lib/base/error.h"
#include "lib/dist/local_communicator.h"
#include "lib/dist/mpi_communicator.h"

namespace fd::dist {
namespace {

bool g_initialised = false;
double g_timeout_s = 600.0;  // init()'s timeout, for finalize() too

// MPI_Init and MPI_Finalize wait for every rank (PMIx fences) and have no
// timeout of their own: with a rank stopped or wedged there, its peers would
// wait forever. A Watchdog ends this process if `what` takes longer than
// `seconds`; mpirun then sees a rank exit and ends the whole job.
class Watchdog {
 public:
  Watchdog(double seconds, const char* what) {
    thread_ = std::thread([this, seconds, what] {
      std::unique_lock<std::mutex> lock(mu_);
      if (cv_.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return done_; }))
        return;
      const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
      if (rank == nullptr) rank = std::getenv("PMIX_RANK");
      std::fprintf(stderr,
                   "fdtrain: rank %s (pid %d): %s did not complete within %g s (dist.timeout_s): "
                   "another rank is stopped, dead or unreachable; ending the job\n",
                   rank ? rank : "?", int(::getpid()), what, seconds);
      std::fflush(stderr);
      std::_Exit(1);
    });
  }
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

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

std::unique_ptr<Communicator> init(int* argc, char*** argv, double timeout_s) {
  FD_CHECK(!g_initialised, "dist::init() called twice");
  FD_CHECK(timeout_s > 0, "timeout {}", timeout_s);
  g_initialised = true;
  g_timeout_s = timeout_s;
  if (!launched_with_mpi_world()) return std::make_unique<LocalCommunicator>();

  int provided = MPI_THREAD_SINGLE;
  int rc = MPI_SUCCESS;
  {
    Watchdog watchdog(timeout_s, "MPI initialisation");
    rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  }
  if (rc != MPI_SUCCESS) {
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
  auto comm = std::make_unique<MpiCommunicator>();
  comm->set_timeout(timeout_s);  // from the first collective on
  return comm;
}

void finalize() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin) return;
  detail::shutdown_live_communicators();
  Watchdog watchdog(g_timeout_s, "MPI_Finalize");
  MPI_Finalize();
}

}  // namespace fd::dist
