// The recipe: everything one training run is told, as typed option structs.
//
// lib/config is the only code that reads YAML (load.h fills these structs and
// validates them); every other module reads a Recipe. Each field carries its
// default; docs/RECIPE.md is the user-facing reference for every key, and a
// field here corresponds one-to-one to a recipe key of the same name.
//
// A Recipe returned by load_recipe() is valid: ranges and cross-field rules
// (d_model divisible by n_head, seq_len <= max_seq_len, ...) hold, data globs
// are expanded to existing files, and features not supported yet are refused.
// The one check left to the engine is check_world_size() (load.h).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fd::config {

enum class Arch { kGpt2, kLlama, kMistral, kQwen2, kQwen3 };
enum class RopeScalingName { kNone, kLinear, kLlama3 };
enum class DataFormat {
  kText,      // raw bytes, byte tokenizer (token = byte, vocab 256), or documents with a tokenizer
  kTokens,    // llm.c / nanoGPT .bin token files
  kChat,      // fine-tuning conversations (.jsonl/.json): messages or ShareGPT conversations
  kInstruct,  // fine-tuning instructions (.jsonl/.json): Alpaca's instruction, input, output
  kPreference,  // preference pairs (.jsonl/.json): TRL's prompt, chosen, rejected
};
enum class TruncationName { kError, kRight, kLeft };
enum class BadRecordName { kError, kSkip };
enum class PackingOrderName { kBestFit, kFirstCome };
enum class OptimizerName { kAdamW };
enum class ScheduleName { kConstant, kCosine };
enum class Precision { kFp32, kBf16, kFp16 };
enum class DeviceName { kCpu, kCuda };
enum class OffloadDevice { kNone, kHost, kNvme };
enum class PipelineSchedule { k1F1B, kGPipe };
enum class PartitionName { kParameters, kUniform, kList };

// The recipe spelling of each enum value ("gpt2", "text", "cosine", "bf16", ...).
std::string_view to_string(Arch v);
std::string_view to_string(RopeScalingName v);
std::string_view to_string(DataFormat v);
std::string_view to_string(TruncationName v);
std::string_view to_string(BadRecordName v);
std::string_view to_string(PackingOrderName v);
std::string_view to_string(OptimizerName v);
std::string_view to_string(ScheduleName v);
std::string_view to_string(Precision v);
std::string_view to_string(DeviceName v);
std::string_view to_string(OffloadDevice v);
std::string_view to_string(PipelineSchedule v);  // "1f1b", "gpipe"
std::string_view to_string(PartitionName v);     // "parameters", "uniform", "list"

// The model section. arch picks the family; the keys after max_seq_len
// belong to the Llama family (llama, mistral, qwen2, qwen3) and are refused
// for gpt2. After loading, the family's defaults are filled in (n_kv_head,
// head_dim, norm_eps, rope_theta, attention_bias), so a loaded recipe states
// every value it runs with.
// model.quantize: the frozen base of a LoRA run stored in 4 bits (QLoRA, issue 37), with
// bitsandbytes' semantics (lib/quant, docs/QUANTIZATION.md). Defaults are bitsandbytes'.
enum class QuantTypeName { kNf4, kFp4 };
// ZeRO++'s quantized gradient reduction (zero.quantized_gradients): off, int8 or int4 codes.
enum class GradientCodes { kNone, kInt8, kInt4 };
enum class ObjectiveName { kDpo, kSimpo, kOrpo };
std::string_view to_string(ObjectiveName v);  // "dpo", "simpo", "orpo"
enum class DpoLossName { kSigmoid, kIpo, kHinge, kRobust };
std::string_view to_string(DpoLossName v);    // "sigmoid", "ipo", "hinge", "robust"
std::string_view to_string(QuantTypeName v);  // "nf4", "fp4"
std::string_view to_string(GradientCodes v);  // "none", "int8", "int4"
// The block sizes bitsandbytes' 4-bit kernels support: quant::kBlockSizes, which lib/config
// cannot include (it does not link fd_quant); lib/engine/assemble.cc checks that they agree.
inline constexpr std::array<int, 8> kQuantBlockSizes = {32, 64, 128, 256, 512, 1024, 2048, 4096};
struct QuantizeOptions {
  QuantTypeName type = QuantTypeName::kNf4;  // nf4 | fp4
  int block_size = 64;                       // 32, 64, ..., 4096 (bitsandbytes' sizes)
  bool double_quant = true;                  // the absmax values double-quantized to 8 bits
  bool operator==(const QuantizeOptions&) const = default;
};

