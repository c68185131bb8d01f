// Assembly: the one place a config::Recipe becomes the objects of a run.
//
//   Assembly a = assemble(recipe, comm.size());
//   std::unique_ptr<nn::Decoder> model = build_model(a, Init::kDeferred);
//   zero::ZeroEngine engine(*model, comm, a.zero, initial_weights(*model, {a.seed, ...}));
//
// The trainer, `fdtrain estimate`, eval/generate and the exports that rebuild
// a model from a checkpoint all go through here (the C API builds no model
// from a recipe). A recipe field that changes what is built is one edit here
// plus its schema entry (lib/config/schema.cc). The data side is here too:
// open_dataset().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "lib/ckpt/peft.h"
#include "lib/config/recipe.h"
#include "lib/data/example_dataset.h"
#include "lib/data/preference_dataset.h"
#include "lib/data/sampler.h"
#include "lib/data/token_dataset.h"
#include "lib/dist/mesh.h"
#include "lib/engine/generate.h"
#include "lib/nn/decoder.h"
#include "lib/objective/preference.h"
#include "lib/optim/schedule.h"
#include "lib/pipe/schedule.h"
#include "lib/precision/loss_scaler.h"
#include "lib/quant/quantize.h"
#include "lib/zero/zero_engine.h"

namespace fd::engine {

// Parameters, gradients and activations: fp32 -> f32, bf16 -> bf16, fp16 -> f16.
DType compute_dtype(config::Precision precision);

// Everything a run is built from, for one world size.
struct Assembly {
  int world = 1;  // ranks in the job: stages x replicas x tensor-parallel ranks
  // The ranks as a mesh of named axes (lib/dist/mesh.h), from the recipe's
  // parallel section: {pp: stages, dp: replicas}, dp fastest, and with
  // tensor parallelism {pp, dp, tp: parallel.tensor}, tp fastest. Without a
  // pipeline: one stage holding every block.
  dist::Mesh mesh = dist::Mesh({});
  // Pipeline parallelism (lib/pipe): the mesh's axis sizes, for short.
  bool sequence_parallel = false;  // parallel.sequence_parallel (over the mesh's tp axis)
  int stages = 1;                  // P
  int replicas = 1;  // D = world / (P T): ZeRO's world, the ranks its engine pads the groups for
  pipe::Schedule pipeline_schedule = pipe::Schedule::k1F1B;
  std::vector<int> stage_blocks;  // transformer blocks per stage (pipe::partition_blocks)
  nn::DecoderConfig model;        // the network: family, dimensions, switches
  nn::LoraConfig lora;            // adapters; disabled (r = 0) without a lora section
  // model.quantize: the frozen base's block linears in 4 bits (QLoRA); absent: the compute dtype.
  std::optional<quant::QuantOptions> quantize;
  DType dtype = DType::kF32;      // the compute dtype (fp32 master weights when 16-bit)
  nn::GroupLayout layout;         // trainable flat groups' accounting for zero.stage (no world)
  nn::GroupLayout frozen_layout;  // the frozen base of a LoRA run
  zero::ZeroConfig zero;          // stage, overlap, accumulation, AdamW, clipping, checkpointing
  // dist.hierarchical: the ZeRO group's collectives inside and across hosts
  // (dist::HierarchicalCommunicator, which build_run puts under the engine also for hpZ and qgZ).
  bool hierarchical = false;
  std::optional<precision::LossScalerOptions> loss_scaler;  // fp16 only
  optim::ScheduleOptions schedule;
  uint64_t seed = 0;  // model init, sampling, adapter dropout
  // Checkpoints are saved behind the step (checkpoint.async with checkpoint.every > 0): each rank
  // holds a staging copy of its saved state (CheckpointStaging, MemCategory::kCheckpoint), unless
  // that state streams from a file (ZeRO-Infinity), which is saved synchronously.
  bool async_checkpoints = false;
  bool saves_checkpoints = false;  // checkpoint.every > 0 or checkpoint.at_end
  // The end-of-run sample (logging.sample_tokens > 0): the most tokens one KvDecoder append takes
  // (generate.h: the prompt, or the newest half of a full window); 0 without a sample.
  int sample_rows = 0;
  int micro = 1;           // sequences per micro-batch
  int seq_len = 1;         // tokens per sequence
  bool byte_level = true;  // tokens are bytes (data.format text without data.tokenizer), else ids
  // Packed rows (data.packing; preference pairs always): batches carry doc_starts (step.h,
  // data/batch_source.h).
  bool packed = false;
  // Preference training (the recipe's objective section): batches carry roles and pairs, and
  // the head computes the objective (preference.h). Absent: next-token loss.
  std::optional<objective::PreferenceOptions> objective;
};

// A training run of `r` at `world` ranks (r as validated by lib/config).
// With a pipeline (parallel.pipeline > 1) throws fd::Error (kUsage) when the
// stages do not divide `world` or batch.global does not fit it
// (config::check_world_size).
Assembly assemble(const config::Recipe& r, int world);

// The model of a checkpoint's stored recipe, for inference and exports: fp32,
// one rank, unpadded groups, adapter dropout off.
Assembly assemble_for_inference(const config::Recipe& r);

// How build_model() fills the parameters.
enum class Init {
  kRandom,  // the family's random initialisation from Assembly::seed (training;
            // Decoder::init_weights)
  kNone,    // contents unspecified: the caller loads every parameter (inference)
  // Nothing filled and nothing allocated: every flat buffer starts released
  // (GroupLayout::params_resident, grads_resident false). The ZeroEngine pads
  // each group for its ranks, allocates what its stage keeps and fills what
  // each rank holds through a ParamFill (initial_weights(), weights_io.h); a
  // pipeline stage does the same for the segments outside its engine
  // (PipelineStage::attach). Under ZeRO-3 no rank ever holds the whole model,
  // not even while it is set up.
  kDeferred,
};

// The model `a` describes, in a.dtype on the thread's default device
// (model.init_from, adapters and checkpoints are loaded by the caller).
// `present` (a pipeline stage): the segments this process holds (nn::Decoder).
// `tp` (tensor parallelism): the slices this process holds (nn::TensorParallel); `sp` (Ulysses):
// the slice of each sequence it computes (nn::SequenceParallel).
std::unique_ptr<nn::Decoder> build_model(const Assembly& a, Init init = Init::kRandom,
                                         const std::function<bool(int segment)>& present = {},
                                         const nn::TensorParallel& tp = {},
                                         const nn::SequenceParallel& sp = {});

// Opens data.train and data.val (data.format, data.val_fraction,
// data.seq_len, model.vocab_size) as a TokenDataset and its Sampler (seeded
// with the recipe's seed), as training opens them;
// `fdtrain validate` calls it to find, without training, every data problem
// `fdtrain train` would stop at (an empty or malformed file, a token id past
// model.vocab_size, a split shorter than data.seq_len + 1). Throws fd::Error
// (kUsage) for a bad file or split; the message starts with where the recipe
// names the file at fault ("r.yaml:9:11: data.train[0]: ...", else where the
// data section is), then the problem and what to do.
//
// Fine-tuning examples (data.format chat or instruct, or text with data.packing) are read,
// rendered with the chat template and encoded as an ExampleDataset instead
// (example_dataset.h), with the same errors for bad records, templates and lengths;
// preference pairs (data.format preference) as a PreferenceDataset (preference_dataset.h).
struct TrainingData {
  std::unique_ptr<data::TokenDataset> stream;           // windows of a token stream, or
  std::unique_ptr<data::Sampler> sampler;               // (over `stream`)
  std::unique_ptr<data::ExampleDataset> examples;       // fine-tuning examples, or
  std::unique_ptr<data::PreferenceDataset> preference;  // preference pairs

