// Hugging Face bitsandbytes 4-bit directories (lib/ckpt/bnb4bit.h): the
// quant_state blob's text as bitsandbytes writes it, a directory made by our
// quantizer read back field for field, read-then-written byte for byte, and
// hostile directories refused with one usage error each.
#include "lib/ckpt/bnb4bit.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>

#include "lib/base/error.h"
#include "lib/nn/config/hf_config.h"
#include "tests/ckpt/bnb4bit_fixture.h"
#include "tests/ckpt/ckpt_test_util.h"

namespace fd::ckpt {
namespace {

namespace fs = std::filesystem;
using testing::Bnb4bitFixture;
using testing::make_bnb4bit_llama;
using testing::TempDir;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Python 3's json.dumps of each float32 value (widened to a double, as .item() gives it).
TEST(Bnb4bit, FloatsAreWrittenAsPythonWritesThem) {
  const std::pair<uint32_t, const char*> kPython[] = {
      {0x3c4a4588, "0.012345679104328156"},
      {0x3727c5ac, "9.999999747378752e-06"},
      {0x40c00000, "6.0"},
      {0x80000000, "-0.0"},
      {0x00000000, "0.0"},
      {0x5a0e1bca, "1.0000000272564224e+16"},
      {0x58635fa9, "999999986991104.0"},
      {0x3dcccccd, "0.10000000149011612"},
      {0x47f1205a, "123456.703125"},
      {0x7f7fffff, "3.4028234663852886e+38"},
      {0x00000001, "1.401298464324817e-45"},
      {0x38d1b717, "9.999999747378752e-05"},
      {0xbb23d70a, "-0.0024999999441206455"},
      {0x38e6afcd, "0.00011000000085914508"},
      {0x3f800000, "1.0"},
      {0xb5429d9f, "-7.250000066960638e-07"},
      {0x477fe000, "65504.0"},
      {0x00800000, "1.1754943508222875e-38"},
  };
  for (const auto& [bits, want] : kPython)
    EXPECT_EQ(python_float_repr(double(from_bits(bits))), want) << std::hex << bits;
  // The switch to exponent form: decimal point position <= -4 or > 16 (repr's 'r' format).
  EXPECT_EQ(python_float_repr(1e16), "1e+16");
  EXPECT_EQ(python_float_repr(1e15), "1000000000000000.0");
  EXPECT_EQ(python_float_repr(1e-4), "0.0001");
  EXPECT_EQ(python_float_repr(1e-5), "1e-05");
  EXPECT_EQ(python_float_repr(1.5e300), "1.5e+300");
  EXPECT_EQ(python_float_repr(-123.0), "-123.0");
  EXPECT_EQ(python_float_repr(0.5), "0.5");
}

TEST(Bnb4bit, QuantStateTextIsBitsandbytesAsDict) {
  Bnb4bitWeight w;
  w.quant_type = "nf4";
  w.block_size = 64;
  w.shape = {64, 64};
  w.dtype = "bfloat16";
  w.packed.resize(2048);
  w.absmax_codes.resize(64);
  w.nested.emplace();
  w.nested->absmax.resize(1);
  w.nested->offset = from_bits(0x3c4a4588);
  // Python: json.dumps of as_dict(packed=True)'s non-tensor items (see the test above).
  EXPECT_EQ(bnb4bit_quant_state_json(w),
            R"({"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [64, 64], )"
            R"("nested_blocksize": 256, "nested_dtype": "float32", )"
            R"("nested_offset": 0.012345679104328156})");
  Bnb4bitWeight p;
  p.quant_type = "fp4";
  p.block_size = 128;
  p.shape = {3, 5};
  p.dtype = "float16";
  p.packed.resize(8);
  p.absmax.resize(1);
  EXPECT_EQ(bnb4bit_quant_state_json(p),
            R"({"quant_type": "fp4", "blocksize": 128, "dtype": "float16", "shape": [3, 5]})");
}

TEST(Bnb4bit, QuantizationConfigIsBitsAndBytesConfigToDict) {
  BnbQuantizationConfig c;
  c.quant_type = "nf4";
  c.double_quant = true;
  c.compute_dtype = "bfloat16";
  // BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
  // bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16).to_dict(), as
  // config.json holds it (json.dumps(indent=2, sort_keys=True), nested one level).
  const std::string text = bnb4bit_config_json("{\"model_type\": \"llama\"}", c);
  EXPECT_EQ(text,
            "{\n"
            "  \"model_type\": \"llama\",\n"
            "  \"quantization_config\": {\n"
            "    \"_load_in_4bit\": true,\n"
            "    \"_load_in_8bit\": false,\n"
            "    \"bnb_4bit_compute_dtype\": \"bfloat16\",\n"
            "    \"bnb_4bit_quant_storage\": \"uint8\",\n"
            "    \"bnb_4bit_quant_type\": \"nf4\",\n"
            "    \"bnb_4bit_use_double_quant\": true,\n"
            "    \"llm_int8_enable_fp32_cpu_offload\": false,\n"
            "    \"llm_int8_has_fp16_weight\": false,\n"
            "    \"llm_int8_skip_modules\": null,\n"
            "    \"llm_int8_threshold\": 6.0,\n"
            "    \"load_in_4bit\": true,\n"
            "    \"load_in_8bit\": false,\n"
            "    \"quant_method\": \"bitsandbytes\"\n"
            "  }\n"
            "}\n");
  // Keys a file leaves out take BitsAndBytesConfig's defaults (fp4, no double quant).
  const BnbQuantizationConfig d = parse_bnb_quantization_config(
      nlohmann::json::parse(R"({"quant_method": "bitsandbytes", "load_in_4bit": true})"), "x");
  EXPECT_EQ(d.quant_type, "fp4");
  EXPECT_FALSE(d.double_quant);
  EXPECT_EQ(d.compute_dtype, "float32");
  EXPECT_FALSE(d.llm_int8_skip_modules.has_value());
}

struct Case {
  quant::QuantType type;
  int64_t block_size;
  bool double_quant;
};

class Bnb4bitDirs : public ::testing::TestWithParam<Case> {
 protected:
  quant::QuantOptions options() const {
    return quant::QuantOptions{GetParam().type, GetParam().block_size, GetParam().double_quant};
  }
};

void expect_equal(const Bnb4bitWeight& got, const Bnb4bitWeight& want, const std::string& name) {
  SCOPED_TRACE(name);
  EXPECT_EQ(got.quant_type, want.quant_type);
  EXPECT_EQ(got.block_size, want.block_size);
  EXPECT_EQ(got.shape, want.shape);
  EXPECT_EQ(got.dtype, want.dtype);
  EXPECT_EQ(got.packed, want.packed);
  EXPECT_EQ(got.absmax_codes, want.absmax_codes);
  ASSERT_EQ(got.absmax.size(), want.absmax.size());
  EXPECT_TRUE(got.absmax.empty() ||
              std::memcmp(got.absmax.data(), want.absmax.data(), 4 * got.absmax.size()) == 0);
  EXPECT_EQ(0, std::memcmp(got.quant_map.data(), want.quant_map.data(), 4 * 16));
  ASSERT_EQ(got.nested.has_value(), want.nested.has_value());
  if (got.nested) {
    EXPECT_EQ(got.nested->absmax, want.nested->absmax);
    EXPECT_EQ(std::memcmp(&got.nested->offset, &want.nested->offset, 4), 0);
    EXPECT_EQ(0, std::memcmp(got.nested->map.data(), want.nested->map.data(), 4 * 256));
    EXPECT_EQ(got.nested->block_size, 256);
    EXPECT_EQ(got.nested->dtype, "float32");
  }
}

TEST_P(Bnb4bitDirs, ReadsWhatOurQuantizerProduced) {
  TempDir tmp;
  const Bnb4bitFixture f = make_bnb4bit_llama(tmp.path("m"), options());
  const Bnb4bitDir d = Bnb4bitDir::open(tmp.path("m"));
  EXPECT_EQ(d.config().quant_type, f.qconfig.quant_type);
  EXPECT_EQ(d.config().double_quant, f.qconfig.double_quant);
  EXPECT_EQ(d.config().compute_dtype, "bfloat16");
  std::vector<std::string> want_q;
  for (const auto& [name, q] : f.quantized) want_q.push_back(name);
  EXPECT_EQ(d.quantized(), want_q);
  std::vector<std::string> want_plain;
  for (const auto& [name, t] : f.plain) want_plain.push_back(name);
  EXPECT_EQ(d.plain(), want_plain);
  for (const auto& [name, q] : f.quantized) {
    const Bnb4bitWeight got = d.read(name);
    expect_equal(got, f.stored.at(name), name);
    // Field by field against lib/quant's own struct, not only through to_bnb.
    EXPECT_EQ(got.packed, q.packed);
    EXPECT_EQ(got.shape, q.shape);
    EXPECT_EQ(got.block_size, q.block_size);
    if (q.nested) {
      EXPECT_EQ(got.absmax_codes, q.nested->codes);
      EXPECT_EQ(got.nested->absmax, q.nested->absmax);
      EXPECT_EQ(got.nested->offset, q.nested->offset);
    } else {
      EXPECT_EQ(got.absmax, q.absmax);
    }
  }
  for (const auto& [name, t] : f.plain) {
    Tensor got = Tensor::empty(t.shape(), DType::kBF16, MemCategory::kOther, Device::cpu());
    d.weights().read(name, got);
    EXPECT_EQ(0, std::memcmp(got.raw(), t.raw(), t.nbytes())) << name;
  }
  // What is left of config.json is the model's, as nn reads it.
  EXPECT_EQ(nn::parse_hf_config(d.model_config_json(), "config.json"), f.config);
}

// Everything read, written to another directory: the same bytes, file by file.
void rewrite(const Bnb4bitDir& d, const std::string& out, int64_t max_shard_bytes,
             bool same_shards = false) {
  std::vector<std::pair<std::string, Tensor>> plain;
  std::map<std::string, Bnb4bitWeight> quantized;
  std::vector<Bnb4bitEntry> entries;
  for (const std::string& name : d.plain()) {
    TensorInfo i = d.weights().info(name);
    Tensor t = Tensor::empty(i.shape, i.dtype, MemCategory::kOther, Device::cpu());
    d.weights().read(name, t);
    plain.emplace_back(name, t);
  }
  for (const std::string& name : d.quantized()) quantized[name] = d.read(name);
  // The source's order: each quantized weight where its packed bytes were.
  for (const std::string& name : d.file_order()) {
    if (d.is_quantized(name)) {
      entries.emplace_back(name, &quantized.at(name));
    } else {
      auto it =
          std::find_if(plain.begin(), plain.end(), [&](const auto& p) { return p.first == name; });
      if (it != plain.end()) entries.emplace_back(name, it->second);
    }
  }
  const std::map<std::string, size_t> placement = d.weights().placement();
  write_bnb4bit_weights(out, entries, d.weights().metadata(), max_shard_bytes,
                        same_shards ? &placement : nullptr);
  std::ofstream(out + "/config.json", std::ios::binary)
      << bnb4bit_config_json(d.model_config_json(), d.config());
}

void expect_same_files(const std::string& a, const std::string& b) {
  std::vector<std::string> fa, fb;
  for (const auto& e : fs::directory_iterator(a)) fa.push_back(e.path().filename().string());
  for (const auto& e : fs::directory_iterator(b)) fb.push_back(e.path().filename().string());
  std::sort(fa.begin(), fa.end());
  std::sort(fb.begin(), fb.end());
  ASSERT_EQ(fa, fb);
  for (const std::string& f : fa) {
    const std::string x = slurp(a + "/" + f), y = slurp(b + "/" + f);
    EXPECT_EQ(x.size(), y.size()) << f;
    EXPECT_TRUE(x == y) << f << " differs";
  }
}

TEST_P(Bnb4bitDirs, ReadThenWrittenIsByteIdentical) {
  TempDir tmp;
  make_bnb4bit_llama(tmp.path("m"), options());
  rewrite(Bnb4bitDir::open(tmp.path("m")), tmp.path("again"), int64_t(1) << 30);
  expect_same_files(tmp.path("m"), tmp.path("again"));
  // And once more from the copy.
  rewrite(Bnb4bitDir::open(tmp.path("again")), tmp.path("third"), int64_t(1) << 30);
  expect_same_files(tmp.path("m"), tmp.path("third"));
}

// Shards (a weight's companions may lie in another shard than its packed bytes) read the same,
// and written again into the same shards give the same bytes.
TEST_P(Bnb4bitDirs, ShardedReadsTheSameAndRewritesByteForByte) {
  TempDir tmp;
  const int64_t shard = 20000;
  const Bnb4bitFixture f = make_bnb4bit_llama(tmp.path("m"), options(), shard);
  ASSERT_TRUE(fs::exists(tmp.path("m/model.safetensors.index.json")));
  const Bnb4bitDir d = Bnb4bitDir::open(tmp.path("m"));
  for (const auto& [name, w] : f.stored) expect_equal(d.read(name), w, name);
  EXPECT_EQ(d.plain().size(), f.plain.size());
  // Some weight's companions in another shard than its packed bytes (the case placement is for).
  const std::map<std::string, size_t> where = d.weights().placement();
  bool split = false;
  for (const auto& [name, w] : f.stored)
    split = split || where.at(name) != where.at(name + ".quant_map");
  EXPECT_TRUE(split);
  rewrite(d, tmp.path("again"), shard, /*same_shards=*/true);
  expect_same_files(tmp.path("m"), tmp.path("again"));
}

// Directories from an independent writer (tests/ckpt/make_bnb4bit_python.py: Python's json for
// config.json and the quant_state blobs, the safetensors library's layout): read and written
// again by fdtrain, the same bytes.
TEST(Bnb4bit, RewritesAPythonWrittenDirectoryByteForByte) {
  for (const char* name : {"nf4_dq", "fp4"}) {
    SCOPED_TRACE(name);
    TempDir tmp;
    const std::string src = std::string(FD_SOURCE_DIR) + "/tests/ckpt/bnb4bit_python/" + name;
    fs::copy(src, tmp.path("src"));
    const Bnb4bitDir d = Bnb4bitDir::open(tmp.path("src"));
    EXPECT_EQ(d.quantized().size(), 2u);
    EXPECT_EQ(d.plain(), (std::vector<std::string>{"lm_head.weight", "model.norm.weight"}));
    rewrite(d, tmp.path("again"), int64_t(1) << 30);
    expect_same_files(src, tmp.path("again"));
  }
}

INSTANTIATE_TEST_SUITE_P(Types, Bnb4bitDirs,
                         ::testing::Values(Case{quant::QuantType::kNF4, 64, true},
                                           Case{quant::QuantType::kNF4, 64, false},
                                           Case{quant::QuantType::kFP4, 128, true},
                                           Case{quant::QuantType::kFP4, 32, false}),
                         [](const auto& info) {
                           return std::string(info.param.type == quant::QuantType::kNF4 ? "nf4"
                                                                                        : "fp4") +
                                  "_" + std::to_string(info.param.block_size) +
                                  (info.param.double_quant ? "_dq" : "");
                         });

// A weight whose element count is odd: the last byte's low nibble is padding.
TEST(Bnb4bit, AnOddWeightRoundTrips) {
  TempDir tmp;
  const std::vector<float> v = {0.5f,  -1.0f, 0.25f, 0.0f, 2.0f,  -0.125f, 1.5f, 0.75f,
                                -0.5f, 0.1f,  0.2f,  0.3f, -0.4f, 0.6f,    0.9f};
  for (bool dq : {false, true}) {
    const quant::Quantized4bit q =
        quant::quantize(v, {3, 5}, {quant::QuantType::kNF4, 32, dq}, "odd");
    const Bnb4bitWeight w = testing::to_bnb(q, "float32");
    ASSERT_EQ(w.packed.size(), 8u);
    write_bnb4bit_weights(tmp.path("o"), {{"x.weight", &w}}, {{"format", "pt"}}, 1 << 20);
    BnbQuantizationConfig c;
    c.quant_type = "nf4";
    c.double_quant = dq;
    std::ofstream(tmp.path("o/config.json")) << bnb4bit_config_json("{}", c);
    const Bnb4bitDir d = Bnb4bitDir::open(tmp.path("o"));
    expect_equal(d.read("x.weight"), w, dq ? "odd, double quant" : "odd");
    EXPECT_TRUE(d.plain().empty());
  }
}

// With one tensor a shard, the shards' numbers show the order the writer split in: the
// module's state dict (weight, bias, then the quant_state's tensors in as_dict's order).
TEST(Bnb4bit, SplitsInTheStateDictOrder) {
  TempDir tmp;
  const std::vector<float> v(64, 0.5f);
  const Bnb4bitWeight w = testing::to_bnb(
      quant::quantize(v, {8, 8}, {quant::QuantType::kNF4, 64, true}, "w"), "bfloat16");
  Tensor bias = Tensor::empty(Shape{8}, DType::kBF16, MemCategory::kOther, Device::cpu());
  std::memset(bias.raw(), 0, bias.nbytes());
  Tensor norm = Tensor::empty(Shape{8}, DType::kF32, MemCategory::kOther, Device::cpu());
  std::memset(norm.raw(), 0, norm.nbytes());
  write_bnb4bit_weights(tmp.path("s"),
                        {{"a.q_proj.weight", &w}, {"a.q_proj.bias", bias}, {"b.norm.weight", norm}},
                        {{"format", "pt"}}, 1);
  const nlohmann::json index =
      nlohmann::json::parse(slurp(tmp.path("s/model.safetensors.index.json")));
  const std::vector<std::string> want = {"a.q_proj.weight",
                                         "a.q_proj.bias",
                                         "a.q_proj.weight.absmax",
                                         "a.q_proj.weight.quant_map",
                                         "a.q_proj.weight.nested_absmax",
                                         "a.q_proj.weight.nested_quant_map",
                                         "a.q_proj.weight.quant_state.bitsandbytes__nf4",
                                         "b.norm.weight"};
  ASSERT_EQ(index["weight_map"].size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_EQ(index["weight_map"][want[i]].get<std::string>(),
              fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, want.size()))
        << want[i];
}

// ---- hostile directories ----

// A tensor as stored, for building broken directories.
struct Raw {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

struct Hostile : ::testing::Test {
  TempDir tmp;
  std::vector<Raw> tensors;
  std::string config;
  const std::string q = "model.layers.0.self_attn.q_proj.weight";  // 64 x 64: 64 blocks

