#include "lib/engine/assemble.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "lib/base/check.h"
#include "lib/base/error.h"
#include "lib/base/log.h"
#include "lib/config/model_dir.h"
#include "lib/data/token_file.h"
#include "lib/engine/tokenizer_fit.h"
#include "lib/nn/config/segments.h"
#include "lib/pipe/partition.h"
#include "lib/text/tokenizer.h"

namespace fd::engine {

DType compute_dtype(config::Precision precision) {
  switch (precision) {
    case config::Precision::kBf16:
      return DType::kBF16;
    case config::Precision::kFp16:
      return DType::kF16;
    case config::Precision::kFp32:
      break;
  }
  return DType::kF32;
}

namespace {

nn::DecoderConfig model_config(const config::ModelOptions& m) {
  nn::DecoderConfig c = config::decoder_config(m);
  c.validate();
  return c;
}

nn::LoraConfig lora_config(const config::Recipe& r, const nn::DecoderConfig& model) {
  nn::LoraConfig lora;
  if (!r.lora) return lora;
  lora.r = r.lora->r;
  lora.alpha = float(r.lora->alpha);
  lora.dropout = float(r.lora->dropout);
  lora.modules = nn::lora_modules_for_targets(model, r.lora->targets);
  lora.layers = r.lora->layers;
  return lora;
}

// The recipe states bitsandbytes' block sizes without lib/quant (config::kQuantBlockSizes).
static_assert(std::equal(config::kQuantBlockSizes.begin(), config::kQuantBlockSizes.end(),
                         quant::kBlockSizes.begin(), quant::kBlockSizes.end()),
              "config::kQuantBlockSizes and quant::kBlockSizes disagree");

// model.quantize as lib/quant's options; none without it.
std::optional<quant::QuantOptions> quant_options(const config::ModelOptions& m) {
  if (!m.quantize) return std::nullopt;
  quant::QuantOptions q;
  q.type = m.quantize->type == config::QuantTypeName::kFp4 ? quant::QuantType::kFP4
                                                           : quant::QuantType::kNF4;
  q.block_size = m.quantize->block_size;
  q.double_quant = m.quantize->double_quant;
  quant::check_block_size(q.block_size);  // valid in a loaded recipe; a Recipe built in code
  return q;
}

pipe::PartitionSpec partition_spec(const config::ParallelOptions& p) {
  switch (p.partition) {
    case config::PartitionName::kUniform:
      return {pipe::PartitionKind::kUniform, {}};
    case config::PartitionName::kList:
      return {pipe::PartitionKind::kExplicit, p.partition_blocks};
    case config::PartitionName::kParameters:
      break;
  }
  return {pipe::PartitionKind::kParameters, {}};
}

// The recipe's objective section as lib/objective's options; none without it.
std::optional<objective::PreferenceOptions> objective_options(const config::Recipe& r) {
  if (!r.objective) return std::nullopt;
  const config::ObjectiveOptions& o = *r.objective;
  objective::PreferenceOptions p;
  switch (o.name) {
    case config::ObjectiveName::kDpo:
      p.objective = objective::Objective::kDpo;
      break;
    case config::ObjectiveName::kSimpo:
      p.objective = objective::Objective::kSimpo;
      break;
    case config::ObjectiveName::kOrpo:
      p.objective = objective::Objective::kOrpo;
      break;
  }
  switch (o.loss_type) {
    case config::DpoLossName::kSigmoid:
      p.dpo_loss = objective::DpoLoss::kSigmoid;
      break;
    case config::DpoLossName::kIpo:
      p.dpo_loss = objective::DpoLoss::kIpo;
      break;
    case config::DpoLossName::kHinge:
      p.dpo_loss = objective::DpoLoss::kHinge;
      break;
    case config::DpoLossName::kRobust:
      p.dpo_loss = objective::DpoLoss::kRobust;
      break;
  }
  p.beta = o.beta;
  p.label_smoothing = o.label_smoothing;
  p.gamma = o.gamma;
  p.cpo_alpha = o.cpo_alpha;
  return p;
}

}  // namespace

Assembly assemble(const config::Recipe& r, int world) {
  Assembly a;
  a.world = world;
  a.model = model_config(r.model);
  a.lora = lora_config(r, a.model);
  a.quantize = quant_options(r.model);
  a.dtype = compute_dtype(r.precision);
  if (r.parallel.pipeline > 1 || r.parallel.tensor > 1 || r.parallel.sequence > 1)
    config::check_world_size(r, world);
  a.stages = r.parallel.pipeline;
  a.sequence_parallel = r.parallel.sequence_parallel;
  a.replicas = config::data_parallel_size(r, world);
  a.mesh = dist::Mesh::layout(world, a.stages, r.parallel.tensor, r.parallel.sequence);
  a.pipeline_schedule = r.parallel.schedule == config::PipelineSchedule::kGPipe
                            ? pipe::Schedule::kGPipe
                            : pipe::Schedule::k1F1B;
  a.stage_blocks = pipe::partition_blocks(a.model, a.stages, partition_spec(r.parallel));
  // No world in them: the engine pads the groups for its replicas (build_run).
  a.layout = zero::layout_for(r.zero.stage);
  a.frozen_layout = zero::frozen_layout_for(r.zero.stage);
  a.seed = uint64_t(r.seed);
  a.micro = r.batch.micro;
  a.seq_len = r.data.seq_len;
  a.byte_level = r.data.format == config::DataFormat::kText && r.data.tokenizer.empty();
  a.objective = objective_options(r);
  a.packed = r.data.packing || r.data.format == config::DataFormat::kPreference;

  zero::ZeroConfig& z = a.zero;
  z.stage = r.zero.stage;
  z.overlap_comm = r.zero.overlap_comm;
  z.reductions_in_flight = r.zero.reductions_in_flight;
  z.sum16 =
      r.zero.reduce_dtype == config::Precision::kFp32 ? dist::Sum16::kFp32 : dist::Sum16::kNative;
  z.accumulation = r.batch.accumulation;
  z.adamw.lr = float(r.optimizer.lr);
  z.adamw.beta1 = float(r.optimizer.betas[0]);
  z.adamw.beta2 = float(r.optimizer.betas[1]);
  z.adamw.eps = float(r.optimizer.eps);
  z.adamw.weight_decay = float(r.optimizer.weight_decay);
  z.grad_clip = float(r.optimizer.grad_clip);
  const std::vector<nn::SegmentInfo> segments = nn::decoder_segments(a.model);
  for (int layer : r.activation_checkpointing.layers)
    z.checkpoint_segments.push_back(nn::find_segment(segments, nn::SegmentRole::kBlock, layer));
  const config::OffloadOptions& oo = r.zero.offload_optimizer;
  z.offload.optimizer = oo.device != config::OffloadDevice::kNone;
  z.offload.host = oo.device == config::OffloadDevice::kHost;
  z.offload.gpu = r.device == config::DeviceName::kCuda;
  z.offload.dir = oo.path;
  z.offload.buffer_bytes = int64_t(oo.buffer_mib) << 20;
  z.offload.params = r.zero.offload_params.device == config::OffloadDevice::kNvme;
  z.quantized_weights = r.zero.quantized_weights;
  z.hierarchical_partition = r.zero.hierarchical_partition;
  z.gradient_codes =
      r.zero.quantized_gradients == config::GradientCodes::kInt8   ? zero::kGradientCodes8
      : r.zero.quantized_gradients == config::GradientCodes::kInt4 ? zero::kGradientCodes4
                                                                   : dist::WireFormat{0, 0};
  a.hierarchical = r.dist.hierarchical;

  if (r.precision == config::Precision::kFp16) {
    precision::LossScalerOptions lo;
    lo.loss_scale = r.loss_scale.loss_scale;
    lo.initial_scale_power = r.loss_scale.initial_scale_power;
    lo.loss_scale_window = r.loss_scale.loss_scale_window;
    lo.hysteresis = r.loss_scale.hysteresis;
    lo.consecutive_hysteresis = r.loss_scale.consecutive_hysteresis;
    lo.min_loss_scale = r.loss_scale.min_loss_scale;
    a.loss_scaler = lo;
  }

  a.schedule.kind = r.schedule.name == config::ScheduleName::kCosine
                        ? optim::ScheduleKind::kCosine
                        : optim::ScheduleKind::kConstant;
  a.schedule.peak_lr = z.adamw.lr;
  a.schedule.warmup_steps = r.schedule.warmup_steps;
  a.schedule.total_steps = r.steps;
  a.schedule.min_lr = float(r.schedule.min_lr);
  a.async_checkpoints = r.checkpoint.async && r.checkpoint.every > 0;
  a.saves_checkpoints = r.checkpoint.every > 0 || r.checkpoint.at_end;
  if (r.logging.sample_tokens > 0) {
    // The prompt's tokens are at most its bytes (one when empty: the start token); a sample
    // longer than the window runs its newest half again each time the window fills.
    const int prompt = std::max<int>(
        1, int(std::min<size_t>(r.logging.sample_prompt.size(), size_t(r.data.seq_len))));
    a.sample_rows = prompt + r.logging.sample_tokens > r.data.seq_len
                        ? std::max(prompt, (r.data.seq_len + 1) / 2)
                        : prompt;
  }
  return a;
}

Assembly assemble_for_inference(const config::Recipe& r) {
  Assembly a;
  a.model = model_config(r.model);
  a.stage_blocks = {a.model.num_layers};  // one process runs the whole model
  a.lora = lora_config(r, a.model);
  a.lora.dropout = 0.0f;
  a.quantize = quant_options(r.model);
  a.seed = uint64_t(r.seed);
  a.micro = r.batch.micro;
  a.seq_len = r.data.seq_len;
  a.byte_level = r.data.format == config::DataFormat::kText && r.data.tokenizer.empty();
  a.packed = r.data.packing || r.data.format == config::DataFormat::kPreference;
  return a;
}

std::unique_ptr<nn::Decoder> build_model(const Assembly& a, Init init,
                                         const std::function<bool(int segment)>& present,
                                         const nn::TensorParallel& tp,
                                         const nn::SequenceParallel& sp) {
  nn::GroupLayout layout = a.layout, frozen_layout = a.frozen_layout;
  if (init == Init::kDeferred)
    layout.params_resident = layout.grads_resident = frozen_layout.params_resident = false;
  auto model = std::make_unique<nn::Decoder>(a.model, a.dtype, layout, a.lora, frozen_layout,
                                             present, a.quantize, tp, sp);
  if (init == Init::kRandom) model->init_weights(a.seed);
  return model;
}

namespace {

std::unique_ptr<data::TokenDataset> open_stream(const config::Recipe& r);

std::shared_ptr<const text::Tokenizer> recipe_tokenizer(const config::Recipe& r) {
  std::shared_ptr<const text::Tokenizer> tok;
  try {
    tok = text::load_tokenizer(r.data.tokenizer);
  } catch (const Error& e) {
    throw Error(e.kind(),
                fmt::format("{}: data.tokenizer: {}", r.where("data.tokenizer"), e.what()));
  }
  require_tokenizer_fits(
      *tok, r.model.vocab_size,
      fmt::format("{}: data.tokenizer {}", r.where("data.tokenizer"), r.data.tokenizer),
      "model.vocab_size is",
      fmt::format("raise model.vocab_size to at least {} (or use the model's own tokenizer)",
                  tok->vocab_size()));
  return tok;
}

data::RecordFormat record_format(config::DataFormat f) {
  switch (f) {
    case config::DataFormat::kChat:
      return data::RecordFormat::kChat;
    case config::DataFormat::kInstruct:
      return data::RecordFormat::kInstruct;
    default:
      return data::RecordFormat::kText;
  }
}

// data.chat_template (or data.tokenizer's own), loaded. optional: nullptr when the tokenizer
// has none and data.chat_template is unset, instead of the error.
std::shared_ptr<const data::ChatTemplate> recipe_chat_template(const config::Recipe& r,
                                                               bool optional = false) {
  const config::DataOptions& d = r.data;
  std::shared_ptr<data::ChatTemplate> t;
  try {
    t = std::make_shared<data::ChatTemplate>(
        data::ChatTemplate::load(d.chat_template, d.tokenizer));
  } catch (const Error& e) {
    if (optional && d.chat_template.empty() && e.kind() == ErrorKind::kUsage) return nullptr;
    throw Error(e.kind(), fmt::format("{}: data.chat_template: {}",
                                      r.where(d.chat_template.empty() ? "data.tokenizer"
                                                                      : "data.chat_template"),
                                      e.what()));
  }
  if (!d.template_vars.empty()) {
    const std::string where = r.where("data.template_vars") + ": data.template_vars";
    for (const std::string& name :
         t->set_variables(nlohmann::ordered_json::parse(d.template_vars), where)) {
      log::warn_shared("{}.{}: {} never reads \"{}\"; the variable changes nothing", where, name,
                       t->name(), name);
    }
  }
  return t;
}

data::PackOrder pack_order(const config::DataOptions& d) {
  return d.packing_order == config::PackingOrderName::kFirstCome ? data::PackOrder::kFirstCome
                                                                 : data::PackOrder::kBestFit;
}

data::BadRecords bad_records(const config::DataOptions& d) {
  return d.on_bad_record == config::BadRecordName::kSkip ? data::BadRecords::kSkip
                                                         : data::BadRecords::kError;
}

}  // namespace

data::PreferenceDatasetOptions preference_options(const config::Recipe& r) {
  const config::DataOptions& d = r.data;
  data::PreferenceDatasetOptions o;
  o.train_files = d.train;
  o.val_files = d.val;
  o.val_fraction = d.val_fraction;
  o.records.bad = bad_records(d);
  o.seq_len = d.seq_len;
  o.max_length = d.max_length;
  o.vocab_size = r.model.vocab_size;
  o.tokenizer = recipe_tokenizer(r);
  o.chat_template = recipe_chat_template(r, /*optional=*/true);
  o.packing = d.packing;
  o.pack_order = pack_order(d);
  o.seed = uint64_t(r.seed);
  o.threads = r.threads;
  // ORPO's NLL term scores the chosen sequence's prompt too (docs/OBJECTIVES.md).
  o.prompt_targets = r.objective && r.objective->name == config::ObjectiveName::kOrpo;
  return o;
}

data::ExampleOptions example_options(const config::Recipe& r) {
  const config::DataOptions& d = r.data;
  data::ExampleOptions o;
  o.train_files = d.train;
  o.val_files = d.val;
  o.val_fraction = d.val_fraction;
  o.records.format = record_format(d.format);
  o.records.fields = {.messages = d.messages_field,
                      .instruction = d.instruction_field,
                      .input = d.input_field,
                      .output = d.output_field,
                      .text = d.text_field};
  o.records.bad = bad_records(d);
  o.seq_len = d.seq_len;
  o.vocab_size = r.model.vocab_size;
  o.tokenizer = recipe_tokenizer(r);
  if (o.records.format != data::RecordFormat::kText) o.chat_template = recipe_chat_template(r);
  o.train_on_prompt = d.train_on_prompt;
  o.truncation = d.truncation == config::TruncationName::kRight  ? data::Truncation::kRight
                 : d.truncation == config::TruncationName::kLeft ? data::Truncation::kLeft
                                                                 : data::Truncation::kError;
  o.packing = d.packing;
  o.pack_order = pack_order(d);
  o.seed = uint64_t(r.seed);
  o.threads = r.threads;
  return o;
}

namespace {

// The dataset `Options` builds, its usage errors located at the recipe's data section.
template <class Dataset, class Options>
std::unique_ptr<Dataset> open_located(const config::Recipe& r, const Options& o) {
  try {
    return std::make_unique<Dataset>(o);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kUsage) throw;
    throw Error(ErrorKind::kUsage, fmt::format("{}: {}", r.where("data"), e.what()));
  }
}

}  // namespace

