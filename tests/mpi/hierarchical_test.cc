// HierarchicalCommunicator (lib/dist/hierarchical_communicator.h) under mpirun -n 2, -n 4 and
// -n 6, with the nodes given to a copy of the world (set_nodes): every layout of equal runs of
// consecutive ranks: at -n 4 two nodes of two ranks {0, 0, 1, 1}, one node of four, four nodes
// of one; at -n 6 also three nodes of two and two of three (H and L both > 1 and unequal: the
// index math); at -n 2 two nodes of one and one node of two. Inputs with exact sums (small
// integers) give the flat results bit for bit; random fp32 inputs give them to rounding (the sums
// are grouped by node); the bytes sent and sent across nodes follow the formulas in the header, and
// the counting backend counts what MPI does; quantized reduce-scatters (ZeRO++'s qgZ, int8 and
// int4) stay within the documented bound of the float64 sum; a layout whose nodes are not equal
// runs of consecutive ranks is refused with a message naming it.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "lib/base/error.h"
#include "lib/dist/counting_communicator.h"
#include "lib/dist/hierarchical_communicator.h"
#include "tests/mpi/mpi_test_main.h"

namespace fd::dist {
namespace {

Communicator* g_comm = nullptr;

// The world's copy with the given node of each rank.
std::unique_ptr<Communicator> with_nodes(const std::vector<int>& nodes) {
  std::unique_ptr<Communicator> c = g_comm->split(SplitPlan::whole(g_comm->size()));
  std::vector<std::string> names;
  for (int i = 0; i < g_comm->size(); ++i) names.push_back("host" + std::to_string(i));
  c->set_nodes(nodes, names);
  return c;
}

// The node layouts this world size can test: equal runs of consecutive ranks.
std::vector<std::vector<int>> layouts() {
  const int n = g_comm->size();
  std::vector<std::vector<int>> out;
  for (int l = 1; l <= n; ++l) {
    if (n % l != 0) continue;
    std::vector<int> nodes;
    for (int r = 0; r < n; ++r) nodes.push_back(r / l);
    out.push_back(nodes);
  }
  return out;
}

std::vector<float> exact_values(int64_t n, int rank) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = float((rank + 1) * ((i % 13) + 1));
  return v;
}

std::vector<float> random_values(int64_t n, int rank, uint32_t seed) {
  std::mt19937 rng(seed * 101 + uint32_t(rank));
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0.0, scale = 0.0;
  for (size_t i = 0; i < a.size(); ++i) scale = std::max(scale, std::fabs(double(b[i])));
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::fabs(double(a[i]) - double(b[i])) / scale);
  return worst;
}

TEST(Hierarchical, ExactSumsEqualTheFlatOnesOnEveryLayout) {
  const int n = g_comm->size(), me = g_comm->rank();
  for (const std::vector<int>& nodes : layouts()) {
    auto flat = with_nodes(nodes);
    auto h = HierarchicalCommunicator::make(*flat, true, "dist.hierarchical");
    for (int64_t count : {int64_t(1), int64_t(5), int64_t(1000)}) {
      // reduce-scatter
      const std::vector<float> send = exact_values(n * count, me);
      std::vector<float> got(static_cast<size_t>(count)), want(static_cast<size_t>(count));
      h->reduce_scatter(send.data(), got.data(), count, DType::kF32);
      flat->reduce_scatter(send.data(), want.data(), count, DType::kF32);
      EXPECT_EQ(got, want) << "reduce-scatter, nodes of " << n / flat->num_nodes();
      // all-gather, out of place and in place
      std::vector<float> mine = exact_values(count, me), all(static_cast<size_t>(n * count)),
                         all_flat(static_cast<size_t>(n * count));
      h->all_gather(mine.data(), all.data(), count, DType::kF32);
      flat->all_gather(mine.data(), all_flat.data(), count, DType::kF32);
      EXPECT_EQ(all, all_flat);
      std::vector<float> in_place(static_cast<size_t>(n * count), -1.0f);
      std::copy(mine.begin(), mine.end(), in_place.begin() + me * count);
      h->all_gather(in_place.data() + me * count, in_place.data(), count, DType::kF32);
      EXPECT_EQ(in_place, all_flat);
      // all-reduce, sum (padded to the local ranks) and max; bf16 too (exact small integers)
      for (DType dt : {DType::kF32, DType::kBF16}) {
        std::vector<float> v = exact_values(count, me), w = v;
        std::vector<uint16_t> vb(v.size()), wb(v.size());
        void* a = v.data();
        void* b = w.data();
        if (dt == DType::kBF16) {
          convert_f32_to(dt, v.data(), vb.data(), v.size());
          wb = vb;
          a = vb.data();
          b = wb.data();
        }
        h->all_reduce(a, count, dt);
        flat->all_reduce(b, count, dt);
        if (dt == DType::kF32) {
          EXPECT_EQ(v, w);
        } else {
          EXPECT_EQ(vb, wb);
        }
      }
      std::vector<float> m = exact_values(count, me), m2 = m;
      h->all_reduce(m.data(), count, DType::kF32, ReduceOp::kMax);
      flat->all_reduce(m2.data(), count, DType::kF32, ReduceOp::kMax);
      EXPECT_EQ(m, m2);
    }
  }
}

