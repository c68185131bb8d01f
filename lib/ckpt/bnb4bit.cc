#include "lib/ckpt/bnb4bit.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <set>

#include "lib/base/error.h"
#include "lib/base/input_file.h"

namespace fd::ckpt {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kFix =
    "the directory is corrupt or was not saved by transformers: re-save or re-download it";

// The dtypes a quantized weight may have had (QuantState's "dtype"), and compute dtypes.
bool known_float_dtype(const std::string& d) {
  return d == "float32" || d == "bfloat16" || d == "float16";
}

bool known_quant_type(const std::string& t) { return t == "nf4" || t == "fp4"; }

bool supported_block_size(int64_t b) {
  return std::find(kBnbBlockSizes.begin(), kBnbBlockSizes.end(), b) != kBnbBlockSizes.end();
}

std::string shape_str(const std::vector<int64_t>& d) {
  return fmt::format("[{}]", fmt::join(d, ", "));
}

// Elements of `shape`, refusing a shape no weight has (a hostile blob must not overflow).
int64_t checked_numel(const std::vector<int64_t>& shape, const std::string& where) {
  if (shape.empty() || shape.size() > size_t(Shape::kMaxDims))
    usage_error("{}: shape {} has {} dimensions; a quantized weight has 1 to {}; {}", where,
                shape_str(shape), shape.size(), Shape::kMaxDims, kFix);
  constexpr int64_t kMaxNumel = int64_t(1) << 48;
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || d > kMaxNumel)
      usage_error("{}: shape {} has dimension {}; {}", where, shape_str(shape), d, kFix);
    if (d != 0 && n > kMaxNumel / d)
      usage_error("{}: shape {} has more than 2^48 elements; {}", where, shape_str(shape), kFix);
    n *= d;
  }
  return n;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

// ---- quantization_config ----

