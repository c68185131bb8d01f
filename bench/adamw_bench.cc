// adamw_bench: the CPU AdamW pass (ops::adamw_update on flat tensors,
// lib/ops/cpu/adamw.cc) in GB/s of state traffic, per kernel (scalar, AVX2,
// AVX-512) and thread count, next to a STREAM triad measured in the same
// process at the same thread count. Prints a table; asserts nothing.
//
//   adamw_bench [--n ELEMENTS] [--reps R] [--threads N...]
//   ELEMENTS default 64 Mi (2 GiB of arrays in all: far beyond the caches);
//   R: timed passes per row, the best kept (default 5, after one warm-up pass);
//   --threads default 1 2.
//
// Bytes counted per element, as STREAM counts them (no write-allocate reads):
// AdamW reads p, m, v (fp32) and g, writes p, m, v and, with a compute copy, the
// 16-bit parameters: 28 bytes with fp32 gradients, 4 * 3 + 2 + 4 * 3 + 2 = 28
// with bf16 gradients and a bf16 copy. The triad a[i] = b[i] + s * c[i]: 12.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "lib/ops/adamw.h"
#include "lib/ops/cpu/adamw_isa.h"
#include "lib/tensor/tensor.h"

namespace {

using Clock = std::chrono::steady_clock;
using fd::DType;
using fd::Shape;
using fd::Tensor;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown CPU";
}

// Fills x with values in [lo, hi) from a cheap generator (the values do not matter, only that
// they are finite and the pages are touched).
void fill(float* x, int64_t n, float lo, float hi, uint32_t seed) {
  uint32_t s = seed * 2654435761u + 1;
  for (int64_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    x[i] = lo + (hi - lo) * float(s >> 8) * (1.0f / 16777216.0f);
  }
}

// a[i] = b[i] + s * c[i] over [0, n), split into `threads` contiguous parts.
double triad_seconds(float* a, const float* b, const float* c, int64_t n, int threads) {
  const float s = 3.0f;
  auto part = [=](int k) {
    const int64_t lo = n * k / threads, hi = n * (k + 1) / threads;
    float* __restrict pa = a;
    const float* __restrict pb = b;
    const float* __restrict pc = c;
    for (int64_t i = lo; i < hi; ++i) pa[i] = pb[i] + s * pc[i];
  };
  std::vector<std::thread> others;
  others.reserve(size_t(threads));
  // Threads are started before the clock, and wait for it: the pass alone is timed.
  std::atomic<bool> go{false};
  std::atomic<int> ready{0};
  for (int k = 1; k < threads; ++k) {
    others.emplace_back([&, k] {
      ready.fetch_add(1);
      while (!go.load()) std::this_thread::yield();
      part(k);
    });
  }
  while (ready.load() < threads - 1) std::this_thread::yield();
  const Clock::time_point t0 = Clock::now();
  go.store(true);
  part(0);
  for (std::thread& t : others) t.join();
  return seconds_since(t0);
}

struct Row {
  int threads;
  std::string pass;
  std::string kernel;
  double seconds;
  double bytes;
  double triad_gbs;
};

void print_row(const Row& r) {
  const double gbs = r.bytes / r.seconds / 1e9;
  std::printf("%-8d %-34s %-8s %10.2f %10.2f", r.threads, r.pass.c_str(), r.kernel.c_str(),
              r.seconds * 1e3, gbs);
  if (r.triad_gbs > 0)
    std::printf(" %9.1f%%\n", 100.0 * gbs / r.triad_gbs);
  else
    std::printf(" %10s\n", "100.0%");
}

}  // namespace

