// Decoder: the one decoder-only transformer, built from a DecoderConfig
// (decoder_config.h): GPT-2 and the Llama family (Llama 2/3, Mistral,
// SmolLM, Qwen2, Qwen3) are configurations of it, not copies.
//
//   x = embed(tokens) (+ learned positions)
//   per block: x += o_proj(attention(norm_1(x)));  x += mlp(norm_2(x))
//   loss = cross_entropy(head(norm(x)), targets), the head chunked over rows
//
// Parameters carry the family's Hugging Face names and layouts, so a model
// directory's tensors load by name: GPT-2 "h.0.attn.c_attn.weight" (Conv1D,
// stored (in, out), q|k|v fused), the Llama family
// "model.layers.0.self_attn.q_proj.weight" (Linear, stored [out, in]).
//
// The model is a list of segments, each owning one FlatParamGroup, in the
// order and with the roles it publishes (decoder_segments,
// lib/nn/config/segments.h):
//   "embed"  the token embedding (+ GPT-2's position table)
//   "h.i"    block i's norms, attention and MLP
//   "final"  the final norm (+ the untied lm head); a tied head reads the
//            embedding's matrix
// Segments are the unit of everything distributed (ZeRO partitions,
// gradient buckets, activation checkpointing, pipeline stages; see
// docs/ARCHITECTURE.md).
// Forward records on the current autograd tape; parameter gradients
// accumulate into the groups' flat gradient buffers.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lib/autograd/variable.h"
#include "lib/dist/communicator.h"
#include "lib/nn/config/decoder_config.h"
#include "lib/nn/config/segments.h"
#include "lib/nn/module.h"
#include "lib/nn/parameter.h"
#include "lib/nn/segment_runner.h"
#include "lib/ops/elementwise.h"
#include "lib/ops/linear_cross_entropy.h"
#include "lib/ops/rope.h"
#include "lib/quant/quantized_weight.h"

