#include "lib/engine/hf_export.h"

#include <cctype>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <regex>
#include <set>

#include "lib/base/atomic_file.h"
#include "lib/base/check.h"
#include "lib/base/error.h"
#include "lib/base/log.h"
#include "lib/ckpt/hf_dir.h"
#include "lib/ckpt/manifest.h"
#include "lib/engine/quant_io.h"
#include "lib/nn/config/hf_config.h"
#include "lib/quant/tables.h"
#include "lib/tensor/lora_merge.h"
#include "lib/text/tokenizer.h"

namespace fd::engine {
namespace {

namespace fs = std::filesystem;

}  // namespace

const char* torch_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "float32";
    case DType::kBF16:
      return "bfloat16";
    case DType::kF16:
      return "float16";
    default:
      usage_error("--dtype must be fp32 or bf16, got {}", dtype_name(dtype));
  }
}

namespace {

// `dir` without a trailing separator ("out/" -> "out").
fs::path normal_dir(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p;
}

}  // namespace

int64_t parse_shard_size(const std::string& text) {
  static const std::regex kSize(R"(^\s*([0-9]+(\.[0-9]+)?)\s*([kmg]i?b)?\s*$)", std::regex::icase);
  std::smatch m;
  auto bad = [&]() {
    usage_error(
        "--max-shard-size {}: expected bytes (e.g. 1000000) or a size such as 5GB, 500MB, "
        "2GiB",
        text);
  };
  if (!std::regex_match(text, m, kSize)) bad();
  std::string unit = m[3].str();
  for (char& ch : unit) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  if (unit.empty() && m[2].matched) bad();  // fractional bytes
  const std::map<std::string, double> scale = {
      {"", 1.0},       {"kb", 1e3},        {"mb", 1e6},          {"gb", 1e9},
      {"kib", 1024.0}, {"mib", 1048576.0}, {"gib", 1073741824.0}};
  const double bytes = std::stod(m[1].str()) * scale.at(unit);
  if (!(bytes >= 1) || bytes > 9e18) bad();
  return int64_t(bytes);
}

const std::vector<std::string>& hf_tokenizer_files() {
  static const std::vector<std::string> files = {"tokenizer.json",
                                                 "tokenizer_config.json",
                                                 "special_tokens_map.json",
                                                 "tokenizer.model",
                                                 "vocab.json",
                                                 "merges.txt",
                                                 "added_tokens.json",
                                                 "generation_config.json"};
  return files;
}

std::vector<std::pair<std::string, Tensor>> hf_tensors(const nn::Decoder& model, DType dtype) {
  const nn::DecoderConfig& c = model.config();
  const nn::LoraConfig& lora = model.lora();
  const nn::FamilyNames names = nn::family_names(c);
  std::map<std::string, const nn::Parameter*> adapters;  // LoRA parameters by name
  struct Adapted {
    const nn::Parameter *a, *b;
    nn::LinearShape shape;
  };
  std::map<std::string, Adapted> adapted;  // base weight name -> its adapter
  if (lora.enabled()) {
    for (const nn::Parameter* p : model.parameters()) adapters[p->name] = p;
    for (int layer = 0; layer < c.num_layers; ++layer)
      for (const nn::LinearShape& s : nn::block_linears(c)) {
        if (!lora.applies(layer, s.module)) continue;
        const std::string base = names.block_prefix(layer) + s.module;
        auto a = adapters.find(base + ".lora_A.weight"), b = adapters.find(base + ".lora_B.weight");
        FD_CHECK(a != adapters.end() && b != adapters.end(), "hf_tensors: {} has no adapter pair",
                 base);
        adapted[base + ".weight"] = {a->second, b->second, s};
      }
  }
  const double scaling = lora.enabled() ? double(lora.scaling()) : 0.0;
  std::vector<std::pair<std::string, Tensor>> out;
  for (const nn::Parameter* p : lora.enabled() ? model.frozen_parameters() : model.parameters()) {
    FD_CHECK(!p->value.is_cuda(), "hf_tensors: {} is not on the CPU", p->name);
    // A 4-bit base weight (QLoRA): the values the run computed with, dequantized.
    std::vector<float> v = model.quantized(*p) ? model.dequantized(*p) : p->value.to_vector();
    if (auto it = adapted.find(p->name); it != adapted.end()) {
      const Adapted& ad = it->second;
      merge_lora_into(v, ad.a->value.to_vector(), ad.b->value.to_vector(), lora.r, ad.shape.in,
                      ad.shape.out, scaling,
                      names.gpt2_blocks ? WeightLayout::kInOut : WeightLayout::kOutIn);
    }
    Tensor t = Tensor::from_vector(v, p->value.shape(), DType::kF32, MemCategory::kOther);
    out.emplace_back(p->name, dtype == DType::kF32 ? t : t.to(dtype, MemCategory::kOther));
  }
  return out;
}

