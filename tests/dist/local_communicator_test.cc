// The local backend (world of one) and the ring-model byte formula.
#include "lib/dist/local_communicator.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <tuple>
#include <vector>

#include "lib/dist/init.h"
#include "lib/tensor/memory.h"

namespace fd::dist {
namespace {

TEST(RingBytes, FormulaTimesN) {
  // S = 1000 bytes, n = 4: all-reduce 2*3/4*S = 1500, others 3/4*S = 750 (times n).
  EXPECT_EQ(ring_bytes_times_n(Collective::kAllReduce, 1000, 4), 4 * 1500);
  EXPECT_EQ(ring_bytes_times_n(Collective::kReduceScatter, 1000, 4), 4 * 750);
  EXPECT_EQ(ring_bytes_times_n(Collective::kAllGather, 1000, 4), 4 * 750);
  EXPECT_EQ(ring_bytes_times_n(Collective::kBroadcast, 1000, 4), 4 * 750);
  EXPECT_EQ(ring_bytes_times_n(Collective::kBarrier, 1000, 4), 0);
  for (auto c : {Collective::kAllReduce, Collective::kReduceScatter, Collective::kAllGather,
                 Collective::kBroadcast, Collective::kBarrier}) {
    EXPECT_EQ(ring_bytes_times_n(c, 12345, 1), 0) << collective_name(c);
  }
  // Point-to-point is exact, no model: what this rank sends, times n.
  EXPECT_EQ(ring_bytes_times_n(Collective::kSendRecv, 1001, 4), 4 * 1001);
  EXPECT_EQ(ring_bytes_times_n(Collective::kSendRecv, 1001, 1), 1001);
  EXPECT_EQ(collective_name(Collective::kSendRecv), "send_recv");
  // All-to-all: every block but this rank's own leaves it, 3/4 of the send buffer.
  EXPECT_EQ(ring_bytes_times_n(Collective::kAllToAll, 1000, 4), 4 * 750);
  EXPECT_EQ(ring_bytes_times_n(Collective::kAllToAll, 12345, 1), 0);
  EXPECT_EQ(collective_name(Collective::kAllToAll), "all_to_all");
  // Large buffers stay exact in int64: 2*(8-1)*10 GiB.
  EXPECT_EQ(ring_bytes_times_n(Collective::kAllReduce, int64_t(10) << 30, 8),
            int64_t(14) * (int64_t(10) << 30));
}

TEST(LocalCommunicator, Identity) {
  LocalCommunicator c;
  EXPECT_EQ(c.rank(), 0);
  EXPECT_EQ(c.size(), 1);
  EXPECT_EQ(c.backend(), "local");
}

TEST(LocalCommunicator, AllReduceLeavesBufferForEveryDtypeAndOp) {
  LocalCommunicator c;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      std::vector<uint8_t> buf(7 * dtype_size(t));
      for (size_t i = 0; i < buf.size(); ++i) buf[i] = uint8_t(i * 37 + 1);
      auto before = buf;
      WorkPtr w = c.all_reduce_async(buf.data(), 7, t, op);
      EXPECT_TRUE(w->is_completed());
      w->wait();
      EXPECT_EQ(buf, before) << dtype_name(t);
      c.all_reduce(buf.data(), 7, t, op);
      EXPECT_EQ(buf, before) << dtype_name(t);
    }
  }
}

TEST(LocalCommunicator, ReduceScatterAndAllGatherCopy) {
  LocalCommunicator c;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32}) {
    const size_t n = 1000 * dtype_size(t);
    std::vector<uint8_t> send(n), recv(n, 0);
    for (size_t i = 0; i < n; ++i) send[i] = uint8_t(i * 13 + 5);
    c.reduce_scatter(send.data(), recv.data(), 1000, t);
    EXPECT_EQ(recv, send) << dtype_name(t);
    std::fill(recv.begin(), recv.end(), 0);
    c.all_gather(send.data(), recv.data(), 1000, t);
    EXPECT_EQ(recv, send) << dtype_name(t);
    // In place: send == recv + rank()*count.
    c.all_gather(recv.data(), recv.data(), 1000, t);
    EXPECT_EQ(recv, send) << dtype_name(t);
  }
}

