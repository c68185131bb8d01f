// AdamW over flat parameter groups (decoupled weight decay, as torch.optim.AdamW).
//
// The optimizer owns fp32 Adam moments m and v laid out exactly like each
// group's flat buffer, and walks each group as a few contiguous runs of
// equal weight-decay setting (decay on 2-D weights; none on biases, norms and
// other 1-D tensors), so the update is one fused loop per run. Padding
// elements are skipped. fp32 groups are updated in place.
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

class AdamW {
 public:
  // `groups` must outlive the optimizer and hold fp32 parameters.
  AdamW(std::vector<const nn::FlatParamGroup*> groups, const AdamWOptions& options);

  // One update of every group from its flat gradient buffer at learning rate `lr`.
  void step(float lr);
  int64_t steps_taken() const { return step_; }
  // Bytes of optimizer state (m and v).
  int64_t state_bytes() const;

 private:
  struct Run {
    int64_t offset;
    int64_t count;
    bool decay;
  };
  struct GroupState {
    const nn::FlatParamGroup* group;
    Tensor m, v;
    std::vector<Run> runs;
  };
  AdamWOptions options_;
  std::vector<GroupState> state_;
  int64_t step_ = 0;
};

}  // namespace fd::optim
