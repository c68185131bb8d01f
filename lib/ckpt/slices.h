// Tensor-parallel slices in checkpoint form (DESIGN 17): a tensor-parallel shard's /layout row
// says which part of the whole tensor the parameter is (ParamLayout's slice_* fields, the
// checkpoint's mirror of nn::TensorSlice: lib/ckpt does not depend on lib/nn). These map a
// row's local elements to the whole tensor's and back, so that consolidation and a resume at
// another layout read whole tensors from whichever tp rank's shards hold them.
//
// Along dimension slice_dim, the whole tensor divides into slice_blocks equal parts of
// slice_global elements each; the row holds elements [slice_offset, slice_offset + n) of every
// part, n being its own size along slice_dim divided by slice_blocks. slice_dim -1: the whole
// tensor (unsharded, or replicated over the tp ranks).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lib/ckpt/shard.h"

namespace fd::ckpt {

// The whole tensor's shape: the row's, with the sliced dimension's full length.
std::vector<int64_t> global_shape(const ParamLayout& p);

// Elements [begin, begin + count) of row `p` (row-major over its own shape) as runs of
// consecutive elements of the whole tensor: fn(global_begin, local_begin, n), in order.
// As nn::for_each_global_run does for a Parameter.
void for_each_global_run(
    const ParamLayout& p, int64_t begin, int64_t count,
    const std::function<void(int64_t global_begin, int64_t local_begin, int64_t n)>& fn);

// One parameter's rows in every tp rank's layout of a checkpoint: rows[t] is tp rank t's.
// Elements [begin, begin + count) of the whole tensor as pieces held by the writers:
// fn(t, local_begin, global_begin, n), in order. A whole parameter is read from tp rank 0.
// `rows` must tile the whole tensor (tiling_problem() == "").
void for_each_writer_piece(
    const std::vector<const ParamLayout*>& rows, int64_t begin, int64_t count,
    const std::function<void(int t, int64_t local_begin, int64_t global_begin, int64_t n)>& fn);

// What is wrong with `rows` (one parameter's rows of every tp rank) as a split of one whole
// tensor, or "" when they tile it: whole rows must have one shape; sliced rows one dimension,
// block count, part length and otherwise equal shapes, their parts back to back from 0 to
// slice_global in tp rank order.
std::string tiling_problem(const std::vector<const ParamLayout*>& rows);

}  // namespace fd::ckpt