  void SetUp() override {
    make_bnb4bit_llama(tmp.path("m"), quant::QuantOptions{});  // nf4, 64, double quant
    HfWeights w = HfWeights::open(tmp.path("m"));
    for (const std::string& name : w.file_order()) {
      RawTensorInfo i = w.raw_info(name);
      tensors.push_back({name, i.dtype, i.shape, w.read_raw(name)});
    }
    config = slurp(tmp.path("m/config.json"));
  }
  Raw& find(const std::string& name) {
    for (Raw& r : tensors)
      if (r.name == name) return r;
    throw std::runtime_error("no tensor " + name);
  }
  void remove(const std::string& name) {
    tensors.erase(std::remove_if(tensors.begin(), tensors.end(),
                                 [&](const Raw& r) { return r.name == name; }),
                  tensors.end());
  }
  void set_blob(const std::string& text) {
    Raw& b = find(q + ".quant_state.bitsandbytes__nf4");
    b.bytes.assign(text.begin(), text.end());
    b.shape = {int64_t(text.size())};
  }
  // Writes the (edited) directory `name`.
  std::string write_dir(const std::string& name) {
    const std::string dir = tmp.path(name);
    fs::remove_all(dir);
    std::vector<std::pair<std::string, TensorBytes>> out;
    for (const Raw& r : tensors)
      out.emplace_back(r.name, TensorBytes{r.dtype, r.shape, r.bytes.data(), r.bytes.size()});
    write_hf_tensors(dir, out, {{"format", "pt"}}, int64_t(1) << 30, true);
    std::ofstream(dir + "/config.json") << config;
    return dir;
  }
  // Writes the (edited) directory and expects open + read of every weight to refuse it with
  // one usage error whose message holds `want`.
  void expect_refused(const std::string& want) {
    const std::string dir = write_dir("bad");
    try {
      Bnb4bitDir d = Bnb4bitDir::open(dir);
      for (const std::string& name : d.quantized()) d.read(name);
      FAIL() << "accepted; expected an error with: " << want;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
      EXPECT_EQ(e.exit_code(), 2);
      const std::string msg = e.what();
      EXPECT_NE(msg.find(want), std::string::npos) << msg;
      EXPECT_NE(msg.find(dir), std::string::npos) << "the directory is not named: " << msg;
      std::printf("refused: %s\n", msg.c_str());
    }
  }
};

TEST_F(Hostile, TheUneditedCopyIsAccepted) {
  const std::string dir = write_dir("copy");
  EXPECT_EQ(Bnb4bitDir::open(dir).quantized().size(), 14u);
  expect_same_files(tmp.path("m"), dir);
}

TEST_F(Hostile, ATruncatedPackedWeight) {
  Raw& w = find(q);
  w.bytes.resize(w.bytes.size() - 64);
  w.shape = {int64_t(w.bytes.size()), 1};
  expect_refused("\"" + q + "\" (packed weight) is U8 [1984, 1]; it must be U8 [2048, 1]");
}

TEST_F(Hostile, ATruncatedFile) {
  const std::string file = write_dir("bad") + "/model.safetensors";
  fs::resize_file(file, fs::file_size(file) - 100);
  try {
    Bnb4bitDir::open(tmp.path("bad"));
    FAIL() << "a truncated file was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find("run past the data section"), std::string::npos)
        << e.what();
  }
}

TEST_F(Hostile, AQuantStateThatDisagreesWithTheTensorsShape) {
  set_blob(R"({"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [64, 32], )"
           R"("nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": 0.5})");
  expect_refused("is U8 [2048, 1]; it must be U8 [1024, 1] (the quant_state says shape [64, 32]");
}

TEST_F(Hostile, AQuantStateWithAnotherBlockSize) {
  set_blob(R"({"quant_type": "nf4", "blocksize": 128, "dtype": "bfloat16", "shape": [64, 64], )"
           R"("nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": 0.5})");
  expect_refused("(absmax) is U8 [64]; it must be U8 [32]");
}

TEST_F(Hostile, AnUnsupportedBlockSize) {
  set_blob(R"({"quant_type": "nf4", "blocksize": 48, "dtype": "bfloat16", "shape": [64, 64], )"
           R"("nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": 0.5})");
  expect_refused("blocksize 48; bitsandbytes' 4-bit block sizes are 32, 64, 128");
}

TEST_F(Hostile, AnUnknownQuantTypeInTheTensorName) {
  find(q + ".quant_state.bitsandbytes__nf4").name = q + ".quant_state.bitsandbytes__int4";
  expect_refused("unknown quant type \"int4\"");
}

TEST_F(Hostile, AnUnknownQuantTypeInTheBlob) {
  set_blob(R"({"quant_type": "nf3", "blocksize": 64, "dtype": "bfloat16", "shape": [64, 64], )"
           R"("nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": 0.5})");
  expect_refused("unknown quant type \"nf3\"");
}

TEST_F(Hostile, AMissingAbsmax) {
  remove(q + ".absmax");
  expect_refused("the absmax \"" + q + ".absmax\" of 4-bit weight \"" + q + "\" is missing");
}

TEST_F(Hostile, AnAbsmaxOfTheWrongCount) {
  Raw& a = find(q + ".absmax");
  a.bytes.pop_back();
  a.shape = {63};
  expect_refused("(absmax) is U8 [63]; it must be U8 [64]");
}

TEST_F(Hostile, AnAbsmaxOfTheWrongDtype) {
  Raw& a = find(q + ".absmax");
  a.bytes.resize(64 * 4);
  a.dtype = "F32";
  expect_refused("(absmax) is F32 [64]; it must be U8 [64]");
}

TEST_F(Hostile, AQuantMapOfTheWrongLength) {
  Raw& m = find(q + ".quant_map");
  m.bytes.resize(15 * 4);
  m.shape = {15};
  expect_refused("(quant_map) is F32 [15]; it must be F32 [16]");
}

TEST_F(Hostile, ANestedAbsmaxOfTheWrongCount) {
  Raw& m = find("model.layers.0.mlp.gate_proj.weight.nested_absmax");  // 288 blocks: 2
  m.bytes.resize(4);
  m.shape = {1};
  expect_refused("(nested_absmax) is F32 [1]; it must be F32 [2]");
}

TEST_F(Hostile, ANonFiniteNestedAbsmax) {
  Raw& m = find(q + ".nested_absmax");
  const float inf = std::numeric_limits<float>::infinity();
  std::memcpy(m.bytes.data(), &inf, 4);
  expect_refused("nested_absmax");
}

TEST_F(Hostile, BadJsonInTheBlob) {
  set_blob(R"({"quant_type": "nf4", "blocksize": 64, "dtype": )");
  expect_refused("not valid JSON");
}

TEST_F(Hostile, ABlobNestedTooDeep) {
  set_blob(std::string(100, '[') + std::string(100, ']'));
  expect_refused("nested deeper than 4 levels");
}

TEST_F(Hostile, ABlobThatIsNotUtf8) {
  set_blob("{\"quant_type\": \"nf\xff\"}");
  expect_refused(".quant_state.bitsandbytes__nf4");
}

TEST_F(Hostile, ANestedOffsetThatIsNoFloat32) {
  set_blob(R"({"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [64, 64], )"
           R"("nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": 0.1})");
  expect_refused("nested_offset 0.1 is not a finite float32 value");
}

