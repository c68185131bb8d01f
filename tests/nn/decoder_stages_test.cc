// Decoder::stage_loss, the pipeline's unit: a model cut into stages, each
// built with only its segments present, chained by hand (hidden state
// forward, its gradient back, a tied head's embedding gradient handed to the
// first stage before its embedding backward) gives loss()'s loss and every
// gradient bit for bit, for GPT-2 (tied head, learned positions) and a Llama
// (untied head, RoPE, GQA), in fp32 and bf16, cut into 2 and 3 stages.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "lib/autograd/tape.h"
#include "lib/nn/decoder.h"
#include "lib/ops/reduce.h"

namespace fd::nn {
namespace {

using autograd::Tape;
using autograd::TapeScope;
using autograd::Variable;

DecoderConfig tiny_gpt2() {
  GptConfig c;
  c.n_layer = 4;
  c.n_head = 2;
  c.d_model = 16;
  c.vocab_size = 32;
  c.max_seq_len = 16;
  return gpt2_config(c);
}

DecoderConfig tiny_llama() {
  DecoderConfig c;
  c.family = ModelFamily::kLlama;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_layers = 4;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.vocab_size = 32;
  c.max_position_embeddings = 64;
  return c;
}

Tensor ids(int64_t B, int64_t T, int V, uint32_t seed, bool some_ignored) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(0, V - 1);
  Tensor t = Tensor::empty(Shape{B, T}, DType::kI32);
  for (int64_t i = 0; i < B * T; ++i) t.i32()[i] = some_ignored && i % 5 == 3 ? -1 : d(rng);
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// blocks: transformer blocks per stage (the embedding rides with the first,
// the final norm and head with the last).
// Returns whether every gradient matched; hand_over false leaves out the
// tied head's embedding gradient (a negative control).
bool check_stages(const DecoderConfig& c, const std::vector<int>& blocks, DType dtype,
                  const std::string& what, bool hand_over = true) {
  SCOPED_TRACE(what);
  // The segments as the model publishes them: embed, h.0 .. h.{L-1}, final.
  const std::vector<SegmentInfo> segs = decoder_segments(c);
  const int final_seg = find_segment(segs, SegmentRole::kHead);
  const int tied_to = segs[size_t(final_seg)].tied_to;  // the embedding, or -1
  EXPECT_EQ(tied_to >= 0, c.tie_word_embeddings);
  Decoder full(c, dtype);
  full.init_weights(7);
  const Tensor tokens = ids(2, 12, c.vocab_size, 1, false);
  const Tensor targets = ids(2, 12, c.vocab_size, 2, true);
  Tape full_tape;
  Variable full_loss;
  {
    TapeScope scope(full_tape);
    full_loss = full.loss(tokens, targets);
    full_tape.backward(full_loss, 1.0f);
  }

  // Stage s holds segments [first[s], last[s]] (and, last stage of a tied
  // model, the embedding's matrix for its head).
  const int P = int(blocks.size());
  std::vector<int> first, last;
  for (int s = 0; s < P; ++s) {
    const int b0 = std::accumulate(blocks.begin(), blocks.begin() + s, 0);
    first.push_back(s == 0 ? 0 : find_segment(segs, SegmentRole::kBlock, b0));
    last.push_back(s == P - 1
                       ? final_seg
                       : find_segment(segs, SegmentRole::kBlock, b0 + blocks[size_t(s)] - 1));
  }
  EXPECT_EQ(std::accumulate(blocks.begin(), blocks.end(), 0), c.num_layers);
  std::vector<std::unique_ptr<Decoder>> stages;
  for (int s = 0; s < P; ++s) {
    auto present = [&, s](int g) {
      return (g >= first[size_t(s)] && g <= last[size_t(s)]) || (s == P - 1 && g == tied_to);
    };
    stages.push_back(std::make_unique<Decoder>(c, dtype, GroupLayout{}, LoraConfig{},
                                               GroupLayout{}, present));
    for (int g = 0; g <= final_seg; ++g) {
      const Tensor& mine = stages.back()->segments()[size_t(g)]->flat_params();
      EXPECT_EQ(mine.storage()->resident(), present(g)) << "stage " << s << " segment " << g;
      if (present(g)) mine.copy_from(full.segments()[size_t(g)]->flat_params());
    }
  }

  // Forward, stage by stage: each receives a copy of the previous output.
  std::vector<std::unique_ptr<Tape>> tapes;
  std::vector<Variable> outs, ins;
  std::vector<Tensor> in_grads;
  for (int s = 0; s < P; ++s) {
    tapes.push_back(std::make_unique<Tape>());
    TapeScope scope(*tapes.back());
    Variable in;
    if (s > 0) {
      const Tensor& prev = outs.back().value();
      Tensor received = Tensor::empty(prev.shape(), prev.dtype(), MemCategory::kActivations);
      received.copy_from(prev);
      in_grads.push_back(Tensor::zeros(prev.shape(), prev.dtype(), MemCategory::kActivations));
      in = Variable::bound_leaf(received, in_grads.back());
    } else {
      in_grads.push_back(Tensor());
    }
    ins.push_back(in);
    outs.push_back(stages[size_t(s)]->stage_loss(first[size_t(s)], last[size_t(s)], tokens,
                                                 targets, in));
  }
  EXPECT_TRUE(same_bits(outs.back().value(), full_loss.value())) << "loss";

  // Backward, last stage first; the hidden state's gradient goes back.
  for (int s = P - 1; s >= 0; --s) {
    TapeScope scope(*tapes[size_t(s)]);
    if (s == P - 1) {
      tapes[size_t(s)]->backward(outs[size_t(s)], 1.0f);
    } else {
      Tensor g = Tensor::empty(outs[size_t(s)].shape(), outs[size_t(s)].dtype(),
                               MemCategory::kActivations);
      g.copy_from(in_grads[size_t(s + 1)]);
      outs[size_t(s)].slot()->grad = g;
      // The head's part of the embedding gradient, before the embedding's.
      if (s == 0 && tied_to >= 0 && hand_over)
        ops::add_(stages[0]->segments()[size_t(tied_to)]->flat_grads(),
                  stages[size_t(P - 1)]->segments()[size_t(tied_to)]->flat_grads());
      tapes[size_t(s)]->run_backward();
    }
  }
  bool all = true;
  for (int g = 0; g <= final_seg; ++g) {
    int owner = 0;
    while (g > last[size_t(owner)]) ++owner;
    const bool same = same_bits(stages[size_t(owner)]->segments()[size_t(g)]->flat_grads(),
                                full.segments()[size_t(g)]->flat_grads());
    if (hand_over) {
      EXPECT_TRUE(same) << "gradient of segment " << g << " (stage " << owner << ")";
    }
    all = all && same;
  }
  return all;
}

TEST(DecoderStages, ChainedStagesAreTheWholeModelBitwise) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const std::string d(dtype_name(dtype));
    check_stages(tiny_gpt2(), {2, 2}, dtype, "gpt2 2 stages " + d);
    check_stages(tiny_gpt2(), {1, 2, 1}, dtype, "gpt2 3 stages " + d);
    check_stages(tiny_llama(), {3, 1}, dtype, "llama 2 stages " + d);
    check_stages(tiny_llama(), {1, 1, 2}, dtype, "llama 3 stages " + d);
  }
}

