#include "lib/data/row_order.h"

#include "lib/base/rng.h"

namespace fd::data {
namespace {

constexpr uint64_t kPackStream = 0x7061'636b'0000'0003ULL;   // "pack"
constexpr uint64_t kEpochStream = 0x6570'6f63'6800'0004ULL;  // "epoch"

}  // namespace

// A four-round Feistel network on the smallest even-bit domain holding n, walked until the
// value falls inside [0, n) (on average fewer than four times: the domain is under 4n).
uint64_t permute(uint64_t i, uint64_t n, uint64_t key) {
  if (n <= 1) return 0;
  int bits = 0;
  while ((uint64_t{1} << bits) < n) ++bits;
  const int half = (bits + 1) / 2;
  const uint64_t mask = (uint64_t{1} << half) - 1;
  uint64_t x = i;
  do {
    uint64_t l = x >> half, r = x & mask;
    for (uint64_t round = 0; round < 4; ++round) {
      const uint64_t f = hash_words(key, round, r) & mask;
      const uint64_t next = l ^ f;
      l = r;
      r = next;
    }
    x = (l << half) | r;
  } while (x >= n);
  return x;
}

std::vector<int32_t> fill_order(int64_t n, bool shuffle, uint64_t seed, bool is_train) {
  std::vector<int32_t> order(static_cast<size_t>(n));
  const uint64_t key = hash_words(seed, kPackStream, is_train ? 0 : 1);
  for (int64_t e = 0; e < n; ++e)
    order[size_t(e)] = int32_t(shuffle ? permute(uint64_t(e), uint64_t(n), key) : uint64_t(e));
  return order;
}

std::vector<int64_t> fill_rows(std::span<const int64_t> positions, int64_t capacity, bool packing) {
  std::vector<int64_t> rows;
  if (positions.empty()) return rows;
  rows.push_back(0);
  int64_t used = 0;
  for (size_t k = 0; k < positions.size(); ++k) {
    if (k > 0 && (!packing || used + positions[k] > capacity)) {
      rows.push_back(int64_t(k));
      used = 0;
    }
    used += positions[k];
  }
  rows.push_back(int64_t(positions.size()));
  return rows;
}

int64_t epoch_row(uint64_t seed, int64_t step, int64_t g, int64_t global_batch, int64_t rows) {
  const uint64_t R = uint64_t(rows);
  const uint64_t i = uint64_t(step) * uint64_t(global_batch) + uint64_t(g);
  return int64_t(permute(i % R, R, hash_words(seed, kEpochStream, i / R)));
}

}  // namespace fd::data