namespace fd::nn {

// Low-rank adapters (LoRA, as Hugging Face PEFT): a targeted linear layer
// y = W x + b becomes y = W x + b + (alpha / r) B A dropout(x), A (r, in)
// Kaiming-uniform (a = sqrt 5: bound 1/sqrt(in)), B (out, r) zero. The base is frozen.
struct LoraConfig {
  int r = 0;                         // rank; 0 = no adapters (every parameter trains)
  float alpha = 0.0f;                // scaling = alpha / r
  float dropout = 0.0f;              // on the adapter's input only
  std::vector<std::string> modules;  // block modules, e.g. attn.c_attn, self_attn.q_proj
  std::vector<int> layers;           // blocks with adapters; empty = all
  bool enabled() const { return r > 0; }
  // alpha / r as the forward applies it (fp32); merges into a base use this
  // value, so a merged model computes what the trained one did.
  float scaling() const { return alpha / float(r); }
  bool applies(int layer, const std::string& module) const;
  // Trainable parameters for `config`: sum over adapted modules of r * (in + out).
  int64_t num_params(const DecoderConfig& config) const;
};

// A block's linear layer: its module name within the block ("attn.c_attn",
// "self_attn.q_proj", ...), fan-in and fan-out, and whether it has a bias.
struct LinearShape {
  std::string module;
  int64_t in, out;
  bool bias;
};
// The linear layers of a block of `config`, in the block's parameter order:
// GPT-2 attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj; the Llama family
// self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj.
std::vector<LinearShape> block_linears(const DecoderConfig& config);

// Target names (lora_target_names, or a module's own name such as
// self_attn.q_proj, as PEFT configs may write) as module names of `config`'s
// family. A name the family does not have is a usage error listing the names
// it has; lm_head and embed_tokens are refused with the reason (adapters on
// the head or the embedding are not supported).
std::vector<std::string> lora_modules_for_targets(const DecoderConfig& config,
                                                  const std::vector<std::string>& targets);

// The family's Hugging Face parameter names: GPT-2's file names have no
// prefix, the Llama family's are those of *ForCausalLM.
struct FamilyNames {
  std::string embed;         // "wte.weight" | "model.embed_tokens.weight"
  std::string positions;     // "wpe.weight" (learned positions only)
  std::string final_norm;    // "ln_f" | "model.norm" (+ ".weight", ".bias")
  std::string lm_head;       // "lm_head.weight" (untied head only)
  std::string norm1, norm2;  // "ln_1" | "input_layernorm", "ln_2" | "post_attention_layernorm"
  bool gpt2_blocks = false;  // blocks are "h.N." (else "model.layers.N.")
  std::string block_prefix(int layer) const;  // "h.3." | "model.layers.3."
};
FamilyNames family_names(const DecoderConfig& config);

// The rotary tables' options for `config` (RoPE models).
ops::RopeOptions rope_options(const DecoderConfig& config);

// Tensor parallelism (Megatron-LM, arXiv 1909.08053; DESIGN 17): the model is rank `rank` of
// the `size` ranks of `group`, the mesh's tp group, and holds its slice of each split tensor
// (Parameter::slice):
//   column-parallel (output features split): q_proj, k_proj, v_proj, gate_proj, up_proj;
//     GPT-2's c_attn (each of q | k | v split alike) and mlp.c_fc; their biases alike;
//   row-parallel (input features split): o_proj, down_proj; GPT-2's attn.c_proj, mlp.c_proj
//     (biases whole);
//   vocabulary-parallel: the embedding's and the untied head's rows (ops::vocab_shard_range);
//   whole on every rank: the norms, learned positions, q/k norms, and k_proj / v_proj when the
//     key/value heads are fewer than the ranks (nn::kv_heads_replicated: each rank computes
//     them all and attends with the one its query heads share).
// LoRA follows the base: a column-parallel linear's B split like its rows (A whole), a
// row-parallel one's A split like its columns (B whole).
// The forward runs Megatron's f (ops::copy_to_tp_region) on the normed input of each attention
// and MLP and g (ops::reduce_from_tp_region) on the row-parallel outputs and on the
// embedding's partial lookup; the head and loss are ops::vocab_parallel_cross_entropy. A whole
// parameter whose gradient is partial on each rank (a replicated k_proj, q/k norms, the whole
// LoRA factor of a split linear, a row-parallel bias) is read through f, whose backward sums
// its gradient over the group: every whole parameter ends a backward with the same gradient on
// every rank, so the ranks keep identical copies without further communication.
//
// sequence_parallel (Megatron-LM's sequence parallelism, arXiv 2205.05198): between the
// tensor-parallel regions the residual stream is split along the sequence, rank r holding
// positions [r T/size, (r+1) T/size) of every row (T divisible by size): the embedding's g is a
// reduce-scatter (ops::reduce_scatter_to_sequence_region), each attention's and MLP's f an
// all-gather (ops::gather_from_sequence_region) and their g a reduce-scatter, the final norm's
// output gathered for the head (whose dh the gather's backward sums); the norms (and learned
// positions) then see a slice of the sequence, so their weights are read through f. Attention
// runs on the whole sequence, as without.
struct TensorParallel {
  int rank = 0, size = 1;
  dist::Communicator* group = nullptr;  // size > 1: the tp group (rank(), size() as above)
  bool sequence_parallel = false;
  bool enabled() const { return size > 1; }
};

// DeepSpeed-Ulysses sequence parallelism (arXiv 2309.14509; DESIGN 17): the model is rank `rank`
// of the `size` ranks of `group`, the mesh's sp group, which share a micro-batch; it computes
// positions [rank T/size, (rank+1) T/size) of every row through every segment (loss() and
// stage_loss() take the whole rows and slice them), and around attention
// ops::sequence_to_heads gives it the whole sequence for 1/size of its query heads and
// heads_to_sequence the positions back. Key/value heads are exchanged likewise when size divides
// them; when they are fewer (and divide size) each rank gathers them whole along the sequence
// (ops::gather_from_sequence_region) and keeps the one its query heads share. Positions (RoPE or
// learned) are global, and attention masks by the whole rows' document starts, so packed rows
// keep their documents across the slices. The loss is this rank's share of the micro-batch's
// mean: the mean over its targets times its share of the micro-batch's targets, so the group's
// losses (and gradients) sum to the unsplit micro-batch's. Every parameter is whole on each rank
// with a partial gradient, which the ZeroEngine sums over the dp x sp group. Composes with
// TensorParallel (the heads split over T first, each rank's then over size); not with
// Megatron's sequence_parallel.
struct SequenceParallel {
  int rank = 0, size = 1;
  dist::Communicator* group = nullptr;  // size > 1: the sp group (rank(), size() as above)
  bool enabled() const { return size > 1; }
};

// One segment's name and parameters, in layout order.
struct SegmentSpec {
  std::string name;               // "embed", "h.0" .. "h.{L-1}", "final"
  std::vector<ParamSpec> params;  // in the order the segment's flat buffer holds them
};

class Decoder : public Module {
 public:
  // The segments a Decoder of `config` is made of, without allocating anything:
  // the constructor builds its groups from exactly these, so sizes computed
  // from them (FlatParamGroup::padded_numel) are the sizes a model will have,
  // before and after a ZeroEngine pads it for its ranks.
  // With LoRA, these are the trainable (adapter) segments; segment_specs of
  // the plain config are then the frozen base's.
  // With tensor parallelism, rank tp.rank's slices (tp.group is not read).
  static std::vector<SegmentSpec> segment_specs(const DecoderConfig& config,
                                                const LoraConfig& lora = {},
                                                const TensorParallel& tp = {});

