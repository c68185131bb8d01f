// The main() of every multi-rank gtest binary (tests/mpi/*_test.cc), run by
// ctest under `mpirun -n 2` and `-n 4`. Only rank 0 prints gtest's usual
// output; other ranks print their failures prefixed with [rank r]. The exit
// code is agreed by all ranks, so a failure on any rank fails the test.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>

#include "lib/dist/init.h"

namespace fd::dist::testing {

class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.message());
  }

 private:
  int rank_;
};

// Initialises the communicator (stored in *comm_out for the tests), runs every
// test, and returns the exit code agreed by all ranks.
inline int run_mpi_tests(int argc, char** argv, Communicator** comm_out) {
  auto comm = init(&argc, &argv);
  *comm_out = comm.get();
  comm->set_timeout(120);  // a mismatched collective ends the job instead of hanging ctest
  ::testing::InitGoogleTest(&argc, argv);
  if (comm->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(comm->rank()));
  }
  const int32_t mine = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int32_t failed = mine;
  comm->all_reduce(&failed, 1, DType::kI32, ReduceOp::kMax);
  if (comm->rank() == 0 && failed && !mine)
    std::fprintf(stderr, "FAILED on another rank (see the [rank r] lines above)\n");
  *comm_out = nullptr;
  comm.reset();
  finalize();
  return failed;
}

}  // namespace fd::dist::testing
