// GPU ops against the CPU backend, on fresh random inputs.
//
// Every op of lib/ops runs forward and backward twice on the same inputs and
// output gradient: on CPU tensors and on CUDA tensors. The test prints one
// PARITY line per (op, dtype) with ||gpu - cpu|| / ||cpu|| of the output and
// of every input gradient, and fails above the bounds: fp32 1e-5,
// bf16 1e-2. Inputs are never all zero (checked). Without a usable GPU every
// test is skipped with the reason (this is what `make test` shows on a
// machine without one); tests/gpu/device_check.sh runs them on a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "lib/autograd/tape.h"
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
#include "lib/optim/adamw.h"
#include "lib/tensor/device.h"
#include "lib/tensor/host_link.h"
#include "lib/tensor/tensor.h"
#include "tests/gpu/require_gpu.h"

namespace fd {
namespace {

using autograd::Variable;

double bound_for(DType t) { return t == DType::kF32 ? 1e-5 : 1e-2; }

std::vector<float> randn(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

double rel_diff(const Tensor& gpu, const Tensor& cpu) {
  std::vector<float> g = gpu.to_vector(), c = cpu.to_vector();
  EXPECT_EQ(g.size(), c.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    num += (double(g[i]) - c[i]) * (double(g[i]) - c[i]);
    den += double(c[i]) * c[i];
  }
  EXPECT_GT(den, 0.0) << "reference is all zero: the comparison would prove nothing";
  return std::sqrt(num / den);
}

struct Input {
  std::vector<float> values;
  Shape shape;
  bool float_input = true;  // false: i32 ids (no gradient)
};

// Runs `op` on `dev` (cpu or cuda:0): inputs in `dtype`, backward from `dy`.
// Returns the output followed by every float input's gradient (host copies).
std::vector<Tensor> run_on(
    Device dev, DType dtype, const std::vector<Input>& inputs,
    const std::function<Variable(const std::vector<Variable>&, const std::vector<Tensor>&)>& op,
    uint32_t dy_seed) {
  DeviceScope scope(dev);
  autograd::Tape tape;
  autograd::TapeScope tape_scope(tape);
  std::vector<Variable> vars;
  std::vector<Tensor> ids;
  for (const Input& in : inputs) {
    if (in.float_input) {
      vars.emplace_back(Tensor::from_vector(in.values, in.shape, dtype), true);
    } else {
      Tensor host = Tensor::empty(in.shape, DType::kI32, MemCategory::kOther, Device::cpu());
      for (int64_t i = 0; i < host.numel(); ++i) host.i32()[i] = int32_t(in.values[size_t(i)]);
      ids.push_back(host);
    }
  }
  Variable y = op(vars, ids);
  std::vector<float> dy = randn(y.value().numel(), dy_seed);
  y.slot()->grad = Tensor::from_vector(dy, y.shape(), y.dtype());
  tape.run_backward();
  std::vector<Tensor> out{y.value().to_device(Device::cpu())};
  for (const Variable& v : vars) out.push_back(v.grad().to_device(Device::cpu()));
  return out;
}

void check_parity(
    const std::string& name, DType dtype, const std::vector<Input>& inputs,
    const std::function<Variable(const std::vector<Variable>&, const std::vector<Tensor>&)>& op) {
  for (const Input& in : inputs) {
    bool nonzero = false;
    for (float v : in.values) nonzero = nonzero || v != 0.0f;
    ASSERT_TRUE(nonzero) << name << ": an all-zero input";
  }
  std::vector<Tensor> cpu = run_on(Device::cpu(), dtype, inputs, op, 77);
  const kernels::AttentionLaunches before = kernels::attention_launches();
  std::vector<Tensor> gpu = run_on(Device::cuda(0), dtype, inputs, op, 77);
  const kernels::AttentionLaunches after = kernels::attention_launches();
  ASSERT_EQ(cpu.size(), gpu.size());
  std::string line = "PARITY op=" + name + " dtype=" + std::string(dtype_name(dtype));
  // Which attention kernels the GPU run took (the device check's table shows it per case).
  const int64_t tensor_cores = after.forward_tensor_cores - before.forward_tensor_cores +
                               after.backward_tensor_cores - before.backward_tensor_cores;
  const int64_t simt =
      after.forward_simt - before.forward_simt + after.backward_simt - before.backward_simt;
  if (tensor_cores + simt > 0) {
    line += std::string(" attention=") + (simt == 0           ? "tensor_cores"
                                          : tensor_cores == 0 ? "simt"
                                                              : "mixed");
    if (kernels::attention_kernels() == kernels::AttentionKernels::kSimt) {
      EXPECT_EQ(tensor_cores, 0) << name << ": tensor cores ran while SIMT was asked for";
    }
  }
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double r = rel_diff(gpu[i], cpu[i]);
    char buf[64];
    std::snprintf(buf, sizeof buf, " %s=%.2e",
                  i == 0 ? "out" : ("grad" + std::to_string(i - 1)).c_str(), r);
    line += buf;
    EXPECT_LE(r, bound_for(dtype)) << name << " " << dtype_name(dtype) << " tensor " << i;
  }
  std::printf("%s (bound %.0e)\n", line.c_str(), bound_for(dtype));
}

class GpuParity : public ::testing::TestWithParam<DType> {};

TEST_P(GpuParity, Matmul) {
  REQUIRE_GPU();
  const int64_t M = 37, K = 70, N = 53;
  for (bool tb : {false, true}) {
    Shape bs = tb ? Shape{N, K} : Shape{K, N};
    check_parity(tb ? "matmul_bt" : "matmul_bias", GetParam(),
                 {{randn(M * K, 1), Shape{M, K}}, {randn(K * N, 2), bs}, {randn(N, 3), Shape{N}}},
                 [tb](const std::vector<Variable>& v, const std::vector<Tensor>&) {
                   return ops::matmul(v[0], v[1], tb ? Variable() : v[2],
                                      ops::MatmulOptions{.trans_a = false, .trans_b = tb});
                 });
  }
}

TEST_P(GpuParity, LayerNorm) {
  REQUIRE_GPU();
  const int64_t R = 45, C = 96;
  check_parity(
      "layernorm", GetParam(),
      {{randn(R * C, 4, 2.0f), Shape{R, C}}, {randn(C, 5), Shape{C}}, {randn(C, 6), Shape{C}}},
      [](const std::vector<Variable>& v, const std::vector<Tensor>&) {
        return ops::layernorm(v[0], v[1], v[2]);
      });
}

TEST_P(GpuParity, Gelu) {
  REQUIRE_GPU();
  check_parity(
      "gelu", GetParam(), {{randn(3001, 7, 2.0f), Shape{3001}}},
      [](const std::vector<Variable>& v, const std::vector<Tensor>&) { return ops::gelu(v[0]); });
}

TEST_P(GpuParity, AddAndScale) {
  REQUIRE_GPU();
  check_parity("add", GetParam(), {{randn(999, 8), Shape{999}}, {randn(999, 9), Shape{999}}},
               [](const std::vector<Variable>& v, const std::vector<Tensor>&) {
                 return ops::add(v[0], v[1]);
               });
  check_parity("scale", GetParam(), {{randn(999, 10), Shape{999}}},
               [](const std::vector<Variable>& v, const std::vector<Tensor>&) {
                 return ops::scale(v[0], 0.37f);
               });
}

TEST_P(GpuParity, Dropout) {
  REQUIRE_GPU();
  check_parity("dropout", GetParam(), {{randn(4099, 11), Shape{4099}}},
               [](const std::vector<Variable>& v, const std::vector<Tensor>&) {
                 return ops::dropout(v[0], 0.1f, 1234, 56);
               });
}

TEST_P(GpuParity, Embedding) {
  REQUIRE_GPU();
  const int64_t V = 50, C = 24, n = 300;  // repeated ids exercise the deterministic scatter
  std::vector<float> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[size_t(i)] = float((i * 7 + 3) % V);
  check_parity("embedding", GetParam(), {{randn(V * C, 12), Shape{V, C}}, {ids, Shape{n}, false}},
               [](const std::vector<Variable>& v, const std::vector<Tensor>& id) {
                 return ops::embedding(v[0], id[0]);
               });
}

// Runs body(suffix, dtype) once per attention implementation dtype dt can take: the
// default choice (tensor cores for 16-bit shapes that fit, kernels::attention_on_tensor_cores),
// then, for 16-bit dtypes, the SIMT fp32 kernels (suffix "_simt"), so both are held to
// the bound and the device check shows both. The bf16 run also covers f16 (suffix "_f16":
// the tensor-core kernels' other mma type).
void for_each_attention_kernels(DType dt,
                                const std::function<void(const std::string&, DType)>& body) {
  body("", dt);
  if (dt == DType::kF32) return;
  kernels::set_attention_kernels(kernels::AttentionKernels::kSimt);
  body("_simt", dt);
  kernels::set_attention_kernels(kernels::AttentionKernels::kTensorCores);
  if (dt == DType::kBF16) body("_f16", DType::kF16);
}

TEST_P(GpuParity, CausalAttention) {
  REQUIRE_GPU();
  for (auto [T, n_head, hs] :
       {std::tuple{70, 2, 64}, std::tuple{33, 3, 32}, std::tuple{130, 1, 128},
        // GPT-2's sequence length, with its head size and Llama's.
        std::tuple{1024, 2, 64}, std::tuple{1024, 1, 128}}) {
    const int64_t B = 2, C = int64_t(n_head) * hs;
    for_each_attention_kernels(GetParam(), [&](const std::string& impl, DType dtype) {
      check_parity("attention_T" + std::to_string(T) + "_hs" + std::to_string(hs) + impl, dtype,
                   {{randn(B * T * 3 * C, 13), Shape{B, T, 3 * C}}},
                   [n_head](const std::vector<Variable>& v, const std::vector<Tensor>&) {
                     return ops::causal_attention(v[0], n_head);
                   });
    });
  }
}

// Separate q, k, v with grouped (GQA) and single (MQA) key/value heads: dk and dv sum
// over each group's query heads, in the backward kernel's registers; each case runs with
// the group's heads in one block (splits 1) and split as the kernel chooses for this GPU
// (these small shapes leave it idle, so it splits them: kernels::set_attention_backward_splits).
TEST_P(GpuParity, CausalAttentionGroupedKv) {
  REQUIRE_GPU();
  for (auto [T, n_head, n_kv_head, hs] :
       {std::tuple{70, 4, 2, 64}, std::tuple{33, 6, 3, 32}, std::tuple{130, 4, 1, 128},
        std::tuple{65, 2, 2, 16}, std::tuple{1024, 4, 1, 128}, std::tuple{130, 4, 2, 80},
        std::tuple{200, 2, 1, 96}})
    for (int splits : {1, 0}) {
      kernels::set_attention_backward_splits(splits);
      const int64_t B = 2, Cq = int64_t(n_head) * hs, Ckv = int64_t(n_kv_head) * hs;
      for_each_attention_kernels(GetParam(), [&](const std::string& impl, DType dtype) {
        check_parity(
            "attention_gqa_T" + std::to_string(T) + "_h" + std::to_string(n_head) + "_kv" +
                std::to_string(n_kv_head) + "_hs" + std::to_string(hs) +
                (splits == 1 ? "_one_block_per_group" : "") + impl,
            dtype,
            {{randn(B * T * Cq, 15), Shape{B, T, Cq}},
             {randn(B * T * Ckv, 16), Shape{B, T, Ckv}},
             {randn(B * T * Ckv, 17), Shape{B, T, Ckv}}},
            [n_head, n_kv_head](const std::vector<Variable>& v, const std::vector<Tensor>&) {
              return ops::causal_attention(v[0], v[1], v[2], n_head, n_kv_head);
            });
      });
      kernels::set_attention_backward_splits(0);
    }
}

// Packed rows (doc_starts, host i32 ids): documents crossing the kernels' 64-row tiles,
// a one-token document and padding-like one-token documents at the end.
std::vector<float> packed_starts(int64_t B, const std::vector<int>& lens) {
  std::vector<float> s;
  for (int64_t b = 0; b < B; ++b) {
    int at = 0;
    for (int len : lens) {
      for (int i = 0; i < len; ++i) s.push_back(float(at));
      at += len;
    }
  }
  return s;
}

TEST_P(GpuParity, CausalAttentionPacked) {
  REQUIRE_GPU();
  const std::vector<int> lens = {50, 1, 90, 3, 1, 1};  // T = 146
  const int64_t B = 2, T = 146, n_head = 4, n_kv_head = 2, hs = 64;
  const int64_t Cq = n_head * hs, Ckv = n_kv_head * hs;
  for_each_attention_kernels(GetParam(), [&](const std::string& impl, DType dtype) {
    check_parity("attention_packed_T146_gqa" + impl, dtype,
                 {{randn(B * T * Cq, 41), Shape{B, T, Cq}},
                  {randn(B * T * Ckv, 42), Shape{B, T, Ckv}},
                  {randn(B * T * Ckv, 43), Shape{B, T, Ckv}},
                  {packed_starts(B, lens), Shape{B, T}, false}},
                 [](const std::vector<Variable>& v, const std::vector<Tensor>& t) {
                   return ops::causal_attention(v[0], v[1], v[2], 4, 2, t[0]);
                 });
    const int64_t C = 2 * 32;
    check_parity("attention_packed_T146_qkv" + impl, dtype,
                 {{randn(B * T * 3 * C, 44), Shape{B, T, 3 * C}},
                  {packed_starts(B, lens), Shape{B, T}, false}},
                 [](const std::vector<Variable>& v, const std::vector<Tensor>& t) {
                   return ops::causal_attention(v[0], 2, t[0]);
                 });
  });
}

TEST_P(GpuParity, RopePositions) {
  REQUIRE_GPU();
  const int64_t B = 2, T = 9, H = 2, D = 64;
  std::vector<float> pos;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) pos.push_back(float(t < 4 ? t : t - 4));
  ops::RopeOptions o;
  o.head_dim = D;
  check_parity("rope_positions", GetParam(),
               {{randn(B * T * H * D, 45, 2.0f), Shape{B, T, H * D}}, {pos, Shape{B, T}, false}},
               [o, T](const std::vector<Variable>& v, const std::vector<Tensor>& t) {
                 const ops::RopeTables tables = ops::rope_tables(o, T);
                 return ops::rope(v[0], tables.cos, tables.sin, t[0]);
               });
}

TEST_P(GpuParity, CrossEntropy) {
  REQUIRE_GPU();
  const int64_t R = 40, V = 300;
  std::vector<float> targets(R);
  for (int64_t r = 0; r < R; ++r) targets[size_t(r)] = r % 9 == 0 ? -1.0f : float((r * 31) % V);
  check_parity("cross_entropy", GetParam(),
               {{randn(R * V, 14, 3.0f), Shape{R, V}}, {targets, Shape{R}, false}},
               [](const std::vector<Variable>& v, const std::vector<Tensor>& t) {
                 return ops::cross_entropy(v[0], t[0], -1);
               });
}

TEST_P(GpuParity, RmsNorm) {
  REQUIRE_GPU();
  const int64_t R = 45, C = 96;
  check_parity("rms_norm", GetParam(),
               {{randn(R * C, 31, 2.0f), Shape{R, C}}, {randn(C, 32), Shape{C}}},
               [](const std::vector<Variable>& v, const std::vector<Tensor>&) {
                 return ops::rms_norm(v[0], v[1], 1e-6f);
               });
  // Per-head q/k norm: a weight of D elements normalises each head of (B, T, H * D).
  const int64_t B = 2, T = 7, H = 4, D = 32;
  check_parity("rms_norm_grouped", GetParam(),
               {{randn(B * T * H * D, 33, 2.0f), Shape{B, T, H * D}}, {randn(D, 34), Shape{D}}},
               [](const std::vector<Variable>& v, const std::vector<Tensor>&) {
                 return ops::rms_norm(v[0], v[1], 1e-6f);
               });
}

// The residual add fused with the norm after it (one kernel on the GPU where x and y share a
// dtype): both outputs feed the result, so both gradients reach the op, as in a decoder block
// (the sum goes on to the next residual add, the normed value to the MLP).
Variable add_norm_both(const ops::AddNorm& r) {
  return ops::add(ops::scale(r.sum, 0.5f), r.normed);
}

TEST_P(GpuParity, AddLayerNormAndAddRmsNorm) {
  REQUIRE_GPU();
  const int64_t R = 45, C = 96;
  check_parity("add_layernorm", GetParam(),
               {{randn(R * C, 61, 2.0f), Shape{R, C}},
                {randn(R * C, 62), Shape{R, C}},
                {randn(C, 63), Shape{C}},
                {randn(C, 64), Shape{C}}},
               [](const std::vector<Variable>& v, const std::vector<Tensor>&) {
                 return add_norm_both(ops::add_layernorm(v[0], v[1], v[2], v[3]));
               });
  check_parity("add_rms_norm", GetParam(),
               {{randn(R * C, 65, 2.0f), Shape{R, C}},
                {randn(R * C, 66), Shape{R, C}},
                {randn(C, 67), Shape{C}}},
               [](const std::vector<Variable>& v, const std::vector<Tensor>&) {
                 return add_norm_both(ops::add_rms_norm(v[0], v[1], v[2], 1e-6f));
               });
}

// On the GPU the fused kernels are the add kernel then the norm's, bit for bit (the same
// roundings in the same order), forward and backward, at a row length with a vector tail.
TEST_P(GpuParity, AddNormFusedIsAddThenNormBitForBit) {
  REQUIRE_GPU();
  const int64_t R = 33, C = 76;
  for (bool layer : {true, false}) {
    std::vector<Input> in{{randn(R * C, 71, 2.0f), Shape{R, C}},
                          {randn(R * C, 72), Shape{R, C}},
                          {randn(C, 73), Shape{C}}};
    if (layer) in.push_back({randn(C, 74), Shape{C}});  // the bias
    std::vector<Tensor> runs[2];
    for (int fused = 0; fused < 2; ++fused) {
      runs[fused] = run_on(
          Device::cuda(0), GetParam(), in,
          [layer, fused](const std::vector<Variable>& v, const std::vector<Tensor>&) {
            if (fused == 1)
              return add_norm_both(layer ? ops::add_layernorm(v[0], v[1], v[2], v[3])
                                         : ops::add_rms_norm(v[0], v[1], v[2]));
            Variable sum = ops::add(v[0], v[1]);
            return add_norm_both(
                {sum, layer ? ops::layernorm(sum, v[2], v[3]) : ops::rms_norm(sum, v[2])});
          },
          78);
    }
    ASSERT_EQ(runs[0].size(), runs[1].size());
    for (size_t i = 0; i < runs[0].size(); ++i) {
      EXPECT_EQ(runs[0][i].to_vector(), runs[1][i].to_vector())
          << (layer ? "add_layernorm" : "add_rms_norm") << " tensor " << i;
    }
  }
}

TEST_P(GpuParity, SwiGlu) {
  REQUIRE_GPU();
  check_parity("swiglu", GetParam(),
               {{randn(3001, 35, 2.0f), Shape{3001}}, {randn(3001, 36), Shape{3001}}},
               [](const std::vector<Variable>& v, const std::vector<Tensor>&) {
                 return ops::swiglu(v[0], v[1]);
               });
}

TEST_P(GpuParity, Rope) {
  REQUIRE_GPU();
  const int64_t B = 2, T = 9, H = 3, D = 64;
  // The tables are built inside the op, on the device it runs on (rope_tables uses the
  // default device); more positions than T, as a model's tables have.
  ops::RopeOptions o;
  o.head_dim = D;
  o.theta = 500000.0;
  for (const Shape& shape : {Shape{B, T, H * D}, Shape{B, T, H, D}}) {
    check_parity("rope_" + std::to_string(shape.ndim()) + "d", GetParam(),
                 {{randn(B * T * H * D, 37, 2.0f), shape}},
                 [o, T](const std::vector<Variable>& v, const std::vector<Tensor>&) {
                   const ops::RopeTables tables = ops::rope_tables(o, T + 5);
                   return ops::rope(v[0], tables.cos, tables.sin);
                 });
  }
}

TEST_P(GpuParity, LinearCrossEntropy) {
  REQUIRE_GPU();
  // 70 rows in chunks of 16 (the last one partial: fp32 logits per chunk, recomputed in the
  // backward), and in one chunk (1024: the logits kept in the operands' dtype and turned
  // into the gradient in place, the kernels' `kept` path); rows 16-31 (a whole chunk) and
  // every seventh row are ignored.
  const int64_t B = 2, T = 35, C = 48, V = 300, R = B * T;
  constexpr int kIgnore = -100;
  std::vector<float> targets(R);
  for (int64_t r = 0; r < R; ++r) {
    const bool ignored = (r >= 16 && r < 32) || r % 7 == 0;
    targets[size_t(r)] = ignored ? float(kIgnore) : float((r * 31 + 5) % V);
  }
  for (int64_t chunk : {int64_t{16}, int64_t{1024}}) {
    check_parity("linear_cross_entropy_chunk" + std::to_string(chunk), GetParam(),
                 {{randn(R * C, 38), Shape{B, T, C}},
                  {randn(V * C, 39, 0.3f), Shape{V, C}},
                  {targets, Shape{B, T}, false}},
                 [chunk](const std::vector<Variable>& v, const std::vector<Tensor>& t) {
                   return ops::linear_cross_entropy(v[0], v[1], t[0], kIgnore, chunk);
                 });
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuParity, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// Reductions and the optimizer step: not autograd ops, compared directly.
TEST(GpuParityState, ReductionsAndAdamW) {
  REQUIRE_GPU();
  const int64_t n = 100003;
  std::vector<float> g = randn(n, 21), p = randn(n, 22), m = randn(n, 23, 0.1f);
  std::vector<float> v = randn(n, 24, 0.1f);
  for (float& x : v) x = x * x;
  Tensor cg = Tensor::from_vector(g, Shape{n});
  Tensor dg = cg.to_device(Device::cuda(0));
  const double ss_cpu = ops::sum_of_squares(cg), ss_gpu = ops::sum_of_squares(dg);
  std::printf("PARITY op=sum_of_squares dtype=f32 out=%.2e (bound 1e-12)\n",
              std::abs(ss_gpu - ss_cpu) / ss_cpu);
  EXPECT_LE(std::abs(ss_gpu - ss_cpu) / ss_cpu, 1e-12);
  EXPECT_TRUE(ops::all_finite(dg));
  Tensor bad = Tensor::from_vector({1.0f, INFINITY, 2.0f}, Shape{3}).to_device(Device::cuda(0));
  EXPECT_FALSE(ops::all_finite(bad));

  Tensor cp = Tensor::from_vector(p, Shape{n}), cm = Tensor::from_vector(m, Shape{n}),
         cv = Tensor::from_vector(v, Shape{n});
  Tensor dp = cp.to_device(Device::cuda(0)), dm = cm.to_device(Device::cuda(0)),
         dv = cv.to_device(Device::cuda(0));
  Tensor d16 = Tensor::empty(Shape{n}, DType::kBF16, MemCategory::kOther, Device::cuda(0));
  const ops::AdamWStep s{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 7};
  const float scale = 0.5f;
  std::vector<float> scaled(g);
  for (float& x : scaled) x *= scale;
  ops::adamw_update(cp.f32(), scaled.data(), cm.f32(), cv.f32(), n, s);
  ops::adamw_update(dp, dg, scale, dm, dv, d16, 0, n, s);
  const double rp = rel_diff(dp, cp), rm = rel_diff(dm, cm), rv = rel_diff(dv, cv);
  const double r16 = rel_diff(d16, cp.to(DType::kBF16));
  std::printf("PARITY op=adamw dtype=f32 param=%.2e m=%.2e v=%.2e bf16_copy=%.2e (bound 1e-5)\n",
              rp, rm, rv, r16);
  EXPECT_LE(rp, 1e-5);
  EXPECT_LE(rm, 1e-5);
  EXPECT_LE(rv, 1e-5);
  EXPECT_LE(r16, 1e-2);
  // Bitwise, in fact: the kernel rounds every operation as the CPU reference
  // does (what host offload's weights_sha256 equality rests on).
  const bool same =
      dp.to_vector() == cp.to_vector() && dm.to_vector() == cm.to_vector() &&
      dv.to_vector() == cv.to_vector() &&
      d16.to(DType::kF32).to_vector() == cp.to(DType::kBF16).to(DType::kF32).to_vector();
  std::printf("PARITY op=adamw_bitwise dtype=f32 same=%d (bound: identical)\n", same ? 1 : 0);
  EXPECT_TRUE(same);
}

// ZeRO-Offload's host tier: the optimizer state in host memory, gradients
// down and parameters up a chunk at a time (2048-element chunks here, edges
// inside the range), AdamW on the CPU: the GPU's own AdamW, bit for bit.
TEST(GpuParityState, HostOffloadedAdamWIsTheGpusBitwise) {
  REQUIRE_GPU();
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    nn::FlatParamGroup a("a", {{"w", Shape{61, 97}, true}, {"b", Shape{97}, false}}, dtype);
    nn::FlatParamGroup b("b", {{"w", Shape{61, 97}, true}, {"b", Shape{97}, false}}, dtype);
    const int64_t n = a.numel();
    Tensor p0 = Tensor::from_vector(randn(n, 31), Shape{n}).to(dtype);
    Tensor ga = Tensor::from_vector(randn(n, 32, 0.01f), Shape{n}).to(dtype);
    // The same group twice on the GPU: one updated by the GPU AdamW, one offloaded.
    std::vector<Tensor> keep;
    auto on_gpu = [&](const Tensor& t) {
      keep.push_back(t.to_device(Device::cuda(0)));
      return keep.back();
    };
    Tensor pa = on_gpu(p0), pb = on_gpu(p0), g = on_gpu(ga);
    const bool mixed = dtype != DType::kF32;
    Tensor master = mixed ? pa.to(DType::kF32, MemCategory::kMaster) : pa;
    optim::AdamWOptions o;
    o.weight_decay = 0.1f;
    optim::AdamW gpu({{&a, 0, n, master, g, mixed ? pa : Tensor()}}, o);
    optim::AdamWOffload off;
    off.stream.buffer_bytes = 3 * (12 * 2048 + 4096);  // host memory: path empty
    off.link = make_host_link(Device::cuda(0), 2);     // pinned buffers, a transfer stream
    optim::AdamW host({{&b, 0, n, Tensor(), g, pb}}, o, off);
    EXPECT_GT(host.host_bytes(), 0);
    EXPECT_EQ(host.link_bytes(), n * int64_t(dtype_size(dtype)) * 2);
    for (int step = 0; step < 3; ++step) {
      gpu.step(1e-2f, 0.5f);
      if (step % 2 == 1) host.stage_grads(0);  // the download started early, as ZeRO does
      int done = 0;
      host.step(1e-2f, 0.5f, [&](size_t) { ++done; });
      EXPECT_EQ(done, 1);
      host.params_ready(0);  // the read below runs after the upload
    }
    const bool same = pa.to_vector() == pb.to_vector();
    std::printf("PARITY op=adamw_host_offload dtype=%s same=%d (bound: identical)\n",
                std::string(dtype_name(dtype)).c_str(), same ? 1 : 0);
    EXPECT_TRUE(same) << dtype_name(dtype);
  }
}

}  // namespace
}  // namespace fd