// A GPU run at world 1 copies with the device's copy (make_gpu_communicator):
// every out-of-place copy goes through it, with the right pointers and bytes,
// in-place ones do not, a split keeps it, and overlapping buffers are refused.
struct CopyLog {
  static inline std::vector<std::tuple<void*, const void*, size_t>> calls;
  static void copy(void* dst, const void* src, size_t bytes) {
    calls.emplace_back(dst, src, bytes);
    std::memcpy(dst, src, bytes);
  }
};

TEST(LocalCommunicator, CopiesThroughTheGivenCopy) {
  CopyLog::calls.clear();
  LocalCommunicator c(&CopyLog::copy);
  std::vector<uint16_t> a(8, 7), b(8, 0);
  c.reduce_scatter(a.data(), b.data(), 8, DType::kBF16);
  c.all_gather(a.data(), b.data(), 3, DType::kF16);
  c.reduce_scatter(a.data(), a.data(), 8, DType::kBF16);  // in place: nothing to copy
  std::unique_ptr<Communicator> sub = c.split(SplitPlan::whole(1));
  sub->all_gather(b.data(), a.data(), 2, DType::kBF16);
  ASSERT_EQ(CopyLog::calls.size(), 3u);
  EXPECT_EQ(CopyLog::calls[0], std::make_tuple(static_cast<void*>(b.data()),
                                               static_cast<const void*>(a.data()), size_t(16)));
  EXPECT_EQ(std::get<2>(CopyLog::calls[1]), size_t(6));
  EXPECT_EQ(std::get<0>(CopyLog::calls[2]), static_cast<void*>(a.data()));
  EXPECT_EQ(b, std::vector<uint16_t>(8, 7));
}

// A world of one: the all-to-all's one block is copied, send to recv, through the given copy
// when there is one; null buffers (meta) and empty blocks copy nothing; 0 bytes counted.
TEST(LocalCommunicator, AllToAllCopiesTheOneBlock) {
  LocalCommunicator c;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32}) {
    const size_t n = 37 * dtype_size(t);
    std::vector<uint8_t> send(n), recv(n, 0);
    for (size_t i = 0; i < n; ++i) send[i] = uint8_t(i * 29 + 3);
    WorkPtr w = c.all_to_all_async(send.data(), recv.data(), 37, t);
    EXPECT_TRUE(w->is_completed());
    w->wait();
    EXPECT_EQ(recv, send) << dtype_name(t);
  }
  c.all_to_all(nullptr, nullptr, 10, DType::kF32);
  c.all_to_all(nullptr, nullptr, 0, DType::kBF16);
  EXPECT_EQ(c.bytes_sent(), 0);
  CopyLog::calls.clear();
  LocalCommunicator device(&CopyLog::copy);
  std::vector<uint16_t> a(6, 9), b(6, 0);
  device.all_to_all(a.data(), b.data(), 6, DType::kBF16);
  ASSERT_EQ(CopyLog::calls.size(), 1u);
  EXPECT_EQ(CopyLog::calls[0], std::make_tuple(static_cast<void*>(b.data()),
                                               static_cast<const void*>(a.data()), size_t(12)));
  EXPECT_EQ(b, a);
}

TEST(LocalCommunicatorDeathTest, AllToAllRefusesOverlapAndNegativeCounts) {
  LocalCommunicator c;
  std::vector<float> buf(8);
  EXPECT_DEATH(c.all_to_all(buf.data(), buf.data() + 2, 4, DType::kF32), "overlap");
  EXPECT_DEATH(c.all_to_all(buf.data(), buf.data(), 4, DType::kF32), "overlap");
  EXPECT_DEATH(c.all_to_all(nullptr, nullptr, -1, DType::kF32), "negative count");
}

TEST(LocalCommunicatorDeathTest, DeviceCopyOfOverlappingBuffersIsRefused) {
  LocalCommunicator c(&CopyLog::copy);
  std::vector<uint16_t> a(8, 7);
  EXPECT_DEATH(c.reduce_scatter(a.data(), a.data() + 1, 4, DType::kBF16), "overlapping buffers");
}

