// Multi-rank tests of the communicator (run by ctest under mpirun -n 2 and -n 4).
// The collectives, then point-to-point send_recv and split() (PointToPoint*,
// Split*: the communication pipeline parallelism needs).
//
// Inputs are crafted so that the exact result is known (nccl-tests
// "verifiable"): element i of rank r is (r + 1) * ((i % 13) + 1), small
// integers whose sums over up to 4 ranks (<= 130) are exact in bf16 and f16.
// Tests use EXPECT_* only: an early return on one rank would leave its peers
// waiting in the next collective. Only rank 0 prints the gtest report; other
// ranks print their failures, and the exit code is the MAX over ranks.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "lib/dist/communicator.h"
#include "lib/dist/counting_communicator.h"
#include "lib/dist/init.h"
#include "lib/dist/mesh.h"
#include "lib/dist/mpi_communicator.h"
#include "lib/tensor/dtype.h"
#include "lib/tensor/memory.h"
#include "tests/mpi/mpi_test_main.h"

namespace fd::dist {
namespace {

Communicator* g_comm = nullptr;

const std::vector<int64_t> kSizes = {1, 7, 1000, (int64_t(1) << 20) + 3};
const std::vector<DType> kFloatTypes = {DType::kF32, DType::kBF16, DType::kF16};
const std::vector<DType> kAllTypes = {DType::kF32, DType::kBF16, DType::kF16, DType::kI32};

// A host buffer of `n` elements of one dtype, set and read as doubles.
struct Buf {
  Buf(DType t, int64_t n) : dtype(t), bytes(size_t(n) * dtype_size(t)) {}
  void* data() { return bytes.data(); }
  uint8_t* at(int64_t i) { return bytes.data() + size_t(i) * dtype_size(dtype); }
  void set(int64_t i, double v) {
    switch (dtype) {
      case DType::kF32: {
        float f = float(v);
        std::memcpy(at(i), &f, 4);
        return;
      }
      case DType::kI32: {
        int32_t x = int32_t(v);
        std::memcpy(at(i), &x, 4);
        return;
      }
      case DType::kU8:
        *at(i) = uint8_t(v);
        return;
      case DType::kBF16:
      case DType::kF16: {
        uint16_t h = dtype == DType::kBF16 ? f32_to_bf16(float(v)) : f32_to_f16(float(v));
        std::memcpy(at(i), &h, 2);
        return;
      }
    }
  }
  double get(int64_t i) {
    switch (dtype) {
      case DType::kF32: {
        float f;
        std::memcpy(&f, at(i), 4);
        return f;
      }
      case DType::kI32: {
        int32_t x;
        std::memcpy(&x, at(i), 4);
        return x;
      }
      case DType::kU8:
        return *at(i);
      case DType::kBF16:
      case DType::kF16: {
        uint16_t h;
        std::memcpy(&h, at(i), 2);
        return dtype == DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
      }
    }
    return 0;
  }
  DType dtype;
  std::vector<uint8_t> bytes;
};

double value(int r, int64_t i) { return double((r + 1) * ((i % 13) + 1)); }
double sum_over_ranks(int64_t i) {
  double s = 0;
  for (int r = 0; r < g_comm->size(); ++r) s += value(r, i);
  return s;
}

// Checks buf[offset + i] == expect(i) for i < count; reports the first mismatch.
template <typename F>
void expect_all(Buf& buf, int64_t offset, int64_t count, F expect, const std::string& what) {
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < count; ++i) {
    if (buf.get(offset + i) != expect(i)) {
      if (first < 0) first = i;
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << what << " (" << dtype_name(buf.dtype) << "): " << bad << " wrong, first at "
                    << first << ": got " << (first >= 0 ? buf.get(offset + first) : 0) << ", want "
                    << (first >= 0 ? expect(first) : 0) << " on rank " << g_comm->rank();
}

uint64_t fnv1a(const std::vector<uint8_t>& b) {
  uint64_t h = 1469598103934665603ull;
  for (uint8_t c : b) h = (h ^ c) * 1099511628211ull;
  return h;
}

// True on every rank iff every rank passed the same 64-bit value.
bool same_on_all_ranks(uint64_t h) {
  std::vector<uint64_t> all(size_t(g_comm->size()));
  g_comm->all_gather(&h, all.data(), 2, DType::kI32);
  for (uint64_t x : all)
    if (x != h) return false;
  return true;
}

TEST(Comm, World) {
  if (g_comm->size() > 1) {
    EXPECT_EQ(g_comm->backend(), "mpi");  // size 1: local, or mpi when forced
  }
  EXPECT_GE(g_comm->rank(), 0);
  EXPECT_LT(g_comm->rank(), g_comm->size());
}

TEST(Comm, AllReduceSum) {
  const int r = g_comm->rank();
  for (DType t : kAllTypes) {
    for (int64_t n : kSizes) {
      Buf b(t, n);
      for (int64_t i = 0; i < n; ++i) b.set(i, value(r, i));
      g_comm->all_reduce(b.data(), n, t, ReduceOp::kSum);
      expect_all(b, 0, n, sum_over_ranks, "all_reduce sum n=" + std::to_string(n));
    }
  }
}

TEST(Comm, AllReduceMax) {
  const int r = g_comm->rank(), w = g_comm->size();
  // Element i of rank r is ((i + r) % 13) - 6: the max over ranks is known and may be negative.
  auto v = [](int rr, int64_t i) { return double((i + rr) % 13) - 6; };
  auto want = [&](int64_t i) {
    double m = v(0, i);
    for (int q = 1; q < w; ++q) m = std::max(m, v(q, i));
    return m;
  };
  for (DType t : kAllTypes) {
    for (int64_t n : kSizes) {
      Buf b(t, n);
      for (int64_t i = 0; i < n; ++i) b.set(i, v(r, i));
      g_comm->all_reduce(b.data(), n, t, ReduceOp::kMax);
      expect_all(b, 0, n, want, "all_reduce max n=" + std::to_string(n));
    }
  }
}

TEST(Comm, ReduceScatterChunkPlacement) {
  const int r = g_comm->rank(), w = g_comm->size();
  for (DType t : kAllTypes) {
    for (int64_t rc : kSizes) {
      Buf send(t, rc * w), recv(t, rc);
      for (int64_t j = 0; j < rc * w; ++j) send.set(j, value(r, j));
      g_comm->reduce_scatter(send.data(), recv.data(), rc, t);
      expect_all(
          recv, 0, rc, [&](int64_t i) { return sum_over_ranks(r * rc + i); },
          "reduce_scatter rc=" + std::to_string(rc));
      // Recv aliasing its own chunk of send (ZeRO's in-place gradient shard).
      g_comm->reduce_scatter(send.data(), send.at(r * rc), rc, t);
      expect_all(
          send, r * rc, rc, [&](int64_t i) { return sum_over_ranks(r * rc + i); },
          "reduce_scatter aliased rc=" + std::to_string(rc));
    }
  }
}

TEST(Comm, AllGatherOutOfPlaceAndInPlace) {
  const int r = g_comm->rank(), w = g_comm->size();
  for (DType t : kAllTypes) {
    for (int64_t sc : kSizes) {
      auto want = [&](int64_t j) { return value(int(j / sc), j % sc); };
      Buf send(t, sc), recv(t, sc * w);
      for (int64_t i = 0; i < sc; ++i) send.set(i, value(r, i));
      g_comm->all_gather(send.data(), recv.data(), sc, t);
      expect_all(recv, 0, sc * w, want, "all_gather sc=" + std::to_string(sc));
      Buf inplace(t, sc * w);
      for (int64_t j = 0; j < sc * w; ++j) inplace.set(j, -1);
      for (int64_t i = 0; i < sc; ++i) inplace.set(r * sc + i, value(r, i));
      g_comm->all_gather(inplace.at(r * sc), inplace.data(), sc, t);
      expect_all(inplace, 0, sc * w, want, "all_gather in place sc=" + std::to_string(sc));
    }
  }
}

// All-to-all element i of the block that rank `src` sends to rank `dst` (world or group
// ranks < 4): distinct for every (src, dst) pair and i % 13, at most 208, so exact in bf16
// and f16: a block sent to the wrong rank, received into the wrong slot or shifted shows.
double a2a_value(int src, int dst, int64_t i) { return double((src * 4 + dst) * 13 + i % 13 + 1); }

// Fills send's blocks as rank `src` of a group of `n`, all-to-alls over `c`, and checks that
// recv's block q holds what group rank q (world rank world_of(q)) sent to this rank.
void check_all_to_all(Communicator& c, DType t, int64_t count, int src,
                      const std::function<int(int)>& world_of, const std::string& what) {
  const int n = c.size(), me = c.rank();
  Buf send(t, count * n), recv(t, count * n);
  for (int j = 0; j < n; ++j)
    for (int64_t i = 0; i < count; ++i) send.set(j * count + i, a2a_value(src, j, i));
  for (int64_t k = 0; k < count * n; ++k) recv.set(k, -1);
  c.all_to_all(send.data(), recv.data(), count, t);
  expect_all(
      recv, 0, count * n,
      [&](int64_t k) { return a2a_value(world_of(int(k / count)), me, k % count); },
      what + " count=" + std::to_string(count));
}

TEST(Comm, AllToAllBlockPlacement) {
  const int r = g_comm->rank();
  for (DType t : kAllTypes)
    for (int64_t count : {int64_t(1), int64_t(7), int64_t(1000), (int64_t(1) << 18) + 3})
      check_all_to_all(
          *g_comm, t, count, r, [](int q) { return q; }, "all_to_all");
}

TEST(Comm, BroadcastFromEveryRoot) {
  const int r = g_comm->rank(), w = g_comm->size();
  for (DType t : kAllTypes) {
    for (int64_t n : {int64_t(1), int64_t(7), int64_t(1000), (int64_t(1) << 20) + 3}) {
      for (int root = 0; root < w; ++root) {
        Buf b(t, n);
        for (int64_t i = 0; i < n; ++i) b.set(i, r == root ? value(root, i) : -1);
        g_comm->broadcast(b.data(), n, t, root);
        expect_all(
            b, 0, n, [&](int64_t i) { return value(root, i); },
            "broadcast root=" + std::to_string(root) + " n=" + std::to_string(n));
      }
    }
  }
}

TEST(Comm, AsyncBackToBackWaitedInReverse) {
  const int r = g_comm->rank(), w = g_comm->size();
  const int64_t n = 1000;
  Buf ar(DType::kBF16, n), rs_send(DType::kF32, n * w), rs_recv(DType::kF32, n),
      ag_send(DType::kF16, n), ag_recv(DType::kF16, n * w), bc(DType::kI32, n), ar2(DType::kF32, n),
      a2a_send(DType::kBF16, n * w), a2a_recv(DType::kBF16, n * w);
  for (int64_t i = 0; i < n; ++i) {
    ar.set(i, value(r, i));
    ag_send.set(i, value(r, i));
    bc.set(i, r == w - 1 ? value(w - 1, i) : 0);
    ar2.set(i, value(r, i + 5));
  }
  for (int64_t j = 0; j < n * w; ++j) {
    rs_send.set(j, value(r, j));
    a2a_send.set(j, a2a_value(r, int(j / n), j % n));
  }
  std::vector<WorkPtr> works;
  works.push_back(g_comm->all_reduce_async(ar.data(), n, DType::kBF16, ReduceOp::kSum));
  works.push_back(g_comm->reduce_scatter_async(rs_send.data(), rs_recv.data(), n, DType::kF32));
  works.push_back(g_comm->all_gather_async(ag_send.data(), ag_recv.data(), n, DType::kF16));
  works.push_back(g_comm->broadcast_async(bc.data(), n, DType::kI32, w - 1));
  works.push_back(g_comm->barrier_async());
  works.push_back(g_comm->all_reduce_async(ar2.data(), n, DType::kF32, ReduceOp::kMax));
  works.push_back(g_comm->all_to_all_async(a2a_send.data(), a2a_recv.data(), n, DType::kBF16));
  for (auto it = works.rbegin(); it != works.rend(); ++it) {
    (*it)->wait();
    EXPECT_TRUE((*it)->is_completed());
  }
  // FIFO: once the last op is done, every earlier one is too.
  for (auto& wk : works) EXPECT_TRUE(wk->is_completed());
  expect_all(ar, 0, n, sum_over_ranks, "async all_reduce");
  expect_all(
      rs_recv, 0, n, [&](int64_t i) { return sum_over_ranks(r * n + i); }, "async reduce_scatter");
  expect_all(
      ag_recv, 0, n * w, [&](int64_t j) { return value(int(j / n), j % n); }, "async all_gather");
  expect_all(
      bc, 0, n, [&](int64_t i) { return value(w - 1, i); }, "async broadcast");
  expect_all(
      ar2, 0, n, [&](int64_t i) { return value(w - 1, i + 5); }, "async all_reduce max");
  expect_all(
      a2a_recv, 0, n * w, [&](int64_t j) { return a2a_value(int(j / n), r, j % n); },
      "async all_to_all");
  for (auto& wk : works) wk->wait();  // waiting again is a no-op
}

TEST(Comm, BytesSentFollowsTheRingModel) {
  const int w = g_comm->size();
  g_comm->barrier();
  g_comm->reset_counters();
  std::vector<float> f(3000);
  std::vector<uint16_t> h(7 * w);
  std::vector<int32_t> iv(5);
  g_comm->all_reduce(f.data(), 1000, DType::kF32);                // S = 4000
  g_comm->all_reduce(h.data(), 7, DType::kBF16);                  // S = 14
  g_comm->reduce_scatter(h.data(), f.data(), 7, DType::kF16);     // S = 14 w
  g_comm->all_gather(f.data(), f.data() + 3, 3, DType::kF32);     // S = 12 w
  g_comm->broadcast(iv.data(), 5, DType::kI32, 0);                // S = 20
  g_comm->barrier();                                              // 0
  g_comm->all_to_all(h.data(), f.data() + 100, 7, DType::kBF16);  // S = 14 w
  g_comm->all_to_all(f.data(), f.data() + 100, 5, DType::kF32);   // S = 20 w
  const int64_t times_n = 2 * (w - 1) * 4000 + 2 * (w - 1) * 14 + (w - 1) * 14 * w +
                          (w - 1) * 12 * w + (w - 1) * 20 + (w - 1) * 14 * w + (w - 1) * 20 * w;
  EXPECT_EQ(g_comm->bytes_sent(), times_n / w);
  EXPECT_EQ(g_comm->control_bytes(), 0);
  std::vector<double> d(3, 1.0);
  g_comm->all_reduce_f64(d.data(), 3);  // an all-gather of 3 doubles: (w-1)/w * 24 w
  EXPECT_EQ(g_comm->bytes_sent(), times_n / w);
  EXPECT_EQ(g_comm->control_bytes(), (w - 1) * 24);
  g_comm->reset_counters();
  EXPECT_EQ(g_comm->bytes_sent(), 0);
  EXPECT_EQ(g_comm->control_bytes(), 0);
}

TEST(Comm, F64Helpers) {
  const int r = g_comm->rank(), w = g_comm->size();
  std::vector<double> d = {r + 0.5, -1.0 * r, 1e300 * (r == 1)};
  g_comm->all_reduce_f64(d.data(), 3);
  EXPECT_EQ(d[0], w * w / 2.0);
  EXPECT_EQ(d[1], -w * (w - 1) / 2.0);
  EXPECT_EQ(d[2], w > 1 ? 1e300 : 0.0);
  std::vector<double> m = {double(r), -double(r)};
  g_comm->all_reduce_f64(m.data(), 2, ReduceOp::kMax);
  EXPECT_EQ(m[0], w - 1);
  EXPECT_EQ(m[1], 0.0);
  std::vector<double> send = {r * 1.25, r * 2.5}, recv(size_t(2 * w));
  g_comm->all_gather_f64(send.data(), recv.data(), 2);
  for (int q = 0; q < w; ++q) {
    EXPECT_EQ(recv[size_t(2 * q)], q * 1.25);
    EXPECT_EQ(recv[size_t(2 * q + 1)], q * 2.5);
  }
}

TEST(Comm, WaitSecondsGrowsWhenAPeerIsSlow) {
  if (g_comm->size() < 2) GTEST_SKIP() << "needs two ranks";
  const int r = g_comm->rank();
  g_comm->barrier();
  g_comm->reset_counters();
  if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  float x = 1;
  g_comm->all_reduce(&x, 1, DType::kF32);
  EXPECT_EQ(x, float(g_comm->size()));
  if (r != 1) {
    EXPECT_GE(g_comm->wait_seconds(), 0.15) << "rank " << r;
  }
  EXPECT_LT(g_comm->wait_seconds(), 30.0);
}

TEST(Comm, DeterministicAndIdenticalOnAllRanks) {
  const int r = g_comm->rank(), w = g_comm->size();
  for (DType t : kFloatTypes) {
    for (int64_t n : {int64_t(1000), (int64_t(1) << 20) + 3}) {
      // Random fp32 values of mixed magnitude: sums round, so the order matters.
      std::mt19937 rng(1234u + unsigned(r));
      std::normal_distribution<float> dist(0.f, 1.f);
      Buf in(t, n * w);
      for (int64_t i = 0; i < n * w; ++i) in.set(i, dist(rng) * std::ldexp(1.0, int(i % 17) - 8));
      Buf a = in, b = in;
      g_comm->all_reduce(a.data(), n * w, t, ReduceOp::kSum);
      g_comm->all_reduce(b.data(), n * w, t, ReduceOp::kSum);
      EXPECT_EQ(a.bytes, b.bytes) << "all_reduce not repeatable, " << dtype_name(t) << " n=" << n;
      EXPECT_TRUE(same_on_all_ranks(fnv1a(a.bytes)))
          << "all_reduce differs across ranks, " << dtype_name(t) << " n=" << n;
      Buf rs1(t, n), rs2(t, n);
      g_comm->reduce_scatter(in.data(), rs1.data(), n, t);
      g_comm->reduce_scatter(in.data(), rs2.data(), n, t);
      EXPECT_EQ(rs1.bytes, rs2.bytes) << "reduce_scatter not repeatable, " << dtype_name(t);
      // Every rank's chunk, gathered, must be the same everywhere (trivially) and
      // close to the all-reduce result.
      Buf gathered(t, n * w);
      g_comm->all_gather(rs1.data(), gathered.data(), n, t);
      double worst = 0;
      for (int64_t i = 0; i < n * w; ++i)
        worst = std::max(worst, std::abs(gathered.get(i) - a.get(i)) / (std::abs(a.get(i)) + 1));
      EXPECT_LT(worst, t == DType::kF32 ? 1e-5 : 1e-2) << dtype_name(t);
    }
  }
}

TEST(Comm, ZeroCounts) {
  const int w = g_comm->size();
  std::vector<float> f(4 * size_t(w));
  g_comm->all_reduce(f.data(), 0, DType::kBF16);
  g_comm->reduce_scatter(f.data(), f.data(), 0, DType::kF32);
  g_comm->all_gather(f.data(), f.data(), 0, DType::kF16);
  g_comm->broadcast(f.data(), 0, DType::kI32, w - 1);
  g_comm->all_to_all(f.data(), f.data() + 2 * w, 0, DType::kBF16);
  std::vector<WorkPtr> ws = {g_comm->barrier_async(), g_comm->barrier_async()};
  for (auto& wk : ws) wk->wait();
}

TEST(Comm, DestructorDrainsPendingOpsAndWorksOutliveIt) {
  if (g_comm->backend() != "mpi") GTEST_SKIP() << "needs the mpi backend";
  const int r = g_comm->rank();
  const int64_t n = (int64_t(1) << 16) + 1;
  std::vector<Buf> bufs;
  for (int k = 0; k < 8; ++k) {
    bufs.emplace_back(k % 2 ? DType::kF32 : DType::kBF16, n);
    for (int64_t i = 0; i < n; ++i) bufs.back().set(i, value(r, i + k));
  }
  std::vector<WorkPtr> works;
  {
    MpiCommunicator second;  // its own MPI_Comm_dup: independent of g_comm's queue
    for (auto& b : bufs)
      works.push_back(second.all_reduce_async(b.data(), n, b.dtype, ReduceOp::kSum));
  }  // destroyed with ops still queued: must complete them, not hang or drop them
  for (auto& wk : works) {
    EXPECT_TRUE(wk->is_completed());
    wk->wait();
  }
  for (int k = 0; k < 8; ++k)
    expect_all(
        bufs[size_t(k)], 0, n, [&](int64_t i) { return sum_over_ranks(i + k); },
        "drained all_reduce " + std::to_string(k));
}

// ---- Point-to-point and split ----

int next_rank(int r) { return (r + 1) % g_comm->size(); }
int prev_rank(int r) { return (r + g_comm->size() - 1) % g_comm->size(); }
// The partner of an exchange between neighbours: 0<->1, 2<->3, ...; -1 for the odd one out.
int partner(int r) { return (r ^ 1) < g_comm->size() ? (r ^ 1) : -1; }

// Each rank sends to rank+1 and receives from rank-1 in one op: the values
// are the sender's, so a message from the wrong rank or of the wrong size shows.
TEST(PointToPoint, RingExchangeEveryDtype) {
  if (g_comm->size() < 2) GTEST_SKIP() << "needs two ranks";
  const int r = g_comm->rank(), dst = next_rank(r), src = prev_rank(r);
  for (DType t : {DType::kF32, DType::kBF16, DType::kI32, DType::kF16}) {
    for (int64_t n : {int64_t(1), int64_t(1000), (int64_t(1) << 16) + 3}) {
      Buf send(t, n), recv(t, n);
      for (int64_t i = 0; i < n; ++i) {
        send.set(i, value(r, i));
        recv.set(i, -1);
      }
      g_comm->send_recv(send.data(), n, dst, recv.data(), n, src, t);
      expect_all(
          recv, 0, n, [&](int64_t i) { return value(src, i); },
          "ring send_recv n=" + std::to_string(n));
      expect_all(
          send, 0, n, [&](int64_t i) { return value(r, i); }, "send buffer left as it was");
    }
  }
}

// Neighbours exchange 4 MiB in both directions at once (beyond MPI's eager
// limit: a send completes only once its receive is posted). Posting the send
// before the receive, or as separate ops, would deadlock here (and time out).
TEST(PointToPoint, SimultaneousLargeExchangeDoesNotDeadlock) {
  if (g_comm->size() < 2) GTEST_SKIP() << "needs two ranks";
  const int r = g_comm->rank(), p = partner(r);
  const int64_t n = int64_t(1) << 20;  // 4 MiB of f32
  g_comm->set_timeout(10);             // fail in seconds, not after the suite's 120 s
  Buf send(DType::kF32, n), recv(DType::kF32, n);
  for (int64_t i = 0; i < n; ++i) send.set(i, value(r, i + 1));
  for (int round = 0; round < 2; ++round) {
    std::memset(recv.data(), 0, recv.bytes.size());
    const int64_t k = p < 0 ? 0 : n;
    g_comm->send_recv(send.data(), k, p, recv.data(), k, p, DType::kF32);
    if (p >= 0)
      expect_all(
          recv, 0, n, [&](int64_t i) { return value(p, i + 1); }, "bidirectional 4 MiB");
  }
  // The blocking one-sided helpers, large: even ranks send, odd ranks receive, then back.
  if (p >= 0) {
    for (int dir = 0; dir < 2; ++dir) {
      std::memset(recv.data(), 0, recv.bytes.size());
      if ((r % 2) == dir) {
        g_comm->send(send.data(), n, p, DType::kF32);
      } else {
        g_comm->recv(recv.data(), n, p, DType::kF32);
        expect_all(
            recv, 0, n, [&](int64_t i) { return value(p, i + 1); }, "send/recv 4 MiB");
      }
    }
  }
  g_comm->set_timeout(120);
}

// Back-to-back async ops to the same neighbours, of different sizes (eager and
// rendezvous) and contents, waited in reverse: message k lands in buffer k.
TEST(PointToPoint, AsyncBackToBackArriveInIssueOrder) {
  if (g_comm->size() < 2) GTEST_SKIP() << "needs two ranks";
  const int r = g_comm->rank(), dst = next_rank(r), src = prev_rank(r);
  const std::vector<int64_t> sizes = {300000, 5, 1000, 300000, 1, 70000};
  std::vector<Buf> sends, recvs;
  for (size_t k = 0; k < sizes.size(); ++k) {
    sends.emplace_back(DType::kF32, sizes[k]);
    recvs.emplace_back(DType::kF32, sizes[k]);
    for (int64_t i = 0; i < sizes[k]; ++i) sends[k].set(i, value(r, i + 100 * int64_t(k)));
  }
  std::vector<WorkPtr> works;
  for (size_t k = 0; k < sizes.size(); ++k)
    works.push_back(g_comm->send_recv_async(sends[k].data(), sizes[k], dst, recvs[k].data(),
                                            sizes[k], src, DType::kF32));
  for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
  for (auto& w : works) EXPECT_TRUE(w->is_completed());
  for (size_t k = 0; k < sizes.size(); ++k)
    expect_all(
        recvs[k], 0, sizes[k], [&](int64_t i) { return value(src, i + 100 * int64_t(k)); },
        "async send_recv #" + std::to_string(k));
}

// An op with nothing to move completes at once, and a half with count 0 posts
// no message. Every empty half here names the partner but has no counterpart
// on it: a posted empty send would be matched by the partner's next receive
// (a count mismatch), a posted empty receive would take its next message.
TEST(PointToPoint, ZeroCountsCompleteAndPostNothing) {
  const int r = g_comm->rank();
  WorkPtr none = g_comm->send_recv_async(nullptr, 0, -1, nullptr, 0, -1, DType::kF32);
  EXPECT_TRUE(none->is_completed());
  none->wait();
  const int p = partner(r);
  if (p < 0) return;
  const bool even = r % 2 == 0;
  Buf x(DType::kI32, 10), y(DType::kI32, 10), z(DType::kI32, 10);  // sent
  Buf rx(DType::kI32, 10), ry(DType::kI32, 10), rz(DType::kI32, 10);
  for (int64_t i = 0; i < 10; ++i) {
    x.set(i, value(r, i));
    y.set(i, value(r, i + 5));
    z.set(i, value(r, i + 9));
  }
  std::vector<WorkPtr> works;
  works.push_back(g_comm->send_recv_async(x.data(), 10, p, rx.data(), 10, p, DType::kI32));
  if (even) {
    WorkPtr empty = g_comm->send_recv_async(x.data(), 0, p, rx.data(), 0, p, DType::kI32);
    EXPECT_TRUE(empty->is_completed());
    g_comm->send(x.data(), 0, p, DType::kI32);
    g_comm->recv(rx.data(), 0, p, DType::kI32);
    // Even sends y with an empty receive from p, then receives y with an empty send to p.
    works.push_back(g_comm->send_recv_async(y.data(), 10, p, nullptr, 0, p, DType::kI32));
    works.push_back(g_comm->send_recv_async(nullptr, 0, p, ry.data(), 10, p, DType::kI32));
  } else {
    works.push_back(g_comm->send_recv_async(nullptr, 0, -1, ry.data(), 10, p, DType::kI32));
    works.push_back(g_comm->send_recv_async(y.data(), 10, p, nullptr, 0, -1, DType::kI32));
  }
  works.push_back(g_comm->send_recv_async(z.data(), 10, p, rz.data(), 10, p, DType::kI32));
  for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
  expect_all(
      rx, 0, 10, [&](int64_t i) { return value(p, i); }, "before the empty halves");
  expect_all(
      ry, 0, 10, [&](int64_t i) { return value(p, i + 5); }, "beside the empty halves");
  expect_all(
      rz, 0, 10, [&](int64_t i) { return value(p, i + 9); }, "after the empty halves");
}

// send_recv counts exactly the bytes this rank sends: here each rank sends
// its own amount, and receives (uncounted) another.
TEST(PointToPoint, BytesSentAreExact) {
  if (g_comm->size() < 2) GTEST_SKIP() << "needs two ranks";
  const int r = g_comm->rank(), dst = next_rank(r), src = prev_rank(r);
  g_comm->barrier();
  g_comm->reset_counters();
  std::vector<uint16_t> send(size_t(7 * (r + 1))), recv(size_t(7 * (src + 1)));
  g_comm->send_recv(send.data(), int64_t(send.size()), dst, recv.data(), int64_t(recv.size()), src,
                    DType::kBF16);
  EXPECT_EQ(g_comm->bytes_sent(), 14 * (r + 1));  // not a multiple of size(): still exact
  const int p = partner(r);
  std::vector<int32_t> iv(5);
  if (p >= 0) {
    if (r % 2 == 0) {
      g_comm->send(iv.data(), 5, p, DType::kI32);
    } else {
      g_comm->recv(iv.data(), 5, p, DType::kI32);
    }
  }
  EXPECT_EQ(g_comm->bytes_sent(), 14 * (r + 1) + (p >= 0 && r % 2 == 0 ? 20 : 0));
  EXPECT_EQ(g_comm->control_bytes(), 0);
  g_comm->reset_counters();
}

// A P x D grid: world rank r is stage r / D, replica r % D (D = 2): the
// placement of Mesh::pipeline_data (lib/dist/mesh.h), which makes the groups.
struct Grid {
  int d = 2;
  int stage(int r) const { return r / d; }
  int replica(int r) const { return r % d; }
  int stages() const { return g_comm->size() / d; }
};

TEST(Split, StageMajorAndReplicaMajorGroups) {
  const int r = g_comm->rank(), w = g_comm->size();
  if (w % 2 != 0) GTEST_SKIP() << "needs an even world";
  const Grid g;
  // The ranks of one stage (the data-parallel group), and of one replica (its pipeline).
  const Mesh mesh = Mesh::pipeline_data(w, g.stages());  // the same grid, as a run's mesh
  auto dp = mesh.group(*g_comm, {"dp"});
  auto pp = mesh.group(*g_comm, {"pp"});
  // Keys order the ranks: reversed keys give reversed ranks.
  auto rev = g_comm->split(SplitPlan::by(w, [&](int q) { return SplitKey{0, w - q}; }));
  ASSERT_EQ(dp->size(), g.d);
  EXPECT_EQ(dp->rank(), g.replica(r));
  ASSERT_EQ(pp->size(), g.stages());
  EXPECT_EQ(pp->rank(), g.stage(r));
  EXPECT_EQ(rev->size(), w);
  EXPECT_EQ(rev->rank(), w - 1 - r);
  EXPECT_EQ(dp->backend(), g_comm->backend());
  // World rank of dp rank q is stage*d + q; of pp rank s is s*d + replica.
  auto dp_world = [&](int q) { return g.stage(r) * g.d + q; };
  auto pp_world = [&](int s) { return s * g.d + g.replica(r); };

  const int64_t n = 5000;
  Buf ar(DType::kF32, n), ag_send(DType::kBF16, n), ag_recv(DType::kBF16, n * g.stages());
  Buf ring_send(DType::kI32, n), ring_recv(DType::kI32, n), ring2(DType::kI32, n);
  for (int64_t i = 0; i < n; ++i) {
    ar.set(i, value(r, i));
    ag_send.set(i, value(r, i + 3));
    ring_send.set(i, value(r, i + 11));
  }
  g_comm->barrier();
  dp->reset_counters();
  g_comm->reset_counters();
  // Interleaved: P2P on the parent, an all-reduce over each stage, an
  // all-gather along each pipeline, another P2P on the parent; all in flight.
  const int dst = next_rank(r), src = prev_rank(r);
  std::vector<WorkPtr> works;
  works.push_back(
      g_comm->send_recv_async(ring_send.data(), n, dst, ring_recv.data(), n, src, DType::kI32));
  works.push_back(dp->all_reduce_async(ar.data(), n, DType::kF32, ReduceOp::kSum));
  works.push_back(pp->all_gather_async(ag_send.data(), ag_recv.data(), n, DType::kBF16));
  works.push_back(
      g_comm->send_recv_async(ring_send.data(), n, src, ring2.data(), n, dst, DType::kI32));
  for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
  expect_all(
      ar, 0, n,
      [&](int64_t i) {
        double s = 0;
        for (int q = 0; q < g.d; ++q) s += value(dp_world(q), i);
        return s;
      },
      "all_reduce over the stage");
  expect_all(
      ag_recv, 0, n * g.stages(), [&](int64_t j) { return value(pp_world(int(j / n)), j % n + 3); },
      "all_gather along the pipeline");
  if (w > 1) {
    expect_all(
        ring_recv, 0, n, [&](int64_t i) { return value(src, i + 11); }, "parent ring forward");
    expect_all(
        ring2, 0, n, [&](int64_t i) { return value(dst, i + 11); }, "parent ring backward");
  }
  // Each communicator counts its own traffic.
  EXPECT_EQ(dp->bytes_sent(), 2 * (g.d - 1) * n * 4 / g.d);
  EXPECT_EQ(g_comm->bytes_sent(), w > 1 ? 2 * n * 4 : 0);
  // A sub-communicator splits again (one group each) and outlives its parent's use.
  auto solo = dp->split(SplitPlan::each(dp->size()));
  EXPECT_EQ(solo->size(), 1);
  float x = 2;
  solo->all_reduce(&x, 1, DType::kF32);
  EXPECT_EQ(x, 2.0f);
}

// All-to-all within sub-communicators: consecutive pairs ({dp, sp: 2}, sp fastest), strided
// groups (at -n 2 groups of one: the copy of the own block), and the whole world with
// reversed keys. Each block's values name its sender's world rank, so a block from another
// group, or from the wrong member of this one, shows. Each counts its own bytes.
TEST(Split, AllToAllInSubCommunicators) {
  const int r = g_comm->rank(), w = g_comm->size();
  if (w % 2 != 0) GTEST_SKIP() << "needs an even world";
  const Mesh mesh({{"dp", w / 2}, {"sp", 2}});
  auto sp = mesh.group(*g_comm, {"sp"});
  auto strided = g_comm->split(SplitPlan::by(w, [](int q) { return SplitKey{q % 2, q / 2}; }));
  auto rev = g_comm->split(SplitPlan::by(w, [&](int q) { return SplitKey{0, w - q}; }));
  ASSERT_EQ(sp->size(), 2);
  ASSERT_EQ(strided->size(), w / 2);
  ASSERT_EQ(rev->size(), w);
  for (DType t : kAllTypes) {
    for (int64_t count : {int64_t(3), int64_t(5000)}) {
      check_all_to_all(
          *sp, t, count, r, [&](int q) { return (r / 2) * 2 + q; }, "sp pairs");
      check_all_to_all(
          *strided, t, count, r, [&](int q) { return q * 2 + r % 2; }, "strided");
      check_all_to_all(
          *rev, t, count, r, [&](int q) { return w - 1 - q; }, "reversed world");
    }
  }
  sp->reset_counters();
  strided->reset_counters();
  g_comm->reset_counters();
  std::vector<uint16_t> send(size_t(100 * w)), recv(size_t(100 * w));
  sp->all_to_all(send.data(), recv.data(), 100, DType::kBF16);     // S = 400: 1/2
  strided->all_to_all(send.data(), recv.data(), 10, DType::kF16);  // S = 20 w/2
  EXPECT_EQ(sp->bytes_sent(), 200);
  EXPECT_EQ(strided->bytes_sent(), (w / 2 - 1) * 20);
  EXPECT_EQ(g_comm->bytes_sent(), 0);
}

// Two sub-communicators progress independently. The ranks issue a stage
// all-reduce and a pipeline exchange in an order that forms a cycle (rank 0
// all-reduce -> 1 exchange -> 3 all-reduce -> 2 exchange -> 0) were they
// queued behind each other: they complete only because both are in flight.
TEST(Split, TwoSubCommunicatorsInFlightAtOnce) {
  const int r = g_comm->rank(), w = g_comm->size();
  if (w < 4 || w % 2 != 0) GTEST_SKIP() << "needs an even world of at least 4";
  const Grid g;
  const Mesh mesh = Mesh::pipeline_data(w, g.stages());  // the same grid, as a run's mesh
  auto dp = mesh.group(*g_comm, {"dp"});
  auto pp = mesh.group(*g_comm, {"pp"});
  dp->set_timeout(10);  // fail in seconds, not after the suite's 120 s
  pp->set_timeout(10);
  const int s = pp->rank(), ns = pp->size();
  const int64_t n = int64_t(1) << 18;  // 1 MiB of f32: rendezvous
  Buf ar(DType::kF32, n), send(DType::kF32, n), recv(DType::kF32, n);
  for (int64_t i = 0; i < n; ++i) {
    ar.set(i, value(r, i));
    send.set(i, value(r, i + 1));
  }
  // Pipeline neighbours pair up: stages 0<->1, 2<->3, ...
  const int peer = (s ^ 1) < ns ? (s ^ 1) : -1;
  const int64_t k = peer < 0 ? 0 : n;
  WorkPtr a, b;
  if ((g.replica(r) + g.stage(r)) % 2 == 0) {
    a = dp->all_reduce_async(ar.data(), n, DType::kF32, ReduceOp::kSum);
    b = pp->send_recv_async(send.data(), k, peer, recv.data(), k, peer, DType::kF32);
  } else {
    b = pp->send_recv_async(send.data(), k, peer, recv.data(), k, peer, DType::kF32);
    a = dp->all_reduce_async(ar.data(), n, DType::kF32, ReduceOp::kSum);
  }
  b->wait();
  a->wait();
  expect_all(
      ar, 0, n,
      [&](int64_t i) {
        double sum = 0;
        for (int q = 0; q < g.d; ++q) sum += value(g.stage(r) * g.d + q, i);
        return sum;
      },
      "stage all_reduce");
  if (peer >= 0)
    expect_all(
        recv, 0, n, [&](int64_t i) { return value(peer * g.d + g.replica(r), i + 1); },
        "pipeline exchange");
}

// The counting communicator (one simulated rank, for estimates on the meta
// device) counts what the MPI backend counts: the same bytes and control
// bytes, and the same kComm peak from the fp32 staging of 16-bit sums.
TEST(Comm, CountingCommunicatorCountsAsMpi) {
  const int w = g_comm->size();
  std::vector<uint16_t> h(size_t(64 * w));
  std::vector<float> f(size_t(64 * w));
  std::vector<double> d(size_t(2 * w), 1.0);
  // Each collective, blocking, with the buffers the test gives it.
  const std::vector<std::function<void(Communicator&, bool)>> ops = {
      [&](Communicator& c, bool real) {
        c.reduce_scatter(real ? h.data() : nullptr, real ? f.data() : nullptr, 64, DType::kBF16);
      },
      [&](Communicator& c, bool real) {
        c.reduce_scatter(real ? f.data() : nullptr, real ? h.data() : nullptr, 32, DType::kF32);
      },
      [&](Communicator& c, bool real) { c.all_reduce(real ? h.data() : nullptr, 50, DType::kF16); },
      [&](Communicator& c, bool real) { c.all_reduce(real ? f.data() : nullptr, 50, DType::kF32); },
      [&](Communicator& c, bool real) {
        c.all_gather(real ? h.data() : nullptr, real ? h.data() + 64 * w / 2 : nullptr, 3,
                     DType::kBF16);
      },
      [&](Communicator& c, bool real) {
        c.broadcast(real ? f.data() : nullptr, 9, DType::kF32, w - 1);
      },
      [&](Communicator& c, bool) { c.barrier(); },
      [&](Communicator& c, bool) { c.all_reduce_f64(d.data(), 2); },
      [&](Communicator& c, bool real) {
        c.all_to_all(real ? h.data() : nullptr, real ? f.data() : nullptr, 16, DType::kBF16);
      },
      [&](Communicator& c, bool real) {
        c.all_to_all(real ? f.data() : nullptr, real ? h.data() : nullptr, 8, DType::kF32);
      },
      // Point-to-point: a ring of 64 bf16, then rank-dependent one-sided sends.
      [&](Communicator& c, bool real) {
        if (w < 2) return;
        const int r = c.rank();
        c.send_recv(real ? h.data() : nullptr, 64, (r + 1) % w, real ? h.data() + 64 : nullptr, 64,
                    (r + w - 1) % w, DType::kBF16);
      },
      [&](Communicator& c, bool real) {
        const int r = c.rank(), p = (r ^ 1) < w ? (r ^ 1) : -1;
        if (p < 0) return;
        if (r % 2 == 0) {
          c.send(real ? f.data() : nullptr, 3 + r, p, DType::kF32);
        } else {
          c.recv(real ? f.data() : nullptr, 3 + p, p, DType::kF32);
        }
      },
  };
  MemoryAccountant& acct = MemoryAccountant::global();
  CountingCommunicator counting(g_comm->rank(), w);
  for (size_t i = 0; i < 2 * ops.size(); ++i) {
    // Each collective in either mode of 16-bit sums: fp32 staging, then native.
    const Sum16 mode = i < ops.size() ? Sum16::kFp32 : Sum16::kNative;
    g_comm->set_sum16(mode);
    counting.set_sum16(mode);
    SCOPED_TRACE(::testing::Message()
                 << "collective " << i % ops.size() << ", 16-bit sums " << sum16_name(mode));
    int64_t bytes[2], control[2], peak[2];
    for (int k = 0; k < 2; ++k) {
      Communicator& c = k == 0 ? *g_comm : counting;
      g_comm->barrier();
      c.reset_counters();
      const int64_t base = acct.current(MemCategory::kComm);
      acct.reset_peaks();
      ops[i % ops.size()](c, k == 0);
      bytes[k] = c.bytes_sent();
      control[k] = c.control_bytes();
      peak[k] = acct.peak(MemCategory::kComm) - base;
      EXPECT_EQ(acct.current(MemCategory::kComm), base);
    }
    EXPECT_EQ(bytes[1], bytes[0]);
    EXPECT_EQ(control[1], control[0]);
    EXPECT_EQ(peak[1], peak[0]);
  }
  g_comm->set_sum16(Sum16::kFp32);
}

// keep_staging: MPI allocates the fp32 staging of 16-bit sums once, holds it,
// and stages every sum that fits there (nothing allocated per sum; a sum that
// does not fit stages its own buffers, as before); the counting communicator
// accounts the same bytes at the same moments. The sums are right either way.
TEST(Comm, KeptStagingIsHeldOnceAndCountedAsMpi) {
  const int w = g_comm->size();
  const int64_t kept = 64, big = 100;
  // Nothing kept yet.
  std::unique_ptr<Communicator> fresh = g_comm->split(SplitPlan::whole(g_comm->size()));
  CountingCommunicator counting(g_comm->rank(), w);
  MemoryAccountant& acct = MemoryAccountant::global();
  std::vector<uint16_t> in(static_cast<size_t>(big * w)), out(static_cast<size_t>(big));
  for (size_t i = 0; i < in.size(); ++i)
    in[i] = f32_to_bf16(float(1 + g_comm->rank() + int(i % 7)));
  auto expect_sums = [&](int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      float want = 0;
      for (int r = 0; r < w; ++r) want += float(1 + r + int((g_comm->rank() * n + i) % 7));
      ASSERT_EQ(bf16_to_f32(out[size_t(i)]), want) << "element " << i << " of " << n;
    }
  };
  int64_t held[2], fits[2], not_fit[2];
  for (int k = 0; k < 2; ++k) {
    Communicator& c = k == 0 ? *fresh : counting;
    const bool real = k == 0;
    g_comm->barrier();
    const int64_t base = acct.current(MemCategory::kComm);
    c.keep_staging(Collective::kReduceScatter, kept, DType::kBF16);
    c.keep_staging(Collective::kReduceScatter, kept / 2, DType::kBF16);  // never shrinks
    c.keep_staging(Collective::kReduceScatter, kept, DType::kF32);       // 32-bit: nothing staged
    held[k] = acct.current(MemCategory::kComm) - base;
    acct.reset_peaks();
    c.reduce_scatter(real ? in.data() : nullptr, real ? out.data() : nullptr, kept, DType::kBF16);
    c.all_reduce(real ? out.data() : nullptr, kept, DType::kBF16);
    fits[k] = acct.peak(MemCategory::kComm) - acct.current(MemCategory::kComm);
    if (real) {
      c.reduce_scatter(in.data(), out.data(), kept, DType::kBF16);
      expect_sums(kept);
    }
    acct.reset_peaks();
    c.reduce_scatter(real ? in.data() : nullptr, real ? out.data() : nullptr, big, DType::kBF16);
    not_fit[k] = acct.peak(MemCategory::kComm) - acct.current(MemCategory::kComm);
    if (real) expect_sums(big);
  }
  const int64_t f32 = 4;
  EXPECT_EQ(held[0], w > 1 ? (w + 1) * kept * f32 : 0);
  EXPECT_EQ(fits[0], 0);
  EXPECT_EQ(not_fit[0], w > 1 ? (w + 1) * big * f32 : 0);
  EXPECT_EQ(held[1], held[0]);
  EXPECT_EQ(fits[1], fits[0]);
  EXPECT_EQ(not_fit[1], not_fit[0]);
}

// Sum16::kNative (zero.reduce_dtype bf16/fp16): a 16-bit reduce-scatter or
// all-reduce is the left fold of every rank's values in rank order, each
// partial sum rounded to the 16-bit dtype, bit for bit as recomputed here; it
// differs from the fp32-staged sum by no more than the bound docs/ZERO.md
// states; at world 2 (one addition, one rounding) both modes give the same
// bits; crafted elements show the difference at world >= 3.
double gamma_k(int k, double u) { return k * u / (1 - k * u); }

// Rank r's value at element i: either sign, magnitudes 2^-7 .. 2^4 (no
// subnormals, where the relative bound would not hold).
float native_input(int r, int64_t i) {
  uint64_t h = (uint64_t(r) * 0x9E3779B97F4A7C15ull) ^ (uint64_t(i) * 0xBF58476D1CE4E5B9ull);
  h ^= h >> 31;
  h *= 0x94D049BB133111EBull;
  h ^= h >> 29;
  const double mag = double(500 + int64_t(h % 501)) / 1000.0;
  return float(std::ldexp((h >> 40) & 1 ? -mag : mag, int((h >> 20) % 11) - 6));
}

TEST(Comm, NativeSixteenBitSumsAreRankOrderedRoundedSums) {
  const int w = g_comm->size(), me = g_comm->rank();
  std::unique_ptr<Communicator> native = g_comm->split(SplitPlan::whole(g_comm->size()));
  native->set_sum16(Sum16::kNative);
  const int64_t n = 3000;  // per rank
  for (DType t : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(t));
    const double u = t == DType::kBF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
    // Elements 0-7 crafted: rank 0 gives 2^8 (bf16) or 2^11 (fp16), the others 1;
    // 2^8 + 1 is a tie that rounds (to even) back to 2^8, again at every step.
    const float big = t == DType::kBF16 ? 256.0f : 2048.0f;
    auto input = [&](int r, int64_t i) {
      if (i % n < 8) return r == 0 ? big : 1.0f;
      return native_input(r, i);
    };
    auto round16 = [&](float v) {
      return t == DType::kBF16 ? bf16_to_f32(f32_to_bf16(v)) : f16_to_f32(f32_to_f16(v));
    };
    Buf send(t, n * w), got_native(t, n), got_staged(t, n);
    for (int64_t i = 0; i < n * w; ++i) send.set(i, input(me, i));
    native->reduce_scatter(send.data(), got_native.data(), n, t);
    g_comm->reduce_scatter(send.data(), got_staged.data(), n, t);
    int64_t fold_bad = 0, bound_bad = 0, same = 0;
    for (int64_t j = 0; j < n; ++j) {
      const int64_t i = int64_t(me) * n + j;
      float acc = round16(input(0, i));
      double sum_abs = std::fabs(double(acc));
      for (int r = 1; r < w; ++r) {
        const float x = round16(input(r, i));
        acc = round16(acc + x);
        sum_abs += std::fabs(double(x));
      }
      if (got_native.get(j) != double(acc)) ++fold_bad;
      const double bound =
          (gamma_k(w - 1, u) + u + 2 * gamma_k(w - 1, std::ldexp(1.0, -24))) * sum_abs;
      if (std::fabs(got_native.get(j) - got_staged.get(j)) > bound) ++bound_bad;
      if (got_native.get(j) == got_staged.get(j)) ++same;
    }
    EXPECT_EQ(fold_bad, 0) << "native sums that are not the rank-ordered 16-bit fold";
    EXPECT_EQ(bound_bad, 0) << "native sums farther from the fp32-staged ones than the bound";
    if (w == 2) {
      EXPECT_EQ(same, n) << "world 2: one addition, one rounding in either mode";
    }
    if (me == 0 && w >= 3) {
      // 2^8 + (w-1) ones: native stays at 2^8; staged rounds big + w - 1 once.
      EXPECT_EQ(got_native.get(0), big);
      EXPECT_EQ(got_staged.get(0), double(round16(big + float(w - 1))));
      EXPECT_NE(got_native.get(0), got_staged.get(0));
    }
    // All-reduce: the same fold over whole buffers, identical on every rank.
    Buf ar(t, n);
    for (int64_t i = 0; i < n; ++i) ar.set(i, input(me, i));
    native->all_reduce(ar.data(), n, t);
    int64_t ar_bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      float acc = round16(input(0, i));
      for (int r = 1; r < w; ++r) acc = round16(acc + round16(input(r, i)));
      if (ar.get(i) != double(acc)) ++ar_bad;
    }
    EXPECT_EQ(ar_bad, 0);
    EXPECT_TRUE(same_on_all_ranks(fnv1a(ar.bytes)));
  }
}