int main(int argc, char** argv) {
  int64_t n = int64_t(64) << 20;
  int reps = 5;
  std::vector<int> thread_counts;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--n" && i + 1 < argc) {
      n = std::atoll(argv[++i]);
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (a == "--threads") {
      while (i + 1 < argc && argv[i + 1][0] != '-') thread_counts.push_back(std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: adamw_bench [--n ELEMENTS] [--reps R] [--threads N...]\n");
      return 2;
    }
  }
  if (thread_counts.empty()) thread_counts = {1, 2};
  if (n < 1 || reps < 1) {
    std::fprintf(stderr, "adamw_bench: --n and --reps must be positive\n");
    return 2;
  }

  namespace cpu = fd::ops::cpu;
  std::vector<cpu::AdamWIsa> kernels;
  std::string kernel_names;
  for (cpu::AdamWIsa isa : cpu::kAdamWIsas) {
    if (!cpu::adamw_isa_supported(isa)) continue;
    kernels.push_back(isa);
    kernel_names.append(" ").append(cpu::adamw_isa_name(isa));
  }
  std::printf("adamw_bench: %s, %u hardware threads\n", cpu_name().c_str(),
              std::thread::hardware_concurrency());
  std::printf(
      "N = %lld elements (%.3g Mi), best of %d passes after 1 warm-up; kernels:%s "
      "(default: %s)\n",
      static_cast<long long>(n), double(n) / (1 << 20), reps, kernel_names.c_str(),
      std::string(cpu::adamw_isa_name(cpu::adamw_best_isa())).c_str());
  std::printf(
      "GB/s = bytes counted / best time: AdamW 28 B per element (read p, m, v, g; write "
      "p, m, v [, 16-bit p]), triad 12 B (STREAM's count: its stores also read a first,\n"
      "write-allocate, so the triad moves 16 B; AdamW stores over lines it has just read)\n\n");

  const Shape shape{n};
  Tensor p = Tensor::empty(shape), m = Tensor::empty(shape), v = Tensor::empty(shape);
  Tensor g32 = Tensor::empty(shape), g16 = Tensor::empty(shape, DType::kBF16);
  Tensor c16 = Tensor::empty(shape, DType::kBF16);
  Tensor ta = Tensor::empty(shape), tb = Tensor::empty(shape), tc = Tensor::empty(shape);
  fill(p.f32(), n, -1.0f, 1.0f, 1);
  fill(m.f32(), n, -1e-3f, 1e-3f, 2);
  fill(v.f32(), n, 0.0f, 1e-6f, 3);
  fill(g32.f32(), n, -1e-3f, 1e-3f, 4);
  fd::convert_f32_to(DType::kBF16, g32.f32(), g16.raw(), size_t(n));
  fd::convert_f32_to(DType::kBF16, p.f32(), c16.raw(), size_t(n));
  fill(ta.f32(), n, 0.0f, 1.0f, 5);
  fill(tb.f32(), n, 0.0f, 1.0f, 6);
  fill(tc.f32(), n, 0.0f, 1.0f, 7);

  std::printf("%-8s %-34s %-8s %10s %10s %10s\n", "threads", "pass", "kernel", "ms", "GB/s",
              "of triad");
  fd::ops::AdamWStep step{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0};
  for (int threads : thread_counts) {
    double best = 1e30;
    for (int r = 0; r <= reps; ++r) {
      const double s = triad_seconds(ta.f32(), tb.f32(), tc.f32(), n, threads);
      if (r > 0) best = std::min(best, s);
    }
    const double triad_gbs = 12.0 * double(n) / best / 1e9;
    print_row({threads, "triad a = b + s*c", "-", best, 12.0 * double(n), 0.0});

    fd::ops::set_adamw_threads(threads);
    struct Case {
      const char* name;
      const Tensor* grad;
      const Tensor* copy;
    };
    const Tensor none;
    for (const Case& c : {Case{"adamw fp32 grads", &g32, &none},
                          Case{"adamw bf16 grads + bf16 copy", &g16, &c16}}) {
      for (cpu::AdamWIsa isa : kernels) {
        cpu::set_adamw_isa(isa);
        best = 1e30;
        for (int r = 0; r <= reps; ++r) {
          ++step.step;
          const Clock::time_point t0 = Clock::now();
          fd::ops::adamw_update(p, *c.grad, 1.0f, m, v, *c.copy, 0, n, step);
          const double s = seconds_since(t0);
          if (r > 0) best = std::min(best, s);
        }
        print_row({threads, c.name, std::string(cpu::adamw_isa_name(isa)), best, 28.0 * double(n),
                   triad_gbs});
      }
    }
  }
  cpu::set_adamw_isa(cpu::adamw_best_isa());
  fd::ops::set_adamw_threads(1);
  return 0;
}
