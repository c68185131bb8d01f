// train_bench: throughput of one fdtrain training step (forward, backward,
// clipping, AdamW) on synthetic tokens, next to the sgemm peak measured in the
// same process. Prints one table row per config; `make bench` runs it.
// Every config is a DecoderConfig: GPT-2 ones through gpt2_config, Llama ones
// written out; both go through the same nn::Decoder, loss and AdamW step.
//
//   train_bench [--steps N] [--warmup N] [--threads N] [CONFIG...]
//   CONFIG: S, M, 124M (GPT-2), Llama-S (Llama family); default S M
#include <cblas.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "lib/autograd/tape.h"
#include "lib/base/rng.h"
#include "lib/nn/decoder.h"
#include "lib/ops/blas_setup.h"
#include "lib/optim/adamw.h"
#include "lib/optim/clip.h"
#include "lib/tensor/storage.h"

namespace {

using Clock = std::chrono::steady_clock;

struct BenchConfig {
  const char* name;
  fd::nn::DecoderConfig model;
  int batch;
  int seq_len;
};

// Llama family (RMSNorm, RoPE, GQA, SwiGLU, untied head) by its sizes.
fd::nn::DecoderConfig llama_config(int layers, int64_t hidden, int heads, int kv_heads,
                                   int64_t intermediate, int64_t vocab, int64_t max_positions) {
  fd::nn::DecoderConfig c;
  c.family = fd::nn::ModelFamily::kLlama;
  c.num_layers = layers;
  c.hidden_size = hidden;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = int(hidden / heads);
  c.intermediate_size = intermediate;
  c.vocab_size = vocab;
  c.max_position_embeddings = max_positions;
  c.validate();
  return c;
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Best-of-3 sgemm GFLOP/s on n x n x n.
double sgemm_gflops(int n) {
  std::vector<float> a(size_t(n) * n, 0.5f), b(size_t(n) * n, 0.25f), c(size_t(n) * n);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
              0.0f, c.data(), n);
  double best = 1e30;
  for (int r = 0; r < 3; ++r) {
    auto t = Clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                0.0f, c.data(), n);
    best = std::min(best, seconds_since(t));
  }
  return 2.0 * n * double(n) * n / best / 1e9;
}

double peak_rss_mib() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_maxrss) / 1024.0;  // ru_maxrss is KiB on Linux
}

void run_config(const BenchConfig& c, int steps, int warmup, double peak) {
  fd::nn::Decoder model(c.model);
  model.init_weights(1);
  const std::vector<const fd::nn::FlatParamGroup*> groups = model.groups();
  fd::optim::AdamW opt(groups, {6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f});
  fd::Tensor tokens = fd::Tensor::empty(fd::Shape{c.batch, c.seq_len}, fd::DType::kI32);
  fd::Tensor targets = fd::Tensor::empty(fd::Shape{c.batch, c.seq_len}, fd::DType::kI32);
  double total = 0;
  size_t allocs_before = 0;
  for (int s = 0; s < warmup + steps; ++s) {
    for (int i = 0; i < c.batch * c.seq_len; ++i) {
      tokens.i32()[i] =
          int32_t(fd::uniform_below(fd::hash_words(s, i, 1), uint64_t(c.model.vocab_size)));
      targets.i32()[i] =
          int32_t(fd::uniform_below(fd::hash_words(s, i, 2), uint64_t(c.model.vocab_size)));
    }
    if (s == warmup) allocs_before = fd::cpu_allocator::system_allocations();
    auto t = Clock::now();
    model.zero_grads();
    fd::autograd::Tape tape;
    fd::autograd::TapeScope scope(tape);
    fd::autograd::Variable loss = model.loss(tokens, targets);
    tape.backward(loss);
    double norm = fd::optim::global_grad_norm(groups);
    fd::optim::clip_grad_norm(groups, norm, 1.0f);
    opt.step(6e-4f);
    if (s >= warmup) total += seconds_since(t);
  }
  size_t steady_allocs = fd::cpu_allocator::system_allocations() - allocs_before;
  double ms = total / steps * 1e3;
  double tok_s = double(c.batch) * c.seq_len / (ms / 1e3);
  double gflops = tok_s * c.model.flops_per_token(c.seq_len) / 1e9;
  // The head + loss's chunks (ops::head_chunk_plan): one chunk keeps its logits (no recompute).
  const fd::ops::HeadChunkPlan& head = model.head_plan();
  std::printf("%-7s %10.1f %10.0f %9.1f %8.1f%% %9.0f %12.2f %14zu %7lldx%lld\n", c.name, ms, tok_s,
              gflops, 100.0 * gflops / peak, peak_rss_mib(), double(c.model.num_params()) / 1e6,
              steady_allocs, (long long)head.chunks, (long long)head.chunk_rows);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  fd::ops::select_blas_kernel(argv);
  int steps = 5, warmup = 1, threads = 1;
  std::vector<std::string> names;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc)
      steps = std::atoi(argv[++i]);
    else if (a == "--warmup" && i + 1 < argc)
      warmup = std::atoi(argv[++i]);
    else if (a == "--threads" && i + 1 < argc)
      threads = std::atoi(argv[++i]);
    else
      names.push_back(a);
  }
  if (names.empty()) names = {"S", "M"};
  fd::ops::set_blas_threads(threads);
  using fd::nn::gpt2_config;
  const std::vector<BenchConfig> configs = {
      {"S", gpt2_config({4, 4, 256, 256, 256}), 8, 256},
      {"M", gpt2_config({6, 8, 512, 256, 256}), 4, 256},
      // batch 1: seconds per step on a CPU
      {"124M", gpt2_config({12, 12, 768, 50257, 1024}), 1, 1024},
      // L6, hidden 512, 8 heads / 2 kv heads (head_dim 64), I1408, V32000, untied head
      {"Llama-S", llama_config(6, 512, 8, 2, 1408, 32000, 256), 4, 256},
  };
  double peak = sgemm_gflops(2048);
  std::printf("fdtrain train_bench: fp32, %d BLAS thread(s), %d timed steps after %d warmup\n",
              threads, steps, warmup);
  std::printf("sgemm 2048^3: %.1f GFLOP/s (OpenBLAS kernel %s)\n", peak,
              fd::ops::blas_kernel_name().c_str());
  std::printf("%-7s %10s %10s %9s %9s %9s %12s %14s %12s\n", "cfg", "ms/step", "tok/s", "GFLOP/s",
              "%peak", "RSS MiB", "params (M)", "steady allocs", "head chunks");
  for (const std::string& n : names) {
    bool found = false;
    for (const auto& c : configs)
      if (n == c.name) {
        run_config(c, steps, warmup, peak);
        found = true;
      }
    if (!found) {
      std::fprintf(stderr, "train_bench: unknown config '%s' (S, M, 124M, Llama-S)\n", n.c_str());
      return 2;
    }
  }
  return 0;
}
