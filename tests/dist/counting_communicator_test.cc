// CountingCommunicator counts what MpiCommunicator counts (ring-model bytes,
// 16-bit fp32 staging) and moves nothing.
#include "lib/dist/counting_communicator.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lib/dist/mesh.h"
#include "lib/tensor/memory.h"

namespace fd::dist {
namespace {

int64_t comm_current() { return MemoryAccountant::global().current(MemCategory::kComm); }
int64_t comm_peak() { return MemoryAccountant::global().peak(MemCategory::kComm); }

TEST(CountingCommunicator, BytesFollowTheRingModel) {
  CountingCommunicator c(1, 4);
  EXPECT_EQ(c.rank(), 1);
  EXPECT_EQ(c.size(), 4);
  EXPECT_EQ(c.backend(), "counting");
  // Reduce-scatter of 1000 bf16 per rank: S = 4 * 1000 * 2 bytes; a rank sends 3/4 S.
  c.reduce_scatter_async(nullptr, nullptr, 1000, DType::kBF16)->wait();
  EXPECT_EQ(c.bytes_sent(), 6000);
  c.all_gather(nullptr, nullptr, 1000, DType::kF32);  // S = 16000: 12000
  EXPECT_EQ(c.bytes_sent(), 18000);
  c.all_reduce(nullptr, 10, DType::kF32);  // 2 * 3/4 * 40 = 60
  EXPECT_EQ(c.bytes_sent(), 18060);
  c.broadcast(nullptr, 10, DType::kF16, 0);  // 3/4 * 20 = 15
  c.barrier();
  EXPECT_EQ(c.bytes_sent(), 18075);
  EXPECT_EQ(c.control_bytes(), 0);
  // Exact accumulation: three ops of 1 byte * 3/4 each add up to 2 (9/4), not 0.
  c.reset_counters();
  for (int i = 0; i < 3; ++i) c.broadcast(nullptr, 1, DType::kF32, 0);  // 3 bytes each
  EXPECT_EQ(c.bytes_sent(), 9);
}

TEST(CountingCommunicator, SixteenBitSumsAccountMpisFp32Staging) {
  MemoryAccountant& acct = MemoryAccountant::global();
  const int64_t base = comm_current();
  CountingCommunicator c(3, 4);
  acct.reset_peaks();
  c.reduce_scatter(nullptr, nullptr, 100, DType::kBF16);
  EXPECT_EQ(comm_peak() - base, (4 * 100 + 100) * 4);  // in and out together, fp32
  EXPECT_EQ(comm_current(), base);                     // and freed
  acct.reset_peaks();
  c.all_reduce(nullptr, 50, DType::kF16);
  EXPECT_EQ(comm_peak() - base, 50 * 4);
  acct.reset_peaks();
  c.reduce_scatter(nullptr, nullptr, 100, DType::kF32);  // fp32: no staging
  c.all_gather(nullptr, nullptr, 100, DType::kBF16);     // gathers never stage
  EXPECT_EQ(comm_peak(), base);
  // A world of one is the local backend: no staging.
  CountingCommunicator one(0, 1);
  one.reduce_scatter(nullptr, nullptr, 100, DType::kBF16);
  EXPECT_EQ(comm_peak(), base);
  EXPECT_EQ(one.bytes_sent(), 0);
}

// zero.reduce_dtype bf16/fp16 (Sum16::kNative): MPI stages every rank's
// 16-bit chunk (2 * n * count bytes) instead of fp32 copies; the kept staging
// is of that kind, and the bytes counted are the same in either mode.
TEST(CountingCommunicator, NativeSixteenBitSumsAccountMpisSixteenBitStaging) {
  EXPECT_EQ(sum16_staging_bytes(Collective::kReduceScatter, 100, 4, Sum16::kFp32), 5 * 100 * 4);
  EXPECT_EQ(sum16_staging_bytes(Collective::kReduceScatter, 100, 4, Sum16::kNative), 4 * 100 * 2);
  EXPECT_EQ(sum16_staging_bytes(Collective::kAllReduce, 50, 4, Sum16::kNative), 4 * 50 * 2);
  EXPECT_EQ(sum16_staging_bytes(Collective::kAllGather, 50, 4, Sum16::kNative), 0);
  EXPECT_EQ(sum16_staging_bytes(Collective::kReduceScatter, 100, 1, Sum16::kNative), 0);
  MemoryAccountant& acct = MemoryAccountant::global();
  const int64_t base = comm_current();
  CountingCommunicator c(3, 4);
  c.set_sum16(Sum16::kNative);
  acct.reset_peaks();
  c.reduce_scatter(nullptr, nullptr, 100, DType::kBF16);
  EXPECT_EQ(comm_peak() - base, 4 * 100 * 2);
  EXPECT_EQ(comm_current(), base);
  EXPECT_EQ(c.bytes_sent(), 3 * 100 * 2);  // the ring model at 2 bytes, as in fp32 mode
  acct.reset_peaks();
  c.all_reduce(nullptr, 50, DType::kF16);
  EXPECT_EQ(comm_peak() - base, 4 * 50 * 2);
  // Kept: held from now on, and sums up to that size stage nothing more.
  c.keep_staging(Collective::kReduceScatter, 100, DType::kBF16);
  EXPECT_EQ(comm_current() - base, 4 * 100 * 2);
  acct.reset_peaks();
  c.reduce_scatter(nullptr, nullptr, 100, DType::kBF16);
  c.reduce_scatter(nullptr, nullptr, 60, DType::kF16);
  EXPECT_EQ(comm_peak() - base, 4 * 100 * 2);
  c.reduce_scatter(nullptr, nullptr, 101, DType::kBF16);  // does not fit: its own
  EXPECT_EQ(comm_peak() - base, 4 * 100 * 2 + 4 * 101 * 2);
}

TEST(CountingCommunicator, MovesNothingButTheF64HelpersSeeEveryRankAlike) {
  CountingCommunicator c(2, 3);
  std::vector<float> buf = {1, 2, 3}, out = {7, 7, 7, 7, 7, 7, 7, 7, 7};
  c.all_gather(buf.data(), out.data(), 3, DType::kF32);
  EXPECT_EQ(out, std::vector<float>(9, 7.0f));
  c.all_reduce(buf.data(), 3, DType::kF32);
  EXPECT_EQ(buf, (std::vector<float>{1, 2, 3}));
  const double mine[2] = {1.5, -2.0};
  double all[6] = {};
  c.all_gather_f64(mine, all, 2);
  EXPECT_EQ(std::vector<double>(all, all + 6), (std::vector<double>{1.5, -2, 1.5, -2, 1.5, -2}));
  double sum[1] = {0.25};
  c.all_reduce_f64(sum, 1);
  EXPECT_EQ(sum[0], 0.75);
  // The gather: 2/3 of 36 bytes; the all-reduce: 2 * 2/3 of 12.
  EXPECT_EQ(c.bytes_sent(), 24 + 16);
  // The f64 helpers, as control traffic: 2/3 of 48 bytes, then 2/3 of 24.
  EXPECT_EQ(c.control_bytes(), 32 + 16);
}

TEST(CountingCommunicator, SendRecvCountsTheBytesSentExactly) {
  CountingCommunicator c(1, 4);
  // 7 bf16 to rank 2, 1000 from rank 0: only the 14 bytes sent count, exactly.
  WorkPtr w = c.send_recv_async(nullptr, 7, 2, nullptr, 1000, 0, DType::kBF16);
  EXPECT_TRUE(w->is_completed());
  EXPECT_EQ(c.bytes_sent(), 14);
  c.recv(nullptr, 50, 3, DType::kF32);
  EXPECT_EQ(c.bytes_sent(), 14);
  c.send(nullptr, 3, 0, DType::kI32);
  EXPECT_EQ(c.bytes_sent(), 26);
  c.send_recv(nullptr, 0, -1, nullptr, 0, -1, DType::kF32);
  EXPECT_EQ(c.bytes_sent(), 26);
  EXPECT_EQ(c.control_bytes(), 0);
  // Buffers are left alone.
  std::vector<float> buf = {1, 2}, out = {5, 5};
  c.send_recv(buf.data(), 2, 0, out.data(), 2, 2, DType::kF32);
  EXPECT_EQ(out, (std::vector<float>{5, 5}));
}

// All-to-all: (n-1)/n of the send buffer (size() * count_per_rank elements), in any dtype,
// nothing staged (16-bit blocks move as raw bits on MPI), nothing moved; a split counts its
// own group's size.
TEST(CountingCommunicator, AllToAllCountsItsShareAndStagesNothing) {
  const int64_t base = comm_current();
  CountingCommunicator c(1, 4);
  c.all_to_all_async(nullptr, nullptr, 1000, DType::kBF16)->wait();  // S = 8000: 6000
  EXPECT_EQ(c.bytes_sent(), 6000);
  c.all_to_all(nullptr, nullptr, 5, DType::kF32);  // S = 80: 60
  EXPECT_EQ(c.bytes_sent(), 6060);
  c.all_to_all(nullptr, nullptr, 0, DType::kF16);
  EXPECT_EQ(c.bytes_sent(), 6060);
  EXPECT_EQ(comm_current(), base);
  EXPECT_EQ(c.control_bytes(), 0);
  std::vector<float> send = {1, 2, 3, 4}, recv = {7, 7, 7, 7};
  c.all_to_all(send.data(), recv.data(), 1, DType::kF32);
  EXPECT_EQ(recv, std::vector<float>(4, 7.0f));
  // Rank 1 of {dp: 2, sp: 2}'s sp group: 2 ranks, 1/2 of S = 2 * 100 * 2.
  std::unique_ptr<Communicator> sp = c.split(SplitPlan::by(4, [](int r) {
    return SplitKey{r / 2, r % 2};
  }));
  ASSERT_EQ(sp->size(), 2);
  sp->all_to_all(nullptr, nullptr, 100, DType::kBF16);
  EXPECT_EQ(sp->bytes_sent(), 200);
}

TEST(CountingCommunicator, SplitGivesThisRanksGroup) {
  CountingCommunicator c(3, 4);
  // Rank 3 of a 2 x 2 grid: replica 1 of stage 1.
  auto dp = c.split(SplitPlan::by(4, [](int r) { return SplitKey{r / 2, r % 2}; }));
  EXPECT_EQ(dp->backend(), "counting");
  EXPECT_EQ(dp->rank(), 1);
  EXPECT_EQ(dp->size(), 2);
  dp->all_reduce(nullptr, 100, DType::kF32);  // 2 * 1/2 * 400
  EXPECT_EQ(dp->bytes_sent(), 400);
  EXPECT_EQ(c.bytes_sent(), 0);  // counters are the group's own
  // Keys order a group, ties by rank; groups need not be contiguous.
  auto odd = c.split(SplitPlan::by(4, [](int r) { return SplitKey{r % 2, r == 3 ? -5 : 0}; }));
  EXPECT_EQ(odd->rank(), 0);
  EXPECT_EQ(odd->size(), 2);
  EXPECT_EQ(c.split(SplitPlan::each(4))->size(), 1);
  // Staging carries over: a 16-bit sum stages fp32 at size > 1.
  MemoryAccountant& acct = MemoryAccountant::global();
  const int64_t base = comm_current();
  acct.reset_peaks();
  dp->all_reduce(nullptr, 50, DType::kBF16);
  EXPECT_EQ(comm_peak() - base, 50 * 4);
  CountingCommunicator no_staging(0, 4, false);
  acct.reset_peaks();
  no_staging.split(SplitPlan::by(4,
                                 [](int r) {
                                   return SplitKey{r / 2, r};
                                 }))
      ->all_reduce(nullptr, 50, DType::kBF16);
  EXPECT_EQ(comm_peak(), base);
}

// Every rank of a 2 x 2 (pp x dp) and a 2 x 2 x 2 (pp x dp x tp) mesh,
// simulated through the counting communicator: each group's communicator has
// the rank and size the mesh's placement gives, and counts what MPI would for
// that rank: the ring bytes of its group's size.
TEST(CountingCommunicator, SimulatesARankOfAMesh) {
  for (const Mesh& mesh : {Mesh::pipeline_data(4, 2), Mesh({{"pp", 2}, {"dp", 2}, {"tp", 2}})}) {
    for (int r = 0; r < mesh.world(); ++r) {
      CountingCommunicator world(r, mesh.world());
      for (const std::vector<std::string_view>& axes : std::vector<std::vector<std::string_view>>{
               {"dp"}, {"pp"}, {"tp"}, {"dp", "tp"}, {"pp", "dp", "tp"}, {}}) {
        const std::vector<int> ranks = mesh.group_ranks(r, axes);
        std::unique_ptr<Communicator> g = mesh.group(world, axes);
        ASSERT_EQ(g->size(), int(ranks.size()));
        EXPECT_EQ(ranks[size_t(g->rank())], r);
        g->all_gather(nullptr, nullptr, 10, DType::kF32);  // (n - 1)/n * n * 40
        EXPECT_EQ(g->bytes_sent(), (g->size() - 1) * 40);
      }
      EXPECT_EQ(world.bytes_sent(), 0);
    }
  }
}

TEST(CountingCommunicatorDeathTest, SendRecvAndSplitChecks) {
  CountingCommunicator c(1, 4);
  EXPECT_DEATH(c.send(nullptr, 1, 4, DType::kF32), "dst rank 4 outside");
  EXPECT_DEATH(c.recv(nullptr, 1, -2, DType::kF32), "src rank -2 outside");
  EXPECT_DEATH(c.send(nullptr, 1, 1, DType::kF32), "rank 1 of 4 sends 1 elements to itself");
  EXPECT_DEATH(c.send_recv(nullptr, 2, -1, nullptr, 0, -1, DType::kF32), "no dst");
  EXPECT_DEATH(c.send_recv(nullptr, 0, -1, nullptr, 2, -1, DType::kF32), "no src");
  EXPECT_DEATH(c.send(nullptr, -1, 0, DType::kF32), "negative count");
  std::vector<float> buf(8);
  EXPECT_DEATH(c.send_recv(buf.data(), 4, 0, buf.data() + 2, 4, 2, DType::kF32), "overlap");
  EXPECT_DEATH(c.all_to_all(buf.data(), buf.data() + 1, 1, DType::kF32), "all_to_all: the send");
  EXPECT_DEATH(c.all_to_all(nullptr, nullptr, -3, DType::kF32), "all_to_all: negative count");
  EXPECT_DEATH(c.split(SplitPlan::whole(2)), "a plan of 2 ranks for a communicator of 4");
  EXPECT_DEATH(SplitPlan({{0, 0}, {-1, 1}}), "color -1 of rank 1");
}

// Nodes (issue 40): 4 ranks on 2 nodes (0 0 1 1). A ring collective's bytes go to the next
// rank: rank 1's (next: rank 2, the other node) all cross, rank 0's none; an all-to-all sends
// 1/3 to each other rank, 2 of them on the other node; a send_recv by its destination. A mesh's
// groups get their ranks' nodes, and every group's traffic adds up in the world's family totals
// (floor(bytes / n) per op).
TEST(CountingCommunicator, InterNodeBytesByTheRingModel) {
  const std::vector<int> nodes = {0, 0, 1, 1};
  CountingCommunicator r1(1, 4), r0(0, 4);
  r1.set_nodes(nodes);
  r0.set_nodes(nodes);
  EXPECT_EQ(r1.num_nodes(), 2);
  for (CountingCommunicator* c : {&r0, &r1}) c->all_reduce(nullptr, 1000, DType::kF32);
  EXPECT_EQ(r1.bytes_sent(), 6000);  // 2 * 3/4 * 4000
  EXPECT_EQ(r1.inter_node_bytes(), 6000);
  EXPECT_EQ(r0.bytes_sent(), 6000);
  EXPECT_EQ(r0.inter_node_bytes(), 0);
  r0.reset_counters();
  r0.all_to_all(nullptr, nullptr, 100, DType::kF32);  // S = 1600: 1200 sent, 400 to each peer
  EXPECT_EQ(r0.bytes_sent(), 1200);
  EXPECT_EQ(r0.inter_node_bytes(), 800);
  r0.reset_counters();
  r0.send(nullptr, 0, 2, DType::kF32);
  std::vector<float> buf(10);
  r0.send(buf.data(), 10, 1, DType::kF32);  // same node
  r0.send(buf.data(), 5, 3, DType::kF32);   // the other
  EXPECT_EQ(r0.bytes_sent(), 60);
  EXPECT_EQ(r0.inter_node_bytes(), 20);
  // Unknown nodes: nothing crosses.
  CountingCommunicator plain(1, 4);
  plain.all_reduce(nullptr, 1000, DType::kF32);
  EXPECT_EQ(plain.inter_node_bytes(), 0);
  EXPECT_EQ(plain.num_nodes(), 1);

  // A mesh {dp: 2, tp: 2} over the world of rank 1: its tp group {0, 1} is on node 0, its dp
  // group {1, 3} spans both.
  CountingCommunicator world(1, 4);
  world.set_nodes(nodes);
  const Mesh mesh({{"dp", 2}, {"tp", 2}});
  std::unique_ptr<Communicator> tp = mesh.group(world, {"tp"});
  std::unique_ptr<Communicator> dp = mesh.group(world, {"dp"});
  EXPECT_EQ(tp->nodes(), (std::vector<int>{0, 0}));
  EXPECT_EQ(dp->nodes(), (std::vector<int>{0, 1}));
  world.reset_family_counters();
  tp->all_reduce(nullptr, 100, DType::kF32);    // 2 * 1/2 * 400 = 400, inside
  dp->all_reduce(nullptr, 100, DType::kF32);    // 400, to rank 3 on node 1
  world.all_reduce(nullptr, 100, DType::kF32);  // 600, to rank 2 on node 1
  EXPECT_EQ(tp->inter_node_bytes(), 0);
  EXPECT_EQ(dp->inter_node_bytes(), 400);
  EXPECT_EQ(world.family_bytes(), 1400);
  EXPECT_EQ(world.family_inter_node_bytes(), 1000);
  world.reset_family_counters();
  EXPECT_EQ(world.family_bytes(), 0);

  // Names, for messages: a group's ranks by host, runs of consecutive ranks.
  CountingCommunicator named(0, 5);
  named.set_nodes({0, 0, 1, 0, 1}, {"a", "b"});
  EXPECT_EQ(named.ranks_by_host({0, 1, 2, 3, 4}), "ranks 0-1, 3 on host a, ranks 2, 4 on host b");
  EXPECT_EQ(named.ranks_by_host({8, 9, 10, 11, 12}),
            "ranks 8-9, 11 on host a, ranks 10, 12 on host b");
  CountingCommunicator alone(0, 2);
  alone.set_nodes({0, 0}, {"a"});
  EXPECT_EQ(alone.ranks_by_host({0, 1}), "");
  std::unique_ptr<Communicator> half = Mesh({{"dp", 2}, {"tp", 2}}).group(world, {"dp"});
  EXPECT_EQ(half->node_names(), world.node_names());
}

}  // namespace
}  // namespace fd::dist
