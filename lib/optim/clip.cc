#include "lib/optim/clip.h"

#include <cmath>

#include "lib/ops/reduce.h"

namespace fd::optim {

double global_grad_norm(const std::vector<const nn::FlatParamGroup*>& groups) {
  double sum = 0.0;
  for (const nn::FlatParamGroup* g : groups) sum += ops::sum_of_squares(g->flat_grads());
  return std::sqrt(sum);
}

float clip_grad_norm(const std::vector<const nn::FlatParamGroup*>& groups, double norm,
                     float max_norm) {
  if (max_norm <= 0.0f) return 1.0f;
  float coef = float(double(max_norm) / (norm + 1e-6));
  if (coef >= 1.0f) return 1.0f;
  for (const nn::FlatParamGroup* g : groups) ops::scale_(g->flat_grads(), coef);
  return coef;
}

}  // namespace fd::optim
