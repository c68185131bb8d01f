#include "lib/ops/matmul.h"

#include "tests/ops/op_test_util.h"

namespace fd::ops {
namespace {

using namespace fd::ops::testing;

constexpr int64_t kB = 3, kT = 7, kK = 5, kN = 9, kM = kB * kT;

// out[i, j] = sum_k op(a)[i, k] op(b)[k, j] + bias[j]; inputs {a, b, bias?}.
RefFn reference(MatmulOptions o, bool has_bias) {
  return [o, has_bias](const std::vector<Vec>& in) {
    const Vec &a = in[0], &b = in[1];
    Vec out(kM * kN);
    for (int64_t i = 0; i < kM; ++i)
      for (int64_t j = 0; j < kN; ++j) {
        double s = has_bias ? in[2][j] : 0.0;
        for (int64_t k = 0; k < kK; ++k)
          s += (o.trans_a ? a[k * kM + i] : a[i * kK + k]) *
               (o.trans_b ? b[j * kK + k] : b[k * kN + j]);
        out[i * kN + j] = s;
      }
    return out;
  };
}

// a in dtype dt; b and bias in wdt (mixed precision when they differ).
void check(MatmulOptions o, bool has_bias, DType dt, DType wdt) {
  std::printf("matmul trans_a=%d trans_b=%d bias=%d a:%s b:%s\n", o.trans_a, o.trans_b, has_bias,
              name_of(dt), name_of(wdt));
  std::mt19937 rng(42);
  const Shape a_shape = o.trans_a ? Shape{kK, kM} : Shape{kB, kT, kK};
  const Shape b_shape = o.trans_b ? Shape{kN, kK} : Shape{kK, kN};
  std::vector<Vec> in = {rounded(randn(kM * kK, rng), dt), rounded(randn(kK * kN, rng), wdt),
                         rounded(randn(kN, rng), wdt)};
  const Vec R = rounded(randn(kM * kN, rng), dt);
  Variable a(make_tensor(in[0], a_shape, dt), true);
  Variable b(make_tensor(in[1], b_shape, wdt), true);
  Variable bias = has_bias ? Variable(make_tensor(in[2], Shape{kN}, wdt), true) : Variable();
  if (!has_bias) in.pop_back();

  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  Variable y = matmul(a, b, bias, o);
  EXPECT_EQ(y.shape(), (o.trans_a ? Shape{kM, kN} : Shape{kB, kT, kN}));
  EXPECT_EQ(y.dtype(), dt);
  const RefFn ref = reference(o, has_bias);
  const double tol = std::max(tol_for(dt), tol_for(wdt));
  expect_close("out", values(y.value()), ref(in), tol);
  backward_with(tape, y, R);
  expect_close("grad a", values(a.grad()), fd_grad(ref, in, 0, R), tol);
  expect_close("grad b", values(b.grad()), fd_grad(ref, in, 1, R), tol);
  if (has_bias) expect_close("grad bias", values(bias.grad()), fd_grad(ref, in, 2, R), tol);
}

TEST(Matmul, AllTransposesWithAndWithoutBiasF32) {
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (bool bias : {false, true}) check({ta, tb}, bias, DType::kF32, DType::kF32);
}

TEST(Matmul, AllTransposesWithAndWithoutBiasBF16) {
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (bool bias : {false, true}) check({ta, tb}, bias, DType::kBF16, DType::kBF16);
}

TEST(Matmul, F16) { check({false, true}, true, DType::kF16, DType::kF16); }

TEST(Matmul, MixedDtypes) {
  check({false, false}, true, DType::kBF16, DType::kF32);
  check({false, true}, true, DType::kF32, DType::kBF16);
}

// Gradients of bound leaves are added to the caller's buffer, never overwritten; a bf16
// weight with an fp32 gradient buffer (mixed precision) accumulates in fp32.
TEST(Matmul, AccumulatesIntoBoundGradBuffers) {
  std::printf("matmul accumulation into bound buffers\n");
  for (DType wdt : {DType::kF32, DType::kBF16}) {
    std::mt19937 rng(7);
    const MatmulOptions o{false, true};
    std::vector<Vec> in = {rounded(randn(kM * kK, rng), wdt), rounded(randn(kK * kN, rng), wdt),
                           rounded(randn(kN, rng), wdt)};
    const Vec R = rounded(randn(kM * kN, rng), wdt);
    std::vector<Vec> prior = {randn(kM * kK, rng), randn(kK * kN, rng), randn(kN, rng)};
    const Shape shapes[3] = {Shape{kB, kT, kK}, Shape{kN, kK}, Shape{kN}};
    std::vector<Tensor> bufs;
    std::vector<Variable> vars;
    for (int i = 0; i < 3; ++i) {
      bufs.push_back(make_tensor(prior[i], shapes[i], DType::kF32));
      vars.push_back(Variable::bound_leaf(make_tensor(in[i], shapes[i], wdt), bufs[i]));
    }
    autograd::Tape tape;
    autograd::TapeScope scope(tape);
    Variable y = matmul(vars[0], vars[1], vars[2], o);
    backward_with(tape, y, R);
    const char* names[3] = {"a", "b", "bias"};
    for (size_t i = 0; i < 3; ++i) {
      Vec want = fd_grad(reference(o, true), in, i, R);
      for (size_t j = 0; j < want.size(); ++j) want[j] += prior[i][j];
      expect_close(std::string("prior + grad ") + names[i] + " (" + name_of(wdt) + ")",
                   values(bufs[i]), want, 1e-5);
    }
  }
}

TEST(Matmul, NoRecordingWithoutGrad) {
  Variable a(Tensor::zeros(Shape{2, 3}), false), b(Tensor::zeros(Shape{3, 4}), false);
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  Variable y = matmul(a, b);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(tape.size(), 0u);
}

}  // namespace
}  // namespace fd::ops