struct ModelOptions {
  Arch arch = Arch::kGpt2;  // model family: gpt2, llama, mistral, qwen2, qwen3
  int n_layer = 4;          // transformer blocks, >= 1
  int n_head = 4;           // attention (query) heads per block, >= 1
  int d_model = 128;        // residual width, >= 1 (gpt2: divisible by n_head)
  int vocab_size = 256;     // token vocabulary, >= 1 (>= 256 for data.format text)
  int max_seq_len = 256;    // context: gpt2's position table; the others' max_position_embeddings
  // Llama family only.
  int n_kv_head = 0;        // key/value heads (GQA), divides n_head; loaded: default n_head
  int head_dim = 0;         // per head, even; loaded: default d_model / n_head
  int d_ff = 0;             // the MLP's inner width (intermediate_size), required
  double norm_eps = 0.0;    // RMSNorm eps; loaded: default 1e-5 (llama, mistral), 1e-6 (qwen)
  double rope_theta = 0.0;  // RoPE base; loaded: default 10000 (llama, mistral), 1e6 (qwen)
  RopeScalingName rope_scaling = RopeScalingName::kNone;  // rope_scaling.rope_type
  double rope_factor = 1.0;                               // linear, llama3
  double rope_low_freq_factor = 1.0;                      // llama3
  double rope_high_freq_factor = 4.0;                     // llama3
  int rope_original_max_seq_len = 0;  // llama3: original_max_position_embeddings
  bool tie_embeddings = false;        // the head reuses the embedding (tie_word_embeddings)
  bool attention_bias = false;  // biases on q, k, v and (llama, qwen3) o; qwen2: q, k, v always
  bool mlp_bias = false;        // biases on the MLP's projections (llama only)
  bool qk_norm = false;         // per-head q/k RMSNorm (qwen3: always)
  std::string
      init_from;  // weights to start from (fdtrain export, HF GPT-2 safetensors); "" = random init
  // The frozen base in 4 bits (needs lora); absent: the base in the compute dtype.
  std::optional<QuantizeOptions> quantize;
  bool operator==(const ModelOptions&) const = default;
};

struct DataOptions {
  DataFormat format = DataFormat::kText;  // how the files are read
  // Training files: the recipe's paths and globs, expanded (glob(3)), each
  // pattern's matches sorted, duplicates dropped. Paths are as written:
  // relative ones are relative to the working directory. Never empty.
  std::vector<std::string> train;
  // Validation files, expanded the same way. Empty: the last val_fraction of
  // the training tokens is held out for validation instead.
  std::vector<std::string> val;
  double val_fraction = 0.05;  // in [0, 0.5]; used only when val is empty
  int seq_len = 128;           // tokens per training sequence, 1..model.max_seq_len
  // A Hugging Face tokenizer (a directory with tokenizer.json) for format text:
  // each file (each .jsonl line's "text") is a document, encoded with its BOS
  // and EOS. "" = the byte tokenizer.
  std::string tokenizer;
  // Fine-tuning examples (format chat or instruct, or text with packing; example_dataset.h).
  // The chat template: "" = the tokenizer's own, a built-in (chatml, llama3, alpaca) or a file.
  std::string chat_template;
  // Variables for the chat template (Qwen 3's enable_thinking, Llama 3's date_string), as
  // apply_chat_template(**kwargs) passes them: a JSON object's text, "" for none.
  std::string template_vars;
  bool train_on_prompt = false;  // targets on every token, not only the answers
  bool packing = false;          // several examples per row, attention kept inside each
  // With packing: which examples share a row (best fit decreasing, or first come first served).
  PackingOrderName packing_order = PackingOrderName::kBestFit;
  TruncationName truncation = TruncationName::kError;   // an example longer than seq_len + 1
  BadRecordName on_bad_record = BadRecordName::kError;  // a record that breaks the rules
  // format preference: tokens per sequence (prompt + answer), the rest cut; a pair whose
  // prompt alone is this long is dropped. 0 = seq_len / 2 + 1 (a pair always fits a row).
  int max_length = 0;
  // Record field names.
  std::string messages_field = "messages";
  std::string instruction_field = "instruction";
  std::string input_field = "input";
  std::string output_field = "output";
  std::string text_field = "text";
  // Whether the run reads fine-tuning examples (rows of whole examples) rather than
  // windows of a token stream.
  bool examples() const {
    return format == DataFormat::kChat || format == DataFormat::kInstruct ||
           format == DataFormat::kPreference || (format == DataFormat::kText && packing);
  }
  bool operator==(const DataOptions&) const = default;
};