// Without the head's gradient handed over, the tied embedding's gradient is
// not the whole model's: the check above can fail.
TEST(DecoderStages, TheTiedHeadsGradientMustBeHandedOver) {
  EXPECT_FALSE(check_stages(tiny_gpt2(), {2, 2}, DType::kF32, "no hand-over", false));
}

TEST(DecoderStages, AbsentSegmentsHoldNothingAndRefuseToRun) {
  const DecoderConfig c = tiny_gpt2();
  MemoryAccountant& acc = MemoryAccountant::global();
  const int64_t before = acc.current(MemCategory::kParams);
  Decoder part(c, DType::kF32, GroupLayout{}, LoraConfig{}, GroupLayout{},
               [](int g) { return g <= 2; });
  const int64_t held = acc.current(MemCategory::kParams) - before;
  int64_t expect = 0;
  for (int g = 0; g <= 2; ++g) expect += int64_t(part.segments()[size_t(g)]->flat_params().nbytes());
  EXPECT_EQ(held, expect);
  // Gathered later (the end of a run), another stage's segment is a communication buffer.
  const Tensor& other = part.segments()[3]->flat_params();
  EXPECT_EQ(other.storage()->category(), MemCategory::kComm);
  part.init_weights(3);  // skips what is absent
  const Tensor tokens = ids(1, 4, c.vocab_size, 1, false);
  EXPECT_NO_THROW(part.stage_loss(0, 2, tokens, tokens, Variable()));
  EXPECT_DEATH(part.loss(tokens, tokens), "segment 3 is not held here");
  EXPECT_DEATH(part.stage_loss(2, 2, tokens, tokens, Variable()), "previous stage's hidden state");
}

}  // namespace
}  // namespace fd::nn
