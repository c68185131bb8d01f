// generate_bench: time per generated token of engine::generate() (KV-cached,
// incremental) for 64, 128 and 256 new tokens, next to the full re-run it
// replaced (a forward of the whole sequence for every token). With the cache
// the time per token stays flat as the sequence grows (total time linear in
// the length); the re-run's grows with the length (total quadratic).
//
//   generate_bench [--threads N] [--no-rerun] [CONFIG...]   (CONFIG: S, M; default S)
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "lib/autograd/tape.h"
#include "lib/engine/generate.h"
#include "lib/nn/decoder.h"
#include "lib/ops/blas_setup.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The previous generate(): greedy, a full forward of the sequence per token.
void full_rerun(const fd::nn::Decoder& model, int new_tokens) {
  fd::autograd::NoGradGuard no_grad;
  std::vector<int32_t> seq = {10};
  const int V = int(model.config().vocab_size);
  for (int i = 0; i < new_tokens; ++i) {
    const int64_t T = int64_t(seq.size());
    fd::Tensor tokens = fd::Tensor::empty(fd::Shape{1, T}, fd::DType::kI32);
    std::copy(seq.begin(), seq.end(), tokens.i32());
    std::vector<float> logits = model.forward(tokens).value().to_vector();
    const float* last = logits.data() + (T - 1) * V;
    seq.push_back(int32_t(std::max_element(last, last + V) - last));
  }
}

}  // namespace

int main(int argc, char** argv) {
  fd::ops::select_blas_kernel(argv);
  int threads = 1;
  bool rerun = true;
  std::vector<std::string> configs;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--no-rerun")) {
      rerun = false;
    } else {
      configs.emplace_back(argv[i]);
    }
  }
  if (configs.empty()) configs = {"S"};
  fd::ops::set_blas_threads(threads);
  std::printf("generate_bench: %d BLAS thread(s), kernel %s; ms per generated token\n", threads,
              fd::ops::blas_kernel_name().c_str());
  std::printf("%-6s %-28s %7s %12s %10s %14s %10s\n", "config", "model", "tokens", "kv ms/token",
              "kv total s", "rerun ms/token", "rerun s");
  for (const std::string& name : configs) {
    fd::nn::GptConfig c;
    if (name == "S") {
      c = {4, 4, 256, 256, 512};
    } else if (name == "M") {
      c = {6, 8, 512, 256, 512};
    } else {
      std::fprintf(stderr, "unknown config %s (S or M)\n", name.c_str());
      return 2;
    }
    fd::nn::Decoder model(c);
    model.init_weights(1);
    const std::string desc = fmt::format("L{} H{} C{} V{} T{}", c.n_layer, c.n_head, c.d_model,
                                         c.vocab_size, c.max_seq_len);
    fd::engine::SampleOptions o;
    o.top_k = 1;
    o.max_new_tokens = 16;
    fd::engine::generate(model, {10}, o);  // warm-up
    for (int n : {64, 128, 256}) {
      o.max_new_tokens = n;
      double kv = 1e30;
      for (int rep = 0; rep < 3; ++rep) {  // best of 3
        auto t0 = Clock::now();
        fd::engine::generate(model, {10}, o);
        kv = std::min(kv, seconds_since(t0));
      }
      double full = 0;
      if (rerun) {
        auto t0 = Clock::now();
        full_rerun(model, n);
        full = seconds_since(t0);
      }
      std::printf("%-6s %-28s %7d %12.3f %10.3f %14s %10s\n", name.c_str(), desc.c_str(), n,
                  1e3 * kv / n, kv, rerun ? fmt::format("{:.3f}", 1e3 * full / n).c_str() : "-",
                  rerun ? fmt::format("{:.3f}", full).c_str() : "-");
    }
  }
  return 0;
}
