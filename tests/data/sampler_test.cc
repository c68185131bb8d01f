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

// One way of splitting a step's global batch over ranks and micro-batches.
struct Split {
  int world, accumulation, micro;
};

// The tokens of a whole step under `split`, as a trainer would draw them
// (every rank, every micro-batch), concatenated micro-batch-major, then rank:
// row k of the result is the sequence with global index k.
std::vector<int32_t> global_batch(const Sampler& s, int64_t step, Split split, int seq_len) {
  std::vector<int32_t> all, tokens(size_t(split.micro) * seq_len), targets(tokens.size());
  for (int m = 0; m < split.accumulation; ++m) {
    for (int r = 0; r < split.world; ++r) {
      s.sample_train(step, m, r, split.world, split.micro, seq_len, tokens.data(), targets.data());
      all.insert(all.end(), tokens.begin(), tokens.end());
    }
  }
  return all;
}

TEST_F(SamplerTest, EverySplitOfTheGlobalBatchDrawsTheSameSequences) {
  Sampler s(*dataset_, 1234);
  // Global batch 8, split five ways.
  const Split splits[] = {{2, 1, 4}, {1, 2, 4}, {4, 1, 2}, {2, 2, 2}, {1, 8, 1}};
  for (int64_t step : {0, 1, 17}) {
    std::vector<int32_t> reference = global_batch(s, step, {1, 1, 8}, kSeq);
    for (int64_t g = 0; g < 8; ++g) ASSERT_EQ(reference[g * kSeq], s.train_start(step, g, kSeq));
    for (Split sp : splits) {
      EXPECT_EQ(global_batch(s, step, sp, kSeq), reference)
          << "step " << step << ", world " << sp.world << ", accumulation " << sp.accumulation
          << ", micro " << sp.micro;
    }
  }
  // Spot check of the documented index: row 2 of micro-batch 1 on rank 1 of
  // 2 with micro 4 is global sample (1 * 2 + 1) * 4 + 2 = 14.
  auto [x, y] = train_batch(s, 5, 1, 1, 2);
  EXPECT_EQ(x[2 * kSeq], s.train_start(5, 14, kSeq));
}

TEST_F(SamplerTest, ResumingAtAnotherSplitSeesTheStraightRunsData) {
  // Straight: 20 steps at world 2, micro 4. Resumed: a fresh sampler (as after
  // a restart) takes over at step 10 at world 1, accumulation 2, and another at
  // step 15 at world 4, micro 2 - the same global batch of 8 every step.
  Sampler straight(*dataset_, 77);
  std::vector<std::vector<int32_t>> want;
  for (int64_t step = 0; step < 20; ++step)
    want.push_back(global_batch(straight, step, {2, 1, 4}, kSeq));
  Sampler first(*dataset_, 77);
  for (int64_t step = 0; step < 10; ++step) {
    ASSERT_EQ(global_batch(first, step, {2, 1, 4}, kSeq), want[size_t(step)]) << "step " << step;
  }
  Sampler resumed(*dataset_, 77);
  for (int64_t step = 10; step < 15; ++step) {
    ASSERT_EQ(global_batch(resumed, step, {1, 2, 4}, kSeq), want[size_t(step)]) << "step " << step;
  }
  Sampler again(*dataset_, 77);
  for (int64_t step = 19; step >= 15; --step) {  // order of calls does not matter either
    ASSERT_EQ(global_batch(again, step, {4, 1, 2}, kSeq), want[size_t(step)]) << "step " << step;
  }
  // And consecutive steps do see different data.
  EXPECT_NE(want[10], want[11]);
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
      ASSERT_EQ(x[0], s.train_start(step, b, kSeq));
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
    int64_t start = s.train_start(i / 8, i % 8, kSeq);
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
  for (int64_t i = 0; i < 100; ++i) same += s.val_start(i, 0, kSeq) == s.train_start(i, 0, kSeq);
  EXPECT_LT(same, 10);
}

}  // namespace
}  // namespace fd::data
