// nn::Decoder with tensor parallelism (issue 39), with and without Megatron's sequence
// parallelism, against the unsharded model, under mpirun -n 2
// and -n 4, in the world and (at -n 4) in each tp group of {dp: 2, tp: 2}: built from the same
// seed, a T-way model holds exactly its slices of the unsharded model's tensors (init through
// nn::global_fill), its loss on the same batch equals the unsharded loss, and every
// parameter's gradient equals its slice of the unsharded gradient, to fp32 rounding (1e-5
// relative; the sums run in another order). Cases: a Llama with GQA whose key/value heads
// split (2 over 2) or are replicated (2 over 4), an untied head and a vocabulary the ranks do
// not divide (uneven rows), q/k norms and attention biases (Qwen-like), a packed batch with
// ignored targets; GPT-2 (fused c_attn split in its q | k | v parts, biases, learned positions,
// a tied head); LoRA on every linear (a split linear's whole factor gets its gradient summed
// over the group). Also whole-model assembly (engine's gather_whole_model) and the slices'
// arithmetic (for_each_global_run) against an explicit index map. QLoRA: each rank's 4-bit slices
// are the whole weight's blocks.
#include "lib/engine/tensor_parallel.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "lib/autograd/tape.h"
#include "lib/dist/mesh.h"
#include "lib/nn/decoder.h"
#include "tests/mpi/mpi_test_main.h"
#include "tests/mpi/tp_test_util.h"