TrainingData::TrainingData() = default;
TrainingData::TrainingData(TrainingData&&) noexcept = default;
TrainingData& TrainingData::operator=(TrainingData&&) noexcept = default;
TrainingData::~TrainingData() = default;

const data::BatchSource& TrainingData::source() const {
  if (preference) return *preference;
  if (examples) return *examples;
  return *sampler;
}

std::string TrainingData::summary() const {
  if (preference) return preference->summary();
  return examples ? examples->summary() : stream->summary();
}

nlohmann::json TrainingData::stats_json() const {
  if (preference) {
    const data::PreferenceStats& s = preference->stats();
    return {{"pairs", {{"train", s.train_pairs}, {"val", s.val_pairs}}},
            {"rows", {{"train", s.train_rows}, {"val", s.val_rows}}},
            {"tokens", s.train_tokens},
            {"efficiency", s.efficiency},
            {"packing", preference->packing()},
            {"packing_order", preference->packing()
                                  ? nlohmann::json(data::pack_order_name(preference->pack_order()))
                                  : nlohmann::json(nullptr)},
            {"max_length", preference->max_length()},
            {"dropped", s.dropped},
            {"truncated", s.truncated},
            {"identical", s.identical},
            {"identical_where", s.identical_where},
            {"records", s.records.records},
            {"skipped_records", s.records.skipped},
            {"skip_reasons", s.records.skip_reasons}};
  }
  if (!examples) return nullptr;
  const data::ExampleStats& s = examples->stats();
  return {{"examples", {{"train", s.train_examples}, {"val", s.val_examples}}},
          {"rows", {{"train", s.train_rows}, {"val", s.val_rows}}},
          {"tokens", s.train_tokens},
          {"target_tokens", s.train_target_tokens},
          {"efficiency", s.efficiency},
          {"packing", examples->packed()},
          {"packing_order", examples->packed()
                                ? nlohmann::json(data::pack_order_name(examples->pack_order()))
                                : nlohmann::json(nullptr)},
          {"targets_per_row",
           s.train_rows > 0 ? double(s.train_target_tokens) / double(s.train_rows) : 0.0},
          {"truncated", s.truncated},
          {"without_targets", s.without_targets},
          {"not_written", s.not_written},
          {"records", s.records.records},
          {"skipped_records", s.records.skipped},
          {"skip_reasons", s.records.skip_reasons}};
}