TEST_F(Hostile, AMissingQuantState) {
  remove(q + ".quant_state.bitsandbytes__nf4");
  expect_refused("the quant_state is missing");
}

TEST_F(Hostile, AMissingPackedWeight) {
  remove(q);
  expect_refused("the packed weight \"" + q + "\" of 4-bit weight");
}

TEST_F(Hostile, ConfigSaysAnotherQuantType) {
  config.replace(config.find("\"nf4\""), 5, "\"fp4\"");
  expect_refused(
      "says quant_type nf4 but config.json's quantization_config says "
      "bnb_4bit_quant_type fp4");
}

TEST_F(Hostile, ConfigSaysNoDoubleQuantization) {
  config.replace(config.find("\"bnb_4bit_use_double_quant\": true"), 33,
                 "\"bnb_4bit_use_double_quant\": false");
  expect_refused(
      "is with double quantization but config.json's quantization_config says "
      "bnb_4bit_use_double_quant false");
}

TEST_F(Hostile, ConfigWithoutQuantizationConfig) {
  nlohmann::json j = nlohmann::json::parse(config);
  j.erase("quantization_config");
  config = j.dump(2);
  expect_refused("has no quantization_config, but the weights hold 14 bitsandbytes 4-bit weights");
}

TEST_F(Hostile, ConfigWithAnUnknownKey) {
  config.replace(config.find("\"quant_method\""), 14, "\"bnb_4bit_foo\": 1, \"quant_method\"");
  expect_refused("quantization_config has key \"bnb_4bit_foo\"");
}