  // Allocates all segments (parameters zero) in `dtype`, laid out as `layout`
  // says, with alignment padding only (whoever partitions the model pads its
  // groups for its ranks: FlatParamGroup::pad_for).
  // With LoRA the trainable groups hold only the adapters (laid out by `layout`)
  // and the base lives in frozen groups laid out by `frozen_layout`.
  // `config` must be valid (DecoderConfig::validate).
  // `present` (pipeline stages): the segments this process holds; the others
  // are built with released buffers (nothing allocated or accounted) and
  // must not be run. Empty: every segment.
  // `quantize` (QLoRA; needs LoRA): each block's frozen segment is stored in its 4-bit form,
  // one byte buffer (DType::kU8, MemCategory::kQuantized unless frozen_layout says kComm)
  // holding, in the segment's parameter order, each block linear's weight encoded as
  // quant::encoded_layout says and the other parameters (norms, biases) as bytes of `dtype`.
  // ZeRO partitions and gathers that buffer like any other, so a rank never holds a block's
  // base in 16 bits. The embedding and final segments stay in `dtype` (as transformers keeps
  // embeddings, norms and the head unquantized).
  explicit Decoder(const DecoderConfig& config, DType dtype = DType::kF32,
                   const GroupLayout& layout = {}, const LoraConfig& lora = {},
                   const GroupLayout& frozen_layout = {},
                   const std::function<bool(int segment)>& present = {},
                   const std::optional<quant::QuantOptions>& quantize = {},
                   const TensorParallel& tp = {}, const SequenceParallel& sp = {});
  // GPT-2 by its shorthand (gpt2_config).
  explicit Decoder(const GptConfig& config, DType dtype = DType::kF32,
                   const GroupLayout& layout = {}, const LoraConfig& lora = {},
                   const GroupLayout& frozen_layout = {})
      : Decoder(gpt2_config(config), dtype, layout, lora, frozen_layout) {}

