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

// The order in which n units (examples, pairs) fill rows: 0 .. n-1, or with `shuffle` a
// permutation seeded by (seed, is_train), so that a packed row mixes the whole dataset.
std::vector<int32_t> fill_order(int64_t n, bool shuffle, uint64_t seed, bool is_train);

// Rows filled first come first served: unit k (in fill order) of `positions[k]` positions
// starts a new row when `packing` is false or it does not fit in what is left of
// `capacity`. Returns the row starts: row r holds units [rows[r], rows[r + 1]) ({} for none).
std::vector<int64_t> fill_rows(std::span<const int64_t> positions, int64_t capacity, bool packing);

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