nn::HfTokenIds export_token_ids(const nn::DecoderConfig& model, const std::string& init_from,
                                const std::string& tokenizer_dir) {
  std::error_code ec;
  if (!init_from.empty() && fs::is_directory(init_from, ec)) {
    try {
      return nn::read_hf_token_ids(init_from);
    } catch (const Error& e) {
      log::warn(
          "the run's model.init_from {} no longer has a readable config.json ({}); the "
          "exported config.json states bos_token_id and eos_token_id as null",
          init_from, e.what());
      return {"null", "null"};
    }
  }
  if (!tokenizer_dir.empty()) {
    // The ids generate and transformers stop at: the tokenizer's own bos_token / eos_token.
    try {
      const std::unique_ptr<text::Tokenizer> tok = text::load_tokenizer(tokenizer_dir);
      auto id = [](std::optional<int32_t> i) {
        return i ? std::to_string(*i) : std::string("null");
      };
      return {id(tok->bos_id()), id(tok->eos_id())};
    } catch (const Error& e) {
      log::warn(
          "the run's tokenizer {} can no longer be read ({}); the exported config.json states "
          "bos_token_id and eos_token_id as null",
          tokenizer_dir, e.what());
      return {"null", "null"};
    }
  }
  constexpr int64_t kGpt2Vocab = 50257, kGpt2EndOfText = 50256;
  if (model.family == nn::ModelFamily::kGpt2 && model.vocab_size == kGpt2Vocab) {
    const std::string id = std::to_string(kGpt2EndOfText);
    return {id, id};
  }
  return {"null", "null"};
}

void check_hf_export_dir(const std::string& dir, const HfExportOptions& options) {
  torch_dtype_name(options.dtype);
  if (options.max_shard_bytes <= 0)
    usage_error("--max-shard-size must be a positive number of bytes (or e.g. 5GB, 500MB), got {}",
                options.max_shard_bytes);
  const fs::path p = normal_dir(dir);
  std::error_code ec;
  if (!fs::exists(p, ec)) return;
  if (!fs::is_directory(p, ec))
    usage_error("--hf-dir {}: it exists and is not a directory; choose another --hf-dir", dir);
  if (fs::is_empty(p, ec)) return;
  if (!options.overwrite)
    usage_error(
        "--hf-dir {}: the directory already exists and is not empty; pass --overwrite to replace "
        "it (its whole contents), or choose another --hf-dir",
        dir);
  // --overwrite replaces a previous export, never a run or a checkpoint a user would lose.
  for (const char* marker : {"run.json", "summary.json", "config.yaml", "checkpoints",
                             "manifest.json", "latest"})
    if (fs::exists(p / marker, ec))
      usage_error(
          "--hf-dir {}: it holds a run or a checkpoint ({}), which --overwrite would delete; "
          "choose another --hf-dir",
          dir, marker);
  if (!fs::exists(p / "config.json", ec))
    usage_error(
        "--hf-dir {}: --overwrite replaces only a Hugging Face model directory (one with "
        "config.json), and this one has none; choose another --hf-dir",
        dir);
}