  // The segments as published (decoder_segments(config())): segments()[g] and
  // groups()[g] are segment_info()[g]'s.
  const std::vector<SegmentInfo>& segment_info() const { return info_; }
  // Indices of the embedding and head segments (from segment_info()).
  int embedding_segment() const { return embedding_; }
  int head_segment() const { return head_; }

  const DecoderConfig& config() const { return config_; }
  // Segments in forward order (segment_info()): embed, h.0 .. h.{L-1}, final.
  const std::vector<std::unique_ptr<FlatParamGroup>>& segments() const { return segments_; }
  // Every parameter in canonical order (the order of Hugging Face's state_dict).
  std::vector<const Parameter*> parameters() const override;
  std::vector<const FlatParamGroup*> groups() const override;
  std::vector<const Parameter*> frozen_parameters() const override;
  std::vector<const FlatParamGroup*> frozen_groups() const override;
  const LoraConfig& lora() const { return lora_; }
  // Tensor parallelism (TensorParallel above); size 1 without.
  const TensorParallel& tensor_parallel() const { return tp_; }
  // Ulysses sequence parallelism (SequenceParallel above); size 1 without.
  const SequenceParallel& sequence_parallel() const { return sp_; }

  // QLoRA (the constructor's `quantize`): how the block linears of the base are stored.
  const std::optional<quant::QuantOptions>& quantization() const { return quantize_; }
  // The 4-bit weight behind `p` (one of frozen_parameters()), or nullptr if p is stored in the
  // compute dtype. Its tensors are views of the segment's buffer: readable while it is resident.
  // A GPT-2 Conv1D weight (p's shape (in, out)) is stored transposed, [out, in], as
  // transformers stores a quantized Conv1D.
  const quant::QuantizedWeight* quantized(const Parameter& p) const;
  // The values of a quantized parameter (quantized(p) != nullptr), dequantized to fp32 in p's
  // own layout (GPT-2's Conv1D (in, out) transposed back): what the forward computes with.
  std::vector<float> dequantized(const Parameter& p) const;
  // A base weight as stored in 4 bits, if a source has it that way (a 4-bit model directory):
  // nullopt to have storage_fill quantize the value the logical fill gives.
  using QuantizedSource = std::function<std::optional<quant::Quantized4bit>(const Parameter& p)>;
  // The fill for this model's groups (what a ZeroEngine or a loader writes into the flat
  // buffers) from `logical`, a fill by the parameters as parameters() and frozen_parameters()
  // name them (a weights file, init_values, adapters). A 4-bit segment's members are encoded
  // here: a block linear's weight is `stored`'s, or else quantized (quant::quantize with
  // quantization()) from its value in the compute dtype; the other members are their values'
  // bytes. Without quantization it is `logical` itself. The returned fill keeps the last
  // encoded parameter to serve the next range of it; `logical` must outlive it.
  ParamFill storage_fill(ParamFill logical, QuantizedSource stored = {}) const;

  // Random initialisation as the family's Hugging Face model initialises:
  // matrices N(0, 0.02), biases 0, norm weights 1; GPT-2 also scales its
  // residual projections (attn.c_proj, mlp.c_proj) to N(0, 0.02/sqrt(2L)).
  // Each element is a counter-based function of (seed, parameter name,
  // index), so the result does not depend on layout, world size or order of
  // construction. With LoRA: the base as above, A Kaiming-uniform, B zero.
  // Does nothing on the meta device.
  void init_weights(uint64_t seed);
  // Elements [begin, begin + count) of `p`'s initial values as init_weights
  // draws them, into `out` (1-D, count elements of p's dtype, any device):
  // what a ZeRO-3 rank fills its shard with (zero_engine.h, nn::ParamFill).
  void init_values(uint64_t seed, const Parameter& p, int64_t begin, int64_t count,
                   const Tensor& out) const;
  // Seed of the adapters' dropout masks for the coming forward (the Trainer
  // derives it from (seed, step, micro-batch), so recompute and resume repeat it).
  void set_dropout_seed(uint64_t seed) const { dropout_seed_ = seed; }

