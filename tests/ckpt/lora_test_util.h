// Helpers for the LoRA tests (tests/ckpt/peft_test.cc, tests/engine/export_test.cc):
// random GPT-2 bases and adapters in Hugging Face names and layouts.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "lib/tensor/tensor.h"

namespace fd::ckpt::testing {

using Named = std::vector<std::pair<std::string, Tensor>>;

constexpr int kWidth = 16;  // C of the tiny model (testing::tiny_config())

inline bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

inline Tensor random_tensor(const Shape& shape, std::mt19937& rng, double scale = 1.0,
                            DType dt = DType::kF32) {
  std::normal_distribution<float> dist(0.0f, float(scale));
  std::vector<float> v(size_t(shape.numel()));
  for (float& x : v) x = dist(rng);
  return Tensor::from_vector(v, shape, dt, MemCategory::kOther);
}

// (in, out) of a block module of a width-C GPT-2.
inline std::pair<int64_t, int64_t> module_dims(const std::string& module, int64_t c) {
  if (module == "attn.c_attn") return {c, 3 * c};
  if (module == "attn.c_proj") return {c, c};
  if (module == "mlp.c_fc") return {c, 4 * c};
  return {4 * c, c};  // mlp.c_proj
}

// Random LoRA pairs (A (r, in), B (out, r)) for `modules` of blocks `layers`,
// in canonical order.
inline Named random_lora(int r, const std::vector<int>& layers,
                         const std::vector<std::string>& modules, uint64_t seed,
                         DType dt = DType::kF32, int64_t c = kWidth) {
  std::mt19937 rng{uint32_t(seed)};
  Named out;
  for (int layer : layers)
    for (const std::string& m : modules) {
      auto [in, o] = module_dims(m, c);
      std::string base = fmt::format("h.{}.{}.", layer, m);
      out.emplace_back(base + "lora_A.weight", random_tensor(Shape{r, in}, rng, 0.5, dt));
      out.emplace_back(base + "lora_B.weight", random_tensor(Shape{o, r}, rng, 0.5, dt));
    }
  return out;
}

// A GPT-2 base in Hugging Face names and layouts (Conv1D (in, out)).
inline Named gpt2_base(int n_layer, int64_t c, int64_t vocab, int64_t seq, uint64_t seed,
                       DType dt = DType::kF32) {
  std::mt19937 rng{uint32_t(seed)};
  Named out;
  out.emplace_back("wte.weight", random_tensor(Shape{vocab, c}, rng, 0.02, dt));
  out.emplace_back("wpe.weight", random_tensor(Shape{seq, c}, rng, 0.02, dt));
  for (int i = 0; i < n_layer; ++i) {
    std::string h = fmt::format("h.{}.", i);
    out.emplace_back(h + "ln_1.weight", random_tensor(Shape{c}, rng, 1.0, dt));
    out.emplace_back(h + "ln_1.bias", random_tensor(Shape{c}, rng, 0.1, dt));
    for (const char* m : {"attn.c_attn", "attn.c_proj"}) {
      auto [in, o] = module_dims(m, c);
      out.emplace_back(h + m + ".weight", random_tensor(Shape{in, o}, rng, 0.02, dt));
      out.emplace_back(h + m + ".bias", random_tensor(Shape{o}, rng, 0.02, dt));
    }
    out.emplace_back(h + "ln_2.weight", random_tensor(Shape{c}, rng, 1.0, dt));
    out.emplace_back(h + "ln_2.bias", random_tensor(Shape{c}, rng, 0.1, dt));
    for (const char* m : {"mlp.c_fc", "mlp.c_proj"}) {
      auto [in, o] = module_dims(m, c);
      out.emplace_back(h + m + ".weight", random_tensor(Shape{in, o}, rng, 0.02, dt));
      out.emplace_back(h + m + ".bias", random_tensor(Shape{o}, rng, 0.02, dt));
    }
  }
  out.emplace_back("ln_f.weight", random_tensor(Shape{c}, rng, 1.0, dt));
  out.emplace_back("ln_f.bias", random_tensor(Shape{c}, rng, 0.1, dt));
  return out;
}

}  // namespace fd::ckpt::testing