TEST(Hierarchical, RandomSumsAreTheFlatOnesToRounding) {
  const int n = g_comm->size(), me = g_comm->rank();
  auto flat = with_nodes(layouts()[size_t(n >= 4 ? 1 : 0)]);  // 2 x 2 at -n 4
  auto h = HierarchicalCommunicator::make(*flat, true, "dist.hierarchical");
  const int64_t count = 4099;
  const std::vector<float> send = random_values(n * count, me, 1);
  std::vector<float> got(static_cast<size_t>(count)), want(static_cast<size_t>(count));
  h->reduce_scatter(send.data(), got.data(), count, DType::kF32);
  flat->reduce_scatter(send.data(), want.data(), count, DType::kF32);
  EXPECT_LE(max_rel(got, want), 1e-6);
  std::vector<float> v = random_values(count, me, 2), w = v;
  h->all_reduce(v.data(), count, DType::kF32);
  flat->all_reduce(w.data(), count, DType::kF32);
  EXPECT_LE(max_rel(v, w), 1e-6);
  // Identical on every rank of the all-reduce.
  std::vector<float> all(static_cast<size_t>(n * count));
  g_comm->all_gather(v.data(), all.data(), count, DType::kF32);
  for (int r = 0; r < n; ++r)
    EXPECT_TRUE(std::equal(v.begin(), v.end(), all.begin() + r * count)) << "rank " << r;
}

TEST(Hierarchical, BytesFollowTheHeadersFormulasAndCountingAgrees) {
  const int n = g_comm->size(), me = g_comm->rank();
  for (const std::vector<int>& nodes : layouts()) {
    auto flat = with_nodes(nodes);
    auto h = HierarchicalCommunicator::make(*flat, true, "dist.hierarchical");
    CountingCommunicator counting_world(me, n);
    counting_world.set_nodes(nodes);
    auto hc = HierarchicalCommunicator::make(counting_world, true, "dist.hierarchical");
    const int H = flat->num_nodes(), L = n / H;
    const int64_t count = 1200;  // divisible by every L
    const int64_t S = n * count * 4;
    std::vector<float> send(static_cast<size_t>(n * count), 1.0f), recv(static_cast<size_t>(count));
    h->reduce_scatter(send.data(), recv.data(), count, DType::kF32);
    hc->reduce_scatter(nullptr, nullptr, count, DType::kF32);
    const bool parts = H > 1 && L > 1;
    const int64_t flat_inter =
        (nodes[size_t((me + 1) % n)] != nodes[size_t(me)]) ? S * (n - 1) / n : 0;
    // Inside the node (L-1)/L of S, across (H-1)/H of the H chunks; flat: the ring.
    EXPECT_EQ(h->bytes_sent(), parts ? S * (L - 1) / L + count * 4 * (H - 1) : S * (n - 1) / n);
    EXPECT_EQ(h->inter_node_bytes(), parts ? count * 4 * (H - 1) : flat_inter);
    EXPECT_EQ(hc->bytes_sent(), h->bytes_sent());
    EXPECT_EQ(hc->inter_node_bytes(), h->inter_node_bytes());
    h->reset_counters();
    hc->reset_counters();
    std::vector<float> all(static_cast<size_t>(n * count));
    h->all_gather(recv.data(), all.data(), count, DType::kF32);
    hc->all_gather(nullptr, nullptr, count, DType::kF32);
    EXPECT_EQ(h->inter_node_bytes(), parts ? count * 4 * (H - 1) : flat_inter);
    EXPECT_EQ(hc->bytes_sent(), h->bytes_sent());
    EXPECT_EQ(hc->inter_node_bytes(), h->inter_node_bytes());
    h->reset_counters();
    hc->reset_counters();
    std::vector<float> ar(static_cast<size_t>(n * count), 1.0f);
    h->all_reduce(ar.data(), n * count, DType::kF32);
    hc->all_reduce(nullptr, n * count, DType::kF32);
    EXPECT_EQ(h->inter_node_bytes(), parts ? 2 * S * (H - 1) / (H * L) : 2 * flat_inter);
    EXPECT_EQ(hc->bytes_sent(), h->bytes_sent());
    EXPECT_EQ(hc->inter_node_bytes(), h->inter_node_bytes());
  }
}

