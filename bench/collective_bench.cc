// collective_bench: the ZeRO group's collectives flat against hierarchical (dist.hierarchical;
// lib/dist/hierarchical_communicator.h) and ZeRO++'s quantized reduce-scatter, on the world as
// mpirun placed it (its hosts found by dist::init). Run under mpirun; bench/zeropp_bench.sh runs
// it across simulated hosts with shaped links and reads the links' byte counters around it.
//
//   mpirun ... collective_bench OP MODE [--mib M] [--iters K]
//   OP: all_reduce | reduce_scatter | all_gather; MODE: flat | hierarchical | int8 | int4
//   (int8/int4: reduce_scatter through the quantized all-to-all)
//
// Prints one line from rank 0: the op, the mode, the hosts and ranks, the buffer, the median
// seconds of K timed ops (one untimed first), the algorithm bandwidth (buffer / time), and the
// bytes a rank sent per op in all and across hosts, the largest over ranks (ring model, as
// summary.json's network block counts them).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "lib/dist/hierarchical_communicator.h"
#include "lib/dist/init.h"

namespace {

using Clock = std::chrono::steady_clock;

int usage() {
  std::fprintf(stderr,
               "usage: collective_bench all_reduce|reduce_scatter|all_gather "
               "flat|hierarchical|int8|int4 [--mib M] [--iters K]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace fd::dist;
  auto world = init(&argc, &argv, 600.0);
  if (argc < 3) return usage();
  const std::string op = argv[1], mode = argv[2];
  double mib = 64;
  int iters = 5;
  for (int i = 3; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--mib") == 0) mib = std::atof(argv[i + 1]);
    if (std::strcmp(argv[i], "--iters") == 0) iters = std::atoi(argv[i + 1]);
  }
  if ((op != "all_reduce" && op != "reduce_scatter" && op != "all_gather") ||
      (mode != "flat" && mode != "hierarchical" && mode != "int8" && mode != "int4") ||
      ((mode == "int8" || mode == "int4") && op != "reduce_scatter") || iters < 1 || mib <= 0)
    return usage();
  const int n = world->size();
  // The whole buffer: `mib` MiB of fp32, a multiple of n elements.
  const int64_t count = int64_t(mib * (1 << 20) / 4) / n * n;
  std::unique_ptr<HierarchicalCommunicator> h =
      HierarchicalCommunicator::make(*world, mode == "hierarchical", "collective_bench");
  std::vector<float> a(static_cast<size_t>(count)), b(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) a[size_t(i)] = float((i % 97) * 0.01 + world->rank());
  const WireFormat codes{mode == "int4" ? 4 : 8, mode == "int4" ? 64 : 256};
  auto once = [&] {
    if (op == "all_reduce") {
      h->all_reduce(a.data(), count, fd::DType::kF32);
    } else if (op == "reduce_scatter") {
      if (mode == "int8" || mode == "int4") {
        h->quantized_reduce_scatter_async(a.data(), b.data(), count / n, fd::DType::kF32, codes)
            ->wait();
      } else {
        h->reduce_scatter(a.data(), b.data(), count / n, fd::DType::kF32);
      }
    } else {
      h->all_gather(a.data() + world->rank() * (count / n), b.data(), count / n, fd::DType::kF32);
    }
  };
  once();  // connections, staging
  world->barrier();
  h->reset_counters();
  std::vector<double> secs;
  for (int k = 0; k < iters; ++k) {
    world->barrier();
    const auto t0 = Clock::now();
    once();
    world->barrier();
    secs.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(secs.begin(), secs.end());
  const double median = secs[secs.size() / 2];
  double mine[2] = {double(h->bytes_sent()) / iters, double(h->inter_node_bytes()) / iters};
  std::vector<double> all(size_t(2 * n));
  world->all_gather_f64(mine, all.data(), 2);
  double most = 0, most_across = 0;
  for (int r = 0; r < n; ++r) {
    most = std::max(most, all[size_t(2 * r)]);
    most_across = std::max(most_across, all[size_t(2 * r + 1)]);
  }
  if (world->rank() == 0)
    std::printf(
        "%s %s: %d hosts x %d ranks, %.0f MiB fp32: median %.3f s of %d, %.1f MB/s; per op the "
        "busiest rank sends %.1f MB, %.1f MB across hosts\n",
        op.c_str(), mode.c_str(), world->num_nodes(), n / world->num_nodes(),
        double(count) * 4 / (1 << 20), median, iters, double(count) * 4 / median / 1e6, most / 1e6,
        most_across / 1e6);
  h.reset();
  world.reset();
  finalize();
  return 0;
}