BnbQuantizationConfig parse_bnb_quantization_config(const json& j, const std::string& where) {
  if (!j.is_object()) usage_error("{}: quantization_config is not a JSON object; {}", where, kFix);
  static const std::set<std::string> kKeys = {"quant_method",
                                              "_load_in_4bit",
                                              "_load_in_8bit",
                                              "load_in_4bit",
                                              "load_in_8bit",
                                              "llm_int8_threshold",
                                              "llm_int8_skip_modules",
                                              "llm_int8_enable_fp32_cpu_offload",
                                              "llm_int8_has_fp16_weight",
                                              "bnb_4bit_quant_type",
                                              "bnb_4bit_use_double_quant",
                                              "bnb_4bit_compute_dtype",
                                              "bnb_4bit_quant_storage"};
  for (const auto& [key, value] : j.items())
    if (!kKeys.count(key))
      usage_error(
          "{}: quantization_config has key \"{}\", which transformers' BitsAndBytesConfig does "
          "not write ({}); fdtrain does not guess what it changes: remove it if it changes "
          "nothing",
          where, key, fmt::join(kKeys, ", "));
  auto bad = [&](const std::string& key, const std::string& want) {
    usage_error("{}: quantization_config.{} = {}: expected {}", where, key, j[key].dump(), want);
  };
  auto boolean = [&](const std::string& key, bool dflt) {
    if (!j.contains(key)) return dflt;
    if (!j[key].is_boolean()) bad(key, "true or false");
    return j[key].get<bool>();
  };
  auto string = [&](const std::string& key, const std::string& dflt) {
    if (!j.contains(key)) return dflt;
    if (!j[key].is_string()) bad(key, "a string");
    return j[key].get<std::string>();
  };

  if (j.contains("quant_method") && string("quant_method", "") != "bitsandbytes")
    usage_error(
        "{}: quantization_config.quant_method is {}: fdtrain reads bitsandbytes 4-bit "
        "directories only; give a bf16/fp32 model or one saved with load_in_4bit",
        where, j["quant_method"].dump());
  // transformers writes both the property (load_in_4bit) and its field (_load_in_4bit).
  auto flag = [&](const char* key, const char* field) {
    const bool a = boolean(key, false), b = boolean(field, a);
    if (j.contains(key) && j.contains(field) && a != b)
      usage_error("{}: quantization_config.{} is {} but {} is {}; {}", where, key, a, field, b,
                  kFix);
    return a || b;
  };
  const bool in_4bit = flag("load_in_4bit", "_load_in_4bit");
  const bool in_8bit = flag("load_in_8bit", "_load_in_8bit");
  if (in_8bit)
    usage_error(
        "{}: quantization_config says load_in_8bit (LLM.int8()); fdtrain reads 4-bit "
        "(load_in_4bit) directories only: save the model with load_in_4bit or in bf16",
        where);
  if (!in_4bit)
    usage_error(
        "{}: quantization_config does not say load_in_4bit: true; fdtrain reads bitsandbytes "
        "4-bit directories only",
        where);

  BnbQuantizationConfig c;
  c.quant_type = string("bnb_4bit_quant_type", c.quant_type);
  if (!known_quant_type(c.quant_type))
    usage_error(
        "{}: quantization_config.bnb_4bit_quant_type is \"{}\"; bitsandbytes' 4-bit types are "
        "nf4 and fp4",
        where, c.quant_type);
  c.double_quant = boolean("bnb_4bit_use_double_quant", c.double_quant);
  c.compute_dtype = string("bnb_4bit_compute_dtype", c.compute_dtype);
  if (!known_float_dtype(c.compute_dtype))
    bad("bnb_4bit_compute_dtype", "\"float32\", \"bfloat16\" or \"float16\"");
  c.quant_storage = string("bnb_4bit_quant_storage", c.quant_storage);
  if (c.quant_storage != "uint8")
    usage_error(
        "{}: quantization_config.bnb_4bit_quant_storage is \"{}\"; fdtrain reads 4-bit weights "
        "packed in uint8 (transformers' default) only: save the model with the default storage",
        where, c.quant_storage);
  if (j.contains("llm_int8_threshold")) {
    const json& t = j["llm_int8_threshold"];
    if (!t.is_number() || !std::isfinite(t.get<double>()))
      bad("llm_int8_threshold", "a finite number");
    c.llm_int8_threshold = t.get<double>();
  }
  if (j.contains("llm_int8_skip_modules") && !j["llm_int8_skip_modules"].is_null()) {
    const json& s = j["llm_int8_skip_modules"];
    if (!s.is_array()) bad("llm_int8_skip_modules", "null or a list of module names");
    c.llm_int8_skip_modules.emplace();
    for (const json& m : s) {
      if (!m.is_string()) bad("llm_int8_skip_modules", "null or a list of module names");
      c.llm_int8_skip_modules->push_back(m.get<std::string>());
    }
  }
  c.llm_int8_enable_fp32_cpu_offload =
      boolean("llm_int8_enable_fp32_cpu_offload", c.llm_int8_enable_fp32_cpu_offload);
  c.llm_int8_has_fp16_weight = boolean("llm_int8_has_fp16_weight", c.llm_int8_has_fp16_weight);
  return c;
}

json bnb_quantization_config_json(const BnbQuantizationConfig& c) {
  json j;  // std::map: keys sorted, as config.json's sort_keys=True
  j["quant_method"] = "bitsandbytes";
  j["_load_in_4bit"] = true;
  j["_load_in_8bit"] = false;
  j["load_in_4bit"] = true;
  j["load_in_8bit"] = false;
  j["llm_int8_threshold"] = c.llm_int8_threshold;
  j["llm_int8_skip_modules"] =
      c.llm_int8_skip_modules ? json(*c.llm_int8_skip_modules) : json(nullptr);
  j["llm_int8_enable_fp32_cpu_offload"] = c.llm_int8_enable_fp32_cpu_offload;
  j["llm_int8_has_fp16_weight"] = c.llm_int8_has_fp16_weight;
  j["bnb_4bit_quant_type"] = c.quant_type;
  j["bnb_4bit_use_double_quant"] = c.double_quant;
  j["bnb_4bit_compute_dtype"] = c.compute_dtype;
  j["bnb_4bit_quant_storage"] = c.quant_storage;
  return j;
}

std::string bnb4bit_config_json(std::string_view model_config, const BnbQuantizationConfig& c) {
  json j = parse_json_input(model_config, "the model's config.json", 16);
  if (!j.is_object()) usage_error("the model's config.json is not a JSON object");
  if (j.contains("quantization_config"))
    usage_error("the model's config.json already has a quantization_config; give it without one");
  parse_bnb_quantization_config(bnb_quantization_config_json(c),
                                "the quantization_config to write");
  j["quantization_config"] = bnb_quantization_config_json(c);
  return j.dump(2) + "\n";  // transformers: json.dumps(indent=2, sort_keys=True) + "\n"
}

