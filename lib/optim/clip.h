// Global-norm gradient clipping over flat gradient buffers.
#pragma once

#include <vector>

#include "lib/nn/parameter.h"

namespace fd::optim {

// The L2 norm of all gradients of `groups` (accumulated in double, groups in order).
double global_grad_norm(const std::vector<const nn::FlatParamGroup*>& groups);

// Scales the gradients by max_norm / (norm + 1e-6) when that is below 1, as
// torch.nn.utils.clip_grad_norm_ does. Returns the factor applied (1 if none).
// max_norm <= 0 disables clipping.
float clip_grad_norm(const std::vector<const nn::FlatParamGroup*>& groups, double norm,
                     float max_norm);

}  // namespace fd::optim