// Sum16::kNative's staging: every rank's 16-bit contribution (2 * w * count
// bytes), kept once by keep_staging and counted alike by the counting
// communicator; a sum that does not fit stages its own.
TEST(Comm, NativeKeptStagingIsHeldOnceAndCountedAsMpi) {
  const int w = g_comm->size();
  const int64_t kept = 64, big = 100;
  std::unique_ptr<Communicator> fresh = g_comm->split(SplitPlan::whole(g_comm->size()));
  CountingCommunicator counting(g_comm->rank(), w);
  fresh->set_sum16(Sum16::kNative);
  counting.set_sum16(Sum16::kNative);
  MemoryAccountant& acct = MemoryAccountant::global();
  std::vector<uint16_t> in(static_cast<size_t>(big * w), f32_to_bf16(1.0f)),
      out(static_cast<size_t>(big));
  int64_t held[2], fits[2], not_fit[2];
  for (int k = 0; k < 2; ++k) {
    Communicator& c = k == 0 ? *fresh : counting;
    const bool real = k == 0;
    g_comm->barrier();
    const int64_t base = acct.current(MemCategory::kComm);
    c.keep_staging(Collective::kReduceScatter, kept, DType::kBF16);
    held[k] = acct.current(MemCategory::kComm) - base;
    acct.reset_peaks();
    c.reduce_scatter(real ? in.data() : nullptr, real ? out.data() : nullptr, kept, DType::kBF16);
    c.all_reduce(real ? out.data() : nullptr, kept, DType::kBF16);
    fits[k] = acct.peak(MemCategory::kComm) - acct.current(MemCategory::kComm);
    acct.reset_peaks();
    c.reduce_scatter(real ? in.data() : nullptr, real ? out.data() : nullptr, big, DType::kBF16);
    not_fit[k] = acct.peak(MemCategory::kComm) - acct.current(MemCategory::kComm);
    if (real) {
      for (int64_t i = 0; i < big; ++i) ASSERT_EQ(bf16_to_f32(out[size_t(i)]), float(w));
    }
  }
  EXPECT_EQ(held[0], w > 1 ? 2 * w * kept : 0);
  EXPECT_EQ(fits[0], 0);
  EXPECT_EQ(not_fit[0], w > 1 ? 2 * w * big : 0);
  EXPECT_EQ(held[1], held[0]);
  EXPECT_EQ(fits[1], fits[0]);
  EXPECT_EQ(not_fit[1], not_fit[0]);
}

// On ranks other than 0: print only failed assertions, prefixed with the rank.
}  // namespace
}  // namespace fd::dist

int main(int argc, char** argv) {
  return fd::dist::testing::run_mpi_tests(argc, argv, &fd::dist::g_comm);
}
