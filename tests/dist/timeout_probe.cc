// timeout_probe: demonstrates that a stalled peer ends the job instead of
// hanging it. Run with two ranks:
//
//   mpirun -n 2 timeout_probe [timeout_s=2] [stall_s=10]
//
// Rank 1 sleeps stall_s before joining a barrier; rank 0 waits in the barrier
// with the communicator's timeout set to timeout_s. Expected: the job ends
// non-zero after about timeout_s seconds with the diagnostic
//   "fdtrain: rank 0 (host H): barrier #1 did not complete within 2 s ...".
// Exit 0 (and "probe: no timeout") means the timeout did not fire: a bug.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "lib/dist/init.h"

int main(int argc, char** argv) {
  auto comm = fd::dist::init(&argc, &argv);
  const double timeout_s = argc > 1 ? std::atof(argv[1]) : 2.0;
  const double stall_s = argc > 2 ? std::atof(argv[2]) : 10.0;
  comm->set_timeout(timeout_s);
  if (comm->size() < 2) {
    std::fprintf(stderr, "probe: needs at least two ranks (run under mpirun -n 2)\n");
    return 2;
  }
  if (comm->rank() == 1) std::this_thread::sleep_for(std::chrono::duration<double>(stall_s));
  comm->barrier();
  std::fprintf(stderr, "probe: rank %d: no timeout\n", comm->rank());
  comm.reset();
  fd::dist::finalize();
  return 0;
}
