// CountingCommunicator: the ring-model bytes of each collective (exact
// integers, as the MPI backend counts them), the MPI comm thread's staging
// counted in and out of MemCategory::kComm at n > 1 only, and no buffer read.
#include "lib/dist/counting_communicator.h"

#include <gtest/gtest.h>

#include <vector>

#include "lib/tensor/memory.h"

namespace fd::dist {
namespace {

TEST(CountingCommunicator, CountsRingBytesLikeTheRealBackends) {
  for (int n : {1, 2, 4, 8}) {
    CountingCommunicator c(n - 1, n);
    EXPECT_EQ(c.rank(), n - 1);
    EXPECT_EQ(c.size(), n);
    // 1000 fp32 per rank reduce-scattered: (n-1)/n of n*4000 bytes = (n-1)*4000.
    c.reduce_scatter_async(nullptr, nullptr, 1000, DType::kF32)->wait();
    EXPECT_EQ(c.bytes_sent(), int64_t(n - 1) * 4000) << "n " << n;
    c.reset_counters();
    c.all_gather_async(nullptr, nullptr, 1000, DType::kBF16)->wait();
    EXPECT_EQ(c.bytes_sent(), int64_t(n - 1) * 2000) << "n " << n;
    c.reset_counters();
    c.all_reduce_async(nullptr, 1000, DType::kF32, ReduceOp::kSum)->wait();
    EXPECT_EQ(c.bytes_sent(), 2 * int64_t(n - 1) * 4000 / n) << "n " << n;
    c.reset_counters();
    // The f64 helpers count as control traffic and give every rank this rank's values.
    double mine[2] = {1.5, -2.0};
    std::vector<double> all(size_t(2 * n));
    c.all_gather_f64(mine, all.data(), 2);
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(all[size_t(2 * r)], 1.5);
      EXPECT_EQ(all[size_t(2 * r + 1)], -2.0);
    }
    EXPECT_EQ(c.bytes_sent(), 0);
    EXPECT_EQ(c.control_bytes(), int64_t(n - 1) * 16);
  }
}

// At n = 4, a bf16 reduce-scatter of 100 elements per rank stages an fp32
// input (4 x 400) and output (4 x 100): 2000 bytes at its launch, gone after.
TEST(CountingCommunicator, StagesSixteenBitReductionsAtLaunchLikeTheMpiCommThread) {
  MemoryAccountant& acct = MemoryAccountant::global();
  auto staged = [&](int n, auto&& launch) {
    CountingCommunicator c(0, n);
    const int64_t before = acct.current(MemCategory::kComm);
    acct.reset_peaks();
    launch(c);
    EXPECT_EQ(acct.current(MemCategory::kComm), before);
    return acct.peak(MemCategory::kComm) - before;
  };
  EXPECT_EQ(staged(4, [](Communicator& c) { c.reduce_scatter(nullptr, nullptr, 100, DType::kBF16); }),
            4 * 400 + 4 * 100);
  EXPECT_EQ(staged(4, [](Communicator& c) { c.all_reduce(nullptr, 100, DType::kF16); }), 400);
  EXPECT_EQ(staged(4, [](Communicator& c) { c.reduce_scatter(nullptr, nullptr, 100, DType::kF32); }),
            0);
  // fp32 in place (the output inside the input): the output is staged.
  std::vector<float> buf(400);
  EXPECT_EQ(staged(4, [&](Communicator& c) {
              c.reduce_scatter(buf.data(), buf.data() + 100, 100, DType::kF32);
            }),
            400);
  // One rank: the LocalCommunicator a one-rank run uses stages nothing.
  EXPECT_EQ(staged(1, [](Communicator& c) { c.reduce_scatter(nullptr, nullptr, 100, DType::kBF16); }),
            0);
}

}  // namespace
}  // namespace fd::dist
