// ZeRO's padding belongs to the partition, not to the model: a model built
// once (alignment padding only) is partitioned by ZeroEngines over groups of
// 1, 2 and 3 ranks in turn, each padding every group for its own size
// (FlatParamGroup::pad_for). The ranks of larger groups are simulated with the
// counting communicator, which moves nothing: the engine is only set up here.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <vector>

#include "lib/dist/counting_communicator.h"
#include "lib/dist/local_communicator.h"
#include "lib/nn/decoder.h"
#include "lib/zero/zero_engine.h"

namespace fd::zero {
namespace {

// d_model 24, vocabulary 40: segments whose aligned lengths are not multiples
// of 16 x 2 or 16 x 3, so every group size pads them differently.
nn::GptConfig small() {
  nn::GptConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 24;
  c.vocab_size = 40;
  c.max_seq_len = 8;
  return c;
}

std::vector<float> values(const nn::Decoder& model) {
  std::vector<float> out;
  for (const nn::Parameter* p : model.parameters()) {
    const std::vector<float> v = p->value.to_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

TEST(ZeroPadding, OneModelIsPartitionedForGroupsOfAnySize) {
  const std::vector<nn::SegmentSpec> specs = nn::Decoder::segment_specs(nn::gpt2_config(small()));
  nn::Decoder model(small(), DType::kF32, layout_for(1));
  model.init_weights(3);
  const std::vector<float> initial = values(model);
  // Built with alignment only, whatever will partition it.
  for (size_t i = 0; i < specs.size(); ++i)
    EXPECT_EQ(model.groups()[i]->numel(), nn::FlatParamGroup::padded_numel(specs[i].params));
  bool some_padded = false;  // some group size pads some segment beyond its alignment
  for (int world : {1, 2, 3, 2, 1}) {
    SCOPED_TRACE(fmt::format("world {}", world));
    dist::LocalCommunicator local;
    dist::CountingCommunicator counting(world - 1, world);  // the last rank
    dist::Communicator& comm = world == 1 ? static_cast<dist::Communicator&>(local) : counting;
    ZeroConfig zc;
    zc.stage = 1;
    ZeroEngine engine(model, comm, zc);
    int64_t padded = 0;
    for (size_t i = 0; i < specs.size(); ++i) {
      const nn::FlatParamGroup& g = *model.groups()[i];
      const int64_t want = nn::FlatParamGroup::padded_numel(specs[i].params, world);
      EXPECT_EQ(g.numel(), want) << g.name();
      EXPECT_EQ(g.flat_grads().numel(), want) << g.name();
      EXPECT_EQ(want % (nn::FlatParamGroup::kAlignElems * world), 0) << g.name();
      some_padded |= want != nn::FlatParamGroup::padded_numel(specs[i].params);
      padded += want;
      // The padding past the parameters is zero.
      const std::vector<float> flat = g.flat_params().to_vector();
      for (int64_t j = nn::FlatParamGroup::padded_numel(specs[i].params); j < want; ++j)
        ASSERT_EQ(flat[size_t(j)], 0.0f) << g.name() << " element " << j;
    }
    EXPECT_EQ(engine.padded_params(), padded);
    // Each rank's range of every segment: [rank*S, (rank+1)*S), S = numel / world.
    const std::vector<ZeroEngine::SegmentState> saved = engine.saved_state();
    ASSERT_EQ(saved.size(), specs.size());
    for (size_t i = 0; i < saved.size(); ++i) {
      EXPECT_EQ(saved[i].segment_numel, model.groups()[i]->numel());
      EXPECT_EQ(saved[i].count * world, saved[i].segment_numel);
      EXPECT_EQ(saved[i].offset, (world - 1) * saved[i].count);
    }
    EXPECT_EQ(values(model), initial) << "padding moves no parameter";
  }
  EXPECT_TRUE(some_padded);
}

// A model built with released buffers (Init::kDeferred) is padded before
// anything is allocated: setting up allocates each full buffer once, at its
// padded size, and never a second one (the setup peak is what it holds).
TEST(ZeroPadding, ADeferredModelIsAllocatedOnlyOncePadded) {
  const std::vector<nn::SegmentSpec> specs = nn::Decoder::segment_specs(nn::gpt2_config(small()));
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE(fmt::format("stage {}", stage));
    DeviceScope on_meta(Device::meta());
    MemoryAccountant& acct = MemoryAccountant::global();
    const int64_t params0 = acct.current(MemCategory::kParams);
    const int64_t grads0 = acct.current(MemCategory::kGrads);
    const int64_t comm0 = acct.current(MemCategory::kComm);
    nn::GroupLayout layout = layout_for(stage);
    layout.params_resident = layout.grads_resident = false;
    nn::Decoder model(small(), DType::kF32, layout);
    EXPECT_EQ(acct.current(MemCategory::kParams), params0) << "nothing allocated at build";
    acct.reset_peaks();
    const int world = 3;
    dist::CountingCommunicator comm(1, world);
    ZeroConfig zc;
    zc.stage = stage;
    const nn::ParamFill fill = [](const nn::Parameter&, int64_t, int64_t, const Tensor&) {};
    ZeroEngine engine(model, comm, zc, fill);
    int64_t P = 0;
    for (const nn::SegmentSpec& s : specs) P += nn::FlatParamGroup::padded_numel(s.params, world);
    EXPECT_EQ(engine.padded_params(), P);
    const ModelStateBytes want = model_state_bytes(stage, world, 1, P);
    EXPECT_EQ(acct.current(MemCategory::kParams) - params0, want.params);
    EXPECT_EQ(acct.current(MemCategory::kGrads) - grads0, want.grads);
    EXPECT_EQ(acct.peak(MemCategory::kParams) - params0, want.params) << "no transient copy";
    EXPECT_EQ(acct.peak(MemCategory::kGrads) - grads0, want.grads) << "no transient copy";
    EXPECT_EQ(acct.peak(MemCategory::kComm) - comm0, 0) << "no full buffer under stages 2-3";
  }
}

}  // namespace
}  // namespace fd::zero
