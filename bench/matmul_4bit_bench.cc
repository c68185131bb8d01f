// matmul_4bit_bench: quant::Linear4bit (a panel of a 4-bit weight's rows dequantized, then one
// BLAS GEMM per panel) against the same GEMM over the weight already in fp32, forward
// (y = x W^T) and input gradient (dx = dy W), and the cost of dequantizing the whole weight once.
// Prints a table; asserts nothing. Threads: OPENBLAS_NUM_THREADS.
//
//   matmul_4bit_bench [--tokens M] [--reps R] [--panel ELEMENTS] [SIZE...]
//   M default 512; R timed runs per row, the best kept (default 3); SIZE: square weights
//   SIZE x SIZE (default 1024 2048 4096), NF4 with double quantization, block size 64.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "lib/ops/gemm.h"
#include "lib/quant/matmul_4bit.h"

namespace {

double seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <typename F>
double best_of(int reps, F f) {
  f();  // warm-up
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t = seconds();
    f();
    best = std::min(best, seconds() - t);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace fd;
  int64_t m = 512;
  int reps = 3;
  quant::Matmul4bitOptions options;
  std::vector<int64_t> sizes;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--tokens") && i + 1 < argc) {
      m = std::atol(argv[++i]);
    } else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--panel") && i + 1 < argc) {
      options.panel_elements = std::atol(argv[++i]);
    } else {
      sizes.push_back(std::atol(argv[i]));
    }
  }
  if (sizes.empty()) sizes = {1024, 2048, 4096};
  std::printf("%6s %6s %10s %10s %6s %10s %10s %6s %10s %6s\n", "tokens", "size", "gemm fwd",
              "4bit fwd", "ratio", "gemm dx", "4bit dx", "ratio", "dequant", "panel");
  std::mt19937 rng(37);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t n : sizes) {
    const int64_t k = n;
    std::vector<float> w(size_t(n * k)), x(size_t(m * k)), y(size_t(m * n)), dx(size_t(m * k));
    for (float& v : w) v = 0.02f * normal(rng);
    for (float& v : x) v = normal(rng);
    const quant::Quantized4bit q = quant::quantize(w, {n, k}, {}, "bench");
    const std::vector<float> wf = quant::dequantize(q);
    const quant::Linear4bit lin(q, options);
    const double g_fwd = best_of(reps, [&] {
      ops::gemm(false, true, m, n, k, 1.0f, x.data(), k, wf.data(), k, 0.0f, y.data(), n);
    });
    const double q_fwd = best_of(reps, [&] { lin.forward(x.data(), m, y.data()); });
    const double g_dx = best_of(reps, [&] {
      ops::gemm(false, false, m, k, n, 1.0f, y.data(), n, wf.data(), k, 0.0f, dx.data(), k);
    });
    const double q_dx = best_of(reps, [&] { lin.backward_input(y.data(), m, dx.data(), false); });
    const std::vector<float> absmax = quant::block_absmax(q);
    std::vector<float> all(size_t(n * k));
    const double deq =
        best_of(reps, [&] { quant::dequantize_range(q, absmax, 0, n * k, all.data()); });
    std::printf("%6ld %6ld %8.2fms %8.2fms %6.2f %8.2fms %8.2fms %6.2f %8.2fms %6ld\n", long(m),
                long(n), g_fwd * 1e3, q_fwd * 1e3, q_fwd / g_fwd, g_dx * 1e3, q_dx * 1e3,
                q_dx / g_dx, deq * 1e3, long(lin.panel_rows()));
  }
  return 0;
}
