#include "lib/config/recipe.h"

#include "lib/base/error.h"

namespace fd::config {

std::string_view to_string(Arch v) {
  switch (v) {
    case Arch::kGpt2:
      return "gpt2";
    case Arch::kLlama:
      return "llama";
    case Arch::kMistral:
      return "mistral";
    case Arch::kQwen2:
      return "qwen2";
    case Arch::kQwen3:
      return "qwen3";
  }
  return "?";
}

std::string_view to_string(GradientCodes v) {
  switch (v) {
    case GradientCodes::kNone:
      return "none";
    case GradientCodes::kInt8:
      return "int8";
    case GradientCodes::kInt4:
      return "int4";
  }
  return "?";
}

std::string_view to_string(QuantTypeName v) {
  switch (v) {
    case QuantTypeName::kNf4:
      return "nf4";
    case QuantTypeName::kFp4:
      return "fp4";
  }
  return "?";
}

std::string_view to_string(ObjectiveName v) {
  switch (v) {
    case ObjectiveName::kDpo:
      return "dpo";
    case ObjectiveName::kSimpo:
      return "simpo";
    case ObjectiveName::kOrpo:
      return "orpo";
  }
  return "?";
}

std::string_view to_string(DpoLossName v) {
  switch (v) {
    case DpoLossName::kSigmoid:
      return "sigmoid";
    case DpoLossName::kIpo:
      return "ipo";
    case DpoLossName::kHinge:
      return "hinge";
    case DpoLossName::kRobust:
      return "robust";
  }
  return "?";
}

std::string_view to_string(RopeScalingName v) {
  switch (v) {
    case RopeScalingName::kNone:
      return "none";
    case RopeScalingName::kLinear:
      return "linear";
    case RopeScalingName::kLlama3:
      return "llama3";
  }
  return "?";
}

std::string_view to_string(DataFormat v) {
  switch (v) {
    case DataFormat::kText:
      return "text";
    case DataFormat::kTokens:
      return "tokens";
    case DataFormat::kChat:
      return "chat";
    case DataFormat::kInstruct:
      return "instruct";
    case DataFormat::kPreference:
      return "preference";
  }
  return "?";
}

std::string_view to_string(TruncationName v) {
  switch (v) {
    case TruncationName::kError:
      return "error";
    case TruncationName::kRight:
      return "right";
    case TruncationName::kLeft:
      return "left";
  }
  return "?";
}

std::string_view to_string(BadRecordName v) {
  switch (v) {
    case BadRecordName::kError:
      return "error";
    case BadRecordName::kSkip:
      return "skip";
  }
  return "?";
}

std::string_view to_string(PackingOrderName v) {
  switch (v) {
    case PackingOrderName::kBestFit:
      return "best_fit";
    case PackingOrderName::kFirstCome:
      return "first_come";
  }
  return "?";
}

std::string_view to_string(OptimizerName v) {
  switch (v) {
    case OptimizerName::kAdamW:
      return "adamw";
  }
  return "?";
}

std::string_view to_string(ScheduleName v) {
  switch (v) {
    case ScheduleName::kConstant:
      return "constant";
    case ScheduleName::kCosine:
      return "cosine";
  }
  return "?";
}

std::string_view to_string(Precision v) {
  switch (v) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kBf16:
      return "bf16";
    case Precision::kFp16:
      return "fp16";
  }
  return "?";
}

std::string_view to_string(OffloadDevice v) {
  switch (v) {
    case OffloadDevice::kNone:
      return "none";
    case OffloadDevice::kHost:
      return "host";
    case OffloadDevice::kNvme:
      return "nvme";
  }
  return "?";
}

std::string_view to_string(PipelineSchedule v) {
  switch (v) {
    case PipelineSchedule::k1F1B:
      return "1f1b";
    case PipelineSchedule::kGPipe:
      return "gpipe";
  }
  return "?";
}

std::string_view to_string(PartitionName v) {
  switch (v) {
    case PartitionName::kParameters:
      return "parameters";
    case PartitionName::kUniform:
      return "uniform";
    case PartitionName::kList:
      return "list";
  }
  return "?";
}

std::string_view to_string(DeviceName v) {
  switch (v) {
    case DeviceName::kCpu:
      return "cpu";
    case DeviceName::kCuda:
      return "cuda";
  }
  return "?";
}

std::string Recipe::where(std::string_view key_path) const {
  auto it = sources.by_key.find(key_path);
  if (it != sources.by_key.end()) return it->second;
  if (!key_path.empty() && key_path.back() == ']') {
    size_t open = key_path.rfind('[');
    if (open != std::string_view::npos) return where(key_path.substr(0, open));
  }
  return "<default>";
}

int data_parallel_size(const Recipe& recipe, int world_size) {
  const ParallelOptions& p = recipe.parallel;
  return world_size / (p.pipeline * p.tensor * p.sequence);
}

