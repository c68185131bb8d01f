// The vectorised kernels' two paths against each other (CUDA builds only: it
// calls kernels/ directly). Every converted kernel runs twice on the same bits:
// with each operand at the start of its own device block (16-byte aligned: the
// 128-bit steps, then the tail, since no size here is a whole number of steps)
// and with each operand one element further on (no pointer aligned: the scalar
// path throughout, the per-element arithmetic of the kernels before they were
// vectorised). Every operand must hold the same bits afterwards, and every
// output must have changed. Skipped without a usable GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "lib/tensor/device.h"
#include "lib/tensor/dtype.h"
#include "tests/gpu/require_gpu.h"

namespace fd {
namespace {

using kernels::DT;

constexpr DT kFloatDts[] = {DT::kF32, DT::kBF16, DT::kF16};

std::string name(DT dt) { return std::string(dtype_name(static_cast<DType>(dt))); }

std::vector<float> randn(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<float> abs_randn(int64_t n, uint32_t seed) {
  std::vector<float> v = randn(n, seed);
  for (float& x : v) x = std::fabs(x) + 0.1f;
  return v;
}

// The operands of one kernel call, each in its own device block, placed at
// the block's start (shifted false) or one element past it (shifted true).
class Operands {
 public:
  explicit Operands(bool shifted) : shifted_(shifted) {}
  ~Operands() {
    for (const Block& b : blocks_) kernels::device_free(b.base, b.bytes);
  }
  Operands(const Operands&) = delete;
  Operands& operator=(const Operands&) = delete;

  // A new operand holding `values` rounded to dt; `output`: the call must change it.
  void* add(DT dt, const std::vector<float>& values, bool output = false) {
    const size_t elem = dtype_size(static_cast<DType>(dt));
    std::vector<uint8_t> host(values.size() * elem);
    convert_f32_to(static_cast<DType>(dt), values.data(), host.data(), values.size());
    return add_bytes(host, elem, output);
  }

  // A new i32 operand (ids, targets, counts).
  void* add_i32(const std::vector<int32_t>& values) {
    std::vector<uint8_t> host(values.size() * sizeof(int32_t));
    std::memcpy(host.data(), values.data(), host.size());
    return add_bytes(host, sizeof(int32_t), false);
  }

  size_t count() const { return blocks_.size(); }
  bool output(size_t k) const { return blocks_[k].output; }
  size_t elem(size_t k) const { return blocks_[k].elem; }
  const std::vector<uint8_t>& initial(size_t k) const { return blocks_[k].initial; }

  // Operand k's bytes now (synchronises).
  std::vector<uint8_t> bytes(size_t k) const {
    const Block& b = blocks_[k];
    std::vector<uint8_t> host(b.initial.size());
    kernels::copy_to_host(host.data(), address(b), host.size());
    return host;
  }

 private:
  struct Block {
    void* base;
    size_t bytes;
    size_t elem;
    bool output;
    std::vector<uint8_t> initial;
  };

  void* address(const Block& b) const {
    return static_cast<char*>(b.base) + (shifted_ ? b.elem : 0);
  }

  void* add_bytes(const std::vector<uint8_t>& host, size_t elem, bool output) {
    const size_t bytes = host.size() + elem;  // room for the shift
    blocks_.push_back({kernels::device_alloc(bytes), bytes, elem, output, host});
    const Block& b = blocks_.back();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.base) % 16, 0u) << "the aligned run would not be";
    kernels::copy_to_device(address(b), host.data(), host.size());
    return address(b);
  }