namespace fd {
namespace {

using mpi_testing::expect_close_all;
using mpi_testing::g_comm;
using nn::Decoder;
using nn::DecoderConfig;
using nn::LoraConfig;
using nn::ModelFamily;
using nn::Parameter;
using ops::testing::Vec;

DecoderConfig llama(int64_t vocab) {
  DecoderConfig c;
  c.family = ModelFamily::kLlama;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.vocab_size = vocab;
  c.max_position_embeddings = 64;
  return c;
}

DecoderConfig gpt2() {
  nn::GptConfig c;
  c.n_layer = 2;
  c.n_head = 4;
  c.d_model = 32;
  c.vocab_size = 37;
  c.max_seq_len = 16;
  return nn::gpt2_config(c);
}

Tensor ids(int64_t B, int64_t T, int64_t V, uint32_t seed, bool some_ignored) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> d(0, V - 1);
  Tensor t = Tensor::empty(Shape{B, T}, DType::kI32);
  for (int64_t i = 0; i < B * T; ++i)
    t.i32()[i] = some_ignored && i % 5 == 3 ? -1 : int32_t(d(rng));
  return t;
}

// p's slice of a whole tensor `whole` (row-major over p.global_shape()).
Vec slice_of(const Parameter& p, const Vec& whole) {
  Vec out(size_t(p.value.numel()));
  nn::for_each_global_run(p, 0, p.value.numel(), [&](int64_t g, int64_t l, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[size_t(l + i)] = whole[size_t(g + i)];
  });
  return out;
}

// Loss and every trainable parameter's gradient (by name) of `m` on (tokens, targets).
struct Run {
  double loss = 0;
  std::map<std::string, Vec> grads;
};
Run run(const Decoder& m, const Tensor& tokens, const Tensor& targets, const Tensor& doc_starts) {
  for (const nn::FlatParamGroup* g : m.groups()) g->zero_grads();
  autograd::Tape tape;
  autograd::TapeScope scope(tape);
  autograd::Variable loss = m.loss(tokens, targets, nullptr, doc_starts);
  Run r;
  r.loss = ops::testing::values(loss.value())[0];
  tape.backward(loss);
  for (const Parameter* p : m.parameters()) r.grads[p->name] = ops::testing::values(p->grad);
  return r;
}

// LoRA's B starts at zero: every trainable parameter of `models` gets a non-zero value, drawn
// over the whole tensor by name (each rank its slice), so the adapters' paths carry gradients.
void trainable_away_from_zero(std::initializer_list<const Decoder*> models) {
  const nn::ParamFill fill =
      nn::global_fill([](const Parameter& p, int64_t begin, int64_t count, const Tensor& out) {
        std::vector<float> v(static_cast<size_t>(count));
        for (int64_t i = 0; i < count; ++i)
          v[size_t(i)] = 0.01f * float(std::sin(double(begin + i) + double(p.name.size())));
        out.copy_from(Tensor::from_vector(v, Shape{count}, DType::kF32));
      });
  for (const Decoder* m : models)
    for (const Parameter* p : m->parameters())
      fill(*p, 0, p->value.numel(), p->value.reshape(Shape{p->value.numel()}));
}

void check(const DecoderConfig& c, const LoraConfig& lora, bool packed, const std::string& what,
           bool sequence_parallel = false) {
  mpi_testing::Groups groups = mpi_testing::make_groups("tp");
  for (dist::Communicator* group : groups.all) {
    const int T = group->size();
    if (!nn::tensor_parallel_refusal(c, T).empty()) continue;
    SCOPED_TRACE(what + " T=" + std::to_string(T));
    if (g_comm->rank() == 0)
      std::printf("%s at T=%d (%s key/value heads%s)\n", what.c_str(), T,
                  nn::kv_heads_replicated(c, T) ? "replicated" : "split",
                  sequence_parallel ? ", sequence parallel" : "");
    const Decoder whole(c, DType::kF32, {}, lora);
    const Decoder split(c, DType::kF32, {}, lora, {}, {}, std::nullopt,
                        nn::TensorParallel{group->rank(), T, group, sequence_parallel});
    const_cast<Decoder&>(whole).init_weights(7);
    const_cast<Decoder&>(split).init_weights(7);
    if (lora.enabled()) trainable_away_from_zero({&whole, &split});
    // Every parameter (and frozen one) is its slice of the whole model's.
    std::map<std::string, Vec> values;
    for (const Parameter* p : whole.parameters()) values[p->name] = ops::testing::values(p->value);
    for (const Parameter* p : whole.frozen_parameters())
      values[p->name] = ops::testing::values(p->value);
    std::vector<const Parameter*> mine = split.parameters();
    for (const Parameter* p : split.frozen_parameters()) mine.push_back(p);
    for (const Parameter* p : mine)
      mpi_testing::expect_exact(p->name + " value", ops::testing::values(p->value),
                                slice_of(*p, values.at(p->name)));
    const int64_t B = 2, Tq = 12;
    const Tensor tokens = ids(B, Tq, c.vocab_size, 3, false);
    const Tensor targets = ids(B, Tq, c.vocab_size, 4, true);
    Tensor starts;
    if (packed) {  // two documents per row: positions 0-4 and 5-11
      starts = Tensor::empty(Shape{B, Tq}, DType::kI32);
      for (int64_t i = 0; i < B * Tq; ++i) starts.i32()[i] = int32_t(i % Tq < 5 ? 0 : 5);
    }
    const Run ref = run(whole, tokens, targets, starts);
    const Run got = run(split, tokens, targets, starts);
    expect_close_all("loss", {got.loss}, {ref.loss}, 1e-6);
    for (const Parameter* p : split.parameters())
      expect_close_all(p->name + " grad", got.grads.at(p->name),
                       slice_of(*p, ref.grads.at(p->name)), 1e-5);
    // The whole model assembled from the slices is the unsharded one, bit for bit.
    const std::unique_ptr<Decoder> gathered = engine::gather_whole_model(split);
    std::vector<const Parameter*> all = gathered->parameters();
    for (const Parameter* p : gathered->frozen_parameters()) all.push_back(p);
    for (const Parameter* p : all)
      mpi_testing::expect_exact(p->name + " gathered", ops::testing::values(p->value),
                                values.at(p->name));
  }
}

TEST(TensorParallel, LlamaGqaUntiedUnevenVocabulary) { check(llama(37), {}, false, "llama V37"); }

TEST(TensorParallel, LlamaTiedPackedQkNormBiases) {
  DecoderConfig c = llama(40);
  c.tie_word_embeddings = true;
  c.qk_norm = true;
  c.attention_bias = true;
  check(c, {}, true, "llama tied, packed, q/k norms, qkv biases");
}

TEST(TensorParallel, Gpt2FusedAttentionTiedBiases) { check(gpt2(), {}, false, "gpt2"); }

// Megatron's sequence parallelism: the same values and gradients, the norm regions on slices
// of the sequence (12 positions: 6 or 3 per rank).
TEST(TensorParallel, SequenceParallel) {
  check(llama(37), {}, false, "llama V37", true);
  DecoderConfig c = llama(40);
  c.tie_word_embeddings = true;
  c.qk_norm = true;
  check(c, {}, true, "llama tied, packed, q/k norms", true);
  check(gpt2(), {}, false, "gpt2 (learned positions, LayerNorm biases)", true);
}

TEST(TensorParallel, LoraOnEveryLinear) {
  for (const DecoderConfig& c : {llama(37), gpt2()}) {
    LoraConfig lora;
    lora.r = 4;
    lora.alpha = 8;
    for (const nn::LinearShape& l : nn::block_linears(c)) lora.modules.push_back(l.module);
    check(c, lora, false, std::string("lora on ") + nn::family_name(c.family));
  }
}

// QLoRA on tensor-sharded linears: every rank's 4-bit slice dequantizes to exactly its slice of
// the unsharded model's 4-bit weight (the whole tensor quantized, NF4 blocks of 32 with double
// quantization, the rank's blocks kept), so the loss and the adapters' gradients are the
// unsharded model's to fp32 rounding, and the whole model assembled from the slices holds the
// dequantized base bit for bit. Hidden 128 (o_proj: 64 or 32 input features per rank), MLP 128.
TEST(TensorParallel, QloraSlicesAreTheWholeWeightsBlocks) {
  DecoderConfig c = llama(37);
  c.hidden_size = 128;
  c.intermediate_size = 128;
  c.head_dim = 32;
  LoraConfig lora;
  lora.r = 4;
  lora.alpha = 8;
  for (const nn::LinearShape& l : nn::block_linears(c)) lora.modules.push_back(l.module);
  const quant::QuantOptions q{quant::QuantType::kNF4, 32, true};
  mpi_testing::Groups groups = mpi_testing::make_groups("tp");
  for (dist::Communicator* group : groups.all) {
    const int T = group->size();
    ASSERT_EQ(nn::quantized_tensor_parallel_refusal(c, T, q.block_size), "");
    SCOPED_TRACE("qlora T=" + std::to_string(T));
    const Decoder whole(c, DType::kF32, {}, lora, {}, {}, q);
    const Decoder split(c, DType::kF32, {}, lora, {}, {}, q,
                        nn::TensorParallel{group->rank(), T, group, false});
    const_cast<Decoder&>(whole).init_weights(7);
    const_cast<Decoder&>(split).init_weights(7);
    trainable_away_from_zero({&whole, &split});
    // The base's values as the forward computes with them, by name.
    std::map<std::string, Vec> base;
    auto value_of = [](const Decoder& m, const Parameter& p) {
      if (!m.quantized(p)) return ops::testing::values(p.value);
      const std::vector<float> v = m.dequantized(p);
      return Vec(v.begin(), v.end());
    };
    for (const Parameter* p : whole.frozen_parameters()) base[p->name] = value_of(whole, *p);
    int sliced = 0;
    for (const Parameter* p : split.frozen_parameters()) {
      mpi_testing::expect_exact(p->name + " value", value_of(split, *p),
                                slice_of(*p, base.at(p->name)));
      sliced += split.quantized(*p) != nullptr && !p->slice.whole();
    }
    EXPECT_EQ(sliced, 2 * (T == 2 ? 7 : 5));  // k and v replicated at T=4 (2 kv heads)
    const Tensor tokens = ids(2, 12, c.vocab_size, 3, false);
    const Tensor targets = ids(2, 12, c.vocab_size, 4, true);
    const ::fd::Run ref = run(whole, tokens, targets, {});
    const ::fd::Run got = run(split, tokens, targets, {});
    expect_close_all("loss", {got.loss}, {ref.loss}, 1e-6);
    for (const Parameter* p : split.parameters())
      expect_close_all(p->name + " grad", got.grads.at(p->name),
                       slice_of(*p, ref.grads.at(p->name)), 1e-5);
    const std::unique_ptr<Decoder> gathered = engine::gather_whole_model(split);
    for (const Parameter* p : gathered->frozen_parameters())
      mpi_testing::expect_exact(p->name + " gathered", ops::testing::values(p->value),
                                base.at(p->name));
  }
}

// DeepSpeed-Ulysses (nn::SequenceParallel), alone and with tensor parallelism: each rank of an sp
// group computes its slice of the sequence; the group's losses sum to the unsharded loss and its
// gradients (summed over the group, as the ZeroEngine sums them over dp x sp) equal the
// unsharded gradients (their tp slices), to fp32 rounding. Layouts of the world: n 2: S=2;
// n 4: S=4, S=2 x T=2, and S=2 in each half ({dp: 2, sp: 2}).
void check_ulysses(const DecoderConfig& c, const LoraConfig& lora, bool packed,
                   const std::string& what) {
  const int n = g_comm->size();
  std::vector<dist::Mesh> layouts = {dist::Mesh({{"sp", n}})};
  if (n == 4) {
    layouts.push_back(dist::Mesh({{"sp", 2}, {"tp", 2}}));
    layouts.push_back(dist::Mesh({{"dp", 2}, {"sp", 2}}));
  }
  for (const dist::Mesh& mesh : layouts) {
    const int S = mesh.size("sp"), T = mesh.size("tp");
    const int hq = c.num_heads / T, hkv = nn::kv_heads_replicated(c, T) ? 1 : c.num_kv_heads / T;
    if (!nn::tensor_parallel_refusal(c, T).empty() || hq % S != 0 || (hkv % S != 0 && S % hkv != 0))
      continue;
    SCOPED_TRACE(what + " S=" + std::to_string(S) + " T=" + std::to_string(T));
    const std::unique_ptr<dist::Communicator> sp_group = mesh.group(*g_comm, {"sp"});
    const std::unique_ptr<dist::Communicator> tp_group = mesh.group(*g_comm, {"tp"});
    if (g_comm->rank() == 0)
      std::printf("%s: Ulysses S=%d x T=%d (%s key/value heads)\n", what.c_str(), S, T,
                  hkv % S == 0 ? "exchanged" : "gathered");
    const Decoder whole(c, DType::kF32, {}, lora);
    const nn::TensorParallel tp =
        T > 1 ? nn::TensorParallel{tp_group->rank(), T, tp_group.get()} : nn::TensorParallel{};
    const Decoder split(c, DType::kF32, {}, lora, {}, {}, std::nullopt, tp,
                        nn::SequenceParallel{sp_group->rank(), S, sp_group.get()});
    const_cast<Decoder&>(whole).init_weights(7);
    const_cast<Decoder&>(split).init_weights(7);
    const int64_t B = 2, Tq = 16;
    const Tensor tokens = ids(B, Tq, c.vocab_size, 3, false);
    const Tensor targets = ids(B, Tq, c.vocab_size, 4, true);
    Tensor starts;
    if (packed) {  // documents at 0-6 and 7-15: the second spans the slices
      starts = Tensor::empty(Shape{B, Tq}, DType::kI32);
      for (int64_t i = 0; i < B * Tq; ++i) starts.i32()[i] = int32_t(i % Tq < 7 ? 0 : 7);
    }
    const Run ref = run(whole, tokens, targets, starts);
    Run got = run(split, tokens, targets, starts);
    sp_group->all_reduce_f64(&got.loss, 1);
    expect_close_all("loss", {got.loss}, {ref.loss}, 1e-6);
    for (const Parameter* p : split.parameters()) {
      Vec g = got.grads.at(p->name);
      sp_group->all_reduce_f64(g.data(), int64_t(g.size()));
      expect_close_all(p->name + " grad", g, slice_of(*p, ref.grads.at(p->name)), 1e-5);
    }
  }
}

TEST(Ulysses, LlamaGqa) {
  check_ulysses(llama(37), {}, false, "llama V37");
  DecoderConfig c = llama(40);
  c.tie_word_embeddings = true;
  c.qk_norm = true;
  check_ulysses(c, {}, true, "llama tied, packed, q/k norms");
}

TEST(Ulysses, KeyValueHeadsGatheredWhenFewer) {
  DecoderConfig c = llama(37);
  c.num_kv_heads = 1;  // MQA: 1 kv head over S = 2 or 4
  check_ulysses(c, {}, true, "llama MQA");
}

TEST(Ulysses, Gpt2AndLora) {
  check_ulysses(gpt2(), {}, false, "gpt2");
  LoraConfig lora;
  lora.r = 4;
  lora.alpha = 8;
  const DecoderConfig c = llama(37);
  for (const nn::LinearShape& l : nn::block_linears(c)) lora.modules.push_back(l.module);
  check_ulysses(c, lora, false, "llama lora");
}

// for_each_global_run against the index map written out: a column slice of a [4, 6] matrix in
// 3 fused parts of 2 columns... a GPT-2 style (in, 3*out) weight split by parts.
TEST(TensorSlice, RunsOfFusedColumnSlices) {
  if (g_comm->rank() != 0) return;
  Parameter p;
  p.name = "w";
  // Whole (2, 3 parts x 4): rank 1 of 2 holds columns [2, 4) of each part: local (2, 6).
  p.value = Tensor::zeros(Shape{2, 6}, DType::kF32);
  p.slice = nn::TensorSlice{1, 2, 4, 3};
  EXPECT_EQ(p.global_shape(), (Shape{2, 12}));
  std::vector<int64_t> map;
  nn::for_each_global_run(p, 1, 10, [&](int64_t g, int64_t l, int64_t n) {
    EXPECT_EQ(int64_t(map.size()) + 1, l);
    for (int64_t i = 0; i < n; ++i) map.push_back(g + i);
  });
  // local (r, j): part j / 2, column 2 + j % 2 -> global r * 12 + part * 4 + 2 + j % 2.
  std::vector<int64_t> want;
  for (int64_t e = 1; e < 11; ++e) {
    const int64_t r = e / 6, j = e % 6;
    want.push_back(r * 12 + (j / 2) * 4 + 2 + j % 2);
  }
  EXPECT_EQ(map, want);
}

}  // namespace
}  // namespace fd

int main(int argc, char** argv) {
  return fd::dist::testing::run_mpi_tests(argc, argv, &fd::mpi_testing::g_comm);
}
