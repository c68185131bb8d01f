#include "lib/ckpt/slices.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "lib/base/check.h"

namespace fd::ckpt {

namespace {

// Elements after dimension `dim` (one step along it).
int64_t inner_of(const std::vector<int64_t>& shape, int dim) {
  int64_t inner = 1;
  for (size_t d = size_t(dim) + 1; d < shape.size(); ++d) inner *= shape[d];
  return inner;
}

int64_t part_of(const ParamLayout& p) { return p.shape[size_t(p.slice_dim)] / p.slice_blocks; }

}  // namespace

std::vector<int64_t> global_shape(const ParamLayout& p) {
  std::vector<int64_t> shape = p.shape;
  if (!p.whole()) shape[size_t(p.slice_dim)] = p.slice_global * p.slice_blocks;
  return shape;
}

void for_each_global_run(const ParamLayout& p, int64_t begin, int64_t count,
                         const std::function<void(int64_t, int64_t, int64_t)>& fn) {
  if (count <= 0) return;
  if (p.whole()) {
    fn(begin, begin, count);
    return;
  }
  // Row-major: rows over the dimensions before slice_dim, each holding shape[dim] (globally
  // global * blocks) times `inner` elements. A run is one part's elements of one such row.
  const int64_t inner = inner_of(p.shape, p.slice_dim);
  const int64_t part = part_of(p);
  const int64_t run = part * inner;
  const int64_t end = begin + count;
  for (int64_t at = begin; at < end;) {
    const int64_t r = at / run;
    const int64_t row = r / p.slice_blocks, block = r % p.slice_blocks;
    const int64_t within = at - r * run;
    const int64_t n = std::min(run - within, end - at);
    fn((row * p.slice_blocks + block) * p.slice_global * inner + p.slice_offset * inner + within,
       at, n);
    at += n;
  }
}

void for_each_writer_piece(const std::vector<const ParamLayout*>& rows, int64_t begin,
                           int64_t count,
                           const std::function<void(int, int64_t, int64_t, int64_t)>& fn) {
  FD_CHECK(!rows.empty(), "no writer rows");
  if (count <= 0) return;
  const ParamLayout& first = *rows.front();
  if (first.whole()) {
    fn(0, begin, begin, count);
    return;
  }
  const int dim = first.slice_dim;
  const int64_t blocks = first.slice_blocks, global = first.slice_global;
  const int64_t inner = inner_of(first.shape, dim);
  const int64_t row_len = global * blocks * inner;  // one row of the whole tensor along dim
  const int64_t end = begin + count;
  for (int64_t at = begin; at < end;) {
    const int64_t row = at / row_len, within = at % row_len;
    const int64_t c = within / inner;  // the index along dim in the whole tensor
    const int64_t block = c / global, pos = c % global;
    int t = 0;
    while (t < int(rows.size()) &&
           !(rows[size_t(t)]->slice_offset <= pos &&
             pos < rows[size_t(t)]->slice_offset + part_of(*rows[size_t(t)])))
      ++t;
    FD_CHECK(t < int(rows.size()), "{}: element {} along dim {} is in no tp rank's slice",
             first.name, pos, dim);
    const ParamLayout& w = *rows[size_t(t)];
    const int64_t part = part_of(w);
    // The writer holds this part's elements up to the end of its slice in this block.
    const int64_t stop = row * row_len + (block * global + w.slice_offset + part) * inner;
    const int64_t n = std::min(end, stop) - at;
    const int64_t local = row * (part * blocks * inner) +
                          (block * part + pos - w.slice_offset) * inner + within % inner;
    fn(t, local, at, n);
    at += n;
  }
}

std::string tiling_problem(const std::vector<const ParamLayout*>& rows) {
  if (rows.empty()) return "no rows";
  const ParamLayout& first = *rows.front();
  auto shape_str = [](const ParamLayout& p) {
    return fmt::format("[{}]", fmt::join(p.shape, ", "));
  };
  if (first.whole()) {
    for (size_t t = 1; t < rows.size(); ++t) {
      if (!rows[t]->whole())
        return fmt::format("it is whole in tp rank 0 but sliced in tp rank {}", t);
      if (rows[t]->shape != first.shape)
        return fmt::format("it is whole but of shape {} in tp rank 0 and {} in tp rank {}",
                           shape_str(first), shape_str(*rows[t]), t);
    }
    return "";
  }
  int64_t next = 0;
  for (size_t t = 0; t < rows.size(); ++t) {
    const ParamLayout& p = *rows[t];
    if (p.whole()) return fmt::format("it is sliced in tp rank 0 but whole in tp rank {}", t);
    if (p.slice_dim != first.slice_dim || p.slice_blocks != first.slice_blocks ||
        p.slice_global != first.slice_global || p.shape.size() != first.shape.size())
      return fmt::format(
          "tp ranks 0 and {} slice it differently (dimension {} vs {}, {} vs {} blocks of {} "
          "vs {})",
          t, first.slice_dim, p.slice_dim, first.slice_blocks, p.slice_blocks, first.slice_global,
          p.slice_global);
    for (size_t d = 0; d < p.shape.size(); ++d)
      if (int(d) != p.slice_dim && p.shape[d] != first.shape[d])
        return fmt::format("tp ranks 0 and {} hold slices of shapes {} and {}", t, shape_str(first),
                           shape_str(p));
    if (p.slice_offset != next)
      return fmt::format(
          "tp rank {}'s slice starts at {} along dimension {}, where tp rank {}'s ends at {}", t,
          p.slice_offset, p.slice_dim, t == 0 ? 0 : t - 1, next);
    next += part_of(p);
  }
  if (next != first.slice_global)
    return fmt::format("the tp ranks' slices cover {} of {} along dimension {}", next,
                       first.slice_global, first.slice_dim);
  return "";
}

}  // namespace fd::ckpt
