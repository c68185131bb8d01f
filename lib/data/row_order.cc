#include "lib/data/row_order.h"

#include <map>

#include "lib/base/rng.h"

namespace fd::data {
namespace {

constexpr uint64_t kPackStream = 0x7061'636b'0000'0003ULL;   // "pack"
constexpr uint64_t kEpochStream = 0x6570'6f63'6800'0004ULL;  // "epoch"
constexpr uint64_t kRowStream = 0x726f'7773'0000'0005ULL;    // "rows"

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

namespace {

// Best fit decreasing of units order[begin, end) into new rows, appended to `out`.
// The window's rows come out in a seeded order (`key`), not in the order they were opened
// (longest units first): validation rows are read from the first, and an evaluation that
// reads only some of them must not see only the longest examples.
void best_fit_window(std::span<const int32_t> units, std::span<const int64_t> positions,
                     int64_t capacity, uint64_t key, RowFill& out) {
  std::vector<int32_t> by_length(units.begin(), units.end());
  std::stable_sort(by_length.begin(), by_length.end(), [&](int32_t a, int32_t b) {
    return positions[size_t(a)] > positions[size_t(b)];
  });
  std::vector<std::vector<int32_t>> bins;
  std::multimap<int64_t, size_t> room;  // room left -> bin (ties: the earlier bin first)
  for (int32_t u : by_length) {
    const int64_t need = positions[size_t(u)];
    auto it = room.lower_bound(need);
    size_t bin;
    int64_t left;
    if (it == room.end()) {
      bin = bins.size();
      bins.emplace_back();
      left = capacity;
    } else {
      bin = it->second;
      left = it->first;
      room.erase(it);
    }
    bins[bin].push_back(u);
    if (left - need > 0) room.emplace(left - need, bin);
  }
  for (size_t r = 0; r < bins.size(); ++r) {
    const std::vector<int32_t>& b = bins[permute(r, bins.size(), key)];
    out.order.insert(out.order.end(), b.begin(), b.end());
    out.rows.push_back(int64_t(out.order.size()));
  }
}

}  // namespace

const char* pack_order_name(PackOrder p) {
  return p == PackOrder::kBestFit ? "best_fit" : "first_come";
}

RowFill fill_rows(std::span<const int64_t> positions, int64_t capacity, bool packing,
                  PackOrder pack_order, uint64_t seed, bool is_train) {
  const int64_t n = int64_t(positions.size());
  RowFill out;
  if (n == 0) return out;
  std::vector<int32_t> order(static_cast<size_t>(n));
  const uint64_t key = hash_words(seed, kPackStream, is_train ? 0 : 1);
  for (int64_t e = 0; e < n; ++e)
    order[size_t(e)] = int32_t(packing ? permute(uint64_t(e), uint64_t(n), key) : uint64_t(e));
  out.rows.push_back(0);
  if (packing && pack_order == PackOrder::kBestFit) {
    out.order.reserve(size_t(n));
    for (int64_t b = 0; b < n; b += kPackWindow) {
      const int64_t e = std::min(n, b + kPackWindow);
      best_fit_window(std::span<const int32_t>(order).subspan(size_t(b), size_t(e - b)), positions,
                      capacity, hash_words(key, kRowStream, uint64_t(b)), out);
    }
    return out;
  }
  int64_t used = 0;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t need = positions[size_t(order[size_t(k)])];
    if (k > 0 && (!packing || used + need > capacity)) {
      out.rows.push_back(k);
      used = 0;
    }
    used += need;
  }
  out.rows.push_back(n);
  out.order = std::move(order);
  return out;
}

int64_t epoch_row(uint64_t seed, int64_t step, int64_t g, int64_t global_batch, int64_t rows) {
  const uint64_t R = uint64_t(rows);
  const uint64_t i = uint64_t(step) * uint64_t(global_batch) + uint64_t(g);
  return int64_t(permute(i % R, R, hash_words(seed, kEpochStream, i / R)));
}

}  // namespace fd::data