  // tokens (B, T) i32 -> logits (B, T, V) (T <= max_position_embeddings with learned
  // positions). Each segment runs through `runner` (nullptr: directly).
  // doc_starts: empty, or a packed batch's i32 (B, T) host tensor of where each token's
  // document starts in its row (ops::causal_attention): attention stays inside each
  // document and positions (learned or RoPE) restart at 0 with each one, so a packed row
  // computes what its documents would one by one.
  // Not with tensor parallelism (each rank has only its vocabulary's logits).
  autograd::Variable forward(const Tensor& tokens, SegmentRunner* runner = nullptr,
                             const Tensor& doc_starts = {}) const;
  // Mean cross-entropy of forward(tokens) against targets (B, T) i32 (-1 = ignore),
  // with the head and the loss computed together in chunks of head_chunk_rows
  // rows (ops::linear_cross_entropy): one chunk when every row's fp32 logits fit
  // the budget, else chunks within it.
  autograd::Variable loss(const Tensor& tokens, const Tensor& targets,
                          SegmentRunner* runner = nullptr, const Tensor& doc_starts = {}) const;
  // A pipeline stage's part of loss(): segments first..last (first <= last).
  // first = embedding_segment() starts from `tokens`; otherwise from `input`, the
  // previous stage's hidden state (B, T, C) (a leaf whose gradient the caller
  // sends back). last = head_segment() ends with the loss (`targets` read);
  // otherwise the result is the hidden state for the next stage. Every stage
  // gets the batch's tokens and doc_starts (positions and document masks).
  // Chained over stages, the values and gradients are loss()'s, bit for bit
  // (a tied head's gradient for the embedding, computed on the last stage,
  // must be added to the first stage's before its embedding backward, as
  // loss()'s backward does).
  autograd::Variable stage_loss(int first, int last, const Tensor& tokens, const Tensor& targets,
                                const autograd::Variable& input, SegmentRunner* runner = nullptr,
                                const Tensor& doc_starts = {}) const;
  // What the head segment of loss()/stage_loss() computes from the final norm's output h
  // (B, T, C), the head's weight ([V, C]) and the targets: a 0-d loss whose gradient the
  // backward is seeded through. Empty (the default): the mean cross-entropy over the targets
  // (ops::linear_cross_entropy). Preference training installs its own (lib/engine/preference.h).
  // `targets` are always the micro-batch's whole (B, T) targets as stage_loss() was given them.
  // With tensor parallelism `weight` is this rank's rows of the head (from
  // ops::vocab_shard_range(V, tp.rank, tp.size).begin) and the head must be vocabulary-parallel
  // (ops::vocab_parallel_token_logps); with Megatron's sequence_parallel h is already gathered
  // into whole rows, and its backward sums the ranks' dh partials (reduce_dh false). With
  // Ulysses h holds this rank's columns of the rows only, columns(targets, sp.rank, sp.size),
  // and the group's losses and gradients must add up to the micro-batch's.
  using HeadLoss = std::function<autograd::Variable(
      const autograd::Variable& h, const autograd::Variable& weight, const Tensor& targets)>;
  void set_head_loss(HeadLoss head_loss) { head_loss_ = std::move(head_loss); }
  // Part `part` of `parts` of (B, T) i32 ids along T: columns [part T/parts, (part+1) T/parts)
  // (what a Ulysses rank computes).
  static Tensor columns(const Tensor& ids, int part, int parts);
  // LoRA: whether the adapters take part in the forward (default true). Switched off, the model
  // computes its base alone: preference training's reference model, without a second copy.
  void set_adapters_enabled(bool enabled) const { adapters_enabled_ = enabled; }
  bool adapters_enabled() const { return adapters_enabled_; }
  // Whether segment g holds its buffers (the constructor's `present`).
  bool present(int segment) const;
  // Rows per chunk of a head + loss over `rows` rows (ops::head_chunk_plan), from static
  // quantities only, so that no layout changes the gradients' bits and every rank of a
  // vocabulary-parallel group plans alike: the budget is 16 x hidden x layers x rows fp32
  // words (about what the blocks keep for their backward without checkpointing), at least
  // 64 MiB; the head's rows are the vocabulary's (the largest shard's under tensor
  // parallelism). The same on the GPU (its one-chunk head keeps the logits in the operands'
  // dtype). Records the plan (head_plan()). A head installed by
  // set_head_loss calls it from within.
  int64_t head_chunk_rows(int64_t rows) const;
  // The plan of the last head + loss this model ran (training or evaluation): `fdtrain
  // estimate` shows it. Empty (rows 0, chunks 0) before the first.
  const ops::HeadChunkPlan& head_plan() const { return head_plan_; }

