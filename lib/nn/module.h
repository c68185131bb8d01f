// Module: anything that owns named parameters.
//
// Parameters are named with Hugging Face conventions ("h.0.attn.c_attn.weight")
// and listed in canonical order (the order of Hugging Face's state_dict), which
// is the order of weights_sha256, exports and checkpoints. The storage behind
// them is a module's FlatParamGroups (parameter.h), one per segment.
#pragma once

#include <string>
#include <vector>

#include "lib/nn/parameter.h"

namespace fd::nn {

class Module {
 public:
  virtual ~Module() = default;

  // Every parameter in canonical order. Pointers stay valid for the module's lifetime.
  virtual std::vector<const Parameter*> parameters() const = 0;
  // The flat groups holding the parameters, in forward order.
  virtual std::vector<const FlatParamGroup*> groups() const = 0;
  // Frozen parameters (a LoRA base): in the compute dtype, no gradients, no
  // optimizer state. Empty unless the module has a frozen part.
  virtual std::vector<const Parameter*> frozen_parameters() const { return {}; }
  // Their flat groups, one per segment, aligned with groups() (empty if none).
  virtual std::vector<const FlatParamGroup*> frozen_groups() const { return {}; }

  // The parameter called `name`, or nullptr.
  const Parameter* find(const std::string& name) const;
  // Sets every gradient to zero.
  void zero_grads() const;
  // Total elements of all parameters (no padding).
  int64_t parameter_count() const;
};

}  // namespace fd::nn
