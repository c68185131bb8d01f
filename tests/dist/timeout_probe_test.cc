// A send_recv whose peer never posts the matching receive, and a split that a
// peer never joins, end the job: runs tests/dist/timeout_probe.cc (its
// send_recv and split modes) under `mpirun -n 2` with a 1 s timeout while the
// peer stalls for 30 s. This cannot run inside a gtest binary (the abort ends
// the job), so the probe is a program of its own (target timeout_probe, built
// by a plain `make`; the tests skip, saying so, when it is not built).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <string>

namespace {

struct Job {
  int exit_code = -1;
  double seconds = 0;
  std::string output;  // stdout and stderr
};

// Runs the probe under `mpirun -n 2` in `mode` with a 1 s timeout while rank 1
// stalls for 30 s (`timeout 60` is the backstop should ours not fire).
Job run_probe(const std::string& probe, const std::string& mode) {
  const std::string cmd =
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 60 mpirun "
      "--oversubscribe --bind-to none -n 2 " +
      probe + " " + mode + " 1 30 2>&1";
  Job job;
  const auto t0 = std::chrono::steady_clock::now();
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return job;
  char chunk[4096];
  for (size_t n; (n = std::fread(chunk, 1, sizeof chunk, p)) > 0;) job.output.append(chunk, n);
  const int status = ::pclose(p);
  job.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  job.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return job;
}

class CommTimeoutProbe : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr) GTEST_SKIP() << "already inside mpirun";
    probe_ = std::string(FD_BINARY_DIR) + "/tests/timeout_probe";
    if (::access(probe_.c_str(), X_OK) != 0)
      GTEST_SKIP() << probe_ << " is not built (make timeout_probe)";
  }
  // The job ended non-zero, well before the stalled rank's 30 s, with every
  // one of `want` in its output.
  void expect_timed_out(const Job& job, std::initializer_list<const char*> want) {
    EXPECT_NE(job.exit_code, 0) << job.output;
    EXPECT_EQ(job.output.find("probe: rank 0: no timeout"), std::string::npos) << job.output;
    // 1 s of timeout plus MPI start-up and abort on a loaded machine.
    EXPECT_LT(job.seconds, 15.0) << job.output;
    for (const char* w : want)
      EXPECT_NE(job.output.find(w), std::string::npos) << "missing '" << w << "' in:\n"
                                                       << job.output;
  }
  std::string probe_;
};

// Rank 0 sends 4 MiB on a sub-communicator (made by split, so the timeout is
// inherited and the sub-communicator's abort must end the job); rank 1 does
// not post the receive.
TEST_F(CommTimeoutProbe, SendRecvWithoutItsReceiveEndsTheJobNamingOpAndPeer) {
  expect_timed_out(
      run_probe(probe_, "send_recv"),
      {"fdtrain: rank 0 (host ", "send_recv #1 (rank 0 of 2 on split(color 0, key 0)",
       "send 4.0 MiB (1048576 f32) to rank 1 (world rank 1), receive nothing",
       "did not complete within 1 s (waited 1.", "has not posted the matching send_recv"});
}

// Rank 1 does not join split(): the split times out like a collective.
TEST_F(CommTimeoutProbe, SplitWithoutAPeerEndsTheJob) {
  expect_timed_out(run_probe(probe_, "split"),
                   {"fdtrain: rank 0 (host ",
                    "split #1 (color 0, key 0) did not complete within 1 s (waited 1."});
}

}  // namespace