TEST(Hierarchical, QuantizedReduceScatterWithinTheBoundOfTheExactSum) {
  const int n = g_comm->size(), me = g_comm->rank();
  for (const std::vector<int>& nodes : layouts()) {
    auto flat = with_nodes(nodes);
    auto h = HierarchicalCommunicator::make(*flat, true, "zero.quantized_gradients");
    const int H = flat->num_nodes(), L = n / H;
    for (int bits : {8, 4}) {
      const WireFormat f{bits, 64};
      const double qmax = bits == 8 ? 127 : 7;
      const int64_t count = 1000;
      const std::vector<float> send = random_values(n * count, me, uint32_t(bits));
      std::vector<float> got(static_cast<size_t>(count));
      h->quantized_reduce_scatter_async(send.data(), got.data(), count, DType::kF32, f)->wait();
      // Every rank's input, to compute the exact sum and the bound here.
      std::vector<float> every(static_cast<size_t>(n) * send.size());
      g_comm->all_gather(send.data(), every.data(), n * count, DType::kF32);
      auto x = [&](int r, int64_t i) { return double(every[size_t(r * n * count + i)]); };
      auto absmax = [&](int r, int64_t i) {  // over i's block of the chunk it lies in
        const int64_t chunk = i / count, b = (i % count) / f.block * f.block;
        double a = 0;
        for (int64_t j = b; j < std::min(b + f.block, count); ++j)
          a = std::max(a, std::fabs(x(r, chunk * count + j)));
        return a;
      };
      double worst = 0.0;
      for (int64_t j = 0; j < count; ++j) {
        const int64_t i = int64_t(me) * count + j;
        double exact = 0.0, bound = 0.0;
        for (int r = 0; r < n; ++r) {
          exact += x(r, i);
          if (L > 1) bound += absmax(r, i) / (2 * qmax);
        }
        if (H > 1) {  // each node's partial is encoded once: bound by its block's absmax
          for (int node = 0; node < H; ++node) {
            const int64_t b = j / f.block * f.block;
            double a = 0;
            for (int64_t k = b; k < std::min(b + f.block, count); ++k) {
              double p = 0, pb = 0;
              for (int l = 0; l < L; ++l) {
                p += x(node * L + l, int64_t(me) * count + k);
                if (L > 1) pb += absmax(node * L + l, int64_t(me) * count + k) / (2 * qmax);
              }
              a = std::max(a, std::fabs(p) + pb);
            }
            bound += a / (2 * qmax);
          }
        }
        const double err = std::fabs(double(got[size_t(j)]) - exact);
        EXPECT_LE(err, bound * (1 + 1e-5) + 1e-5) << "bits " << bits << " H " << H << " at " << j;
        if (bound > 0) worst = std::max(worst, err / bound);
      }
      EXPECT_GT(worst, 0.01) << "bits " << bits;  // the codes do round
    }
    // A non-finite gradient stays non-finite.
    std::vector<float> send(static_cast<size_t>(n * 10), 1.0f), got(10);
    if (me == 0) send[size_t(n * 10 - 1)] = std::numeric_limits<float>::infinity();
    h->quantized_reduce_scatter_async(send.data(), got.data(), 10, DType::kF32, {4, 64})->wait();
    if (me == n - 1) {
      EXPECT_FALSE(std::isfinite(got[9]));
    }
  }
}

TEST(Hierarchical, NodeAllGatherStaysInsideTheNode) {
  const int me = g_comm->rank();
  for (const std::vector<int>& nodes : layouts()) {
    auto flat = with_nodes(nodes);
    auto h = HierarchicalCommunicator::make(*flat, false, "zero.hierarchical_partition");
    const int L = h->local_size();
    std::vector<float> mine = exact_values(5, me), got(static_cast<size_t>(5 * L));
    h->node_all_gather_async(mine.data(), got.data(), 5, DType::kF32)->wait();
    for (int l = 0; l < L; ++l) {
      const std::vector<float> want = exact_values(5, me / L * L + l);
      EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin() + l * 5)) << l;
    }
    EXPECT_EQ(h->inter_node_bytes(), 0);
    EXPECT_EQ(h->bytes_sent(), int64_t(5 * 4) * (L - 1));
  }
}

TEST(Hierarchical, UnequalOrInterleavedNodesAreRefusedByName) {
  if (g_comm->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  for (const std::vector<int>& nodes :
       {std::vector<int>{0, 1, 0, 1}, std::vector<int>{0, 0, 0, 1}}) {
    auto flat = with_nodes(nodes);
    try {
      HierarchicalCommunicator::make(*flat, true, "dist.hierarchical");
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUsage);
      const std::string m = e.what();
      EXPECT_NE(m.find("dist.hierarchical"), std::string::npos) << m;
      EXPECT_NE(m.find("on host host0"), std::string::npos) << m;
      EXPECT_NE(m.find("--map-by slot"), std::string::npos) << m;
    }
  }
}

}  // namespace
}  // namespace fd::dist

int main(int argc, char** argv) {
  return fd::dist::testing::run_mpi_tests(argc, argv, &fd::dist::g_comm);
}
