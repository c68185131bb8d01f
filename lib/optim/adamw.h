// AdamW over flat parameter shards (decoupled weight decay, as torch.optim.AdamW).
//
// The optimizer updates contiguous ranges of flat parameter groups: whole
// groups on one process, or the rank's ZeRO shard of each group. It owns fp32
// Adam moments m and v for exactly those ranges, and walks each range as a
// few contiguous runs of equal weight-decay setting (decay on 2-D weights;
// none on biases, norms and other 1-D tensors), so the update is one fused
// loop per run. Alignment padding inside a range is skipped.
#pragma once

#include <vector>

#include "lib/nn/parameter.h"

namespace fd::optim {

struct AdamWOptions {
  float lr = 3e-4f;           // peak learning rate (the schedule scales it per step)
  float beta1 = 0.9f;         // first-moment decay
  float beta2 = 0.999f;       // second-moment decay
  float eps = 1e-8f;          // added to sqrt(v̂)
  float weight_decay = 0.0f;  // decoupled decay for parameters with decay = true
};

// Elements [begin, begin + count) of `group`'s flat space, with the tensors
// (count elements each) that hold their values and gradients.
struct AdamWShard {
  const nn::FlatParamGroup* group = nullptr;  // gives the parameters' layout and decay flags
  int64_t begin = 0;
  int64_t count = 0;
  Tensor params;          // fp32 values (the master weights), updated in place
  Tensor grads;           // gradients in any float dtype (read as fp32)
  Tensor compute_params;  // optional: the 16-bit copy, rewritten from params after each update
                          // (round to nearest even)
};

class AdamW {
 public:
  explicit AdamW(std::vector<AdamWShard> shards, const AdamWOptions& options);
  // Every element of every group (single process, or ZeRO stage 0).
  AdamW(const std::vector<const nn::FlatParamGroup*>& groups, const AdamWOptions& options);

  // One update of every shard at learning rate `lr` from its gradients times
  // grad_scale (clipping and loss-scale removal folded into the fp32 read).
  void step(float lr, float grad_scale = 1.0f);
  int64_t steps_taken() const { return step_; }
  // Restores the step counter (bias correction) when resuming from a checkpoint.
  void set_steps_taken(int64_t steps) { step_ = steps; }
  // The fp32 moments of shard i (in the order given to the constructor).
  const Tensor& exp_avg(size_t i) const { return state_[i].m; }
  const Tensor& exp_avg_sq(size_t i) const { return state_[i].v; }
  size_t num_shards() const { return state_.size(); }
  // Bytes of optimizer state (m and v).
  int64_t state_bytes() const;

 private:
  struct Run {
    int64_t offset;  // relative to the shard's begin
    int64_t count;
    bool decay;
  };
  struct ShardState {
    AdamWShard shard;
    Tensor m, v;
    std::vector<Run> runs;
  };
  AdamWOptions options_;
  std::vector<ShardState> state_;
  int64_t step_ = 0;
};

}  // namespace fd::optim
