#include "lib/engine/tensor_parallel.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

namespace fd::engine {

std::unique_ptr<nn::Decoder> gather_whole_model(const nn::Decoder& model) {
  const nn::TensorParallel& tp = model.tensor_parallel();
  FD_CHECK(tp.enabled(), "gather_whole_model of a model without tensor parallelism");
  dist::Communicator& group = *tp.group;
  const int T = tp.size;
  // Held for the caller only: a communication buffer, like ZeRO-3's gathered parameters.
  nn::GroupLayout layout;
  layout.params_category = MemCategory::kComm;
  layout.with_grads = false;
  // On the model's device: the CPU, or meta for the estimate's simulated ranks.
  const nn::FlatParamGroup& first = *model.groups().front();
  const DType dtype = first.dtype();
  const Device cpu = first.flat_params().device();
  DeviceScope scope(cpu);
  auto whole = std::make_unique<nn::Decoder>(model.config(), dtype, layout, model.lora(), layout,
                                             std::function<bool(int)>{}, std::nullopt);
  // Every rank's spec of each parameter (its shape and slice), by name.
  std::map<std::string, std::vector<nn::ParamSpec>> specs;
  for (int r = 0; r < T; ++r) {
    const nn::TensorParallel at{r, T, nullptr};
    auto add = [&](const std::vector<nn::SegmentSpec>& segs) {
      for (const nn::SegmentSpec& s : segs)
        for (const nn::ParamSpec& p : s.params) specs[p.name].push_back(p);
    };
    add(nn::Decoder::segment_specs(model.config(), model.lora(), at));
    if (model.lora().enabled()) add(nn::Decoder::segment_specs(model.config(), {}, at));
  }
  std::map<std::string, const nn::Parameter*> targets;
  for (const nn::Parameter* p : whole->parameters()) targets[p->name] = p;
  for (const nn::Parameter* p : whole->frozen_parameters()) targets[p->name] = p;
  std::vector<const nn::Parameter*> mine = model.parameters();
  for (const nn::Parameter* p : model.frozen_parameters()) mine.push_back(p);
  for (const nn::Parameter* p : mine) {
    const nn::Parameter& out = *targets.at(p->name);
    // A QLoRA base's 4-bit weight: its values, dequantized as the forward computes with them
    // (the twin holds the base in the compute dtype).
    Tensor value = p->value;
    if (const quant::QuantizedWeight* q = model.quantized(*p)) {
      value = q->is_meta() ? Tensor::empty(p->value.shape(), p->value.dtype(), MemCategory::kComm,
                                           Device::meta())
                           : Tensor::from_vector(model.dequantized(*p), p->value.shape(),
                                                 p->value.dtype(), MemCategory::kComm);
    }
    if (p->slice.whole()) {  // the same on every rank
      out.value.copy_from(value);
      continue;
    }
    const std::vector<nn::ParamSpec>& by_rank = specs.at(p->name);
    int64_t longest = 0;
    for (const nn::ParamSpec& s : by_rank) longest = std::max(longest, s.shape.numel());
    Tensor send = Tensor::zeros(Shape{longest}, p->value.dtype(), MemCategory::kComm, cpu);
    send.flat_slice(0, value.numel()).copy_from(value.reshape(Shape{value.numel()}));
    Tensor all = Tensor::empty(Shape{longest * T}, p->value.dtype(), MemCategory::kComm, cpu);
    group.all_gather(send.comm_data(), all.comm_data(), longest, p->value.dtype());
    if (out.value.is_meta()) continue;
    for (int r = 0; r < T; ++r) {
      nn::Parameter slice;  // rank r's part, in place in the gathered buffer
      slice.name = p->name;
      slice.slice = by_rank[size_t(r)].slice;
      slice.value = all.flat_slice(r * longest, by_rank[size_t(r)].shape.numel())
                        .reshape(by_rank[size_t(r)].shape);
      nn::for_each_global_run(slice, 0, slice.value.numel(), [&](int64_t g, int64_t l, int64_t n) {
        out.value.flat_slice(g, n).copy_from(slice.value.flat_slice(l, n));
      });
    }
  }
  return whole;
}

}  // namespace fd::engine