TEST(LocalCommunicator, BroadcastBarrierAndZeroCounts) {
  LocalCommunicator c;
  std::vector<float> v = {1, 2, 3};
  c.broadcast(v.data(), 3, DType::kF32, 0);
  EXPECT_EQ(v, (std::vector<float>{1, 2, 3}));
  c.barrier();
  EXPECT_TRUE(c.barrier_async()->is_completed());
  c.all_reduce(nullptr, 0, DType::kF32);
  c.all_gather(nullptr, nullptr, 0, DType::kBF16);
  c.reduce_scatter(nullptr, nullptr, 0, DType::kF16);
}

TEST(LocalCommunicator, F64HelpersAndCountersAreZero) {
  LocalCommunicator c;
  c.set_timeout(5);
  std::vector<double> v = {1.5, -2.25, 1e300};
  c.all_reduce_f64(v.data(), 3);
  EXPECT_EQ(v, (std::vector<double>{1.5, -2.25, 1e300}));
  c.all_reduce_f64(v.data(), 3, ReduceOp::kMax);
  EXPECT_EQ(v, (std::vector<double>{1.5, -2.25, 1e300}));
  std::vector<double> out(3);
  c.all_gather_f64(v.data(), out.data(), 3);
  EXPECT_EQ(out, v);
  std::vector<float> f(1000);
  c.all_reduce(f.data(), 1000, DType::kF32);
  c.all_gather(f.data(), f.data(), 1000, DType::kF32);
  EXPECT_EQ(c.bytes_sent(), 0);
  EXPECT_EQ(c.control_bytes(), 0);
  EXPECT_EQ(c.wait_seconds(), 0.0);
  c.reset_counters();
  EXPECT_EQ(c.bytes_sent(), 0);
}

TEST(LocalCommunicatorDeathTest, AbortExitsWithCodeAndMessage) {
  LocalCommunicator c;
  EXPECT_EXIT(c.abort(3, "stopping on purpose"), ::testing::ExitedWithCode(3),
              "rank 0 \\(host .*\\): stopping on purpose");
}

TEST(LocalCommunicator, EmptySendRecvCompletesAndSplitIsAWorldOfOne) {
  LocalCommunicator c;
  WorkPtr w = c.send_recv_async(nullptr, 0, -1, nullptr, 0, -1, DType::kF32);
  EXPECT_TRUE(w->is_completed());
  w->wait();
  float x = 1;
  c.send_recv(&x, 0, 0, &x, 0, 0, DType::kF32);  // rank 0 named, nothing to move
  c.send(&x, 0, 0, DType::kBF16);
  c.recv(&x, 0, -1, DType::kBF16);
  EXPECT_EQ(c.bytes_sent(), 0);
  std::unique_ptr<Communicator> sub = c.split(SplitPlan({{3, 7}}));
  ASSERT_NE(sub, nullptr);
  EXPECT_EQ(sub->backend(), "local");
  EXPECT_EQ(sub->size(), 1);
  EXPECT_EQ(sub->rank(), 0);
  sub->all_reduce(&x, 1, DType::kF32);
  EXPECT_EQ(x, 1.0f);
}

TEST(LocalCommunicatorDeathTest, NonEmptySendRecvHasNoPeer) {
  LocalCommunicator c;
  float x[4] = {};
  EXPECT_DEATH(c.send(x, 4, 0, DType::kF32), "rank 0 of 1 sends 4 elements to itself");
  EXPECT_DEATH(c.recv(x, 1, 0, DType::kF32), "receives 1 elements from itself");
  EXPECT_DEATH(c.send(x, 1, 1, DType::kF32), "dst rank 1 outside \\[0, 1\\)");
  EXPECT_DEATH(c.split(SplitPlan({{-1, 0}})), "color -1");
}

TEST(Init, LocalWithoutLauncher) {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "FDTRAIN_FORCE_MPI"}) {
    if (std::getenv(v) != nullptr) GTEST_SKIP() << v << " is set";
  }
  int argc = 0;
  char** argv = nullptr;
  auto comm = init(&argc, &argv);
  EXPECT_EQ(comm->backend(), "local");
  EXPECT_EQ(comm->size(), 1);
  comm.reset();
  finalize();  // no MPI: nothing to do
}

}  // namespace
}  // namespace fd::dist