int64_t global_batch(const Recipe& recipe, int world_size) {
  if (recipe.batch.global != 0) return recipe.batch.global;
  return int64_t{recipe.batch.micro} * recipe.batch.accumulation *
         data_parallel_size(recipe, world_size);
}

std::string zero_stage_refusal(const ParallelOptions& p, int stage, bool offload_params) {
  if (p.pipeline <= 1 || stage != 3) return {};
  return fmt::format(
      "ZeRO stage 3 cannot be combined with a pipeline (parallel.pipeline is {}): stage 3 "
      "partitions every parameter across the data-parallel group and gathers each layer's "
      "parameters as it runs, which conflicts with the pipeline's per-stage ownership of its "
      "layers (DeepSpeed refuses it too); use zero.stage 0, 1 or 2{}, or parallel.pipeline: 1",
      p.pipeline, offload_params ? " without zero.offload_params (it needs stage 3)" : "");
}

void check_world_size(const Recipe& recipe, int world_size) {
  const int stages = recipe.parallel.pipeline, tensor = recipe.parallel.tensor;
  const int sequence = recipe.parallel.sequence;
  if (sequence > 1 && world_size % (int64_t{stages} * tensor * sequence) != 0) {
    const int64_t unit = int64_t{stages} * tensor * sequence;
    usage_error(
        "{}: parallel.sequence: {} sequence-parallel ranks x {} tensor-parallel rank(s) x {} "
        "pipeline stage(s) = {} do not divide the {} rank(s) of this job (the ranks are stages "
        "x data-parallel replicas x sequence-parallel ranks x tensor-parallel ranks): start a "
        "multiple of {} ranks (mpirun -n {})",
        recipe.where("parallel.sequence"), sequence, tensor, stages, unit, world_size, unit,
        world_size < unit ? unit : (world_size / unit + 1) * unit);
  }
  if (tensor > 1 && world_size % (int64_t{stages} * tensor) != 0) {
    const int64_t unit = int64_t{stages} * tensor;
    usage_error(
        "{}: parallel.tensor: {} tensor-parallel ranks x {} pipeline stage(s) = {} do not divide "
        "the {} rank(s) of this job (the ranks are stages x data-parallel replicas x "
        "tensor-parallel ranks): start a multiple of {} ranks (mpirun -n {}), or set "
        "parallel.tensor to a divisor of {}",
        recipe.where("parallel.tensor"), tensor, stages, unit, world_size, unit,
        world_size < unit ? unit : (world_size / unit + 1) * unit, world_size / stages);
  }
  if (world_size % stages != 0) {
    usage_error(
        "{}: parallel.pipeline: {} pipeline stages do not divide the {} rank(s) of this job (the "
        "ranks are stages x data-parallel replicas): start a multiple of {} ranks (mpirun -n {}), "
        "or set parallel.pipeline to a divisor of {}",
        recipe.where("parallel.pipeline"), stages, world_size, stages,
        world_size < stages ? stages : (world_size / stages + 1) * stages, world_size);
  }
  const BatchOptions& b = recipe.batch;
  const int replicas = data_parallel_size(recipe, world_size);
  const int64_t per_step = int64_t{b.micro} * b.accumulation * replicas;
  if (b.global == 0 || b.global == per_step) return;
  std::string hint;
  const int64_t per_micro = int64_t{b.micro} * replicas;
  if (b.global % per_micro == 0) {
    hint = fmt::format("; set batch.accumulation to {}", b.global / per_micro);
  } else {
    hint = "; change batch.global or batch.micro, or set batch.global to 0";
  }
  if (tensor > 1 || sequence > 1) {
    usage_error(
        "{}: batch.global: {} sequences per step do not fit {} rank(s) of {} tensor-parallel "
        "rank(s) x {} sequence-parallel rank(s) x {} stage(s): only the data-parallel replicas "
        "read distinct data (tensor- and sequence-parallel groups share their micro-batches), "
        "so batch.micro * batch.accumulation * replicas (ranks / (stages x sequence x tensor)) "
        "= {} * {} * {} = {}{}",
        recipe.where("batch.global"), b.global, world_size, tensor, sequence, stages, b.micro,
        b.accumulation, replicas, per_step, hint);
  }
  if (stages == 1) {
    usage_error(
        "{}: batch.global: {} sequences per step do not fit {} rank(s): batch.micro * "
        "batch.accumulation * ranks = {} * {} * {} = {}{}",
        recipe.where("batch.global"), b.global, world_size, b.micro, b.accumulation, world_size,
        per_step, hint);
  }
  usage_error(
      "{}: batch.global: {} sequences per step do not fit {} rank(s) in {} pipeline stages: only "
      "the data-parallel replicas read distinct data, so batch.micro * batch.accumulation * "
      "replicas (ranks / parallel.pipeline) = {} * {} * {} = {}{}",
      recipe.where("batch.global"), b.global, world_size, stages, b.micro, b.accumulation, replicas,
      per_step, hint);
}

}  // namespace fd::config
