#include "lib/ops/embedding.h"

#include "tests/ops/op_test_util.h"

namespace fd::ops {
namespace {

using namespace fd::ops::testing;

constexpr int64_t kV = 37, kC = 12, kN = 3 * 7;

// Ids with repeats, so the backward must sum several rows into one.
std::vector<float> ids_values() {
  std::vector<float> ids;
  for (int64_t i = 0; i < kN; ++i) ids.push_back(float((i * 5) % 11 + (i % 3 == 0 ? 25 : 0)));
  return ids;
}

RefFn reference(const std::vector<float>& ids) {
  return [ids](const std::vector<Vec>& in) {
    Vec out(kN * kC);
    for (int64_t i = 0; i < kN; ++i)
      for (int64_t c = 0; c < kC; ++c) out[i * kC + c] = in[0][int64_t(ids[i]) * kC + c];
    return out;
  };
}

void check(DType dt) {
  std::printf("embedding %s\n", name_of(dt));
  std::mt19937 rng(11);
  std::vector<Vec> in = {rounded(randn(kV * kC, rng), dt)};
  const Vec R = rounded(randn(kN * kC, rng), dt);
  const std::vector<float> idv = ids_values();
  Tensor ids = Tensor::from_vector(idv, Shape{3, 7}, DType::kI32);
  Variable w(make_tensor(in[0], Shape{kV, kC}, dt), true);
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  Variable y = embedding(w, ids);
  EXPECT_EQ(y.shape(), (Shape{3, 7, kC}));
  EXPECT_EQ(y.dtype(), dt);
  ids.fill_(0.0f);  // the op keeps its own copy of the ids for backward
  const double tol = tol_for(dt);
  expect_close("out", values(y.value()), reference(idv)(in), dt == DType::kF32 ? 0.0 : tol);
  backward_with(tape, y, R);
  expect_close("grad weight", values(w.grad()), fd_grad(reference(idv), in, 0, R), tol);
}

TEST(Embedding, GradF32) { check(DType::kF32); }
TEST(Embedding, GradBF16) { check(DType::kBF16); }
TEST(Embedding, GradF16) { check(DType::kF16); }

TEST(EmbeddingDeathTest, OutOfRangeIdFailsCheck) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Variable w(Tensor::zeros(Shape{4, 2}), true);
  Tensor ids = Tensor::from_vector({1, 4}, Shape{2}, DType::kI32);
  EXPECT_DEATH(embedding(w, ids), "outside");
}

// embedding_shard: rows [begin, begin + V_local) of the kV-row table; ids outside give zero rows
// and no gradient. The reference is the whole table's lookup with the other rows masked;
// gradients against float64 finite differences of it.
void check_shard(DType dt, int64_t begin, int64_t rows) {
  std::printf("embedding_shard %s rows [%lld, %lld)\n", name_of(dt), (long long)begin,
              (long long)(begin + rows));
  std::mt19937 rng(13);
  std::vector<Vec> in = {rounded(randn(rows * kC, rng), dt)};
  const Vec R = rounded(randn(kN * kC, rng), dt);
  const std::vector<float> idv = ids_values();
  RefFn ref = [&](const std::vector<Vec>& x) {
    Vec out(kN * kC, 0.0);
    for (int64_t i = 0; i < kN; ++i) {
      const int64_t r = int64_t(idv[size_t(i)]) - begin;
      if (r < 0 || r >= rows) continue;
      for (int64_t c = 0; c < kC; ++c) out[i * kC + c] = x[0][r * kC + c];
    }
    return out;
  };
  Tensor ids = Tensor::from_vector(idv, Shape{3, 7}, DType::kI32);
  Variable w(make_tensor(in[0], Shape{rows, kC}, dt), true);
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  Variable y = embedding_shard(w, ids, begin);
  EXPECT_EQ(y.shape(), (Shape{3, 7, kC}));
  ids.fill_(0.0f);  // the op keeps its own copy for backward
  expect_close("out", values(y.value()), ref(in), 0.0);
  backward_with(tape, y, R);
  expect_close("grad weight", values(w.grad()), fd_grad(ref, in, 0, R), tol_for(dt));
}

TEST(EmbeddingShard, GradEachSliceF32) {
  for (auto [begin, rows] : {std::pair<int64_t, int64_t>{0, 10}, {10, 9}, {19, 9}, {28, 9}})
    check_shard(DType::kF32, begin, rows);
}
TEST(EmbeddingShard, GradBF16) { check_shard(DType::kBF16, 5, 20); }

// The slices' lookups sum to the whole table's, bit for bit (each position gets one row).
TEST(EmbeddingShard, SlicesSumToTheWholeLookup) {
  std::mt19937 rng(17);
  const Vec table = randn(kV * kC, rng);
  Tensor ids = Tensor::from_vector(ids_values(), Shape{3, 7}, DType::kI32);
  const Vec whole = values(
      embedding(Variable(make_tensor(table, Shape{kV, kC}, DType::kF32), false), ids).value());
  Vec sum(whole.size(), 0.0);
  for (auto [begin, rows] : {std::pair<int64_t, int64_t>{0, 10}, {10, 9}, {19, 9}, {28, 9}}) {
    const Vec part(table.begin() + begin * kC, table.begin() + (begin + rows) * kC);
    const Vec y =
        values(embedding_shard(Variable(make_tensor(part, Shape{rows, kC}, DType::kF32), false),
                               ids, begin)
                   .value());
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += y[i];
  }
  expect_close("sum of slices", sum, whole, 0.0);
}

}  // namespace
}  // namespace fd::ops