  TrainingData();
  TrainingData(TrainingData&&) noexcept;
  TrainingData& operator=(TrainingData&&) noexcept;
  ~TrainingData();
  const data::BatchSource& source() const;
  // One line for the log.
  std::string summary() const;
  // summary.json's "data" (docs/RUN_DIR.md).
  nlohmann::json stats_json() const;
};
TrainingData open_dataset(const config::Recipe& r);
// The fine-tuning example options of `r` (data.format chat or instruct, or text with
// data.packing), its tokenizer and chat template loaded: what open_dataset() and
// `fdtrain data preview` read examples with. Throws fd::Error (kUsage) located in the recipe.
data::ExampleOptions example_options(const config::Recipe& r);
// The same for data.format preference. The chat template is loaded when the tokenizer has
// one or data.chat_template names one; without it conversational pairs are refused (standard
// pairs need none). prompt_targets is set for ORPO (its NLL scores the chosen prompt too).
data::PreferenceDatasetOptions preference_options(const config::Recipe& r);

// The end-of-run sample of `r` (logging.sample_*): byte-level text starts
// from '\n', token files from GPT-2's <|endoftext|> when the vocabulary has it.
SampleOptions sample_options(const config::Recipe& r);

// The adapter settings of `r`'s lora section as a PEFT adapter records them
// (`ckpt export --lora-adapter`), with base = model.init_from. `r` must have a
// lora section.
ckpt::LoraSpec lora_spec(const config::Recipe& r);

}  // namespace fd::engine