TrainingData open_dataset(const config::Recipe& r) {
  TrainingData out;
  if (r.data.format == config::DataFormat::kPreference) {
    out.preference = open_located<data::PreferenceDataset>(r, preference_options(r));
    return out;
  }
  if (r.data.examples()) {
    out.examples = open_located<data::ExampleDataset>(r, example_options(r));
    if (std::string w = out.examples->not_written_warning(); !w.empty())
      log::warn_shared("{}: {}", r.where("data.train"), w);
    return out;
  }
  out.stream = open_stream(r);
  out.sampler = std::make_unique<data::Sampler>(*out.stream, uint64_t(r.seed));
  return out;
}

namespace {
std::unique_ptr<data::TokenDataset> open_stream(const config::Recipe& r) {
  data::DatasetOptions o;
  o.train_files = r.data.train;
  o.val_files = r.data.val;
  o.format = r.data.format == config::DataFormat::kTokens ? data::TokenFormat::kLlmc
                                                          : data::TokenFormat::kText;
  o.val_fraction = r.data.val_fraction;
  o.seq_len = r.data.seq_len;
  o.vocab_size = r.model.vocab_size;
  o.text_field = r.data.text_field;
  if (!r.data.tokenizer.empty()) o.tokenizer = recipe_tokenizer(r);
  try {
    return std::make_unique<data::TokenDataset>(o);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kUsage) throw;
    // Find the file at fault to point at its line in the recipe.
    auto locate = [&](const std::vector<std::string>& files, const char* key) -> std::string {
      for (size_t i = 0; i < files.size(); ++i) {
        try {
          data::TokenFile::open(files[i], o.format, o.vocab_size);
        } catch (const Error&) {
          return fmt::format("{}: {}[{}]: ", r.where(fmt::format("{}[{}]", key, i)), key, i);
        }
      }
      return "";
    };
    std::string where = locate(o.train_files, "data.train");
    if (where.empty()) where = locate(o.val_files, "data.val");
    if (where.empty()) where = fmt::format("{}: ", r.where("data"));
    throw Error(ErrorKind::kUsage, where + e.what());
  }
}
}  // namespace

SampleOptions sample_options(const config::Recipe& r) {
  SampleOptions so;
  so.max_new_tokens = r.logging.sample_tokens;
  so.temperature = float(r.logging.sample_temperature);
  so.top_k = r.logging.sample_top_k;
  so.seed = uint64_t(r.seed);
  so.max_context = r.data.seq_len;  // positions beyond it were never trained
  so.start_token = default_start_token(
      r.data.format == config::DataFormat::kText && r.data.tokenizer.empty(), r.model.vocab_size);
  return so;
}

ckpt::LoraSpec lora_spec(const config::Recipe& r) {
  FD_CHECK(r.lora.has_value());
  const config::LoraOptions& l = *r.lora;
  return ckpt::LoraSpec{l.r, l.alpha, l.dropout, l.targets, l.layers, r.model.init_from};
}

}  // namespace fd::engine