struct BatchOptions {
  int micro = 8;         // sequences per micro-batch per rank, >= 1
  int accumulation = 1;  // micro-batches accumulated per optimizer step, >= 1
  // Total sequences per step over all ranks; 0 = micro * accumulation *
  // world_size. When set it must equal that product (check_world_size()).
  int global = 0;
  bool operator==(const BatchOptions&) const = default;
};

struct OptimizerOptions {
  OptimizerName name = OptimizerName::kAdamW;
  double lr = 3e-4;                            // peak learning rate, > 0
  std::array<double, 2> betas = {0.9, 0.999};  // Adam beta1, beta2, each in [0, 1)
  double eps = 1e-8;                           // Adam epsilon, > 0
  double weight_decay = 0.0;                   // decoupled weight decay, >= 0
  double grad_clip = 1.0;                      // max global grad norm, >= 0; 0 = no clipping
  bool operator==(const OptimizerOptions&) const = default;
};

struct ScheduleOptions {
  ScheduleName name = ScheduleName::kConstant;  // lr after warmup: constant, or cosine to min_lr
  int warmup_steps = 0;                         // linear warmup from 0 to lr, >= 0
  double min_lr = 0.0;  // cosine: lr reached at the last step, in [0, optimizer.lr]
  bool operator==(const ScheduleOptions&) const = default;
};

// Dynamic loss scaling for fp16, with DeepSpeed's key names and semantics.
struct LossScaleOptions {
  double loss_scale = 0.0;              // fixed scale, >= 0; 0 = dynamic
  int initial_scale_power = 16;         // dynamic: start at 2^power, >= 0
  int loss_scale_window = 1000;         // dynamic: steps without overflow before doubling, >= 1
  int hysteresis = 2;                   // dynamic: overflows tolerated before halving, >= 1
  bool consecutive_hysteresis = false;  // dynamic: refill hysteresis on each good step
  double min_loss_scale = 1.0;          // dynamic: the scale never drops below this, > 0
  bool operator==(const LossScaleOptions&) const = default;
};

// Where ZeRO keeps a kind of model state (DeepSpeed's offload_optimizer /
// offload_param): none (with the rest: the run's device), host (pinned host
// memory, GPU runs), nvme (one file per rank under path, streamed in chunks).
struct OffloadOptions {
  OffloadDevice device = OffloadDevice::kNone;
  std::string path;     // nvme: an existing directory (absolute once loaded)
  int buffer_mib = 64;  // optimizer nvme: MiB of chunk buffers per rank, >= 1
  bool operator==(const OffloadOptions&) const = default;
};

struct ZeroOptions {
  int stage = 0;  // ZeRO stage 0..3: 1 shards optimizer state, 2 also gradients, 3 also parameters
  bool overlap_comm = true;  // reduce buckets while backward continues
  // The dtype gradient sums are computed in (DeepSpeed's communication_data_type):
  // fp32 (16-bit gradients widened to fp32 staging, summed in fp32, rounded
  // once: stages bitwise identical) or the 16-bit precision itself (half the
  // bytes, each partial sum rounded to 16 bits; docs/ZERO.md, Reduction dtype).
  Precision reduce_dtype = Precision::kFp32;
  // With overlap_comm: reductions left in flight while the next launches, 1..64.
  int reductions_in_flight = 2;
  OffloadOptions offload_optimizer;  // fp32 master weights and Adam moments: none, host, nvme
  OffloadOptions offload_params;     // stage 3's parameter partitions: none, nvme (in the
                                     // optimizer's file: path and buffer_mib unused)
  // ZeRO++ (stage 3, CPU runs; docs/ZERO.md, ZeRO++), each switch on its own:
  // qwZ: parameters all-gathered as int8 codes in blocks of 256 with an fp32 scale each; the
  // fp32 master weights (and each rank's own shard) untouched.
  bool quantized_weights = false;
  // hpZ: after a segment's forward gather each rank keeps 1/L of its parameters (L the ranks
  // on its node), so the backward's gathers stay inside the node (memory: 1/L of the model in
  // the compute dtype per rank).
  bool hierarchical_partition = false;
  // qgZ: the gradient reduce-scatter as a hierarchical all-to-all of int8 or int4 codes (blocks
  // of 256 for int8, 64 for int4), summed in fp32 after each hop; none: the plain reduce-scatter.
  GradientCodes quantized_gradients = GradientCodes::kNone;
  bool operator==(const ZeroOptions&) const = default;
};

// Multi-rank behaviour.
struct DistOptions {
  double timeout_s = 600.0;  // a collective that takes longer aborts the job, > 0
  // The data-parallel group's reduce-scatters, all-gathers and all-reduces in steps inside and
  // across hosts (dist::HierarchicalCommunicator): fewer bytes over the hosts' links; sums
  // grouped by host, so not bitwise those of a one-host run.
  bool hierarchical = false;
  bool operator==(const DistOptions&) const = default;
};