TEST_F(Hostile, ConfigSaysEightBit) {
  config.replace(config.find("\"load_in_8bit\": false"), 21, "\"load_in_8bit\": true");
  expect_refused("load_in_8bit is true but _load_in_8bit is false");  // the two disagree
  config.replace(config.find("\"_load_in_8bit\": false"), 22, "\"_load_in_8bit\": true");
  expect_refused("says load_in_8bit (LLM.int8())");
}

TEST(Bnb4bit, RefusesAPlainDirectory) {
  TempDir tmp;
  Tensor t = Tensor::empty(Shape{4}, DType::kF32, MemCategory::kOther, Device::cpu());
  std::memset(t.raw(), 0, t.nbytes());
  write_hf_weights(tmp.path("p"), {{"model.norm.weight", t}}, {}, 1 << 20);
  std::ofstream(tmp.path("p/config.json")) << "{\"model_type\": \"llama\"}";
  try {
    Bnb4bitDir::open(tmp.path("p"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find("not a 4-bit directory"), std::string::npos) << e.what();
  }
}

TEST(Bnb4bit, WritingRefusesAnInconsistentWeight) {
  TempDir tmp;
  Bnb4bitWeight w;
  w.shape = {4, 4};
  w.packed.resize(7);  // 8 needed
  w.absmax.resize(1);
  w.quant_type = "nf4";
  w.block_size = 64;
  try {
    write_bnb4bit_weights(tmp.path("w"), {{"x.weight", &w}}, {}, 1 << 20);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find("the packed weight holds 7 values"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(tmp.path("w/model.safetensors")));
}

}  // namespace
}  // namespace fd::ckpt