// ---- one quantized weight ----

int64_t Bnb4bitWeight::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string python_float_repr(double v) {
  if (!std::isfinite(v)) usage_error("cannot write {} as a JSON number", v);
  if (v == 0.0) return std::signbit(v) ? "-0.0" : "0.0";
  // The shortest digits that read back as v (what Python's repr takes), in scientific form.
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string s(buf, r.ptr);
  std::string sign;
  if (s[0] == '-') {
    sign = "-";
    s.erase(0, 1);
  }
  const size_t e = s.find('e');
  std::string digits = s.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp10 = std::stoi(s.substr(e + 1));
  const int decpt = exp10 + 1;  // v = 0.DIGITS x 10^decpt
  const int nd = int(digits.size());
  // float_repr_style 'short', format code 'r': exponent form when decpt <= -4 or > 16.
  if (decpt <= -4 || decpt > 16) {
    std::string m = digits.substr(0, 1);
    if (nd > 1) m += "." + digits.substr(1);
    return sign + m + fmt::format("e{}{:02d}", exp10 < 0 ? '-' : '+', std::abs(exp10));
  }
  if (decpt <= 0) return sign + "0." + std::string(size_t(-decpt), '0') + digits;
  if (decpt >= nd) return sign + digits + std::string(size_t(decpt - nd), '0') + ".0";
  return sign + digits.substr(0, size_t(decpt)) + "." + digits.substr(size_t(decpt));
}

std::string bnb4bit_quant_state_json(const Bnb4bitWeight& w) {
  check_bnb4bit_weight(w, "the quantized weight to write");
  // QuantState.as_dict(packed=True): the non-tensor items in as_dict's order, through
  // json.dumps (separators ", " and ": "; the shape tuple as a list; .item()'s double).
  std::string s =
      fmt::format(R"({{"quant_type": "{}", "blocksize": {}, "dtype": "{}", "shape": [{}])",
                  w.quant_type, w.block_size, w.dtype, fmt::join(w.shape, ", "));
  if (w.nested)
    s += fmt::format(R"(, "nested_blocksize": {}, "nested_dtype": "{}", "nested_offset": {})",
                     w.nested->block_size, w.nested->dtype,
                     python_float_repr(double(w.nested->offset)));
  return s + "}";
}

void check_bnb4bit_weight(const Bnb4bitWeight& w, const std::string& where) {
  if (!known_quant_type(w.quant_type))
    usage_error("{}: quant type \"{}\"; bitsandbytes' 4-bit types are nf4 and fp4", where,
                w.quant_type);
  if (!supported_block_size(w.block_size))
    usage_error("{}: block size {}; bitsandbytes supports {}", where, w.block_size,
                fmt::join(kBnbBlockSizes, ", "));
  if (!known_float_dtype(w.dtype))
    usage_error("{}: dtype \"{}\"; expected float32, bfloat16 or float16", where, w.dtype);
  const int64_t n = checked_numel(w.shape, where);
  const int64_t blocks = ceil_div(n, w.block_size);
  auto count = [&](const char* what, size_t have, int64_t want) {
    if (int64_t(have) != want)
      usage_error("{}: {} holds {} values; shape {} in blocks of {} needs {}", where, what, have,
                  shape_str(w.shape), w.block_size, want);
  };
  count("the packed weight", w.packed.size(), (n + 1) / 2);
  if (w.nested) {
    count("absmax (8-bit codes)", w.absmax_codes.size(), blocks);
    count("absmax (fp32, with double quantization none)", w.absmax.size(), 0);
    if (w.nested->block_size != kBnbNestedBlockSize || w.nested->dtype != "float32")
      usage_error("{}: nested block size {} of {}; bitsandbytes writes 256 of float32", where,
                  w.nested->block_size, w.nested->dtype);
    count("nested_absmax", w.nested->absmax.size(), ceil_div(blocks, kBnbNestedBlockSize));
    if (!std::isfinite(w.nested->offset))
      usage_error("{}: nested_offset is {}; it must be finite", where, w.nested->offset);
  } else {
    count("absmax", w.absmax.size(), blocks);
    count("absmax (8-bit codes, without double quantization none)", w.absmax_codes.size(), 0);
  }
}