 private:
  // One block's parameters (nullptr where the configuration has none).
  struct BlockParams {
    const Parameter *norm1_w = nullptr, *norm1_b = nullptr, *norm2_w = nullptr, *norm2_b = nullptr,
                    *q_norm = nullptr, *k_norm = nullptr;
    // Linear layers by module name: weight, bias (nullptr if none), adapters A, B.
    struct Linear {
      const Parameter *w = nullptr, *b = nullptr, *lora_a = nullptr, *lora_b = nullptr;
      const quant::QuantizedWeight* q = nullptr;  // QLoRA: w's 4-bit storage
    };
    std::map<std::string, Linear> linears;
  };

  // A packed batch's document starts and the positions they give (t - start), both
  // (B, T) i32 on the host; both empty for an unpacked batch. With Ulysses, doc_starts are the
  // whole rows' (attention runs on them) and positions this rank's columns (always defined).
  struct Packing {
    Tensor doc_starts, positions;
  };
  Packing packing(const Tensor& tokens, const Tensor& doc_starts) const;
  autograd::Variable block_forward(int layer, const autograd::Variable& x,
                                   const Packing& packing) const;
  autograd::Variable embed(const Tensor& tokens, const Packing& packing) const;
  // norm(x) with weight w (and bias b for LayerNorm).
  autograd::Variable norm(const autograd::Variable& x, const Parameter* w,
                          const Parameter* b) const;
  // {x + y, norm(x + y)} as one op (ops::add_layernorm / add_rms_norm): the residual add
  // before a block's second norm.
  ops::AddNorm add_norm(const autograd::Variable& x, const autograd::Variable& y,
                        const Parameter* w, const Parameter* b) const;
  autograd::Variable attention(int layer, const autograd::Variable& h,
                               const Packing& packing) const;
  autograd::Variable mlp(int layer, const autograd::Variable& h) const;
  // The final norm's output, and the head's weight ([V, H]).
  autograd::Variable final_norm(const autograd::Variable& x) const;
  autograd::Variable head_weight() const;
  // A base parameter as a Variable: trainable (bound to its gradient) without
  // LoRA, frozen (no gradient) with it.
  autograd::Variable base_var(const Parameter& p) const;
  // Tensor parallelism: x through Megatron's f (identity forward, gradient summed over the tp
  // group in backward), or x itself without tensor parallelism.
  autograd::Variable tp_copy(const autograd::Variable& x) const;
  // The input of a column-parallel region: h through f, or with sequence parallelism h's
  // slices gathered into the whole sequence.
  autograd::Variable tp_in(const autograd::Variable& h) const;
  // The output of a region's last column-parallel linear (v, up, c_attn, c_fc) marked so that
  // the region's weight gradients are computed while tp_in's f all-reduces the input's gradient
  // (with sequence parallelism: while its gather's backward reduce-scatters it;
  // ops::weight_grads_behind); y itself without tensor parallelism.
  autograd::Variable tp_last_column(const autograd::Variable& y) const;
  // A norm's (or learned positions') weight: through f with sequence parallelism (it sees a
  // slice of the sequence), else as base_var.
  autograd::Variable sequence_norm_var(const Parameter& p) const;
  // Ulysses: around attention, x (B, T/S, heads*D) of this rank's positions to the whole
  // sequence for its 1/S of the heads (key/value heads fewer than S: gathered whole and the
  // one `q_heads` (this rank's first query head after the exchange) shares kept); `heads` out:
  // the heads it then holds.
  autograd::Variable ulysses_in(const autograd::Variable& x, int heads, bool kv, int q_first,
                                int q_per_kv, int* heads_out) const;
  // How block linear `module` of `config` splits over `size` tp ranks (kNone: size 1).
  enum class Split { kNone, kColumn, kRow, kReplicated };
  static Split split_of(const DecoderConfig& config, const std::string& module, int size);
  // Module `module` of block `layer` applied to x, plus its adapter if any.
  autograd::Variable linear(int layer, const std::string& module,
                            const autograd::Variable& x) const;
  const FlatParamGroup& base_group(int segment) const;
  // The base parameters of `segment` as the forward reads them: base_group's, or a 4-bit
  // segment's logical ones.
  const std::vector<Parameter>& base_params(int segment) const;
  // QLoRA: builds frozen_'s group for block segment `segment` in its 4-bit form, its logical
  // parameters and its quantized weights' views.
  void add_quantized_segment(int segment, SegmentSpec spec, DType dtype, GroupLayout layout);
  // The encoded bytes of logical parameter `l` of a 4-bit segment (storage_fill).
  std::vector<uint8_t> encoded(const Parameter& l, const ParamFill& logical,
                               const QuantizedSource& stored) const;
  // The rotary tables, built on first use for at least `positions` rows.
  void ensure_rope_tables(int64_t positions) const;

