// A whole training step on the meta device against the same step on the CPU:
// model construction, the ZeRO engine's setup, forward, backward, gradient
// reductions, the optimizer step and an evaluation forward must allocate and
// free the same bytes at the same moments, so every category's peak and what
// is left afterwards are equal. This is what makes an estimate by execution on meta exact.
#include <gtest/gtest.h>

#include <array>
#include <chrono>

#include "lib/autograd/tape.h"
#include "lib/dist/counting_communicator.h"
#include "lib/dist/local_communicator.h"
#include "lib/engine/estimate.h"
#include "lib/nn/decoder.h"
#include "lib/zero/zero_engine.h"
#include "tests/engine/ring_model.h"

namespace fd::engine {
namespace {

using Bytes = std::array<int64_t, kNumMemCategories>;

Bytes currents() {
  Bytes b{};
  for (int i = 0; i < kNumMemCategories; ++i)
    b[size_t(i)] = MemoryAccountant::global().current(MemCategory(i));
  return b;
}

Bytes peaks() {
  Bytes b{};
  for (int i = 0; i < kNumMemCategories; ++i)
    b[size_t(i)] = MemoryAccountant::global().peak(MemCategory(i));
  return b;
}

Bytes minus(Bytes a, const Bytes& b) {
  for (size_t i = 0; i < a.size(); ++i) a[i] -= b[i];
  return a;
}

struct StepCase {
  int stage;
  DType dtype;
  bool checkpoint;  // every block recomputed in backward
  bool lora;
  int accumulation;
};

std::string describe(const StepCase& k) {
  return fmt::format("stage {} {} checkpoint={} lora={} accumulation={}", k.stage,
                     dtype_name(k.dtype), k.checkpoint, k.lora, k.accumulation);
}

// Accountant readings, relative to before the run: peaks and what is held
// after setup (model + engine), after one step, and of an evaluation forward
// (no gradients) after it (peaks reset in between).
struct Measured {
  Bytes setup_peak, setup_held, step_peak, step_held, eval_peak;
};

Measured run_step(Device device, const nn::GptConfig& c, const StepCase& k, int micro, int T) {
  DeviceScope scope(device);
  MemoryAccountant& acct = MemoryAccountant::global();
  const Bytes base = currents();
  acct.reset_peaks();
  Measured m;
  {
    dist::LocalCommunicator comm;
    nn::LoraConfig lora;
    if (k.lora) {
      lora.r = 4;
      lora.alpha = 8.0f;
      lora.dropout = 0.1f;
      lora.modules = {"attn.c_attn", "mlp.c_proj"};
    }
    nn::Decoder model(c, k.dtype, zero::layout_for(k.stage), lora,
                      zero::frozen_layout_for(k.stage));
    model.init_weights(7);
    zero::ZeroConfig zc;
    zc.stage = k.stage;
    zc.accumulation = k.accumulation;
    if (k.checkpoint)
      for (int l = 0; l < c.n_layer; ++l) zc.checkpoint_segments.push_back(1 + l);
    zero::ZeroEngine engine(model, comm, zc);
    // The batch lives on the host, as the trainer's does.
    Tensor tokens = Tensor::empty(Shape{micro, T}, DType::kI32, MemCategory::kOther, Device::cpu());
    Tensor targets =
        Tensor::empty(Shape{micro, T}, DType::kI32, MemCategory::kOther, Device::cpu());
    for (int64_t i = 0; i < tokens.numel(); ++i) {
      tokens.i32()[i] = int32_t((i * 7) % c.vocab_size);
      targets.i32()[i] = int32_t((i * 5 + 3) % c.vocab_size);
    }
    m.setup_peak = minus(peaks(), base);
    m.setup_held = minus(currents(), base);
    acct.reset_peaks();
    for (int micro_batch = 0; micro_batch < k.accumulation; ++micro_batch) {
      model.set_dropout_seed(uint64_t(micro_batch));
      engine.begin_micro_batch(micro_batch);
      autograd::Tape tape;
      autograd::TapeScope tape_scope(tape);
      autograd::Variable loss = model.loss(tokens, targets, &engine);
      tape.backward(loss, 1.0f / float(k.accumulation));
      engine.end_micro_batch(micro_batch);
    }
    const zero::StepResult r = engine.step(1e-3f);
    EXPECT_FALSE(r.skipped);
    m.step_peak = minus(peaks(), base);
    m.step_held = minus(currents(), base);
    acct.reset_peaks();
    {
      autograd::NoGradGuard no_grad;
      const float loss = model.loss(tokens, targets, &engine).value().to_vector()[0];
      EXPECT_EQ(device.is_meta(), loss == 0.0f);  // meta: scalar reads give zeros
    }
    m.eval_peak = minus(peaks(), base);
  }
  EXPECT_EQ(currents(), base) << "the run left memory behind on " << device.str();
  return m;
}

void expect_equal(const Bytes& cpu, const Bytes& meta, const char* when) {
  for (int i = 0; i < kNumMemCategories; ++i)
    EXPECT_EQ(meta[size_t(i)], cpu[size_t(i)]) << when << ", " << mem_category_name(MemCategory(i));
}

nn::GptConfig small_gpt() {
  nn::GptConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 24;  // 1-D parameters need alignment padding
  c.vocab_size = 67;
  c.max_seq_len = 160;
  return c;
}

TEST(MetaStep, EqualsACpuStepInEveryCategory) {
  const nn::GptConfig c = small_gpt();
  std::vector<StepCase> cases;
  for (int stage = 0; stage < 4; ++stage)
    for (DType dtype : {DType::kF32, DType::kBF16})
      for (bool checkpoint : {false, true})
        for (bool lora : {false, true}) cases.push_back({stage, dtype, checkpoint, lora, 1});
  for (int stage = 0; stage < 4; ++stage) cases.push_back({stage, DType::kF16, true, false, 2});
  cases.push_back({1, DType::kBF16, false, true, 3});
  for (const StepCase& k : cases) {
    SCOPED_TRACE(describe(k));
    // T = 130: two blocks of attention query rows.
    const Measured cpu = run_step(Device::cpu(), c, k, 2, 130);
    const Measured meta = run_step(Device::meta(), c, k, 2, 130);
    expect_equal(cpu.setup_peak, meta.setup_peak, "setup peak");
    expect_equal(cpu.setup_held, meta.setup_held, "held after setup");
    expect_equal(cpu.step_peak, meta.step_peak, "step peak");
    expect_equal(cpu.step_held, meta.step_held, "held after the step");
    expect_equal(cpu.eval_peak, meta.eval_peak, "evaluation peak");
    EXPECT_GT(cpu.step_peak[size_t(MemCategory::kActivations)], 0);
  }
}

// GPT-2 124M at micro-batch 8 and T = 1024: building it and running a step on
// meta computes nothing, so it takes milliseconds.
TEST(MetaStep, Gpt2SmallStepIsFast) {
  nn::GptConfig c;
  c.n_layer = 12;
  c.n_head = 12;
  c.d_model = 768;
  c.vocab_size = 50257;
  c.max_seq_len = 1024;
  for (int stage : {0, 3}) {
    const auto t0 = std::chrono::steady_clock::now();
    const Measured m = run_step(Device::meta(), c, {stage, DType::kBF16, false, false, 1}, 8, 1024);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf(
        "GPT-2 124M on meta, stage %d bf16, micro 8, T 1024: %.3f s; step peak "
        "activations %.2f GiB\n",
        stage, seconds, double(m.step_peak[size_t(MemCategory::kActivations)]) / double(1 << 30));
    EXPECT_LT(seconds, 1.0);  // about 10 ms on a laptop; generous for sanitizer builds
    // Parameters: 124,439,808 in bf16, padded (stage 0 keeps them all).
    if (stage == 0) {
      EXPECT_GE(m.setup_held[size_t(MemCategory::kParams)], 2 * 124439808LL);
    }
  }
}

// One rank of a larger world, simulated on meta with the counting
// communicator: its traffic per step is the estimate's formula, exactly.
TEST(MetaStep, CountingCommunicatorSendsTheEstimatedBytes) {
  const nn::GptConfig c = small_gpt();
  for (int world : {2, 4}) {
    for (int stage = 0; stage < 4; ++stage) {
      for (int accumulation : {1, 2}) {
        for (DType dtype : {DType::kF32, DType::kBF16}) {
          SCOPED_TRACE(fmt::format("world {} stage {} accumulation {} {}", world, stage,
                                   accumulation, dtype_name(dtype)));
          DeviceScope scope(Device::meta());
          dist::CountingCommunicator comm(world - 1, world);
          nn::Decoder model(c, dtype, zero::layout_for(stage));
          model.init_weights(7);
          zero::ZeroConfig zc;
          zc.stage = stage;
          zc.accumulation = accumulation;
          zero::ZeroEngine engine(model, comm, zc);
          Tensor tokens = Tensor::empty(Shape{2, 16}, DType::kI32, MemCategory::kOther);
          for (int m = 0; m < accumulation; ++m) {
            engine.begin_micro_batch(m);
            autograd::Tape tape;
            autograd::TapeScope tape_scope(tape);
            tape.backward(model.loss(tokens, tokens, &engine), 1.0f / float(accumulation));
            engine.end_micro_batch(m);
          }
          engine.step(1e-3f);
          EXPECT_EQ(comm.bytes_sent(),
                    comm_bytes_per_step(stage, world, accumulation, engine.padded_params(),
                                        int(dtype_size(dtype))));
        }
      }
    }
  }
}

}  // namespace
}  // namespace fd::engine