// Pipeline parallelism (docs/RECIPE.md, parallel): the world's ranks form
// pipeline stages x data-parallel replicas, world = pipeline x D; each stage
// owns a contiguous run of transformer blocks (the embedding rides with the
// first, the final norm, head and loss with the last), and ZeRO works across
// the D replicas of a stage. The pipeline's micro-batches are
// batch.accumulation's (as DeepSpeed's gradient_accumulation_steps): there is
// no separate key.
struct ParallelOptions {
  int pipeline = 1;  // stages P, >= 1, <= model.n_layer; 1 = no pipeline
  // Tensor parallelism (Megatron-LM's layout, nn::Decoder): T ranks split each layer's heads,
  // the MLP's inner width and the vocabulary; T >= 1 dividing the query heads and the MLP's
  // width, and dividing or divided by the key/value heads. world = P x D x T.
  int tensor = 1;
  // Megatron-LM's sequence parallelism over the tensor-parallel ranks (tensor > 1; T divides
  // data.seq_len): the norm and residual regions split along the sequence (nn::TensorParallel).
  bool sequence_parallel = false;
  // DeepSpeed-Ulysses sequence parallelism: S ranks share each micro-batch, each computing
  // seq_len / S positions of every sequence; an all-to-all around attention gives it the whole
  // sequence for 1/S of the heads (nn::SequenceParallel). S divides data.seq_len and the query
  // heads (per tensor-parallel rank). world = P x D x S x T.
  int sequence = 1;
  PipelineSchedule schedule = PipelineSchedule::k1F1B;  // 1f1b or gpipe
  // How blocks are split over the stages: parameters (balance parameter
  // counts), uniform (equal block counts), or list (partition_blocks).
  PartitionName partition = PartitionName::kParameters;
  // partition list: blocks per stage, pipeline entries, each >= 1, summing to
  // model.n_layer. Empty otherwise.
  std::vector<int> partition_blocks;
  bool operator==(const ParallelOptions&) const = default;
};

// LoRA adapters; present only when the recipe has a lora section.
struct LoraOptions {
  int r = 8;             // adapter rank, >= 1 (required in the recipe)
  double alpha = 8.0;    // scaling numerator (scale = alpha / r), > 0; defaults to r
  double dropout = 0.0;  // dropout on the adapter input, in [0, 1)
  // Linear layers that get adapters, each one of c_attn, c_proj,
  // attn.c_proj, c_fc, mlp.c_proj (c_proj names both projections). Non-empty.
  std::vector<std::string> targets = {"c_attn"};
  std::vector<int> layers;  // block indices that get adapters, sorted; empty = all blocks
  std::string adapter;      // a PEFT adapter directory to start the adapters from; "" = PEFT init
  bool operator==(const LoraOptions&) const = default;
};

// Preference training (data.format preference); present only when the recipe has an objective
// section. Current TRL's definitions and defaults (docs/OBJECTIVES.md).
struct ObjectiveOptions {
  ObjectiveName name = ObjectiveName::kDpo;       // required in the recipe
  DpoLossName loss_type = DpoLossName::kSigmoid;  // dpo only
  double beta = 0.1;                              // > 0: DPO's and SimPO's beta, ORPO's lambda
  double label_smoothing = 0.0;  // [0, 0.5): dpo with loss_type robust, and simpo, only
  double gamma = 0.5;            // simpo only: the target reward margin
  double cpo_alpha = 0.0;        // simpo only: weight of the chosen answers' NLL, >= 0
  // dpo only: a Hugging Face model directory of the policy's architecture holding the
  // reference; "" = the initial weights (under LoRA: the base, adapters off).
  std::string reference;
  bool operator==(const ObjectiveOptions&) const = default;
};

struct ActivationCheckpointingOptions {
  // Block indices whose activations are recomputed in backward, sorted and
  // unique; empty = none. The recipe's "all" and {every: k} are expanded here
  // ({every: k} = blocks 0, k, 2k, ...).
  std::vector<int> layers;
  bool operator==(const ActivationCheckpointingOptions&) const = default;
};

struct CheckpointOptions {
  int every = 0;       // save every N steps, >= 0; 0 = only at the end (at_end) or on a signal
  int keep_last = 3;   // checkpoints kept on disk, >= 1
  bool at_end = true;  // save after the last step, and when a signal stops the run
  // Save behind the step: stage the rank's state in memory at the step boundary, write it on a
  // thread, commit when every rank's shard is durable. Off (resolved) with ZeRO-Infinity's NVMe
  // optimizer, whose state is not in memory to stage.
  bool async = true;
  bool operator==(const CheckpointOptions&) const = default;
};

