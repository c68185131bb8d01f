#include "lib/nn/module.h"

namespace fd::nn {

const Parameter* Module::find(const std::string& name) const {
  for (const Parameter* p : parameters())
    if (p->name == name) return p;
  return nullptr;
}

void Module::zero_grads() const {
  for (const FlatParamGroup* g : groups()) g->zero_grads();
}

int64_t Module::parameter_count() const {
  int64_t n = 0;
  for (const Parameter* p : parameters()) n += p->value.numel();
  return n;
}

}  // namespace fd::nn
