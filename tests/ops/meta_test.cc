// Every op on the meta device allocates what it allocates on the CPU, and
// computes nothing: forward + backward of each op, in f32, bf16 and f16, run
// once on the CPU and once on meta, must move the memory accountant the same
// way (the peak and what is left after backward, per category).
#include <gtest/gtest.h>

#include <array>
#include <functional>
#include <random>

#include "lib/autograd/tape.h"
#include "lib/dist/local_communicator.h"
#include "lib/ops/adamw.h"
#include "lib/ops/attention.h"
#include "lib/ops/cross_entropy.h"
#include "lib/ops/dropout.h"
#include "lib/ops/elementwise.h"
#include "lib/ops/embedding.h"
#include "lib/ops/gelu.h"
#include "lib/ops/layernorm.h"
#include "lib/ops/linear_cross_entropy.h"
#include "lib/ops/matmul.h"
#include "lib/ops/reduce.h"
#include "lib/ops/rms_norm.h"
#include "lib/ops/rope.h"
#include "lib/ops/swiglu.h"
#include "lib/ops/vocab_parallel_cross_entropy.h"

namespace fd::ops {
namespace {

using Bytes = std::array<int64_t, kNumMemCategories>;

Bytes currents() {
  Bytes b{};
  for (int i = 0; i < kNumMemCategories; ++i)
    b[size_t(i)] = MemoryAccountant::global().current(MemCategory(i));
  return b;
}

struct Usage {
  Bytes peak{}, after{};  // relative to the accountant before the run
};

// The test body builds its inputs, runs forward and backward, then calls done()
// while everything it made is still alive.
using Body = std::function<void(const std::function<void()>& done)>;

Usage measure(Device device, const Body& body) {
  DeviceScope scope(device);
  MemoryAccountant& acct = MemoryAccountant::global();
  const Bytes base = currents();
  acct.reset_peaks();
  Usage u;
  body([&] {
    const Bytes now = currents();
    for (int i = 0; i < kNumMemCategories; ++i)
      u.after[size_t(i)] = now[size_t(i)] - base[size_t(i)];
  });
  for (int i = 0; i < kNumMemCategories; ++i)
    u.peak[size_t(i)] = acct.peak(MemCategory(i)) - base[size_t(i)];
  EXPECT_EQ(currents(), base) << "the body left memory behind on " << device.str();
  return u;
}

void expect_same_on_meta(const std::string& what, const Body& body) {
  SCOPED_TRACE(what);
  const Usage cpu = measure(Device::cpu(), body);
  const Usage meta = measure(Device::meta(), body);
  for (int i = 0; i < kNumMemCategories; ++i) {
    const std::string_view cat = mem_category_name(MemCategory(i));
    EXPECT_EQ(meta.peak[size_t(i)], cpu.peak[size_t(i)]) << "peak of " << cat;
    EXPECT_EQ(meta.after[size_t(i)], cpu.after[size_t(i)]) << "after backward, " << cat;
  }
  EXPECT_GT(cpu.peak[size_t(MemCategory::kActivations)], 0);
}

// Random values on the default device (on meta the values are dropped).
Tensor randn(const Shape& shape, DType dtype, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(size_t(shape.numel()));
  for (float& x : v) x = dist(rng);
  return Tensor::from_vector(v, shape, dtype);
}

// Ids in [0, n) (and -1 every `ignore_every` elements when positive).
Tensor ids(const Shape& shape, int n, int ignore_every = 0) {
  std::vector<float> v(size_t(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] =
        ignore_every > 0 && i % size_t(ignore_every) == 1 ? -1.0f : float((i * 7 + 3) % size_t(n));
  return Tensor::from_vector(v, shape, DType::kI32, MemCategory::kOther);
}

// backward from y with every output gradient 1.
void backward(autograd::Tape& tape, const Variable& y) { tape.backward(y, 1.0f); }

const DType kDtypes[] = {DType::kF32, DType::kBF16, DType::kF16};

class MetaOps : public ::testing::TestWithParam<DType> {};

TEST_P(MetaOps, Elementwise) {
  const DType dt = GetParam();
  expect_same_on_meta("add", [dt](const auto& done) {
    Variable a(randn(Shape{3, 5}, dt), true), b(randn(Shape{3, 5}, DType::kF32, 2), true);
    autograd::Tape tape;
    autograd::TapeScope scope(tape);
    Variable y = add(a, b);
    backward(tape, y);
    done();
  });
  expect_same_on_meta("add, one input frozen", [dt](const auto& done) {
    Variable a(randn(Shape{3, 5}, dt), true), b(randn(Shape{3, 5}, dt, 2), false);
    autograd::Tape tape;
    autograd::TapeScope scope(tape);
    backward(tape, add(a, b));
    done();
  });
  expect_same_on_meta("scale", [dt](const auto& done) {
    Variable x(randn(Shape{4, 6}, dt), true);
    autograd::Tape tape;
    autograd::TapeScope scope(tape);
    backward(tape, scale(x, 0.25f));
    done();
  });
}

TEST_P(MetaOps, GeluAndDropout) {
  const DType dt = GetParam();
  expect_same_on_meta("gelu", [dt](const auto& done) {
    Variable x(randn(Shape{2, 3, 7}, dt), true);
    autograd::Tape tape;
    autograd::TapeScope scope(tape);
    backward(tape, gelu(x));
    done();
  });
  expect_same_on_meta("dropout", [dt](const auto& done) {
    Variable x(randn(Shape{2, 9}, dt), true);
    autograd::Tape tape;
    autograd::TapeScope scope(tape);
    backward(tape, dropout(x, 0.2f, 7, 3));
    done();
  });
}

TEST_P(MetaOps, Embedding) {
  const DType dt = GetParam();
  expect_same_on_meta("embedding", [dt](const auto& done) {
    Variable w(randn(Shape{11, 8}, dt), true);
    Tensor tok = ids(Shape{2, 5}, 11);
    autograd::Tape tape;
    autograd::TapeScope scope(tape);
    backward(tape, embedding(w, tok));
    done();
  });
  expect_same_on_meta("embedding, ids from the CPU", [dt](const auto& done) {
    Variable w(randn(Shape{11, 8}, dt), true);
    Tensor host = Tensor::empty(Shape{4}, DType::kI32, MemCategory::kOther, Device::cpu());
    for (int i = 0; i < 4; ++i) host.i32()[i] = (3 * i + 1) % 11;
    autograd::Tape tape;
    autograd::TapeScope scope(tape);
    backward(tape, embedding(w, host));
    done();
  });
}

TEST_P(MetaOps, Layernorm) {
  const DType dt = GetParam();
  for (bool with_bias : {true, false}) {
    for (bool frozen : {false, true}) {
      expect_same_on_meta(
          fmt::format("layernorm bias={} frozen={}", with_bias, frozen), [=](const auto& done) {
            Variable x(randn(Shape{2, 3, 8}, dt), true);
            Variable w(randn(Shape{8}, dt, 2), !frozen);
            Variable b = with_bias ? Variable(randn(Shape{8}, dt, 3), !frozen) : Variable();
            autograd::Tape tape;
            autograd::TapeScope scope(tape);
            backward(tape, layernorm(x, w, b));
            done();
          });
    }
  }
}

TEST_P(MetaOps, LlamaOps) {
  const DType dt = GetParam();
  for (bool frozen : {false, true}) {
    expect_same_on_meta(fmt::format("rms_norm frozen={}", frozen), [=](const auto& done) {
      Variable x(randn(Shape{2, 3, 8}, dt), true);
      Variable w(randn(Shape{8}, dt, 2), !frozen);
      autograd::Tape tape;
      autograd::TapeScope scope(tape);
      backward(tape, rms_norm(x, w));
      done();
    });
    expect_same_on_meta(fmt::format("swiglu frozen={}", frozen), [=](const auto& done) {
      Variable g(randn(Shape{2, 3, 8}, dt), true);
      Variable u(randn(Shape{2, 3, 8}, dt, 2), !frozen);
      autograd::Tape tape;
      autograd::TapeScope scope(tape);
      backward(tape, swiglu(g, u));
      done();
    });
  }
  expect_same_on_meta("rope", [dt](const auto& done) {
    const RopeTables tab = rope_tables(RopeOptions{.head_dim = 4}, 5);
    Variable x(randn(Shape{2, 3, 8}, dt), true);
    autograd::Tape tape;
    autograd::TapeScope scope(tape);
    backward(tape, rope(x, tab.cos, tab.sin));
    done();
  });
}

TEST_P(MetaOps, Matmul) {
  const DType dt = GetParam();
  for (bool trans_b : {false, true}) {
    for (bool with_bias : {true, false}) {
      for (bool frozen : {false, true}) {
        expect_same_on_meta(
            fmt::format("matmul trans_b={} bias={} frozen={}", trans_b, with_bias, frozen),
            [=](const auto& done) {
              Variable a(randn(Shape{2, 3, 8}, dt), true);
              Variable b(randn(trans_b ? Shape{6, 8} : Shape{8, 6}, dt, 2), !frozen);
              Variable bias = with_bias ? Variable(randn(Shape{6}, dt, 3), !frozen) : Variable();
              autograd::Tape tape;
              autograd::TapeScope scope(tape);
              backward(tape,
                       matmul(a, b, bias, MatmulOptions{.trans_a = false, .trans_b = trans_b}));
              done();
            });
      }
    }
  }
  expect_same_on_meta("matmul trans_a", [dt](const auto& done) {
    Variable a(randn(Shape{8, 5}, dt), true);
    Variable b(randn(Shape{8, 6}, DType::kF32, 2), true);
    autograd::Tape tape;
    autograd::TapeScope scope(tape);
    backward(tape, matmul(a, b, {}, MatmulOptions{.trans_a = true, .trans_b = false}));
    done();
  });
}

TEST_P(MetaOps, Attention) {
  const DType dt = GetParam();
  for (int64_t T : {5, 130}) {  // one block of query rows, and two (the second partial)
    expect_same_on_meta(fmt::format("causal_attention T={}", T), [=](const auto& done) {
      Variable qkv(randn(Shape{2, T, 3 * 16}, dt), true);
      autograd::Tape tape;
      autograd::TapeScope scope(tape);
      backward(tape, causal_attention(qkv, 2));
      done();
    });
  }
  // Separate q, k, v with grouped key/value heads; frozen k and v take the
  // backward's other path (no dk, dv buffers).
  for (int64_t T : {5, 130}) {
    for (bool frozen_kv : {false, true}) {
      const std::string what = fmt::format("causal_attention gqa T={} frozen_kv={}", T, frozen_kv);
      expect_same_on_meta(what, [=](const auto& done) {
        Variable q(randn(Shape{2, T, 4 * 8}, dt), true);
        Variable k(randn(Shape{2, T, 2 * 8}, dt, 2), !frozen_kv);
        Variable v(randn(Shape{2, T, 2 * 8}, dt, 3), !frozen_kv);
        autograd::Tape tape;
        autograd::TapeScope scope(tape);
        backward(tape, causal_attention(q, k, v, 4, 2));
        done();
      });
    }
  }
}

TEST_P(MetaOps, CrossEntropy) {
  const DType dt = GetParam();
  for (int ignore_every : {0, 3}) {
    expect_same_on_meta(fmt::format("cross_entropy ignore_every={}", ignore_every),
                        [=](const auto& done) {
                          Variable logits(randn(Shape{2, 5, 13}, dt), true);
                          Tensor tg = ids(Shape{2, 5}, 13, ignore_every);
                          autograd::Tape tape;
                          autograd::TapeScope scope(tape);
                          Variable loss = cross_entropy(logits, tg);
                          EXPECT_EQ(loss.dtype(), DType::kF32);
                          backward(tape, loss);
                          done();
                        });
  }
}

TEST_P(MetaOps, LinearCrossEntropy) {
  const DType dt = GetParam();
  for (int ignore_every : {0, 3}) {
    for (bool train_w : {true, false}) {
      expect_same_on_meta(
          fmt::format("linear_cross_entropy ignore_every={} train_w={}", ignore_every, train_w),
          [=](const auto& done) {
            Variable h(randn(Shape{2, 5, 8}, dt), true);
            Variable w(randn(Shape{13, 8}, dt, 2), train_w);
            Tensor tg = ids(Shape{2, 5}, 13, ignore_every);
            autograd::Tape tape;
            autograd::TapeScope scope(tape);
            Variable loss = linear_cross_entropy(h, w, tg, -1, 3);
            EXPECT_EQ(loss.dtype(), DType::kF32);
            backward(tape, loss);
            done();
          });
    }
  }
}

TEST_P(MetaOps, LinearTokenLogps) {
  const DType dt = GetParam();
  for (int ignore_every : {0, 3}) {
    for (bool train_w : {true, false}) {
      expect_same_on_meta(
          fmt::format("linear_token_logps ignore_every={} train_w={}", ignore_every, train_w),
          [=](const auto& done) {
            Variable h(randn(Shape{2, 5, 8}, dt), true);
            Variable w(randn(Shape{13, 8}, dt, 2), train_w);
            Tensor tg = ids(Shape{2, 5}, 13, ignore_every);
            autograd::Tape tape;
            autograd::TapeScope scope(tape);
            Variable logps = linear_token_logps(h, w, tg, -1, 3);
            EXPECT_EQ(logps.dtype(), DType::kF32);
            backward(tape, logps);
            done();
          });
    }
  }
}

// A world of one: the shard is the whole head (the collectives, on meta with null buffers,
// are the local communicator's no-ops; their bytes: vocab_parallel_cross_entropy_test.cc).
TEST_P(MetaOps, VocabParallelCrossEntropy) {
  const DType dt = GetParam();
  for (int ignore_every : {0, 3}) {
    for (bool train_w : {true, false}) {
      expect_same_on_meta(fmt::format("vocab_parallel_cross_entropy ignore_every={} train_w={}",
                                      ignore_every, train_w),
                          [=](const auto& done) {
                            dist::LocalCommunicator one;
                            Variable h(randn(Shape{2, 5, 8}, dt), true);
                            Variable w(randn(Shape{13, 8}, dt, 2), train_w);
                            Tensor tg = ids(Shape{2, 5}, 13, ignore_every);
                            autograd::Tape tape;
                            autograd::TapeScope scope(tape);
                            Variable loss =
                                vocab_parallel_cross_entropy(h, w, tg, 0, 13, one, -1, 3);
                            EXPECT_EQ(loss.dtype(), DType::kF32);
                            backward(tape, loss);
                            done();
                          });
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, MetaOps, ::testing::ValuesIn(kDtypes),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// Reductions, in-place scaling and AdamW allocate nothing anywhere, and on
// meta read and write nothing.
TEST(MetaOps, ReductionsAndAdamWTouchNothing) {
  DeviceScope scope(Device::meta());
  const Bytes base = currents();
  Tensor g = Tensor::empty(Shape{100}, DType::kBF16);
  Tensor f = Tensor::empty(Shape{100});
  EXPECT_EQ(sum_of_squares(g), 0.0);
  EXPECT_TRUE(all_finite(g));
  scale_(g, 0.5f);
  add_(f, g);
  Tensor p = Tensor::empty(Shape{100}), m = Tensor::zeros(Shape{100}),
         v = Tensor::zeros(Shape{100});
  adamw_update(p, g, 0.5f, m, v, g, 10, 50, AdamWStep{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1});
  Bytes want = base;
  want[size_t(MemCategory::kActivations)] += 5 * 400 - 200;  // g is bf16
  EXPECT_EQ(currents(), want);
}

// A forgotten skip fails loudly rather than computing on nothing.
TEST(MetaOps, Fp32AccessToAMetaTensorFails) {
  Tensor t = Tensor::empty(Shape{4}, DType::kF32, MemCategory::kActivations, Device::meta());
  EXPECT_DEATH(t.f32(), "meta tensor");
}

}  // namespace
}  // namespace fd::ops