  bool shifted_;
  std::vector<Block> blocks_;
};

// Runs `call` (which adds its operands, then launches) aligned and shifted and
// compares every operand element by element, reporting the first difference.
void expect_paths_agree(const std::string& what, const std::function<void(Operands&)>& call) {
  Operands aligned(false), shifted(true);
  call(aligned);
  call(shifted);
  kernels::synchronize();
  ASSERT_EQ(aligned.count(), shifted.count());
  for (size_t k = 0; k < aligned.count(); ++k) {
    const std::vector<uint8_t> a = aligned.bytes(k), s = shifted.bytes(k);
    const size_t elem = aligned.elem(k);
    for (size_t i = 0; i < a.size(); i += elem) {
      if (std::memcmp(&a[i], &s[i], elem) != 0) {
        ADD_FAILURE() << what << ": operand " << k << " differs at element " << i / elem
                      << " between the vector and the scalar path";
        break;
      }
    }
    if (aligned.output(k)) {
      EXPECT_NE(a, aligned.initial(k)) << what << ": operand " << k << " was not written";
    }
  }
}

// Sizes: below one 8-element step, and a few hundred steps plus a tail of 3.
constexpr int64_t kSizes[] = {5, 1003};

TEST(GpuVecPaths, CastFillAccumulate) {
  REQUIRE_GPU();
  for (int64_t n : kSizes) {
    for (DT a : kFloatDts) {
      for (DT b : kFloatDts) {
        const std::string tag = name(a) + "->" + name(b) + " n " + std::to_string(n);
        expect_paths_agree("cast " + tag, [&](Operands& o) {
          void* src = o.add(a, randn(n, 1, 3.0f));
          void* dst = o.add(b, randn(n, 2), true);
          kernels::cast(src, a, dst, b, n, 0.37f);
        });
        expect_paths_agree("accumulate " + tag, [&](Operands& o) {
          void* dst = o.add(b, randn(n, 3), true);
          void* src = o.add(a, randn(n, 4));
          kernels::accumulate(dst, b, src, a, n, -1.7f);
        });
      }
      expect_paths_agree("fill " + name(a), [&](Operands& o) {
        kernels::fill(o.add(a, randn(n, 5), true), a, n, 0.3f);
      });
    }
  }
}

TEST(GpuVecPaths, AddGeluSwiglu) {
  REQUIRE_GPU();
  for (int64_t n : kSizes) {
    for (DT a : kFloatDts) {
      for (DT b : kFloatDts) {
        const std::string tag = name(a) + "," + name(b) + " n " + std::to_string(n);
        for (DT out : {a, b, DT::kF32}) {
          expect_paths_agree("add " + tag + "->" + name(out), [&](Operands& o) {
            void* x = o.add(a, randn(n, 6));
            void* y = o.add(b, randn(n, 7));
            kernels::add(x, a, y, b, o.add(out, randn(n, 8), true), out, n);
          });
          expect_paths_agree("swiglu_forward " + tag + "->" + name(out), [&](Operands& o) {
            void* g = o.add(a, randn(n, 9, 2.0f));
            void* u = o.add(b, randn(n, 10));
            kernels::swiglu_forward(g, a, u, b, o.add(out, randn(n, 11), true), out, n);
          });
        }
        expect_paths_agree("gelu_backward " + tag, [&](Operands& o) {
          void* x = o.add(a, randn(n, 12, 2.0f));
          void* dy = o.add(a, randn(n, 13));
          void* dx = o.add(b, randn(n, 14), true);
          kernels::gelu_backward(x, dy, a, dx, dx, b, n);
        });
        // No prior (a fresh gradient: 0 + term, the output's old contents unread) and a prior
        // elsewhere (a borrowed gradient, read, not written).
        expect_paths_agree("gelu_backward priors " + tag, [&](Operands& o) {
          void* x = o.add(a, randn(n, 12, 2.0f));
          void* dy = o.add(a, randn(n, 13));
          const void* prior = o.add(b, randn(n, 26));
          kernels::gelu_backward(x, dy, a, nullptr, o.add(b, randn(n, 14), true), b, n);
          kernels::gelu_backward(x, dy, a, prior, o.add(b, randn(n, 27), true), b, n);
        });
        // The typed case (gate, up in one dtype, both gradients in one) and,
        // with up in b != a, the mixed kernel; each with one gradient skipped too.
        for (int want = 1; want <= 3; ++want) {
          expect_paths_agree(
              "swiglu_backward " + tag + " want " + std::to_string(want), [&](Operands& o) {
                void* g = o.add(a, randn(n, 15, 2.0f));
                void* u = o.add(b, randn(n, 16));
                void* dy = o.add(DT::kF32, randn(n, 17));
                void* dg = (want & 1) != 0 ? o.add(b, randn(n, 18), true) : nullptr;
                void* du = (want & 2) != 0 ? o.add(b, randn(n, 19), true) : nullptr;
                kernels::swiglu_backward(g, a, u, b, dy, DT::kF32, dg, dg, b, du, du, b, n);
              });
        }
      }
      expect_paths_agree("gelu_forward " + name(a), [&](Operands& o) {
        void* x = o.add(a, randn(n, 20, 2.0f));
        kernels::gelu_forward(x, o.add(a, randn(n, 21), true), a, n);
      });
    }
  }
}

TEST(GpuVecPaths, DropoutAndAdamW) {
  REQUIRE_GPU();
  for (int64_t n : kSizes) {
    for (DT a : kFloatDts) {
      expect_paths_agree("dropout_forward " + name(a), [&](Operands& o) {
        void* x = o.add(a, randn(n, 22));
        kernels::dropout_forward(x, o.add(a, randn(n, 23), true), a, n, 0.3f, 1234, 7);
      });
      for (DT b : kFloatDts) {
        const std::string tag = name(a) + "," + name(b) + " n " + std::to_string(n);
        expect_paths_agree("dropout_backward " + tag, [&](Operands& o) {
          void* dy = o.add(a, randn(n, 24));
          void* dx = o.add(b, randn(n, 25), true);
          kernels::dropout_backward(dy, a, dx, dx, b, n, 0.3f, 1234, 7);
        });
        for (bool with16 : {false, true}) {
          expect_paths_agree("adamw " + tag + (with16 ? " out16" : ""), [&](Operands& o) {
            float* p = static_cast<float*>(o.add(DT::kF32, randn(n, 26), true));
            void* g = o.add(a, randn(n, 27, 0.01f));
            float* m = static_cast<float*>(o.add(DT::kF32, randn(n, 28, 0.01f), true));
            float* v = static_cast<float*>(o.add(DT::kF32, abs_randn(n, 29), true));
            void* out16 = with16 ? o.add(b, randn(n, 30), true) : nullptr;
            const kernels::AdamWArgs args{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.01f, 0.3f, 0.5f};
            kernels::adamw(p, g, a, m, v, n, args, out16, b);
          });
        }
      }
    }
  }
}

// Row kernels: rows of C = 72 (a whole number of steps: 128-bit rows when
// aligned) and C = 76 (4-element steps only: fp32 rows vectorised, 16-bit ones not).
constexpr int64_t kRows = 37;
constexpr int64_t kCols[] = {72, 76};

TEST(GpuVecPaths, NormsForwardAndBackward) {
  REQUIRE_GPU();
  const int64_t R = kRows;
  for (int64_t C : kCols) {
    for (DT x : kFloatDts) {
      for (DT w : {x, DT::kF32}) {
        const std::string tag = name(x) + "," + name(w) + " C " + std::to_string(C);
        expect_paths_agree("layernorm_forward " + tag, [&](Operands& o) {
          void* xp = o.add(x, randn(R * C, 31, 2.0f));
          void* wp = o.add(w, randn(C, 32));
          void* bp = o.add(w, randn(C, 33));
          void* out = o.add(x, randn(R * C, 34), true);
          float* mean = static_cast<float*>(o.add(DT::kF32, randn(R, 35), true));
          float* rstd = static_cast<float*>(o.add(DT::kF32, randn(R, 36), true));
          kernels::layernorm_forward(xp, x, wp, bp, w, out, x, mean, rstd, R, C, 1e-5f);
        });
        expect_paths_agree("add_norm_forward " + tag, [&](Operands& o) {
          void* xp = o.add(x, randn(R * C, 57, 2.0f));
          void* rp = o.add(x, randn(R * C, 58));
          void* wp = o.add(w, randn(C, 59));
          void* bp = o.add(w, randn(C, 60));
          float* mean = static_cast<float*>(o.add(DT::kF32, randn(R, 35), true));
          float* rstd = static_cast<float*>(o.add(DT::kF32, randn(R, 36), true));
          kernels::add_layernorm_forward(xp, rp, o.add(x, randn(R * C, 61), true), x, wp, bp, w,
                                         o.add(x, randn(R * C, 62), true), x, mean, rstd, R, C,
                                         1e-5f);
          kernels::add_rms_norm_forward(xp, rp, o.add(x, randn(R * C, 63), true), x, wp, w,
                                        o.add(x, randn(R * C, 64), true), x, rstd, R, C, 1e-5f);
        });
        expect_paths_agree("rms_norm_forward " + tag, [&](Operands& o) {
          void* xp = o.add(x, randn(R * C, 37, 2.0f));
          void* wp = o.add(w, randn(C, 38));
          void* out = o.add(x, randn(R * C, 39), true);
          float* rstd = static_cast<float*>(o.add(DT::kF32, randn(R, 40), true));
          kernels::rms_norm_forward(xp, x, wp, w, out, x, rstd, R, C, 1e-5f);
        });
        for (DT g : kFloatDts) {
          const std::string bt = tag + " grad " + name(g);
          expect_paths_agree("layernorm_backward " + bt, [&](Operands& o) {
            void* xp = o.add(x, randn(R * C, 41, 2.0f));
            void* wp = o.add(w, randn(C, 42));
            const float* mean = static_cast<const float*>(o.add(DT::kF32, randn(R, 43)));
            const float* rstd = static_cast<const float*>(o.add(DT::kF32, abs_randn(R, 44)));
            void* dy = o.add(g, randn(R * C, 45));
            void* dx = o.add(g, randn(R * C, 46), true);
            void* dw = o.add(DT::kF32, randn(C, 47), true);
            void* db = o.add(DT::kF32, randn(C, 48), true);
            kernels::layernorm_backward(xp, x, wp, w, mean, rstd, dy, g, dx, dx, g, dw, db,
                                        DT::kF32, R, C);
          });
          expect_paths_agree("rms_norm_backward " + bt, [&](Operands& o) {
            void* xp = o.add(x, randn(R * C, 49, 2.0f));
            void* wp = o.add(w, randn(C, 50));
            const float* rstd = static_cast<const float*>(o.add(DT::kF32, abs_randn(R, 51)));
            void* dy = o.add(g, randn(R * C, 52));
            void* dx = o.add(g, randn(R * C, 53), true);
            void* dw = o.add(w, randn(C, 54), true);
            kernels::rms_norm_backward(xp, x, wp, w, rstd, dy, g, dx, dx, g, dw, w, R, C);
          });
          expect_paths_agree("norm_backward priors " + bt, [&](Operands& o) {
            void* xp = o.add(x, randn(R * C, 49, 2.0f));
            void* wp = o.add(w, randn(C, 50));
            const float* mean = static_cast<const float*>(o.add(DT::kF32, randn(R, 43)));
            const float* rstd = static_cast<const float*>(o.add(DT::kF32, abs_randn(R, 51)));
            void* dy = o.add(g, randn(R * C, 52));
            const void* prior = o.add(g, randn(R * C, 55));
            kernels::rms_norm_backward(xp, x, wp, w, rstd, dy, g, nullptr,
                                       o.add(g, randn(R * C, 53), true), g, nullptr, w, R, C);
            kernels::layernorm_backward(xp, x, wp, w, mean, rstd, dy, g, prior,
                                        o.add(g, randn(R * C, 56), true), g, nullptr, nullptr,
                                        DT::kF32, R, C);
          });
        }
      }
    }
  }
}

TEST(GpuVecPaths, EmbeddingRopeCrossEntropy) {
  REQUIRE_GPU();
  const int64_t V = 11, n = 29;  // ids repeat: the backward adds runs of rows
  std::vector<int32_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[size_t(i)] = int32_t((i * 7) % V);
  for (int64_t C : kCols) {
    for (DT a : kFloatDts) {
      expect_paths_agree(
          "embedding_forward " + name(a) + " C " + std::to_string(C), [&](Operands& o) {
            void* w = o.add(a, randn(V * C, 55));
            const auto* id = static_cast<const int32_t*>(o.add_i32(ids));
            kernels::embedding_forward(w, a, id, o.add(a, randn(n * C, 56), true), n, C);
          });
      for (DT b : kFloatDts) {
        expect_paths_agree(
            "embedding_backward " + name(a) + "," + name(b) + " C " + std::to_string(C),
            [&](Operands& o) {
              void* dout = o.add(a, randn(n * C, 57));
              const auto* id = static_cast<const int32_t*>(o.add_i32(ids));
              kernels::embedding_backward(dout, a, id, o.add(b, randn(V * C, 58), true), b, n, C,
                                          V);
            });
      }
    }
  }
  // RoPE: head size 16 (half 8: whole steps) and 12 (half 6: one pair at a time).
  const int64_t B = 2, T = 5, H = 3;
  for (int64_t D : {int64_t{16}, int64_t{12}}) {
    for (DT a : kFloatDts) {
      for (DT b : kFloatDts) {
        const std::string tag = name(a) + "," + name(b) + " D " + std::to_string(D);
        expect_paths_agree("rope_forward " + tag, [&](Operands& o) {
          void* x = o.add(a, randn(B * T * H * D, 59));
          const auto* c = static_cast<const float*>(o.add(DT::kF32, randn(T * D, 60)));
          const auto* s = static_cast<const float*>(o.add(DT::kF32, randn(T * D, 61)));
          kernels::rope_forward(x, a, c, s, nullptr, o.add(b, randn(B * T * H * D, 62), true), b, B,
                                T, H * D, D);
        });
        expect_paths_agree("rope_backward " + tag, [&](Operands& o) {
          void* dy = o.add(a, randn(B * T * H * D, 63));
          const auto* c = static_cast<const float*>(o.add(DT::kF32, randn(T * D, 64)));
          const auto* s = static_cast<const float*>(o.add(DT::kF32, randn(T * D, 65)));
          void* dx = o.add(b, randn(B * T * H * D, 66), true);
          kernels::rope_backward(dy, a, c, s, nullptr, dx, dx, b, B, T, H * D, D);
          // No prior (0 + term, the output unread), then a prior elsewhere (read only).
          kernels::rope_backward(dy, a, c, s, nullptr, nullptr,
                                 o.add(b, randn(B * T * H * D, 67), true), b, B, T, H * D, D);
          kernels::rope_backward(dy, a, c, s, nullptr, dx, o.add(b, randn(B * T * H * D, 68), true),
                                 b, B, T, H * D, D);
        });
      }
    }
  }
  // Cross-entropy backward: V = 1000 (whole steps per row) and 1003 (one at a time).
  const int64_t rows = 6;
  const std::vector<int32_t> targets = {3, -100, 999, 0, 500, 17};
  for (int64_t Vc : {int64_t{1000}, int64_t{1003}}) {
    for (DT a : kFloatDts) {
      for (DT b : kFloatDts) {
        const std::string tag = name(a) + "," + name(b) + " V " + std::to_string(Vc);
        expect_paths_agree("cross_entropy_backward " + tag, [&](Operands& o) {
          void* logits = o.add(a, randn(rows * Vc, 67, 3.0f));
          const auto* t = static_cast<const int32_t*>(o.add_i32(targets));
          const auto* lse = static_cast<const float*>(o.add(DT::kF32, abs_randn(rows, 68)));
          const auto* dloss = static_cast<const float*>(o.add(DT::kF32, {0.7f}));
          const auto* count = static_cast<const int32_t*>(o.add_i32({5}));
          kernels::cross_entropy_backward(logits, a, t, lse, dloss, count, rows, Vc, -100,
                                          o.add(b, randn(rows * Vc, 69), true), b, false);
          // A fresh gradient: written whole, the ignored row's 0 included.
          kernels::cross_entropy_backward(logits, a, t, lse, dloss, count, rows, Vc, -100,
                                          o.add(b, randn(rows * Vc, 70), true), b, true);
        });
      }
    }
  }
}

}  // namespace
}  // namespace fd
