// narrow_last: a range of the last dimension, as a new tensor (torch.narrow(x, -1, begin,
// count) followed by a copy). Tensor parallelism's replicated key/value heads: each rank
// computes every KV head and attends with the one its query heads share (nn::Decoder).
#pragma once

#include <cstdint>

#include "lib/autograd/variable.h"

namespace fd::ops {

using autograd::Variable;

// out[..., j] = x[..., begin + j] for j in [0, count); 0 <= begin, count >= 1, begin + count <=
// x's last dimension (FD_CHECK). Any dtype; out (kActivations) in x's dtype. Saves nothing:
// backward adds dout into those columns of x's gradient (fp32 arithmetic for 16-bit
// gradients). CPU and meta only (FD_CHECK).
Variable narrow_last(const Variable& x, int64_t begin, int64_t count);

}  // namespace fd::ops