// ---- reading a directory ----

namespace {

// The blob's fields into a Bnb4bitWeight (no data); `type` is the one its tensor name says.
Bnb4bitWeight parse_quant_state(const std::vector<uint8_t>& bytes, const std::string& type,
                                const std::string& where) {
  const std::string text(bytes.begin(), bytes.end());
  const json j = parse_json_input(text, where, /*max_depth=*/4);
  if (!j.is_object()) usage_error("{}: not a JSON object; {}", where, kFix);
  static const std::set<std::string> kKeys = {"quant_type",   "blocksize",        "dtype",
                                              "shape",        "nested_blocksize", "nested_dtype",
                                              "nested_offset"};
  for (const auto& [key, value] : j.items())
    if (!kKeys.count(key))
      usage_error("{}: unknown key \"{}\" (bitsandbytes writes {}); {}", where, key,
                  fmt::join(kKeys, ", "), kFix);
  auto need = [&](const char* key) -> const json& {
    if (!j.contains(key)) usage_error("{}: no \"{}\"; {}", where, key, kFix);
    return j[key];
  };
  auto integer = [&](const json& v, const char* key) {
    if (!v.is_number_integer())
      usage_error("{}: \"{}\" is {}, not an integer; {}", where, key, v.dump(), kFix);
    return v.get<int64_t>();
  };
  auto string = [&](const json& v, const char* key) {
    if (!v.is_string())
      usage_error("{}: \"{}\" is {}, not a string; {}", where, key, v.dump(), kFix);
    return v.get<std::string>();
  };

  Bnb4bitWeight w;
  w.quant_type = string(need("quant_type"), "quant_type");
  if (!known_quant_type(w.quant_type))
    usage_error(
        "{}: unknown quant type \"{}\"; bitsandbytes' 4-bit types are nf4 and fp4: the file was "
        "written by another tool or a newer bitsandbytes",
        where, w.quant_type);
  if (w.quant_type != type)
    usage_error("{}: says quant_type \"{}\" but its tensor name says {}; {}", where, w.quant_type,
                type, kFix);
  w.block_size = integer(need("blocksize"), "blocksize");
  if (!supported_block_size(w.block_size))
    usage_error("{}: blocksize {}; bitsandbytes' 4-bit block sizes are {}; {}", where, w.block_size,
                fmt::join(kBnbBlockSizes, ", "), kFix);
  w.dtype = string(need("dtype"), "dtype");
  if (!known_float_dtype(w.dtype))
    usage_error("{}: dtype \"{}\"; expected float32, bfloat16 or float16", where, w.dtype);
  const json& shape = need("shape");
  if (!shape.is_array())
    usage_error("{}: \"shape\" is {}, not a list; {}", where, shape.dump(), kFix);
  for (const json& d : shape) {
    if (!d.is_number_integer())
      usage_error("{}: \"shape\" {} holds a non-integer; {}", where, shape.dump(), kFix);
    w.shape.push_back(d.get<int64_t>());
  }
  checked_numel(w.shape, where);

  const int nested_keys = int(j.contains("nested_blocksize")) + int(j.contains("nested_dtype")) +
                          int(j.contains("nested_offset"));
  if (nested_keys != 0 && nested_keys != 3)
    usage_error(
        "{}: has only some of nested_blocksize, nested_dtype, nested_offset (double "
        "quantization needs all three); {}",
        where, kFix);
  if (nested_keys == 3) {
    Bnb4bitNested n;
    n.block_size = integer(j["nested_blocksize"], "nested_blocksize");
    if (n.block_size != kBnbNestedBlockSize)
      usage_error("{}: nested_blocksize {}; bitsandbytes' double quantization uses {}; {}", where,
                  n.block_size, kBnbNestedBlockSize, kFix);
    n.dtype = string(j["nested_dtype"], "nested_dtype");
    if (n.dtype != "float32")
      usage_error("{}: nested_dtype \"{}\"; bitsandbytes' nested absmax is float32; {}", where,
                  n.dtype, kFix);
    const json& off = j["nested_offset"];
    if (!off.is_number())
      usage_error("{}: nested_offset is {}, not a number; {}", where, off.dump(), kFix);
    const double d = off.get<double>();
    // .item() of a float32 tensor: a float32 value, written exactly. Anything else would not
    // be written back as it was read.
    if (!std::isfinite(d) || double(float(d)) != d)
      usage_error(
          "{}: nested_offset {} is not a finite float32 value (bitsandbytes writes a "
          "float32 mean); {}",
          where, off.dump(), kFix);
    n.offset = float(d);
    w.nested = std::move(n);
  }
  return w;
}

}  // namespace