namespace {

// Stages `dir` (OUT.tmp-XXXXXX beside it), has `write_weights` write the weights into the
// staging directory, copies the tokenizer files, writes `config` as config.json last and renames
// the whole into place. Returns the tokenizer files copied.
std::vector<std::string> write_staged(
    const std::string& dir, const HfExportOptions& options, const std::string& config,
    const std::function<void(const std::string&)>& write_weights) {
  const fs::path final_dir = normal_dir(dir);
  std::error_code ec;
  if (!final_dir.parent_path().empty()) fs::create_directories(final_dir.parent_path(), ec);
  // Staged in a fresh OUT.tmp-XXXXXX (never a directory that was there before), removed again
  // if the export fails; only a crash leaves it behind (lib/base/atomic_file.h).
  StagingDir staging(final_dir);
  const fs::path& tmp = staging.path();
  write_weights(tmp.string());

  std::vector<std::string> copied;
  if (!options.tokenizer_from.empty() && fs::is_directory(options.tokenizer_from, ec)) {
    for (const std::string& f : hf_tokenizer_files()) {
      const fs::path src = fs::path(options.tokenizer_from) / f;
      if (!fs::is_regular_file(src, ec)) continue;
      fs::copy_file(src, tmp / f, fs::copy_options::overwrite_existing, ec);
      if (ec)
        runtime_error("cannot copy {} to {}: {}; check free space and permissions", src.string(),
                      tmp.string(), ec.message());
      copied.push_back(f);
    }
  }
  // config.json last: inside OUT.tmp, a directory with a config.json has all its weights.
  const std::string err =
      write_file_atomically(tmp / "config.json", config, tmp / "config.json.tmp");
  if (!err.empty()) runtime_error("{}; check free space and permissions", err);
  sync_directory(tmp);
  ckpt::replace_directory(tmp.string(), final_dir.string());
  staging.committed();
  return copied;
}

std::string model_config_json(const nn::Decoder& model, const HfExportOptions& options) {
  return options.token_ids
             ? nn::hf_config_json(model.config(), torch_dtype_name(options.dtype), *options.token_ids)
             : nn::hf_config_json(model.config(), torch_dtype_name(options.dtype));
}

}  // namespace

std::vector<std::string> write_hf_model(const nn::Decoder& model, const std::string& dir,
                                        const HfExportOptions& options) {
  check_hf_export_dir(dir, options);
  // Before anything is written: a model config.json cannot describe is refused here.
  const std::string config = model_config_json(model, options);
  return write_staged(dir, options, config, [&](const std::string& tmp) {
    std::map<std::string, std::string> meta = options.metadata;
    meta["format"] = "pt";  // what transformers writes and expects
    ckpt::write_hf_weights(tmp, hf_tensors(model, options.dtype), meta, options.max_shard_bytes);
  });
}

std::vector<std::string> write_bnb4bit_model(const nn::Decoder& model, const std::string& dir,
                                             const HfExportOptions& options,
                                             const Bnb4bitExportOptions& q) {
  check_hf_export_dir(dir, options);
  if (!model.quantization())
    usage_error("--hf-dir {}: the model has no 4-bit base (model.quantize) to write", dir);
  const quant::QuantOptions& o = *model.quantization();
  ckpt::BnbQuantizationConfig bnb = q.config;
  bnb.quant_type = std::string(quant::quant_type_name(o.type));
  bnb.double_quant = o.double_quant;
  const std::string config = ckpt::bnb4bit_config_json(model_config_json(model, options), bnb);

  // The base in the model's state-dict order: each quantized weight as stored, the rest in
  // options.dtype. The weights are converted here, before the staging directory exists.
  std::map<std::string, ckpt::Bnb4bitWeight> stored;
  std::vector<ckpt::Bnb4bitEntry> entries;
  const std::vector<const nn::Parameter*> base =
      model.lora().enabled() ? model.frozen_parameters() : model.parameters();
  for (const nn::Parameter* p : base) {
    FD_CHECK(!p->value.is_cuda(), "write_bnb4bit_model: {} is not on the CPU", p->name);
    if (const quant::QuantizedWeight* w = model.quantized(*p)) {
      auto it = q.blob_dtype.find(p->name);
      stored[p->name] = to_bnb4bit(w->to_quantized4bit(),
                                   it != q.blob_dtype.end() ? it->second : q.default_blob_dtype);
      entries.emplace_back(p->name, &stored.at(p->name));
    } else {
      Tensor t = Tensor::from_vector(p->value.to_vector(), p->value.shape(), DType::kF32,
                                     MemCategory::kOther);
      entries.emplace_back(
          p->name, options.dtype == DType::kF32 ? t : t.to(options.dtype, MemCategory::kOther));
    }
  }
  return write_staged(dir, options, config, [&](const std::string& tmp) {
    ckpt::write_bnb4bit_weights(tmp, entries, {{"format", "pt"}}, options.max_shard_bytes,
                                q.placement);
  });
}

}  // namespace fd::engine
