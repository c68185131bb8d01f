// The head's three GEMMs (logits = h W^T, dh = dlogits W, dW += dlogits^T h) at a
// vocabulary V and at V padded to a multiple of 64, with OpenBLAS on one thread:
// whether padding the head's rows pays on the CPU (issue 18; bench/RESULTS.md).
// Not part of `make bench`; build and run by hand:
//   g++ -O2 -std=c++20 bench/head_padding.cc -o /tmp/head_padding -lopenblas && /tmp/head_padding
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

namespace {

// Median of `reps` timings of f, in seconds.
template <typename F>
double median_seconds(F f, int reps) {
  std::vector<double> v;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    v.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main() {
  openblas_set_num_threads(1);
  const int M = 512, C = 768;  // a chunk of rows, GPT-2 small's width
  for (int V : {50257, 50304, 32000, 32064, 151936}) {
    std::vector<float> h(size_t(M) * C, 0.01f), w(size_t(V) * C, 0.02f), logits(size_t(M) * V),
        dw(size_t(V) * C), dh(size_t(M) * C);
    auto fwd = [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, V, C, 1, h.data(), C, w.data(), C, 0,
                  logits.data(), V);
    };
    auto back_h = [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, C, V, 1, logits.data(), V,
                  w.data(), C, 0, dh.data(), C);
    };
    auto back_w = [&] {
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, C, M, 1, logits.data(), V, h.data(),
                  C, 1, dw.data(), C);
    };
    fwd();
    const double a = median_seconds(fwd, 7), b = median_seconds(back_h, 7),
                 c = median_seconds(back_w, 7);
    const double gflop = 2.0 * M * C * V / 1e9;
    std::printf("V %6d: logits %.4f s (%.1f GFLOP/s), dh %.4f s (%.1f), dW %.4f s (%.1f), all %.4f s\n",
                V, a, gflop / a, b, gflop / b, c, gflop / c, a + b + c);
  }
}