struct LoggingOptions {
  int every = 10;                   // progress line and metrics every N steps, >= 1
  int eval_every = 0;               // validation loss every N steps, >= 0; 0 = only at the end
  int eval_batches = 8;             // micro-batches per validation pass, >= 1
  int sample_tokens = 200;          // tokens generated after training, >= 0; 0 = no sample
  std::string sample_prompt;        // text the sample continues ("" = start from nothing)
  double sample_temperature = 0.8;  // sampling temperature, > 0
  int sample_top_k = 40;            // sample among the k likeliest tokens, >= 0; 0 = all
  bool operator==(const LoggingOptions&) const = default;
};

// Where each recipe value came from: "file:line:col", "override 'k=v'" or
// "<default>". Not part of a recipe's value: all Sources compare equal.
struct Sources {
  std::map<std::string, std::string, std::less<>> by_key;  // key path -> location
  friend bool operator==(const Sources&, const Sources&) { return true; }
};

struct Recipe {
  ModelOptions model;
  DataOptions data;
  BatchOptions batch;
  OptimizerOptions optimizer;
  ScheduleOptions schedule;
  Precision precision = Precision::kFp32;  // compute dtype; bf16/fp16 keep fp32 master weights
  LossScaleOptions loss_scale;             // used only with precision fp16
  ZeroOptions zero;
  DistOptions dist;
  ParallelOptions parallel;
  std::optional<LoraOptions> lora;            // nullopt = full fine-tuning
  std::optional<ObjectiveOptions> objective;  // nullopt = next-token loss
  ActivationCheckpointingOptions activation_checkpointing;
  CheckpointOptions checkpoint;
  LoggingOptions logging;
  DeviceName device = DeviceName::kCpu;  // where to train: cpu, or cuda (one GPU per rank)
  // fp32 GEMMs on a GPU on TF32 tensor cores (inputs rounded to 10-bit
  // mantissas, fp32 accumulation), as PyTorch's allow_tf32 and Hugging Face's
  // `tf32`; false: exact fp32. No effect on the CPU or with 16-bit precision.
  bool tf32 = true;
  int threads = 1;      // BLAS threads per rank, 1 .. 1024
  int64_t seed = 1337;  // seeds init, data order, dropout, sampling; >= 0
  int64_t steps = 0;    // optimizer steps, >= 1 (required in the recipe)
  // A loss above this ends the run as diverged (exit 1), like a non-finite
  // one; >= 0, 0 = only non-finite losses.
  double max_loss = 100.0;

  Sources sources;  // filled by the loader; see where()

  // Where the value of `key_path` ("data.train", "optimizer.lr") was set:
  // "file:line:col", "override 'k=v'", or "<default>" when the recipe left
  // it out (or the path is not a key). A section ("model") is where its key
  // is written. "data.train[i]" is the location of the pattern that produced
  // data.train[i] (likewise data.val[i]).
  std::string where(std::string_view key_path) const;

  bool operator==(const Recipe&) const = default;
};

// Data-parallel replicas D = world_size / (parallel.pipeline * parallel.tensor): the ranks
// that consume distinct data (a pipeline's stages and a tensor-parallel group all work on
// their replica's micro-batches). world_size when there is neither. world_size must be a
// multiple of pipeline * tensor (check_world_size()).
int data_parallel_size(const Recipe& recipe, int world_size);

// Sequences per optimizer step over all ranks: batch.global, or
// micro * accumulation * D when global is 0 (D = data_parallel_size(); the
// world size without a pipeline).
int64_t global_batch(const Recipe& recipe, int world_size);

// Why ZeRO stage `stage` cannot run in the parallel layout `parallel` (the
// reason and what to do; `offload_params`: the recipe offloads parameters,
// which needs stage 3), or empty when it can. The recipe schema refuses such
// a recipe; the estimate leaves that stage's column empty.
std::string zero_stage_refusal(const ParallelOptions& parallel, int stage,
                               bool offload_params = false);

// The checks that need the world size. Throws a usage fd::Error:
// - naming parallel.pipeline's (or parallel.tensor's) location, when world_size is not a
//   multiple of pipeline * tensor (world = stages x data-parallel replicas x tensor ranks);
// - naming batch.global's location and the accumulation that would fit, when
//   a set batch.global is not micro * accumulation * D.
void check_world_size(const Recipe& recipe, int world_size);

}  // namespace fd::config
