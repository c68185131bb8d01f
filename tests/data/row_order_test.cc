// Which examples share a row (row_order.h): best fit decreasing fills rows to >= 95% on a
// realistic mix of lengths where first come first served does not, keeps every unit once,
// never overfills a row, is a pure function of the seed, and, read through the epochs'
// permutation, does not give steps of only short or only long examples.
#include "lib/data/row_order.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <set>

#include "lib/base/rng.h"

namespace fd::data {
namespace {

// Lengths like a chat dataset's: most short, some medium, a few near the row's size.
std::vector<int64_t> chat_lengths(int64_t n, int64_t capacity, uint64_t seed) {
  std::vector<int64_t> len(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double u = uniform01(hash_words(seed, 1, uint64_t(i)));
    const double v = uniform01(hash_words(seed, 2, uint64_t(i)));
    const double frac = u < 0.6 ? 0.04 + 0.26 * v : u < 0.9 ? 0.3 + 0.4 * v : 0.7 + 0.3 * v;
    len[size_t(i)] = std::clamp<int64_t>(int64_t(frac * double(capacity)), 1, capacity);
  }
  return len;
}

double occupancy(const RowFill& f, std::span<const int64_t> len, int64_t capacity) {
  const int64_t total = std::accumulate(len.begin(), len.end(), int64_t{0});
  return double(total) / (double(f.rows.size() - 1) * double(capacity));
}

// Every unit exactly once, no row over capacity, no empty row.
void expect_valid(const RowFill& f, std::span<const int64_t> len, int64_t capacity) {
  ASSERT_EQ(f.order.size(), len.size());
  std::vector<int32_t> sorted = f.order;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) ASSERT_EQ(sorted[i], int32_t(i));
  ASSERT_EQ(f.rows.front(), 0);
  ASSERT_EQ(f.rows.back(), int64_t(len.size()));
  for (size_t r = 0; r + 1 < f.rows.size(); ++r) {
    ASSERT_LT(f.rows[r], f.rows[r + 1]) << "row " << r << " is empty";
    int64_t used = 0;
    for (int64_t k = f.rows[r]; k < f.rows[r + 1]; ++k) used += len[size_t(f.order[size_t(k)])];
    ASSERT_LE(used, capacity) << "row " << r;
  }
}

TEST(RowOrder, BestFitFillsRowsWhereFirstComeDoesNot) {
  const int64_t T = 256, n = 3000;
  const std::vector<int64_t> len = chat_lengths(n, T, 7);
  const RowFill best = fill_rows(len, T, true, PackOrder::kBestFit, 3, true);
  const RowFill first = fill_rows(len, T, true, PackOrder::kFirstCome, 3, true);
  expect_valid(best, len, T);
  expect_valid(first, len, T);
  EXPECT_GE(occupancy(best, len, T), 0.95);
  EXPECT_LT(occupancy(first, len, T), 0.85) << "the mix is one first come packs poorly";
  // Rows come out in a seeded order, not longest first: the first tenth of the rows (what an
  // evaluation reading a few validation rows sees) holds examples of about the mean length.
  const size_t tenth = (best.rows.size() - 1) / 10;
  double head = 0, all = 0;
  for (int64_t k = 0; k < best.rows[tenth]; ++k) head += double(len[size_t(best.order[size_t(k)])]);
  for (int64_t x : len) all += double(x);
  head /= double(best.rows[tenth]);
  all /= double(n);
  EXPECT_NEAR(head, all, 0.15 * all) << "the first rows' examples average " << head;
  // A pure function of its inputs; another seed shuffles differently.
  const RowFill again = fill_rows(len, T, true, PackOrder::kBestFit, 3, true);
  EXPECT_EQ(best.order, again.order);
  EXPECT_EQ(best.rows, again.rows);
  EXPECT_NE(fill_rows(len, T, true, PackOrder::kBestFit, 4, true).order, best.order);
  EXPECT_NE(fill_rows(len, T, true, PackOrder::kBestFit, 3, false).order, best.order);
}

// Lengths 6, 5, 4, 3, 2 in rows of 10: 6 opens a row, 5 opens another, 4 fits the first
// exactly (the tightest room), then 3 and 2 go to the second, whatever the shuffle.
TEST(RowOrder, BestFitPutsEachUnitWhereItLeavesTheLeastRoom) {
  const std::vector<int64_t> len = {3, 6, 2, 5, 4};  // units 0..4
  std::set<std::vector<int32_t>> orders;
  for (uint64_t seed = 0; seed < 8; ++seed) {
    const RowFill f = fill_rows(len, 10, true, PackOrder::kBestFit, seed, true);
    ASSERT_EQ(f.rows.size(), 3u);
    std::set<std::vector<int32_t>> rows;
    for (size_t r = 0; r + 1 < f.rows.size(); ++r)
      rows.emplace(f.order.begin() + f.rows[r], f.order.begin() + f.rows[r + 1]);
    EXPECT_EQ(rows, (std::set<std::vector<int32_t>>{{1, 4}, {3, 0, 2}}));
    orders.insert(f.order);
  }
  EXPECT_EQ(orders.size(), 2u) << "the two rows come out in either order, by the seed";
  // Without packing: one unit per row, in unit order.
  const RowFill one = fill_rows(len, 10, false, PackOrder::kBestFit, 1, true);
  EXPECT_EQ(one.order, (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(one.rows, (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_TRUE(fill_rows({}, 10, true, PackOrder::kBestFit, 1, true).rows.empty());
}

// Windows: past kPackWindow units, each window's rows hold only that window's units (a row
// never waits for units far later in the shuffle), and occupancy stays high.
TEST(RowOrder, BestFitWorksWindowByWindow) {
  const int64_t T = 128, n = kPackWindow + kPackWindow / 2;
  const std::vector<int64_t> len = chat_lengths(n, T, 11);
  const RowFill f = fill_rows(len, T, true, PackOrder::kBestFit, 9, true);
  expect_valid(f, len, T);
  EXPECT_GE(occupancy(f, len, T), 0.95);
  // The first window's units fill a prefix of the rows exactly.
  const RowFill shuffle_only = fill_rows(len, T * n, true, PackOrder::kFirstCome, 9, true);
  ASSERT_EQ(shuffle_only.rows.size(), 2u);  // one row of everything: the shuffle itself
  std::vector<int32_t> first_window(shuffle_only.order.begin(),
                                    shuffle_only.order.begin() + kPackWindow);
  std::sort(first_window.begin(), first_window.end());
  const auto boundary = std::find(f.rows.begin(), f.rows.end(), kPackWindow);
  ASSERT_NE(boundary, f.rows.end()) << "no row ends at the window's end";
  std::vector<int32_t> head(f.order.begin(), f.order.begin() + kPackWindow);
  std::sort(head.begin(), head.end());
  EXPECT_EQ(head, first_window);
}

// Steps read rows through epoch_row: the mean example length of a step spreads about as
// wide with best fit as with first come (within 50%: a best-fit row holds one long example
// and short ones, or many short ones, so its rows differ more), and does not drift along the
// epoch (best fit opens its rows of long examples first; the permutations must hide that).
TEST(RowOrder, StepsMixLengthsAsFirstComeDoes) {
  const int64_t T = 256, n = 4000, G = 8;
  const std::vector<int64_t> len = chat_lengths(n, T, 21);
  struct Spread {
    double stddev, first_half, second_half;
  };
  auto spread = [&](PackOrder p) {
    const RowFill f = fill_rows(len, T, true, p, 5, true);
    const int64_t R = int64_t(f.rows.size()) - 1, steps = R / G;
    std::vector<double> means;
    for (int64_t s = 0; s < steps; ++s) {
      double sum = 0;
      int64_t count = 0;
      for (int64_t g = 0; g < G; ++g) {
        const int64_t row = epoch_row(5, s, g, G, R);
        for (int64_t k = f.rows[size_t(row)]; k < f.rows[size_t(row) + 1]; ++k, ++count)
          sum += double(len[size_t(f.order[size_t(k)])]);
      }
      means.push_back(sum / double(count));
    }
    const double mean = std::accumulate(means.begin(), means.end(), 0.0) / double(means.size());
    double var = 0;
    for (double m : means) var += (m - mean) * (m - mean);
    const size_t h = means.size() / 2;
    return Spread{std::sqrt(var / double(means.size())),
                  std::accumulate(means.begin(), means.begin() + h, 0.0) / double(h),
                  std::accumulate(means.begin() + h, means.end(), 0.0) / double(means.size() - h)};
  };
  const Spread best = spread(PackOrder::kBestFit), first = spread(PackOrder::kFirstCome);
  std::printf(
      "  a step's mean example length: standard deviation %.1f (best fit) against %.1f "
      "(first come); best fit's first and second half of the epoch %.1f and %.1f\n",
      best.stddev, first.stddev, best.first_half, best.second_half);
  EXPECT_LE(best.stddev, 1.5 * first.stddev)
      << "best fit " << best.stddev << ", first come " << first.stddev;
  EXPECT_NEAR(best.first_half, best.second_half, 3 * best.stddev / std::sqrt(double(n / G / 16)))
      << best.first_half << " " << best.second_half;
}

}  // namespace
}  // namespace fd::data
