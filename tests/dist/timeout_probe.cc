// timeout_probe: demonstrates that a stalled peer ends the job instead of
// hanging it. Run with two ranks:
//
//   mpirun -n 2 timeout_probe [barrier|send_recv|split] [timeout_s=2] [stall_s=10]
//
// barrier (the default): rank 1 sleeps stall_s before joining a barrier;
// rank 0 waits in the barrier with the communicator's timeout set to
// timeout_s. Expected: the job ends non-zero after about timeout_s seconds
// with the diagnostic
//   "fdtrain: rank 0 (host H): barrier #1 did not complete within 2 s ...".
// send_recv: the timeout is set on the world communicator, which is then split
// (one color: the sub-communicator must inherit the timeout, and its abort must
// end the job); rank 0 sends 4 MiB (beyond MPI's eager limit, so the send
// cannot complete without the receive) to rank 1, which sleeps stall_s before
// posting the matching receive. Expected: the job ends non-zero after about
// timeout_s with "send_recv #1 (rank 0 of 2 on split(...): send 4.0 MiB ... to
// rank 1 (world rank 1), receive nothing) did not complete within ...".
// split: rank 1 sleeps stall_s before calling split(); expected "split #1
// (color 0, key 0) did not complete within ...".
// Exit 0 (and "probe: no timeout") means the timeout did not fire: a bug.
// tests/dist/timeout_probe_test.cc runs the send_recv and split modes.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "lib/dist/init.h"

int main(int argc, char** argv) {
  auto comm = fd::dist::init(&argc, &argv);
  int arg = 1;
  std::string mode = "barrier";
  if (argc > arg &&
      (std::strcmp(argv[arg], "send_recv") == 0 || std::strcmp(argv[arg], "split") == 0 ||
       std::strcmp(argv[arg], "barrier") == 0)) {
    mode = argv[arg++];
  }
  const double timeout_s = argc > arg ? std::atof(argv[arg]) : 2.0;
  const double stall_s = argc > arg + 1 ? std::atof(argv[arg + 1]) : 10.0;
  comm->set_timeout(timeout_s);
  if (comm->size() < 2) {
    std::fprintf(stderr, "probe: needs at least two ranks (run under mpirun -n 2)\n");
    return 2;
  }
  const int rank = comm->rank();
  if (mode == "split") {
    if (rank == 1) std::this_thread::sleep_for(std::chrono::duration<double>(stall_s));
    comm->split(fd::dist::SplitPlan::whole(comm->size())).reset();
  } else if (mode == "send_recv") {
    auto sub = comm->split(fd::dist::SplitPlan::whole(comm->size()));
    std::vector<float> buf(size_t(1) << 20, float(rank));
    if (rank == 0) {
      sub->send(buf.data(), int64_t(buf.size()), 1, fd::DType::kF32);
    } else if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::duration<double>(stall_s));
      sub->recv(buf.data(), int64_t(buf.size()), 0, fd::DType::kF32);
    }
    sub.reset();
  } else {
    if (rank == 1) std::this_thread::sleep_for(std::chrono::duration<double>(stall_s));
    comm->barrier();
  }
  std::fprintf(stderr, "probe: rank %d: no timeout\n", rank);
  comm.reset();
  fd::dist::finalize();
  return 0;
}
