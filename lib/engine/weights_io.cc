#include "lib/engine/weights_io.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "lib/base/error.h"
#include "lib/base/input_file.h"
#include "lib/base/log.h"
#include "lib/ckpt/bnb4bit.h"
#include "lib/ckpt/hf_dir.h"
#include "lib/ckpt/peft.h"
#include "lib/ckpt/weights_file.h"
#include "lib/engine/quant_io.h"

namespace fd::engine {
namespace {

std::string shape_str(const std::vector<int64_t>& shape) {
  return Shape(std::span<const int64_t>(shape)).str();
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Whether `name` (without "transformer.") is a GPT-2 Conv1D weight of a block, (in, out).
bool is_gpt2_conv1d(const std::string& name) {
  if (name.rfind("h.", 0) != 0) return false;
  for (const char* suffix :
       {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"})
    if (ends_with(name, suffix)) return true;
  return false;
}

// A view of `t`'s elements as one row of `count` (t contiguous).
Tensor flat(const Tensor& t) { return t.reshape(Shape{t.numel()}); }

}  // namespace

// The reader behind a WeightsSource: a Hugging Face directory or a weights file.
struct WeightsSource::Impl {
  std::string where;  // the message prefix ("" or "recipe.yaml:3:14: model.init_from: ")
  std::vector<const nn::Parameter*> order;              // the parameters read, in canonical order
  std::map<std::string, const nn::Parameter*> targets;  // the same, by name
  // What the files must hold: the parameters' names and shapes (of `order`,
  // or of a model not built yet: check_weights_fit).
  std::vector<std::pair<std::string, Shape>> specs;  // in canonical order
  std::set<std::string> spec_names;                  // the same names, for lookup
  bool headers_only = false;                         // check names and shapes only; read no tensor
  std::optional<ckpt::HfWeights> dir;                // a Hugging Face directory
  std::optional<ckpt::Bnb4bitDir> bnb4bit;           // or a transformers 4-bit directory
  const ckpt::HfWeights* hf = nullptr;               // the weights of either
  std::map<std::string, std::string> stored;         // hf: our name -> the file's
  std::optional<quant::QuantOptions> stored_quantization;  // bnb4bit: what its weights share
  // bnb4bit: the quantized weight last decoded and its block absmax (a
  // parameter's shard is read in one piece or a few).
  mutable std::string decoded_name;
  mutable quant::Quantized4bit decoded;
  mutable std::vector<float> decoded_absmax;
  // bnb4bit: the GPT-2 Conv1D weights (our names), stored [out, in] (transformers transposes a
  // Conv1D before quantizing it) for parameters of shape (in, out); read() transposes them back,
  // from the last one dequantized whole.
  std::set<std::string> transposed;
  mutable std::vector<float> decoded_full;
  std::optional<ckpt::WeightsFile> file;
  bool untied = false;  // file: lm_head.weight is a parameter of the model
  // file: the tensor last read (a parameter's shard is read in one piece or a
  // few; whole tensors are what a WeightsFile reads).
  mutable std::string cached_name;
  mutable Tensor cached;
};

namespace {

// Whether `path` is a transformers 4-bit directory: its config.json has a
// quantization_config, or a tensor is a bitsandbytes quant_state (then
// Bnb4bitDir::open says what is wrong with the config). A config.json that
// cannot be read is not looked into here: a plain directory does not need one.
bool has_quantization_config(const std::string& path);

bool is_bnb4bit_dir(const std::string& path, const ckpt::HfWeights& w) {
  for (const std::string& name : w.names())
    if (name.find(".quant_state.") != std::string::npos) return true;
  return has_quantization_config(path);
}

// Whether `path`/config.json reads as a JSON object with a quantization_config.
bool has_quantization_config(const std::string& path) {
  const std::string cfg = (std::filesystem::path(path) / "config.json").string();
  std::error_code ec;
  if (!std::filesystem::is_regular_file(cfg, ec)) return false;
  std::string text;
  try {
    text = read_input_file(cfg, "the model's config.json");
  } catch (const Error&) {
    return false;
  }
  nlohmann::json j;
  return try_parse_json(text, j, 16).empty() && j.is_object() && j.contains("quantization_config");
}

// A 4-bit directory's quantized weights: one type, block size and double
// quantization (fdtrain's 4-bit base is one QuantOptions), and, unless only
// headers are checked, bitsandbytes' tables (to_quantized4bit refuses others).
// Errors without s.where (the caller adds it).
void check_bnb4bit_weights(WeightsSource::Impl& s, const std::string& path) {
  const ckpt::Bnb4bitDir& d = *s.bnb4bit;
  std::string first;
  for (const std::string& weight : d.quantized()) {
    const ckpt::Bnb4bitWeight& h = d.header(weight);
    quant::QuantOptions o;
    o.type = h.quant_type == "nf4" ? quant::QuantType::kNF4 : quant::QuantType::kFP4;
    o.block_size = h.block_size;
    o.double_quant = h.nested.has_value();
    if (!s.stored_quantization) {
      s.stored_quantization = o;
      first = weight;
      continue;
    }
    const quant::QuantOptions& f = *s.stored_quantization;
    if (o.type != f.type || o.block_size != f.block_size || o.double_quant != f.double_quant)
      usage_error(
          "{}: 4-bit weights '{}' ({}, blocks of {}, {} double quantization) and '{}' ({}, "
          "blocks of {}, {} double quantization) are stored differently; fdtrain's 4-bit base "
          "has one quant type, block size and double quantization: re-quantize the model with "
          "one BitsAndBytesConfig",
          path, first, quant::quant_type_name(f.type), f.block_size,
          f.double_quant ? "with" : "without", weight, quant::quant_type_name(o.type), o.block_size,
          o.double_quant ? "with" : "without");
  }
  if (s.headers_only) return;
  // The tables (16 and 256 floats per weight): a weight whose tables are not
  // bitsandbytes' is refused now, not when a rank reaches it.
  for (const std::string& weight : d.quantized()) {
    ckpt::Bnb4bitWeight h = d.header(weight);
    auto f32 = [&](const std::string& name, float* out, int64_t count) {
      Tensor t = Tensor::empty(Shape{count}, DType::kF32, MemCategory::kOther, Device::cpu());
      d.weights().read(name, t);
      std::copy_n(t.f32(), count, out);
    };
    f32(weight + ".quant_map", h.quant_map.data(), 16);
    if (h.nested) f32(weight + ".nested_quant_map", h.nested->map.data(), 256);
    // The sizes are the blob's: the maps are what is looked at here.
    const int64_t blocks = h.num_blocks();
    h.packed.resize(size_t((h.numel() + 1) / 2));
    if (h.nested) {
      h.absmax_codes.resize(size_t(blocks));
      h.nested->absmax.resize(size_t((blocks + 255) / 256));
    } else {
      h.absmax.resize(size_t(blocks));
    }
    to_quantized4bit(h, fmt::format("{}: 4-bit weight '{}'", path, weight));
  }
}

// A Hugging Face model directory's weights (lib/ckpt/hf_dir.h) against
// `model`'s parameters, by name: the family's Hugging Face names are the
// parameters' own (GPT-2's, also with the "transformer." prefix
// GPT2LMHeadModel writes). Tolerated extras: GPT-2's causal-mask buffers
// (attn.bias, attn.masked_bias) and an lm_head.weight beside a tied head (a
// note when it differs from the embedding, which the tied head uses).
void check_hf_dir(WeightsSource::Impl& s, const std::string& path) {
  const std::string& prefix = s.where;
  try {
    s.dir.emplace(ckpt::HfWeights::open(path));
    s.hf = &*s.dir;
    if (is_bnb4bit_dir(path, *s.dir)) {
      s.hf = nullptr;
      s.dir.reset();
      s.bnb4bit.emplace(ckpt::Bnb4bitDir::open(path));
      s.hf = &s.bnb4bit->weights();
      check_bnb4bit_weights(s, path);
    }
  } catch (const Error& e) {
    throw Error(e.kind(), prefix + e.what());
  }
  const ckpt::HfWeights& w = *s.hf;
  // A 4-bit directory's tensors: its plain ones and its quantized weights
  // (P.weight), not their companions.
  std::vector<std::string> names = w.names();
  if (s.bnb4bit) {
    names = s.bnb4bit->plain();
    for (const std::string& q : s.bnb4bit->quantized()) names.push_back(q);
  }
  auto quantized = [&](const std::string& file_name) {
    return s.bnb4bit && s.bnb4bit->is_quantized(file_name);
  };
  // The shape a tensor has in the files: a quantized weight's is its blob's.
  auto stored_shape = [&](const std::string& file_name) {
    if (quantized(file_name))
      return Shape(std::span<const int64_t>(s.bnb4bit->header(file_name).shape));
    return w.info(file_name).shape;
  };
  for (const std::string& name : names)
    s.stored[name.rfind("transformer.", 0) == 0 ? name.substr(12) : name] = name;
  for (const auto& [name, spec_shape] : s.specs) {
    Shape shape = spec_shape;
    auto it = s.stored.find(name);
    if (it == s.stored.end())
      usage_error(
          "{}{} has no tensor '{}' of shape {}, which the model of its config.json needs; is the "
          "directory complete (every shard of model.safetensors.index.json)?",
          prefix, path, name, shape.str());
    Shape have;
    try {
      have = stored_shape(it->second);
    } catch (const Error& e) {
      throw Error(e.kind(), prefix + e.what());
    }
    if (quantized(it->second) && is_gpt2_conv1d(name) && shape.ndim() == 2) {
      // A quantized Conv1D is [out, in] as transformers stores it (square ones too).
      shape = Shape{shape[1], shape[0]};
      s.transposed.insert(name);
    }
    if (have != shape) {
      if (quantized(it->second))
        usage_error(
            "{}{}: 4-bit weight '{}' has shape {} in its quant_state ({}.{}{}) but {} in the "
            "model of its config.json; the quant_state is not this weight's or the config.json "
            "is not this model's: re-save or re-download the directory",
            prefix, path, it->second, have.str(), it->second, ckpt::kBnbQuantStateKey,
            s.bnb4bit->header(it->second).quant_type, shape.str());
      usage_error(
          "{}{}: tensor '{}' has shape {} in the files but {} in the model of its "
          "config.json",
          prefix, path, it->second, have.str(), shape.str());
    }
  }
  bool extra_head = false;
  for (const auto& [name, file_name] : s.stored) {
    if (s.spec_names.count(name)) continue;
    if (ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias")) continue;
    if (name == "lm_head.weight") {
      extra_head = true;
      continue;
    }
    usage_error("{}{} holds {} '{}' {}, which the model of its config.json does not have", prefix,
                path, quantized(file_name) ? "4-bit weight" : "tensor", file_name,
                stored_shape(file_name).str());
  }
  if (!extra_head || s.headers_only) return;
  // lm_head.weight beside a tied head: the embedding is what the head uses.
  // Compared in the files, a block of rows at a time.
  std::string embed;
  for (const char* n : {"wte.weight", "model.embed_tokens.weight"})
    if (s.stored.count(n)) embed = s.stored.at(n);
  const std::string& head = s.stored.at("lm_head.weight");
  bool same = !embed.empty() && !quantized(head) && !quantized(embed) &&
              w.info(head).shape == w.info(embed).shape && w.info(head).shape.ndim() == 2;
  if (same) {
    const int64_t rows = w.info(head).shape[0], cols = w.info(head).shape[1];
    const int64_t block = std::max<int64_t>(1, (int64_t(1) << 22) / std::max<int64_t>(cols, 1));
    for (int64_t r = 0; r < rows && same; r += block) {
      const int64_t n = std::min(block, rows - r);
      Tensor x = Tensor::empty(Shape{n, cols}, DType::kF32, MemCategory::kOther, Device::cpu());
      Tensor y = Tensor::empty(Shape{n, cols}, DType::kF32, MemCategory::kOther, Device::cpu());
      w.read_rows(head, r, n, x);
      w.read_rows(embed, r, n, y);
      same = x.to_vector() == y.to_vector();
    }
  }
  if (!same)
    log::warn(
        "{}{}: lm_head.weight differs from the embedding; the model ties its head to the "
        "embedding (config.json tie_word_embeddings), so lm_head.weight is not used",
        prefix, path);
}

// An fdtrain export or a Hugging Face GPT-2 model.safetensors (WeightsFile)
// against `model`'s parameters.
void check_file(WeightsSource::Impl& s, const std::string& path) {
  const std::string& prefix = s.where;
  try {
    s.file.emplace(ckpt::WeightsFile::open(path));
  } catch (const Error& e) {
    throw Error(e.kind(), prefix + e.what());
  }
  const ckpt::WeightsFile& w = *s.file;
  std::map<std::string, std::vector<int64_t>> file_shapes = w.shapes();
  std::map<std::string, std::vector<int64_t>> model_shapes;
  for (const auto& [name, sh] : s.specs) {
    std::vector<int64_t> v;
    for (int i = 0; i < sh.ndim(); ++i) v.push_back(sh[i]);
    model_shapes[name] = v;
  }
  // An untied head (the Llama family) is a parameter like any other.
  s.untied = model_shapes.count("lm_head.weight") != 0;
  if (s.untied && w.lm_head()) file_shapes["lm_head.weight"] = w.lm_head()->shape;
  std::string hint =
      ckpt::dims_hint(ckpt::implied_dims(file_shapes), ckpt::implied_dims(model_shapes));
  // A file of the other family: say so rather than list its tensors one by one.
  const bool file_llama = file_shapes.count("model.embed_tokens.weight") != 0;
  const bool model_llama = model_shapes.count("model.embed_tokens.weight") != 0;
  if (file_llama != model_llama)
    hint = file_llama ? "; the file holds a Llama-family model (model.embed_tokens.weight): set "
                        "model.arch and its shape keys to match it, or start from a Hugging Face "
                        "directory (fdtrain ckpt export --hf-dir), whose config.json says them"
                      : "; the file holds a GPT-2 model (wte.weight): set model.arch gpt2 and its "
                        "shape keys to match it";

  for (const auto& spec : s.specs) {
    const std::string& name = spec.first;
    const std::vector<int64_t>& shape = model_shapes.at(name);
    auto it = file_shapes.find(name);
    if (it == file_shapes.end())
      usage_error("{}{} has no tensor '{}' of shape {}, which the model needs{}", prefix, path,
                  name, shape_str(shape), hint);
    if (it->second != shape)
      usage_error("{}{}: tensor '{}' has shape {} in the file but {} in the model{}", prefix, path,
                  name, shape_str(it->second), shape_str(shape), hint);
  }
  for (const auto& [name, shape] : file_shapes)
    if (!model_shapes.count(name))
      usage_error("{}{} holds tensor '{}' {}, which the model does not have{}", prefix, path,
                  w.stored_name(name), shape_str(shape),
                  hint.empty() ? "; is it a GPT-2 model?" : hint);
  if (w.lm_head() && !s.untied && !s.headers_only) {
    bool tied = false;
    if (file_shapes.count("wte.weight") && w.lm_head()->shape == file_shapes.at("wte.weight"))
      tied = w.load_lm_head().to_vector() == w.load("wte.weight").to_vector();
    if (!tied)
      log::warn(
          "{}{}: lm_head.weight differs from wte.weight; fdtrain ties the head to wte, so "
          "lm_head.weight is ignored",
          prefix, path);
  }
}

// The quantized weight of parameter `name` as stored (errors without s.where).
quant::Quantized4bit read_stored_4bit(const WeightsSource::Impl& s, const std::string& name) {
  const std::string& file_name = s.stored.at(name);
  return to_quantized4bit(s.bnb4bit->read(file_name),
                          fmt::format("{}: 4-bit weight '{}'", s.bnb4bit->dir(), file_name));
}

// Opens `path` (a directory or a file) into `s` and checks it against s.specs.
void check_source(WeightsSource::Impl& s, const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    check_hf_dir(s, path);
  } else {
    check_file(s, path);
  }
}

// The parameters a weights file fills: a LoRA model's frozen base, else every parameter.
std::vector<const nn::Parameter*> file_targets(const nn::Module& model) {
  std::vector<const nn::Parameter*> targets = model.frozen_parameters();
  return targets.empty() ? model.parameters() : targets;
}

}  // namespace

WeightsSource::WeightsSource(const std::string& path, const nn::Module& model,
                             const std::string& where)
    : impl_(std::make_unique<Impl>()) {
  impl_->where = where.empty() ? "" : where + ": ";
  impl_->order = file_targets(model);
  for (const nn::Parameter* p : impl_->order) {
    impl_->targets[p->name] = p;
    impl_->specs.emplace_back(p->name, p->global_shape());  // a tp slice's whole tensor
    impl_->spec_names.insert(p->name);
  }
  check_source(*impl_, path);
}

bool is_bnb4bit_directory(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return false;
  if (has_quantization_config(path)) return true;
  try {
    return is_bnb4bit_dir(path, ckpt::HfWeights::open(path));
  } catch (const Error&) {
    return false;
  }
}

void check_weights_fit(const std::string& file, const nn::DecoderConfig& config,
                       const std::string& where) {
  WeightsSource::Impl s;
  s.where = where.empty() ? "" : where + ": ";
  s.headers_only = true;
  // The base model's parameters, as build_model would make them (nothing allocated).
  for (const nn::SegmentSpec& seg : nn::Decoder::segment_specs(config))
    for (const nn::ParamSpec& p : seg.params) {
      s.specs.emplace_back(p.name, p.shape);
      s.spec_names.insert(p.name);
    }
  check_source(s, file);
}

WeightsSource::~WeightsSource() = default;

bool WeightsSource::fills(const nn::Parameter& p) const {
  // By name: nn::global_fill asks for a tensor-parallel slice's whole tensor through a
  // stand-in of the same name.
  return impl_->targets.count(p.name) != 0;
}

void WeightsSource::read(const nn::Parameter& p, int64_t begin, int64_t count,
                         const Tensor& out) const {
  FD_CHECK(fills(p), "{} is not read from the weights source", p.name);
  FD_CHECK(begin >= 0 && count >= 0 && begin + count <= p.value.numel() && out.numel() == count,
           "read of {}: elements [{}, {}) into {}", p.name, begin, begin + count, out.numel());
  try {
    if (impl_->bnb4bit && impl_->bnb4bit->is_quantized(impl_->stored.at(p.name))) {
      const bool transposed = impl_->transposed.count(p.name) != 0;
      if (impl_->decoded_name != p.name) {
        impl_->decoded_name.clear();
        impl_->decoded = read_stored_4bit(*impl_, p.name);
        impl_->decoded_absmax = quant::block_absmax(impl_->decoded);
        impl_->decoded_full.clear();
        if (transposed) impl_->decoded_full = quant::dequantize(impl_->decoded);
        impl_->decoded_name = p.name;
      }
      if (transposed) {  // p is (in, out); the stored weight [out, in]
        const int64_t in = p.value.shape()[0], out_features = p.value.shape()[1];
        std::vector<float> v(static_cast<size_t>(count));
        for (int64_t k = 0; k < count; ++k) {
          const int64_t e = begin + k, i = e / out_features, o = e % out_features;
          v[size_t(k)] = impl_->decoded_full[size_t(o * in + i)];
        }
        flat(out).copy_from(Tensor::from_vector(v, Shape{count}, DType::kF32, MemCategory::kOther));
        return;
      }
      // Dequantized in pieces of 16384 values (64 KiB of fp32: no copy of the whole range),
      // each converted into its part of `out`.
      const int64_t piece = std::min<int64_t>(count, int64_t(1) << 14);
      Tensor values = Tensor::empty(Shape{piece}, DType::kF32, MemCategory::kOther, Device::cpu());
      for (int64_t done = 0; done < count; done += piece) {
        const int64_t n = std::min(piece, count - done);
        quant::dequantize_range(impl_->decoded, impl_->decoded_absmax, begin + done, n,
                                values.f32());
        flat(out).flat_slice(done, n).copy_from(values.flat_slice(0, n));
      }
      return;
    }
    if (impl_->hf) {
      impl_->hf->read_range(impl_->stored.at(p.name), begin, count, flat(out));
      return;
    }
    if (impl_->cached_name != p.name) {
      impl_->cached = Tensor();  // drop the previous tensor before reading the next
      const ckpt::WeightsFile& w = *impl_->file;
      impl_->cached =
          impl_->untied && p.name == "lm_head.weight" ? w.load_lm_head() : w.load(p.name);
      impl_->cached_name = p.name;
    }
    flat(out).copy_from(flat(impl_->cached).flat_slice(begin, count));
  } catch (const Error& e) {
    throw Error(e.kind(), impl_->where + e.what());
  }
}

std::optional<quant::QuantOptions> WeightsSource::stored_quantization() const {
  return impl_->stored_quantization;
}

bool WeightsSource::stores_quantized(const nn::Parameter& p) const {
  return fills(p) && impl_->bnb4bit && impl_->bnb4bit->is_quantized(impl_->stored.at(p.name));
}

quant::Quantized4bit WeightsSource::read_quantized(const nn::Parameter& p) const {
  FD_CHECK(stores_quantized(p), "{} is not a 4-bit weight of the weights source", p.name);
  if (impl_->decoded_name == p.name) return impl_->decoded;
  try {
    return read_stored_4bit(*impl_, p.name);
  } catch (const Error& e) {
    throw Error(e.kind(), impl_->where + e.what());
  }
}

namespace {

// The weights `source` stores in 4 bits (a transformers 4-bit directory), as stored: for
// Decoder::storage_fill, which quantizes only what this does not give. `source` must outlive it.
// Throws fd::Error kUsage, prefixed with `where`, when a 4-bit base of `model` would be taken
// from a directory stored with other settings (its weights are used as stored, never
// re-quantized).
nn::Decoder::QuantizedSource stored_4bit(std::shared_ptr<const WeightsSource> source,
                                         const nn::Decoder& model, const std::string& where) {
  const std::optional<quant::QuantOptions> dir = source->stored_quantization();
  if (!dir || !model.quantization()) return {};
  const quant::QuantOptions& want = *model.quantization();
  if (dir->type != want.type || dir->block_size != want.block_size ||
      dir->double_quant != want.double_quant)
    usage_error(
        "{}the 4-bit directory stores its weights as {{type: {}, block_size: {}, double_quant: "
        "{}}} but model.quantize is {{type: {}, block_size: {}, double_quant: {}}}; a 4-bit "
        "directory is used as stored, never re-quantized: set model.quantize to the "
        "directory's settings",
        where.empty() ? "" : where + ": ", quant::quant_type_name(dir->type), dir->block_size,
        dir->double_quant, quant::quant_type_name(want.type), want.block_size, want.double_quant);
  return [source](const nn::Parameter& p) -> std::optional<quant::Quantized4bit> {
    if (!source->stores_quantized(p)) return std::nullopt;
    return source->read_quantized(p);
  };
}

}  // namespace

void load_weights(const std::string& file, const nn::Module& model, const std::string& where,
                  DType held) {
  auto shared = std::make_shared<const WeightsSource>(file, model, where);
  const WeightsSource& source = *shared;
  // Reads a range of p into `out`, through `held` when out is wider.
  auto read = [&source, held](const nn::Parameter& p, int64_t begin, int64_t count,
                              const Tensor& out) {
    if (held == DType::kF32 || out.dtype() == held) return source.read(p, begin, count, out);
    Tensor narrow = Tensor::empty(Shape{count}, held, MemCategory::kOther, Device::cpu());
    source.read(p, begin, count, narrow);
    out.copy_from(narrow);
  };
  if (const auto* d = dynamic_cast<const nn::Decoder*>(&model); d && d->quantization()) {
    // A 4-bit base: its segments are written in their stored form, through the decoder; a 4-bit
    // directory's weights as stored, anything else quantized.
    const nn::ParamFill fill = d->storage_fill(read, stored_4bit(shared, *d, where));
    for (const nn::FlatParamGroup* g : d->frozen_groups())
      for (const nn::Parameter& p : g->params())
        fill(p, 0, p.value.numel(), p.value.flat_slice(0, p.value.numel()));
    return;
  }
  for (const nn::Parameter* p : file_targets(model)) {
    if (held == DType::kF32 || p->value.dtype() == held) {
      source.read(*p, 0, p->value.numel(), p->value);
    } else {
      const int64_t n = p->value.numel();
      read(*p, 0, n, p->value.flat_slice(0, n));
    }
  }
}

namespace {

// The adapters of the PEFT directory `dir` by parameter name, checked against
// `model`'s: the same r, modules and layers, every adapter parameter with its shape.
std::map<std::string, Tensor> peft_adapter(const std::string& dir, const nn::Decoder& model,
                                           const std::vector<std::string>& recipe_targets,
                                           const std::string& where) {
  const nn::LoraConfig& lora = model.lora();
  ckpt::PeftAdapter a;
  try {
    a = ckpt::read_peft_adapter(dir);
  } catch (const Error& e) {
    throw Error(e.kind(), where + ": " + e.what());
  }
  std::vector<std::string> theirs = nn::lora_modules_for_targets(model.config(), a.spec.targets),
                           ours = lora.modules;
  std::sort(theirs.begin(), theirs.end());
  std::sort(ours.begin(), ours.end());
  if (a.spec.r != lora.r || theirs != ours || a.spec.layers != lora.layers) {
    usage_error(
        "{}: the adapter in {} has r = {}, targets [{}], layers [{}]; the recipe asks for "
        "r = {}, targets [{}], layers [{}]; make lora match the adapter",
        where, dir, a.spec.r, fmt::join(a.spec.targets, ", "), fmt::join(a.spec.layers, ", "),
        lora.r, fmt::join(recipe_targets, ", "), fmt::join(lora.layers, ", "));
  }
  std::map<std::string, Tensor> out;
  for (auto& [name, t] : a.tensors) out[name] = std::move(t);
  for (const nn::Parameter* p : model.parameters()) {
    auto it = out.find(p->name);
    if (it == out.end()) usage_error("{}: the adapter in {} has no {}", where, dir, p->name);
    if (it->second.shape() != p->global_shape())
      usage_error("{}: {} in {} has shape {}, the model needs {}", where, p->name, dir,
                  it->second.shape().str(), p->global_shape().str());
  }
  return out;
}

}  // namespace

nn::ParamFill initial_weights(const nn::Decoder& model, const InitialWeights& w) {
  FD_CHECK(w.adapter.empty() || model.lora().enabled(), "lora.adapter without adapters");
  std::shared_ptr<const WeightsSource> base;
  if (!w.init_from.empty())
    base = std::make_shared<const WeightsSource>(w.init_from, model, w.init_from_where);
  auto adapters = std::make_shared<const std::map<std::string, Tensor>>(
      w.adapter.empty() ? std::map<std::string, Tensor>{}
                        : peft_adapter(w.adapter, model, w.adapter_targets, w.adapter_where));
  const uint64_t seed = w.seed;
  // By parameter as the model names them; a 4-bit base's segments are encoded from these.
  // A tensor-parallel rank's slices read the whole tensors' elements (nn::global_fill).
  return model.storage_fill(
      nn::global_fill([&model, base, adapters, seed](const nn::Parameter& p, int64_t begin,
                                                     int64_t count, const Tensor& out) {
        if (base && base->fills(p)) {
          base->read(p, begin, count, out);
        } else if (auto it = adapters->find(p.name); it != adapters->end()) {
          out.copy_from(flat(it->second).flat_slice(begin, count));
        } else {
          model.init_values(seed, p, begin, count, out);
        }
      }),
      base ? stored_4bit(base, model, w.init_from_where) : nn::Decoder::QuantizedSource());
}

}  // namespace fd::engine
