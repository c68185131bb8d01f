#include "lib/data/sampler.h"

#include <gtest/gtest.h>

#include <numeric>

#include "tests/data/data_test_util.h"

namespace fd::data {
namespace {

using test_util::write_llmc;

// A dataset whose token i is i % 60000 for easy start recovery, with two files
// so sequences cross a file boundary.
class SamplerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<uint16_t> a(700), b(300);
    std::iota(a.begin(), a.end(), uint16_t(0));
    std::iota(b.begin(), b.end(), uint16_t(700));
    DatasetOptions o;
    o.train_files = {write_llmc("a.bin", a), write_llmc("b.bin", b)};
    o.val_fraction = 0.2;  // train = 0..799, val = 800..999
    o.seq_len = kSeq;
    o.vocab_size = 1000;
    dataset_ = std::make_unique<TokenDataset>(o);
  }
  static constexpr int kSeq = 16;
  static constexpr int kBatch = 4;
  std::unique_ptr<TokenDataset> dataset_;
};

using Batch = std::pair<std::vector<int32_t>, std::vector<int32_t>>;

Batch train_batch(const Sampler& s, int64_t step, int micro, int rank, int world) {
  Batch out{std::vector<int32_t>(4 * 16), std::vector<int32_t>(4 * 16)};
  s.sample_train(step, micro, rank, world, 4, 16, out.first.data(), out.second.data());
  return out;
}

TEST_F(SamplerTest, SameArgumentsSameBatch) {
  Sampler s(*dataset_, 1234);
  Sampler again(*dataset_, 1234);
  EXPECT_EQ(train_batch(s, 7, 1, 0, 2), train_batch(again, 7, 1, 0, 2));
  // Order of calls does not matter (counter-based).
  Batch first = train_batch(s, 3, 0, 0, 1);
  train_batch(s, 4, 0, 0, 1);
  EXPECT_EQ(train_batch(s, 3, 0, 0, 1), first);
}

TEST_F(SamplerTest, DifferentStepMicroRankOrSeedDiffer) {
  Sampler s(*dataset_, 1234);
  Batch base = train_batch(s, 7, 1, 0, 2);
  EXPECT_NE(train_batch(s, 8, 1, 0, 2), base);
  EXPECT_NE(train_batch(s, 7, 0, 0, 2), base);
  EXPECT_NE(train_batch(s, 7, 1, 1, 2), base);
  EXPECT_NE(train_batch(Sampler(*dataset_, 1235), 7, 1, 0, 2), base);
}

TEST_F(SamplerTest, TargetsAreInputsShiftedByOne) {
  Sampler s(*dataset_, 5);
  for (int64_t step = 0; step < 50; ++step) {
    auto [tokens, targets] = train_batch(s, step, 0, 0, 1);
    for (int b = 0; b < kBatch; ++b) {
      const int32_t* x = tokens.data() + b * kSeq;
      const int32_t* y = targets.data() + b * kSeq;
      // Token i of the stream is i, so a row is start, start+1, ...
      for (int t = 0; t < kSeq; ++t) {
        ASSERT_EQ(x[t], x[0] + t);
        ASSERT_EQ(y[t], x[t] + 1);
      }
      ASSERT_GE(x[0], 0);
      ASSERT_LE(y[kSeq - 1], 799);  // never reads into the validation split
      ASSERT_EQ(x[0], s.train_start(step, 0, b, kSeq));
    }
  }
}

TEST_F(SamplerTest, StartsCoverTheRangeUniformly) {
  Sampler s(*dataset_, 99);
  // Starts are in [0, 800 - 16 - 1] = [0, 783]: 784 values in 8 bins of 98.
  const int64_t n = 784;
  std::vector<int> bins(8, 0);
  int64_t lo = n, hi = -1;
  const int draws = 40000;
  for (int i = 0; i < draws; ++i) {
    int64_t start = s.train_start(i / 8, i % 8, 0, kSeq);
    ASSERT_GE(start, 0);
    ASSERT_LT(start, n);
    lo = std::min(lo, start);
    hi = std::max(hi, start);
    ++bins[size_t(start / 98)];
  }
  EXPECT_EQ(lo, 0);
  EXPECT_EQ(hi, n - 1);
  for (int c : bins) EXPECT_NEAR(c, draws / 8, 5 * std::sqrt(draws / 8.0)) << "bin count " << c;
}

TEST_F(SamplerTest, ValidationIsDeterministicAndInsideValSplit) {
  Sampler s(*dataset_, 1234);
  std::vector<int32_t> x(kBatch * kSeq), y(kBatch * kSeq), x2(kBatch * kSeq), y2(kBatch * kSeq);
  for (int64_t i = 0; i < 20; ++i) {
    s.sample_val(i, 1, 2, kBatch, kSeq, x.data(), y.data());
    s.sample_val(i, 1, 2, kBatch, kSeq, x2.data(), y2.data());
    ASSERT_EQ(x, x2);
    ASSERT_EQ(y, y2);
    for (int j = 0; j < kBatch * kSeq; ++j) {
      ASSERT_GE(x[j], 800);
      ASSERT_LE(y[j], 999);
      ASSERT_EQ(y[j], x[j] + 1);
    }
  }
  s.sample_val(0, 0, 1, kBatch, kSeq, x.data(), y.data());
  s.sample_val(1, 0, 1, kBatch, kSeq, x2.data(), y2.data());
  EXPECT_NE(x, x2);
  // Validation and training draws use different streams.
  int same = 0;
  for (int64_t i = 0; i < 100; ++i) same += s.val_start(i, 0, kSeq) == s.train_start(i, 0, 0, kSeq);
  EXPECT_LT(same, 10);
}

}  // namespace
}  // namespace fd::data
