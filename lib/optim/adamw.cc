#include "lib/optim/adamw.h"

#include <algorithm>

#include "lib/ops/adamw.h"

namespace fd::optim {

AdamW::AdamW(std::vector<AdamWShard> shards, const AdamWOptions& options) : options_(options) {
  for (AdamWShard& sh : shards) {
    FD_CHECK(sh.group != nullptr && sh.begin >= 0 && sh.begin + sh.count <= sh.group->numel(),
             "bad AdamW shard [{}, {})", sh.begin, sh.begin + sh.count);
    FD_CHECK(sh.params.dtype() == DType::kF32, "AdamW updates fp32 (master) values");
    FD_CHECK(!sh.compute_params.defined() || sh.compute_params.numel() == sh.count,
             "compute copy of {} elements for a range of {}", sh.compute_params.numel(), sh.count);
    FD_CHECK(sh.params.numel() == sh.count && sh.grads.numel() == sh.count,
             "AdamW shard tensors of {} / {} elements for a range of {}", sh.params.numel(),
             sh.grads.numel(), sh.count);
    ShardState s;
    s.m = Tensor::zeros(Shape{sh.count}, DType::kF32, MemCategory::kOptimizer);
    s.v = Tensor::zeros(Shape{sh.count}, DType::kF32, MemCategory::kOptimizer);
    const int64_t end = sh.begin + sh.count;
    for (const nn::Parameter& p : sh.group->params()) {
      int64_t lo = std::max(p.offset, sh.begin);
      int64_t hi = std::min(p.offset + p.value.numel(), end);
      if (lo >= hi) continue;
      Run r{lo - sh.begin, hi - lo, p.decay};
      if (!s.runs.empty() && s.runs.back().decay == r.decay &&
          s.runs.back().offset + s.runs.back().count == r.offset) {
        s.runs.back().count += r.count;  // contiguous with the previous run
      } else {
        s.runs.push_back(r);
      }
    }
    s.shard = std::move(sh);
    state_.push_back(std::move(s));
  }
}

namespace {
std::vector<AdamWShard> whole_groups(const std::vector<const nn::FlatParamGroup*>& groups) {
  std::vector<AdamWShard> shards;
  for (const nn::FlatParamGroup* g : groups)
    shards.push_back({g, 0, g->numel(), g->flat_params(), g->flat_grads(), Tensor()});
  return shards;
}
}  // namespace

AdamW::AdamW(const std::vector<const nn::FlatParamGroup*>& groups, const AdamWOptions& options)
    : AdamW(whole_groups(groups), options) {}

void AdamW::step(float lr, float grad_scale) {
  ++step_;
  for (ShardState& s : state_) {
    for (const Run& r : s.runs) {
      ops::AdamWStep hp{lr, options_.beta1, options_.beta2, options_.eps,
                        r.decay ? options_.weight_decay : 0.0f, step_};
      ops::adamw_update(s.shard.params, s.shard.grads, grad_scale, s.m, s.v,
                        s.shard.compute_params, r.offset, r.count, hp);
    }
  }
}

int64_t AdamW::state_bytes() const {
  int64_t b = 0;
  for (const ShardState& s : state_) b += int64_t(s.m.nbytes() + s.v.nbytes());
  return b;
}

}  // namespace fd::optim
