#include "lib/optim/adamw.h"

#include "lib/ops/adamw.h"

namespace fd::optim {

AdamW::AdamW(std::vector<const nn::FlatParamGroup*> groups, const AdamWOptions& options)
    : options_(options) {
  for (const nn::FlatParamGroup* g : groups) {
    FD_CHECK(g->dtype() == DType::kF32, "AdamW updates fp32 groups, '{}' is {}", g->name(),
             dtype_name(g->dtype()));
    GroupState s;
    s.group = g;
    s.m = Tensor::zeros(Shape{g->numel()}, DType::kF32, MemCategory::kOptimizer);
    s.v = Tensor::zeros(Shape{g->numel()}, DType::kF32, MemCategory::kOptimizer);
    for (const nn::Parameter& p : g->params()) {
      int64_t n = p.value.numel();
      if (!s.runs.empty() && s.runs.back().decay == p.decay &&
          s.runs.back().offset + s.runs.back().count == p.offset) {
        s.runs.back().count += n;  // contiguous with the previous run
      } else {
        s.runs.push_back({p.offset, n, p.decay});
      }
    }
    state_.push_back(std::move(s));
  }
}

void AdamW::step(float lr) {
  ++step_;
  for (GroupState& s : state_) {
    float* p = s.group->flat_params().f32();
    const float* g = s.group->flat_grads().f32();
    float* m = s.m.f32();
    float* v = s.v.f32();
    for (const Run& r : s.runs) {
      ops::AdamWStep hp{lr,
                        options_.beta1,
                        options_.beta2,
                        options_.eps,
                        r.decay ? options_.weight_decay : 0.0f,
                        step_};
      ops::adamw_update(p + r.offset, g + r.offset, m + r.offset, v + r.offset, r.count, hp);
    }
  }
}

int64_t AdamW::state_bytes() const {
  int64_t b = 0;
  for (const GroupState& s : state_) b += int64_t(s.m.nbytes() + s.v.nbytes());
  return b;
}

}  // namespace fd::optim