Bnb4bitDir Bnb4bitDir::open(const std::string& dir) {
  Bnb4bitDir d(HfWeights::open(dir));
  const std::string cfg_path = (fs::path(dir) / "config.json").string();
  std::error_code ec;
  if (!fs::exists(cfg_path, ec))
    usage_error(
        "{}: no config.json; a transformers 4-bit directory has one (with its "
        "quantization_config): copy it from where the model came from",
        dir);
  json cfg = read_json_file(cfg_path, "the model's config.json", kMaxConfigFileBytes, 16);
  if (!cfg.is_object()) usage_error("{}: not a JSON object; is it a config.json?", cfg_path);

  // The quantized weights: P.weight.quant_state.bitsandbytes__TYPE.
  const std::string kQs = std::string(".") + kBnbQuantStateKey;
  std::map<std::string, std::pair<std::string, std::string>> blob;  // weight -> (tensor, type)
  for (const std::string& name : d.weights_.names()) {
    const size_t at = name.rfind(".quant_state.");
    if (at == std::string::npos) continue;
    const std::string weight = name.substr(0, at);
    if (name.compare(at, kQs.size(), kQs) != 0)
      usage_error(
          "{}: tensor \"{}\" is a quant_state that is not bitsandbytes' (expected "
          "{}.{}nf4 or fp4); fdtrain reads bitsandbytes 4-bit directories only",
          dir, name, weight, kBnbQuantStateKey);
    const std::string type = name.substr(at + kQs.size());
    if (!known_quant_type(type))
      usage_error(
          "{}: tensor \"{}\": unknown quant type \"{}\"; bitsandbytes' 4-bit types are nf4 and "
          "fp4: the file was written by another tool or a newer bitsandbytes",
          dir, name, type);
    if (blob.count(weight))
      usage_error("{}: weight \"{}\" has two quant_state tensors ({} and {}); {}", dir, weight,
                  blob[weight].first, name, kFix);
    blob[weight] = {name, type};
  }

  auto qc = cfg.find("quantization_config");
  if (qc == cfg.end()) {
    if (!blob.empty())
      usage_error(
          "{}: has no quantization_config, but the weights hold {} bitsandbytes 4-bit weights "
          "(e.g. \"{}\"): the config.json does not belong to these weights; restore the one "
          "saved with them",
          cfg_path, blob.size(), blob.begin()->first);
    usage_error(
        "{}: not a 4-bit directory (config.json has no quantization_config and no tensor is "
        "quantized); read it as a plain Hugging Face directory",
        dir);
  }
  d.config_ = parse_bnb_quantization_config(*qc, cfg_path);
  if (blob.empty())
    usage_error(
        "{}: quantization_config says bitsandbytes 4-bit, but no tensor of the weights is "
        "quantized (none named P.weight.{}nf4/fp4): the config.json does not belong to these "
        "weights; restore the one saved with them",
        cfg_path, kBnbQuantStateKey);
  cfg.erase("quantization_config");
  d.model_config_ = cfg.dump(2) + "\n";

  // Companions without their weight's quant_state.
  static const char* kCompanions[] = {".absmax", ".quant_map", ".nested_absmax",
                                      ".nested_quant_map"};
  for (const std::string& name : d.weights_.names())
    for (const char* suffix : kCompanions) {
      const size_t n = std::strlen(suffix);
      if (name.size() <= n || name.compare(name.size() - n, n, suffix) != 0) continue;
      const std::string weight = name.substr(0, name.size() - n);
      if (d.weights_.contains(weight) && !blob.count(weight))
        usage_error(
            "{}: tensor \"{}\" belongs to a 4-bit weight \"{}\" that has no "
            "{}.{}nf4/fp4 tensor: the quant_state is missing; {}",
            dir, name, weight, weight, kBnbQuantStateKey, kFix);
    }

  const HfWeights& w = d.weights_;
  for (const auto& entry : blob) {
    // (named, not structured, bindings: the lambdas below capture them)
    const std::string& weight = entry.first;
    const std::string& tensor = entry.second.first;
    const std::string& type = entry.second.second;
    const std::string where = fmt::format("{}: tensor \"{}\"", dir, tensor);
    const RawTensorInfo bi = w.raw_info(tensor);
    if (bi.dtype != "U8" || bi.shape.size() != 1)
      usage_error("{}: is {} {}; a quant_state is U8 [bytes of JSON]; {}", where, bi.dtype,
                  shape_str(bi.shape), kFix);
    Bnb4bitWeight h = parse_quant_state(w.read_raw(tensor, /*max_bytes=*/65536), type, where);
    if (h.quant_type != d.config_.quant_type)
      usage_error(
          "{}: says quant_type {} but config.json's quantization_config says "
          "bnb_4bit_quant_type {}; {}",
          where, h.quant_type, d.config_.quant_type, kFix);
    if (h.nested.has_value() != d.config_.double_quant)
      usage_error(
          "{}: is {} double quantization but config.json's quantization_config says "
          "bnb_4bit_use_double_quant {}; {}",
          where, h.nested ? "with" : "without", d.config_.double_quant, kFix);

    const int64_t n = h.numel(), blocks = h.num_blocks();
    const std::string shape_note = fmt::format("(the quant_state says shape {}, blocksize {})",
                                               shape_str(h.shape), h.block_size);
    auto expect = [&](const std::string& name, const char* what, const char* dtype,
                      std::vector<int64_t> shape) {
      if (!w.contains(name))
        usage_error("{}: the {} \"{}\" of 4-bit weight \"{}\" is missing; {}", dir, what, name,
                    weight, kFix);
      const RawTensorInfo i = w.raw_info(name);
      if (i.dtype != dtype || i.shape != shape)
        usage_error(
            "{}: tensor \"{}\" ({}) is {} {}; it must be {} {} {}: the file is truncated or "
            "corrupt, or the quant_state is not this weight's; re-save or re-download it",
            dir, name, what, i.dtype, shape_str(i.shape), dtype, shape_str(shape), shape_note);
    };
    expect(weight, "packed weight", "U8", {(n + 1) / 2, 1});
    expect(weight + ".absmax", "absmax", h.nested ? "U8" : "F32", {blocks});
    expect(weight + ".quant_map", "quant_map", "F32", {16});
    if (h.nested) {
      expect(weight + ".nested_absmax", "nested_absmax", "F32",
             {ceil_div(blocks, kBnbNestedBlockSize)});
      expect(weight + ".nested_quant_map", "nested_quant_map", "F32", {256});
    } else {
      for (const char* extra : {".nested_absmax", ".nested_quant_map"})
        if (w.contains(weight + extra))
          usage_error(
              "{}: tensor \"{}{}\" is there but the quant_state has no double quantization "
              "(no nested_offset); {}",
              dir, weight, extra, kFix);
    }
    d.headers_[weight] = std::move(h);
  }
  return d;
}

