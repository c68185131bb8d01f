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
  constexpr int64_t kChunk = 4096;
  for (ShardState& s : state_) {
#if FDTRAIN_HAVE_CUDA
    if (s.shard.params.is_cuda()) {  // one fused kernel per run, straight from the gradients
      for (const Run& r : s.runs) {
        ops::AdamWStep hp{lr, options_.beta1, options_.beta2, options_.eps,
                          r.decay ? options_.weight_decay : 0.0f, step_};
        ops::adamw_update_gpu(s.shard.params, s.shard.grads, grad_scale, s.m, s.v,
                              s.shard.compute_params, r.offset, r.count, hp);
      }
      continue;
    }
#endif
    float* p = s.shard.params.f32();
    float* m = s.m.f32();
    float* v = s.v.f32();
    const DType gt = s.shard.grads.dtype();
    const bool direct = gt == DType::kF32 && grad_scale == 1.0f;
    const char* g = static_cast<const char*>(s.shard.grads.raw());
    const size_t gsize = dtype_size(gt);
    const bool write_back = s.shard.compute_params.defined();
    char* c = write_back ? static_cast<char*>(s.shard.compute_params.raw()) : nullptr;
    const DType ct = write_back ? s.shard.compute_params.dtype() : DType::kF32;
    for (const Run& r : s.runs) {
      ops::AdamWStep hp{lr, options_.beta1, options_.beta2, options_.eps,
                        r.decay ? options_.weight_decay : 0.0f, step_};
      for (int64_t off = r.offset; off < r.offset + r.count; off += kChunk) {
        const int64_t n = std::min(kChunk, r.offset + r.count - off);
        const float* gf;
        if (direct) {
          gf = reinterpret_cast<const float*>(g) + off;
        } else {
          scratch_.resize(size_t(kChunk));
          convert_to_f32(gt, g + size_t(off) * gsize, scratch_.data(), size_t(n));
          for (int64_t i = 0; i < n; ++i) scratch_[size_t(i)] *= grad_scale;
          gf = scratch_.data();
        }
        ops::adamw_update(p + off, gf, m + off, v + off, n, hp);
        if (write_back) convert_f32_to(ct, p + off, c + size_t(off) * dtype_size(ct), size_t(n));
      }
    }
  }
}

int64_t AdamW::state_bytes() const {
  int64_t b = 0;
  for (const ShardState& s : state_) b += int64_t(s.m.nbytes() + s.v.nbytes());
  return b;
}

}  // namespace fd::optim