  DecoderConfig config_;
  std::vector<SegmentInfo> info_;  // decoder_segments(config_)
  int embedding_ = -1, head_ = -1;
  std::vector<std::unique_ptr<FlatParamGroup>> segments_;  // trainable
  std::vector<std::unique_ptr<FlatParamGroup>> frozen_;    // LoRA base (empty without LoRA)
  // QLoRA. Per segment, its frozen parameters as the model sees them when the segment is
  // stored in 4 bits (else empty): the norms and biases as views of their bytes in the
  // segment's buffer, a quantized weight with its shape and `dtype` but no storage (a released
  // tensor: its values are quantized_[...]'s).
  std::optional<quant::QuantOptions> quantize_;
  std::vector<std::vector<Parameter>> logical_;
  std::map<const Parameter*, quant::QuantizedWeight> quantized_;  // by logical parameter
  std::map<const Parameter*, const Parameter*> logical_of_;       // stored member -> logical
  std::vector<bool> present_;                                     // per segment
  LoraConfig lora_;
  TensorParallel tp_;
  SequenceParallel sp_;
  int64_t vocab_begin_ = 0;  // tensor parallelism: the first vocabulary row held here
  std::vector<BlockParams> blocks_;
  const Parameter* embed_w_ = nullptr;
  const Parameter* positions_w_ = nullptr;  // learned positions only
  const Parameter* final_w_ = nullptr;
  const Parameter* final_b_ = nullptr;
  const Parameter* lm_head_ = nullptr;  // untied head only
  mutable uint64_t dropout_seed_ = 0;
  mutable bool adapters_enabled_ = true;
  HeadLoss head_loss_;
  mutable Tensor position_ids_;           // (B, T) i32, learned positions, cached per shape
  mutable Tensor rope_cos_, rope_sin_;    // (P, head_dim) fp32, RoPE only
  mutable ops::HeadChunkPlan head_plan_;  // the last head + loss's (head_plan())
};

}  // namespace fd::nn