std::vector<std::string> Bnb4bitDir::quantized() const {
  std::vector<std::string> out;
  for (const auto& [name, h] : headers_) out.push_back(name);
  return out;
}

std::vector<std::string> Bnb4bitDir::plain() const {
  std::set<std::string> parts;
  for (const auto& [weight, h] : headers_) {
    parts.insert(weight);
    for (const char* s : {".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map"})
      parts.insert(weight + s);
    parts.insert(weight + "." + kBnbQuantStateKey + h.quant_type);
  }
  std::vector<std::string> out;
  for (const std::string& name : weights_.names())
    if (!parts.count(name)) out.push_back(name);
  return out;
}

const Bnb4bitWeight& Bnb4bitDir::header(const std::string& weight) const {
  auto it = headers_.find(weight);
  if (it == headers_.end())
    usage_error("{}: \"{}\" is not a 4-bit weight of this directory", dir(), weight);
  return it->second;
}

Bnb4bitWeight Bnb4bitDir::read(const std::string& weight) const {
  auto it = headers_.find(weight);
  if (it == headers_.end())
    usage_error("{}: \"{}\" is not a 4-bit weight of this directory", dir(), weight);
  Bnb4bitWeight q = it->second;
  auto f32 = [&](const std::string& name, float* out, int64_t count) {
    Tensor t = Tensor::empty(Shape{count}, DType::kF32, MemCategory::kOther, Device::cpu());
    weights_.read(name, t);  // refuses a NaN or an infinity, naming the element
    if (count > 0) std::memcpy(out, t.raw(), size_t(count) * sizeof(float));
  };
  // Sizes were checked against the blob at open(); read_raw reads what the header states.
  q.packed = weights_.read_raw(weight);
  const int64_t blocks = q.num_blocks();
  if (q.nested) {
    q.absmax_codes = weights_.read_raw(weight + ".absmax");
    q.nested->absmax.resize(size_t(ceil_div(blocks, kBnbNestedBlockSize)));
    f32(weight + ".nested_absmax", q.nested->absmax.data(), int64_t(q.nested->absmax.size()));
    f32(weight + ".nested_quant_map", q.nested->map.data(), 256);
  } else {
    q.absmax.resize(size_t(blocks));
    f32(weight + ".absmax", q.absmax.data(), blocks);
  }
  f32(weight + ".quant_map", q.quant_map.data(), 16);
  check_bnb4bit_weight(q, fmt::format("{}: 4-bit weight \"{}\"", dir(), weight));
  return q;
}

