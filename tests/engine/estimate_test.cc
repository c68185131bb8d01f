// The estimate (a run on the counting device) against the things it
// predicts: padded sizes against constructed models, model states against the
// ZeRO formulas (exact integers), and activations, comm buffers and model
// states against the memory accountant's peaks over a real training step on
// the CPU (world 1, every stage, fp32/bf16/fp16, checkpointing, LoRA), for
// models the estimator is told nothing about.
#include "lib/engine/estimate.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "lib/autograd/tape.h"
#include "lib/config/model_dir.h"
#include "lib/dist/local_communicator.h"
#include "lib/nn/decoder.h"
#include "lib/zero/zero_engine.h"
#include "tests/engine/ring_model.h"

namespace fd::engine {
namespace {

nn::GptConfig config(int L, int H, int C, int V, int T) {
  nn::GptConfig c;
  c.n_layer = L;
  c.n_head = H;
  c.d_model = C;
  c.vocab_size = V;
  c.max_seq_len = T;
  return c;
}

// Every parameter a multiple of 64 elements and every segment of 16 * 4: P = Ψ at N = 1, 2, 4.
nn::GptConfig unpadded() { return config(2, 4, 64, 128, 64); }
// d_model 24: 1-D parameters of 24 elements need alignment padding, and segments world padding.
nn::GptConfig padded() { return config(2, 2, 24, 40, 8); }

config::Recipe recipe_for(const nn::GptConfig& c, int micro, int seq_len, int accumulation,
                          int stage = 0, bool overlap = true, DType dtype = DType::kF32,
                          const std::vector<int>& checkpointed = {}) {
  config::Recipe r;
  r.model.n_layer = c.n_layer;
  r.model.n_head = c.n_head;
  r.model.d_model = c.d_model;
  r.model.vocab_size = c.vocab_size;
  r.model.max_seq_len = c.max_seq_len;
  r.batch.micro = micro;
  r.batch.accumulation = accumulation;
  r.data.seq_len = seq_len;
  r.zero.stage = stage;
  r.zero.overlap_comm = overlap;
  r.precision = dtype == DType::kBF16  ? config::Precision::kBf16
                : dtype == DType::kF16 ? config::Precision::kFp16
                                       : config::Precision::kFp32;
  r.activation_checkpointing.layers = checkpointed;
  return r;
}

TEST(Estimate, PaddedSizesEqualAConstructedModel) {
  for (const nn::GptConfig& c : {unpadded(), padded(), config(3, 3, 48, 257, 33)}) {
    // Built once, padded for each world in turn as an engine over it pads it.
    nn::Decoder model(c, DType::kF32, zero::layout_for(0));
    for (int world : {1, 2, 3, 4, 8}) {
      int64_t built = 0;
      for (const nn::FlatParamGroup* g : model.groups()) {
        g->pad_for(world);
        built += g->numel();
      }
      EXPECT_EQ(estimate(recipe_for(c, 1, c.max_seq_len, 1), world).padded_params, built)
          << "world " << world;
    }
  }
}

TEST(Estimate, FlatParamGroupPaddedNumelIsTheConstructedNumel) {
  const std::vector<nn::ParamSpec> specs = {{"a", Shape{3, 5}, true},
                                            {"b", Shape{5}, false},
                                            {"c", Shape{2, 16}, true},
                                            {"d", Shape{1}, false}};
  nn::FlatParamGroup g("g", specs, DType::kF32);
  EXPECT_EQ(nn::FlatParamGroup::padded_numel(specs), g.numel());
  for (int64_t k : {1, 2, 3, 4, 7, 1}) {
    g.pad_for(k);
    EXPECT_EQ(nn::FlatParamGroup::padded_numel(specs, k), g.numel()) << "shards " << k;
  }
  EXPECT_EQ(nn::FlatParamGroup::padded_numel(specs), 80);  // 16 + 16 + 32 + 16
}

// With P = Ψ the fp32 model states are exactly the paper's fp32 formulas.
TEST(Estimate, ModelStatesAreThePaperFormulasWithoutPadding) {
  const nn::GptConfig c = unpadded();
  const int64_t psi = nn::gpt2_config(c).num_params();
  for (int64_t N : {1, 2, 4}) {
    const Estimate e = estimate(recipe_for(c, 2, 16, 1), int(N));
    ASSERT_EQ(e.num_params, psi);
    ASSERT_EQ(e.padded_params, psi) << "no padding expected at N = " << N;
    ASSERT_EQ(psi % N, 0);
    const int64_t want[4] = {16 * psi, 8 * psi + 8 * psi / N, 4 * psi + 12 * psi / N, 16 * psi / N};
    for (int s = 0; s < 4; ++s) {
      const StageEstimate& st = e.stages[size_t(s)];
      EXPECT_EQ(st.model_states.total(), want[s]) << "stage " << s << " N " << N;
      EXPECT_EQ(st.paper_bytes, double(want[s])) << "stage " << s << " N " << N;
      EXPECT_EQ(st.model_states.master, 0);
    }
    // Stage by stage, what is kept (params, grads, optimizer).
    EXPECT_EQ(e.stages[1].model_states.optimizer, 8 * psi / N);
    EXPECT_EQ(e.stages[2].model_states.grads, 4 * psi / N);
    EXPECT_EQ(e.stages[3].model_states.params, 4 * psi / N);
  }
}

// Offloaded optimizer state: host memory (GPU runs) keeps master, m and v
// (12 bytes per element of the rank's shard, in bf16, plus 4 KiB of alignment)
// in the optimizer category, all of it in host memory, with pinned buffers for
// the shard's gradients and parameters (2 + 2 bytes); NVMe keeps only buffers
// resident and puts 12 bytes per element in the file. Nothing else moves.
TEST(Estimate, OffloadedStateIsInHostMemoryOrInTheFile) {
  const nn::GptConfig c = unpadded();
  const int64_t psi = nn::gpt2_config(c).num_params();
  config::Recipe base = recipe_for(c, 2, 16, 1, 0, true, DType::kBF16);
  const Estimate none = estimate(base, 2);
  config::Recipe host = base;
  host.device = config::DeviceName::kCuda;
  host.zero.offload_optimizer.device = config::OffloadDevice::kHost;
  config::Recipe nvme = base;
  nvme.zero.offload_optimizer.device = config::OffloadDevice::kNvme;
  nvme.zero.offload_optimizer.path = "/nonexistent";  // the counting device makes no file
  nvme.zero.offload_optimizer.buffer_mib = 1;
  config::Recipe nvme_gpu = nvme;
  nvme_gpu.device = config::DeviceName::kCuda;
  const Estimate h = estimate(host, 2), n = estimate(nvme, 2), ng = estimate(nvme_gpu, 2);
  for (int s = 1; s < 4; ++s) {
    const StageEstimate &a = none.stages[size_t(s)], &b = h.stages[size_t(s)],
                        &d = n.stages[size_t(s)];
    EXPECT_EQ(b.model_states.master, 0) << s;
    // The GPU's transfer buffers: gradients and parameters of the shard, bf16.
    const int64_t shard = a.model_states.master / 4;  // the in-memory run's fp32 master: P/N
    EXPECT_EQ(b.offload_pinned, 2 * 2 * shard) << s;
    EXPECT_EQ(b.offload_host + b.offload_pinned, b.model_states.optimizer) << s;
    EXPECT_GE(b.offload_host, 12 * psi / 2) << s;  // fields padded to 2048 elements, 4 KiB slack
    EXPECT_EQ(b.offload_nvme, 0) << s;
    EXPECT_EQ(d.offload_host, 0) << s;
    EXPECT_EQ(d.offload_pinned, 0) << s;  // a CPU run's tensors are host memory already
    const StageEstimate& dg = ng.stages[size_t(s)];
    EXPECT_EQ(dg.offload_pinned, 2 * 2 * shard) << s;  // the GPU's, NVMe or not
    EXPECT_EQ(dg.model_states.optimizer, d.model_states.optimizer + dg.offload_pinned) << s;
    EXPECT_GE(d.offload_nvme, 12 * psi / 2 + 4096) << s;
    EXPECT_LE(d.model_states.optimizer, int64_t(1) << 20) << s;
    EXPECT_EQ(d.model_states.master, 0) << s;
    for (const StageEstimate* x : {&b, &d}) {
      EXPECT_EQ(x->model_states.params, a.model_states.params) << s;
      EXPECT_EQ(x->model_states.grads, a.model_states.grads) << s;
      EXPECT_EQ(x->activations, a.activations) << s;
    }
  }
  EXPECT_EQ(none.stages[1].offload_host + none.stages[1].offload_nvme, 0);
}

// With padding the same formulas hold at P, and P - Ψ is the padding.
TEST(Estimate, ModelStatesArePaddedFormulasWithPadding) {
  const nn::GptConfig c = padded();
  const int64_t psi = nn::gpt2_config(c).num_params();
  for (int64_t N : {1, 2, 4}) {
    const Estimate e = estimate(recipe_for(c, 2, 8, 1), int(N));
    const int64_t P = e.padded_params;
    EXPECT_GT(P, psi) << "N " << N;
    EXPECT_EQ(P % (16 * N), 0);
    const int64_t want[4] = {16 * P, 8 * P + 8 * P / N, 4 * P + 12 * P / N, 16 * P / N};
    for (int s = 0; s < 4; ++s)
      EXPECT_EQ(e.stages[size_t(s)].model_states.total(), want[s]) << "stage " << s << " N " << N;
    EXPECT_GT(double(e.stages[0].model_states.total()), e.stages[0].paper_bytes);
  }
  // World padding only grows with N; alignment padding does not depend on it.
  EXPECT_LE(estimate(recipe_for(c, 2, 8, 1), 2).padded_params,
            estimate(recipe_for(c, 2, 8, 1), 4).padded_params);
  EXPECT_EQ(estimate(recipe_for(c, 2, 8, 1), 4).padded_params_1,
            estimate(recipe_for(c, 2, 8, 1), 1).padded_params);
}

TEST(Estimate, AccumulationAddsAGradientShardToStagesZeroAndOne) {
  const nn::GptConfig c = unpadded();
  const int64_t P = nn::gpt2_config(c).num_params();
  const Estimate e = estimate(recipe_for(c, 2, 16, 3), 4);
  EXPECT_EQ(e.stages[0].model_states.total(), 16 * P + 4 * P / 4);
  EXPECT_EQ(e.stages[1].model_states.total(), 8 * P + 8 * P / 4 + 4 * P / 4);
  EXPECT_EQ(e.stages[2].model_states.total(), 4 * P + 12 * P / 4);
  EXPECT_EQ(e.stages[3].model_states.total(), 16 * P / 4);
}

// The counted traffic of the estimate's step is the ring model's.
TEST(Estimate, CommunicationPerStep) {
  for (int N : {1, 2, 4}) {
    for (int a : {1, 3}) {
      const Estimate e = estimate(recipe_for(unpadded(), 2, 16, a), N);
      for (int s = 0; s < 4; ++s)
        EXPECT_EQ(e.stages[size_t(s)].comm_bytes_per_step,
                  comm_bytes_per_step(s, N, a, e.padded_params))
            << "stage " << s << " N " << N << " a " << a;
    }
  }
  const int64_t P = 1024;
  for (int s = 0; s < 4; ++s) EXPECT_EQ(comm_bytes_per_step(s, 1, 1, P), 0) << "world 1";
  // One pass over P at N = 4 sends 3/4 * 4P = 3072 bytes.
  EXPECT_EQ(comm_bytes_per_step(0, 4, 1, P), 2 * 3072);
  EXPECT_EQ(comm_bytes_per_step(2, 4, 1, P), 2 * 3072);
  EXPECT_EQ(comm_bytes_per_step(3, 4, 1, P), 3 * 3072);
  EXPECT_EQ(comm_bytes_per_step(1, 4, 3, P), 4 * 3072);  // a reduce-scatter per micro-batch + 1
  EXPECT_EQ(comm_bytes_per_step(3, 4, 3, P), 9 * 3072);  // 3 per micro-batch
  EXPECT_EQ(comm_bytes_per_step(0, 2, 1, P), 2 * 2048);
}

// One training step of `c` at world 1 under `stage`, measured by the memory
// accountant from just after the engine is built (peaks reset there).
struct Measured {
  int64_t params, grads, master, optimizer, activations, comm;
};

Measured measure_step(const nn::DecoderConfig& c, int stage, int micro, int seq_len,
                      int accumulation, bool overlap, DType dtype = DType::kF32,
                      const std::vector<int>& checkpointed = {}) {
  dist::LocalCommunicator comm;
  nn::Decoder model(c, dtype, zero::layout_for(stage));
  model.init_weights(7);
  zero::ZeroConfig zc;
  zc.stage = stage;
  zc.accumulation = accumulation;
  zc.overlap_comm = overlap;
  for (int l : checkpointed)  // as the trainer does: the block's segment in the model's list
    zc.checkpoint_segments.push_back(
        nn::find_segment(model.segment_info(), nn::SegmentRole::kBlock, l));
  zero::ZeroEngine engine(model, comm, zc);
  Tensor tokens = Tensor::empty(Shape{micro, seq_len}, DType::kI32, MemCategory::kOther);
  Tensor targets = Tensor::empty(Shape{micro, seq_len}, DType::kI32, MemCategory::kOther);
  MemoryAccountant& acct = MemoryAccountant::global();
  const int64_t act0 = acct.current(MemCategory::kActivations);
  const int64_t comm0 = acct.current(MemCategory::kComm);
  acct.reset_peaks();
  for (int m = 0; m < accumulation; ++m) {
    for (int64_t i = 0; i < tokens.numel(); ++i) {
      tokens.i32()[i] = int32_t((i * 7 + m) % c.vocab_size);
      targets.i32()[i] = int32_t((i * 5 + 3 + m) % c.vocab_size);
    }
    engine.begin_micro_batch(m);
    autograd::Tape tape;
    autograd::TapeScope scope(tape);
    autograd::Variable loss = model.loss(tokens, targets, &engine);
    tape.backward(loss, 1.0f / float(accumulation));
    engine.end_micro_batch(m);
  }
  engine.step(1e-3f);
  return {acct.peak(MemCategory::kParams),
          acct.peak(MemCategory::kGrads),
          acct.peak(MemCategory::kMaster),
          acct.peak(MemCategory::kOptimizer),
          acct.peak(MemCategory::kActivations) - act0,
          acct.peak(MemCategory::kComm) - comm0};
}

struct StepCase {
  nn::GptConfig model;
  int micro, seq_len;
  const char* peak_at;  // the moment the activation formula should pick
};

// A wide MLP against the vocabulary (4C well above V: the head's logits and their gradient
// weigh less than the MLP's backward, whose residual gradients pass through without copies)
// makes the top block's MLP backward the peak; T > 128 uses several
// attention score blocks; V > 6C the head + loss backward (one chunk of
// logits and their gradient, computed in place).
const StepCase kCases[] = {
    {config(2, 4, 64, 97, 64), 3, 32, "block 1 backward (matmul)"},
    {config(2, 2, 64, 40, 160), 1, 150, "block 1 backward (matmul)"},
    {config(1, 3, 48, 300, 16), 2, 16, "head backward (linear_cross_entropy)"},
    {config(3, 2, 24, 40, 8), 2, 8, nullptr},
};

TEST(Estimate, ActivationsAndCommBuffersEqualAMeasuredStep) {
  for (const StepCase& k : kCases) {
    for (int stage = 0; stage < 4; ++stage) {
      for (int accumulation : {1, 2}) {
        for (bool overlap : {true, false}) {
          SCOPED_TRACE(::testing::Message()
                       << "C " << k.model.d_model << " V " << k.model.vocab_size << " T "
                       << k.seq_len << " stage " << stage << " accumulation " << accumulation
                       << " overlap " << overlap);
          const Estimate e =
              estimate(recipe_for(k.model, k.micro, k.seq_len, accumulation, stage, overlap), 1);
          const StageEstimate& st = e.stages[size_t(stage)];
          if (k.peak_at != nullptr) {
            EXPECT_EQ(e.activations.peak_at, k.peak_at);
          }
          const Measured m = measure_step(nn::gpt2_config(k.model), stage, k.micro, k.seq_len,
                                          accumulation, overlap);
          const zero::ModelStateBytes ms =
              zero::model_state_bytes(stage, 1, accumulation, e.padded_params);
          EXPECT_EQ(m.params, ms.params);
          EXPECT_EQ(m.grads, ms.grads);
          EXPECT_EQ(m.master, ms.master);
          EXPECT_EQ(m.optimizer, ms.optimizer);
          EXPECT_EQ(st.model_states.total(), ms.total());
          EXPECT_EQ(m.params, st.model_states.params);
          EXPECT_EQ(m.grads, st.model_states.grads);
          EXPECT_EQ(m.optimizer, st.model_states.optimizer);
          EXPECT_EQ(m.activations, st.activations) << "estimated peak at " << e.activations.peak_at;
          EXPECT_EQ(m.comm, st.comm_step);
        }
      }
    }
  }
}

// bf16 and fp16: 16-bit activations with the ops' fp32 statistics and fp32
// scratch copies, with and without activation checkpointing, against a real
// step (world 1: the local communicator stages nothing). Model states at c = 2.
TEST(Estimate, SixteenBitAndCheckpointedActivationsEqualAMeasuredStep) {
  const std::vector<std::vector<int>> layer_sets = {{}, {0, 1, 2}, {0}, {1}, {0, 2}};
  for (const StepCase& k : {kCases[0], kCases[1], kCases[3]}) {
    const int L = k.model.n_layer;
    for (DType dtype : {DType::kBF16, DType::kF16}) {
      for (const std::vector<int>& all_layers : layer_sets) {
        std::vector<int> layers;
        for (int l : all_layers)
          if (l < L) layers.push_back(l);
        for (int stage : {0, 2, 3}) {
          for (int accumulation : {1, 2}) {
            SCOPED_TRACE(::testing::Message()
                         << "C " << k.model.d_model << " T " << k.seq_len << " "
                         << dtype_name(dtype) << " checkpointed " << layers.size() << " of " << L
                         << " (first " << (layers.empty() ? -1 : layers[0]) << ") stage " << stage
                         << " accumulation " << accumulation);
            const Estimate e = estimate(
                recipe_for(k.model, k.micro, k.seq_len, accumulation, stage, true, dtype, layers),
                1);
            EXPECT_LT(e.activations.eval_peak, e.activations.peak);
            const StageEstimate& st = e.stages[size_t(stage)];
            const Measured m = measure_step(nn::gpt2_config(k.model), stage, k.micro, k.seq_len,
                                            accumulation, true, dtype, layers);
            const zero::ModelStateBytes ms =
                zero::model_state_bytes(stage, 1, accumulation, e.padded_params, 2);
            EXPECT_EQ(m.params, ms.params);
            EXPECT_EQ(m.grads, ms.grads);
            EXPECT_EQ(m.master, ms.master);
            EXPECT_EQ(m.optimizer, ms.optimizer);
            EXPECT_EQ(st.model_states.total(), ms.total());
            EXPECT_EQ(m.activations, st.activations)
                << "estimated peak at " << e.activations.peak_at;
            EXPECT_EQ(m.comm, st.comm_step);
          }
        }
      }
    }
  }
}

// Checkpointing every block keeps one output per block instead of the full
// saved set, and the fp32 figures are the closed form.
TEST(Estimate, CheckpointingKeepsOnlyBlockOutputs) {
  const nn::GptConfig c = config(8, 4, 64, 96, 64);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const int64_t bytes = int64_t(dtype_size(dtype));
    const ActivationEstimate none =
        estimate(recipe_for(c, 2, 64, 1, 0, true, dtype), 1).activations;
    const ActivationEstimate all =
        estimate(recipe_for(c, 2, 64, 1, 0, true, dtype, {0, 1, 2, 3, 4, 5, 6, 7}), 1).activations;
    const int64_t R = 2 * 64, C = 64;
    EXPECT_EQ(all.per_checkpointed_block, bytes * R * C);
    EXPECT_EQ(none.saved - all.saved, 8 * (none.per_block - all.per_checkpointed_block));
    EXPECT_LT(all.peak, none.peak);
    EXPECT_EQ(all.checkpointed, 8);
    EXPECT_EQ(none.embed, all.embed);
    EXPECT_EQ(none.head, all.head);
    EXPECT_EQ(none.saved, none.embed + 8 * none.per_block + none.head);
  }
  // fp32 without checkpointing: a block saves 16 RC values and 4 rows of statistics of R x 4 bytes.
  const ActivationEstimate f32 = estimate(recipe_for(c, 2, 64, 1), 1).activations;
  EXPECT_EQ(f32.per_block, 4 * (16 * 128 * 64 + 4 * 128 + 4 * 128));
}

// With precision bf16 or fp16 and P = Ψ, model states are the paper's
// mixed-precision figures: 16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N; communication
// counts 2 bytes an element.
TEST(Estimate, SixteenBitModelStatesAreThePaperFormulas) {
  const nn::GptConfig c = unpadded();
  const int64_t psi = nn::gpt2_config(c).num_params();
  for (config::Precision p : {config::Precision::kBf16, config::Precision::kFp16}) {
    for (int64_t N : {1, 2, 4}) {
      config::Recipe r = recipe_for(c, 2, 16, 1);
      r.precision = p;
      r.activation_checkpointing.layers = {1};
      const Estimate e = estimate(r, int(N));
      ASSERT_EQ(e.padded_params, psi);
      EXPECT_EQ(e.compute_bytes, 2);
      // MPI's fp32 staging of the largest segment's reduce-scatter (its input
      // and output), kept from the first reduction to the end of the run.
      int64_t largest = 0;
      for (const nn::SegmentSpec& seg : nn::Decoder::segment_specs(nn::gpt2_config(c)))
        largest = std::max(largest, nn::FlatParamGroup::padded_numel(seg.params, N));
      const int64_t kept = N > 1 ? (N + 1) * (largest / N) * 4 : 0;
      const int64_t want[4] = {16 * psi, 4 * psi + 12 * psi / N, 2 * psi + 14 * psi / N,
                               16 * psi / N};
      for (int s = 0; s < 4; ++s) {
        const StageEstimate& st = e.stages[size_t(s)];
        EXPECT_EQ(st.model_states.total(), want[s]) << "stage " << s << " N " << N;
        EXPECT_EQ(st.paper_bytes, double(want[s])) << "stage " << s << " N " << N;
        EXPECT_EQ(st.comm_bytes_per_step, comm_bytes_per_step(s, int(N), 1, psi, 2));
        EXPECT_EQ(st.comm_staging > 0, N > 1) << "fp32 staging only through MPI";
        EXPECT_EQ(st.comm_full_gather, (s == 3 ? 2 * psi : 0) + kept)
            << "stage " << s << " N " << N;
      }
      EXPECT_EQ(e.stages[0].model_states.master, 4 * psi);
      EXPECT_EQ(e.stages[2].model_states.grads, 2 * psi / N);
      EXPECT_EQ(e.stages[3].model_states.params, 2 * psi / N);
      EXPECT_EQ(e.activations.checkpointed, 1);
    }
  }
  EXPECT_EQ(comm_bytes_per_step(3, 4, 1, 1024, 2), 3 * 1536);
}

// zero.reduce_dtype bf16/fp16: MPI's kept staging is every rank's 16-bit chunk
// of the largest segment (2 bytes x the segment) instead of fp32 copies of its
// input and output (4 bytes x (N + 1) shards); model states and the bytes
// counted per step do not change.
TEST(Estimate, NativeSixteenBitReductionsKeepSixteenBitStaging) {
  const nn::GptConfig c = unpadded();
  const int64_t psi = nn::gpt2_config(c).num_params();
  for (config::Precision p : {config::Precision::kBf16, config::Precision::kFp16}) {
    for (int64_t N : {1, 2, 4}) {
      config::Recipe r = recipe_for(c, 2, 16, 1);
      r.precision = p;
      const Estimate fp32 = estimate(r, int(N));
      r.zero.reduce_dtype = p;
      const Estimate native = estimate(r, int(N));
      int64_t largest = 0;
      for (const nn::SegmentSpec& seg : nn::Decoder::segment_specs(nn::gpt2_config(c)))
        largest = std::max(largest, nn::FlatParamGroup::padded_numel(seg.params, N));
      const int64_t kept = N > 1 ? largest * 2 : 0;
      for (int s = 0; s < 4; ++s) {
        const StageEstimate& a = fp32.stages[size_t(s)];
        const StageEstimate& b = native.stages[size_t(s)];
        EXPECT_EQ(b.model_states.total(), a.model_states.total());
        EXPECT_EQ(b.comm_bytes_per_step, a.comm_bytes_per_step);
        EXPECT_EQ(b.comm_full_gather, (s == 3 ? 2 * psi : 0) + kept) << "stage " << s << " N " << N;
        if (N > 1) {
          EXPECT_LT(b.comm_staging, a.comm_staging) << "stage " << s << " N " << N;
        }
      }
    }
  }
}

}  // namespace
}  // namespace fd::engine

