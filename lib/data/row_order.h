// Row order of the example datasets (example_dataset.h, preference_dataset.h): which
// examples share a row, in what order the rows are read each epoch, and encoding on
// threads. One implementation, so both datasets keep batch_source.h's contract alike.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <span>
#include <thread>
#include <vector>

#include "lib/text/tokenizer.h"

namespace fd::data {

// A permutation of [0, n) keyed by `key` (a Feistel network: nothing stored).
uint64_t permute(uint64_t i, uint64_t n, uint64_t key);

// How units fill rows when several share one (data.packing_order).
//   kFirstCome  in a permutation seeded by (seed, is_train), each unit starts a new row when
//               it does not fit in what is left of the current one.
//   kBestFit    best fit decreasing over windows of kPackWindow units of that permutation:
//               within a window the longest unit goes first, each into the open row it
//               leaves the least room in (a new row when none has room); a window's rows
//               are closed when the next window starts, and come out in a seeded order (not
//               longest first: validation rows are read in row order). Training rows are
//               read in a new seeded order every epoch
//               (epoch_row), so a step sees rows from the whole dataset, not a run of rows
//               of similar lengths.
enum class PackOrder { kFirstCome, kBestFit };
inline constexpr int64_t kPackWindow = 8192;
// "best_fit", "first_come" (the recipe's spelling).
const char* pack_order_name(PackOrder p);

// Which units share a row. n units, unit u taking positions[u] positions (<= capacity)
// of a row of `capacity`. Without `packing` one unit per row in unit order. Returns the
// units in row order and the row starts: row r holds order[rows[r] .. rows[r + 1])
// (rows empty for n == 0).
struct RowFill {
  std::vector<int32_t> order;
  std::vector<int64_t> rows;
};
RowFill fill_rows(std::span<const int64_t> positions, int64_t capacity, bool packing,
                  PackOrder pack_order, uint64_t seed, bool is_train);

// The training row sample g of step `step` reads of `rows` rows: perm_e(i mod rows) with
// i = step * global_batch + g, e = i div rows the epoch, perm_e seeded by (seed, e).
int64_t epoch_row(uint64_t seed, int64_t step, int64_t g, int64_t global_batch, int64_t rows);

// fn(i, cache) for i in [0, n) on up to `threads` threads, in contiguous chunks; returns
// the results chunk by chunk in order. Rethrows the first chunk's exception.
template <class T, class Fn>
std::vector<std::vector<T>> map_on_threads(size_t n, int threads, const Fn& fn) {
  const size_t t_count =
      std::clamp<size_t>(size_t(std::max(1, threads)), 1, std::max<size_t>(n, 1));
  std::vector<std::vector<T>> parts(t_count);
  std::vector<std::exception_ptr> errors(t_count);
  auto work = [&](size_t t) {
    try {
      text::EncodeCache cache;
      const size_t begin = n * t / t_count, end = n * (t + 1) / t_count;
      for (size_t i = begin; i < end; ++i) parts[t].push_back(fn(i, cache));
    } catch (...) {
      errors[t] = std::current_exception();
    }
  };
  {
    std::vector<std::jthread> pool;
    for (size_t t = 1; t < t_count; ++t) pool.emplace_back(work, t);
    work(0);
  }
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  return parts;
}

}  // namespace fd::data