// ---- writing ----

void write_bnb4bit_weights(const std::string& dir, const std::vector<Bnb4bitEntry>& entries,
                           const std::map<std::string, std::string>& metadata,
                           int64_t max_shard_bytes,
                           const std::map<std::string, size_t>* placement) {
  std::vector<std::pair<std::string, TensorBytes>> out;
  std::deque<std::string> blobs;  // the quant_state texts, alive until written
  auto bytes = [](const char* dtype, std::vector<int64_t> shape, const void* data, size_t n) {
    return TensorBytes{dtype, std::move(shape), data, uint64_t(n)};
  };
  auto plain = [&](const std::string& name, const Tensor& t) {
    FD_CHECK(t.defined() && t.device().is_cpu(), "tensor {} must be a defined CPU tensor", name);
    out.emplace_back(name, tensor_bytes(t));
  };
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& [name, value] = entries[i];
    if (const Tensor* t = std::get_if<Tensor>(&value)) {
      plain(name, *t);
      continue;
    }
    const Bnb4bitWeight* q = std::get<const Bnb4bitWeight*>(value);
    FD_CHECK(q != nullptr, "quantized weight {} is null", name);
    check_bnb4bit_weight(*q, fmt::format("{}: 4-bit weight \"{}\"", dir, name));
    const int64_t n = q->numel(), blocks = q->num_blocks();
    // QuantState.as_dict(packed=True) after the weight: the module's state-dict order.
    out.emplace_back(name, bytes("U8", {(n + 1) / 2, 1}, q->packed.data(), q->packed.size()));
    // nn.Module saves the weight and the bias, then Linear4bit its quant_state.
    const std::string bias =
        name.ends_with(".weight") ? name.substr(0, name.size() - 7) + ".bias" : std::string();
    if (i + 1 < entries.size() && !bias.empty() && entries[i + 1].first == bias &&
        std::holds_alternative<Tensor>(entries[i + 1].second))
      plain(bias, std::get<Tensor>(entries[++i].second));
    if (q->nested)
      out.emplace_back(name + ".absmax",
                       bytes("U8", {blocks}, q->absmax_codes.data(), q->absmax_codes.size()));
    else
      out.emplace_back(name + ".absmax",
                       bytes("F32", {blocks}, q->absmax.data(), q->absmax.size() * 4));
    out.emplace_back(name + ".quant_map", bytes("F32", {16}, q->quant_map.data(), 16 * 4));
    if (q->nested) {
      const Bnb4bitNested& nq = *q->nested;
      out.emplace_back(name + ".nested_absmax", bytes("F32", {int64_t(nq.absmax.size())},
                                                      nq.absmax.data(), nq.absmax.size() * 4));
      out.emplace_back(name + ".nested_quant_map", bytes("F32", {256}, nq.map.data(), 256 * 4));
    }
    const std::string& text = blobs.emplace_back(bnb4bit_quant_state_json(*q));
    out.emplace_back(name + "." + kBnbQuantStateKey + q->quant_type,
                     bytes("U8", {int64_t(text.size())}, text.data(), text.size()));
  }
  write_hf_tensors(dir, out, metadata, max_shard_bytes, /*safetensors_order=*/true, placement);
}

}  // namespace fd::ckpt