namespace fd::engine {
namespace {

// LoRA at world 1: a real step of a model with adapters on a frozen base
// (every stage, fp32 and bf16, dropout on and off, with and without
// checkpointed blocks) measures exactly the estimate: trainable model states
// at the padded adapter count, the frozen base, activations and comm buffers.
// The second model is one the estimator was never told about: five blocks,
// adapters on c_fc of blocks 1 and 3 only.
TEST(Estimate, LoraStepEqualsTheEstimate) {
  struct LoraCase {
    nn::GptConfig c;
    std::vector<std::string> targets;
    std::vector<int> layers;
  };
  const std::vector<LoraCase> cases = {
      {config(3, 2, 24, 40, 8), {"c_attn", "c_proj"}, {}},
      {config(3, 2, 24, 40, 8), {"c_fc"}, {}},
      {config(5, 2, 32, 50, 8), {"c_fc"}, {1, 3}},
  };
  for (const LoraCase& lc : cases) {
    const nn::GptConfig& c = lc.c;
    const std::vector<std::string>& targets = lc.targets;
    for (float dropout : {0.0f, 0.1f}) {
      for (DType dtype : {DType::kF32, DType::kBF16}) {
        for (const std::vector<int>& ckpt : {std::vector<int>{}, std::vector<int>{0, 1, 2}}) {
          for (int stage = 0; stage < 4; ++stage) {
            config::Recipe r = recipe_for(c, 2, 8, 1);
            r.precision =
                dtype == DType::kF32 ? config::Precision::kFp32 : config::Precision::kBf16;
            r.activation_checkpointing.layers = ckpt;
            r.zero.stage = stage;
            r.lora = config::LoraOptions{};
            r.lora->r = 4;
            r.lora->alpha = 8;
            r.lora->dropout = dropout;
            r.lora->targets = targets;
            r.lora->layers = lc.layers;
            const Estimate e = estimate(r, 1);
            SCOPED_TRACE(::testing::Message()
                         << "L " << c.n_layer << " targets " << targets.size() << " layers "
                         << lc.layers.size() << " dropout " << dropout << " " << dtype_name(dtype)
                         << " ckpt " << ckpt.size() << " stage " << stage);
            EXPECT_EQ(e.num_params, e.lora.num_params(nn::gpt2_config(c)));
            EXPECT_EQ(e.frozen_params, nn::gpt2_config(c).num_params());
            dist::LocalCommunicator comm;
            nn::Decoder model(c, dtype, zero::layout_for(stage), e.lora,
                              zero::frozen_layout_for(stage));
            model.init_weights(7);
            int64_t P = 0, Pb = 0;
            for (const nn::FlatParamGroup* g : model.groups()) P += g->numel();
            for (const nn::FlatParamGroup* g : model.frozen_groups()) Pb += g->numel();
            EXPECT_EQ(P, e.padded_params);
            EXPECT_EQ(Pb, e.frozen_padded_params);
            zero::ZeroConfig zc;
            zc.stage = stage;
            for (int l : ckpt)
              zc.checkpoint_segments.push_back(
                  nn::find_segment(model.segment_info(), nn::SegmentRole::kBlock, l));
            zero::ZeroEngine engine(model, comm, zc);
            Tensor tokens = Tensor::empty(Shape{2, 8}, DType::kI32, MemCategory::kOther);
            Tensor targets_t = Tensor::empty(Shape{2, 8}, DType::kI32, MemCategory::kOther);
            for (int64_t i = 0; i < tokens.numel(); ++i) {
              tokens.i32()[i] = int32_t((i * 7) % c.vocab_size);
              targets_t.i32()[i] = int32_t((i * 5 + 3) % c.vocab_size);
            }
            MemoryAccountant& acct = MemoryAccountant::global();
            const int64_t act0 = acct.current(MemCategory::kActivations);
            const int64_t comm0 = acct.current(MemCategory::kComm);
            acct.reset_peaks();
            model.set_dropout_seed(11);
            engine.begin_micro_batch(0);
            {
              autograd::Tape tape;
              autograd::TapeScope scope(tape);
              autograd::Variable loss = model.loss(tokens, targets_t, &engine);
              tape.backward(loss, 1.0f);
            }
            engine.end_micro_batch(0);
            engine.step(1e-3f);
            const StageEstimate& st = e.stages[size_t(stage)];
            EXPECT_EQ(acct.peak(MemCategory::kParams), st.model_states.params);
            EXPECT_EQ(acct.peak(MemCategory::kGrads), st.model_states.grads);
            EXPECT_EQ(acct.peak(MemCategory::kMaster), st.model_states.master);
            EXPECT_EQ(acct.peak(MemCategory::kOptimizer), st.model_states.optimizer);
            EXPECT_EQ(acct.peak(MemCategory::kFrozen), st.frozen);
            EXPECT_EQ(acct.peak(MemCategory::kActivations) - act0, st.activations)
                << "estimated peak at " << e.activations.peak_at;
            EXPECT_EQ(acct.peak(MemCategory::kComm) - comm0, st.comm_step);
          }
        }
      }
    }
  }
}

// The Llama family through the same road: GQA with an untied head, Qwen3's
// per-head q/k norm with a tied head, and a vocabulary large enough that the
// chunked head + loss is the peak; stages 0-3, fp32 and bf16, with and without
// a checkpointed block: the estimate equals a measured step.
TEST(Estimate, LlamaFamilyEqualsAMeasuredStep) {
  auto llama = [](nn::ModelFamily f, int64_t V) {
    nn::DecoderConfig c;
    c.family = f;
    c.hidden_size = 32;
    c.intermediate_size = 48;
    c.num_layers = 2;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = f == nn::ModelFamily::kQwen3 ? 16 : 8;
    c.vocab_size = V;
    c.max_position_embeddings = 64;
    c.qk_norm = f == nn::ModelFamily::kQwen3;
    c.tie_word_embeddings = f == nn::ModelFamily::kQwen3;
    return c;
  };
  for (const nn::DecoderConfig& c :
       {llama(nn::ModelFamily::kLlama, 96), llama(nn::ModelFamily::kQwen3, 80),
        llama(nn::ModelFamily::kMistral, 1000)}) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      for (const std::vector<int>& layers : {std::vector<int>{}, std::vector<int>{0}}) {
        for (int stage = 0; stage < 4; ++stage) {
          SCOPED_TRACE(::testing::Message()
                       << c.summary() << " " << dtype_name(dtype) << " checkpointed "
                       << layers.size() << " stage " << stage);
          config::Recipe r = recipe_for(padded(), 2, 24, 1, stage, true, dtype, layers);
          r.model = config::model_options(c, "test");
          const Estimate e = estimate(r, 1);
          const StageEstimate& st = e.stages[size_t(stage)];
          const Measured m = measure_step(c, stage, 2, 24, 1, true, dtype, layers);
          EXPECT_EQ(m.params, st.model_states.params);
          EXPECT_EQ(m.grads, st.model_states.grads);
          EXPECT_EQ(m.optimizer, st.model_states.optimizer);
          EXPECT_EQ(m.activations, st.activations) << "estimated peak at " << e.activations.peak_at;
          EXPECT_EQ(m.comm, st.comm_step);
          if (c.vocab_size == 1000) {
            EXPECT_EQ(e.activations.peak_at, "head backward (linear_cross_entropy)");
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace fd::engine
