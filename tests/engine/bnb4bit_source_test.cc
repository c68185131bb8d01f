// A transformers 4-bit directory as a weights source (WeightsSource over
// lib/ckpt/bnb4bit.h) and the exact conversions between the file's weights
// and lib/quant's (engine/quant_io.h): a LoRA model with an fp32 base reads
// the directory as its dequantized twin, bit for bit; read_quantized gives
// what was quantized, byte for byte; a hostile directory is one usage error
// naming the tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <ostream>
#include <sstream>

#include "lib/base/error.h"
#include "lib/ckpt/hf_dir.h"
#include "lib/engine/quant_io.h"
#include "lib/engine/weights_io.h"
#include "lib/nn/decoder.h"
#include "lib/tensor/safetensors.h"
#include "tests/engine/bnb4bit_model_fixture.h"
#include "tests/engine/weights_test_util.h"

namespace fd::quant {
// For gtest's and ctest's test names ("nf4, blocks of 64, double quant"), not the struct's bytes.
inline void PrintTo(const QuantOptions& o, std::ostream* os) {
  *os << quant_type_name(o.type) << ", blocks of " << o.block_size
      << (o.double_quant ? ", double quant" : ", no double quant");
}
}  // namespace fd::quant

namespace fd::engine {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

// The message of the fd::Error `f` throws, which must be a usage error (exit 2).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected an fd::Error";
  return "";
}

const char* kWhere = "r.yaml:3:14: model.init_from";

quant::QuantOptions nf4_64_dq() { return {quant::QuantType::kNF4, 64, true}; }
quant::QuantOptions fp4_128() { return {quant::QuantType::kFP4, 128, false}; }
std::string options_name(const ::testing::TestParamInfo<quant::QuantOptions>& info) {
  const quant::QuantOptions& o = info.param;
  return std::string(quant::quant_type_name(o.type)) + "_" + std::to_string(o.block_size) +
         (o.double_quant ? "_dq" : "");
}

bool same_bits(const void* a, const void* b, size_t n) { return std::memcmp(a, b, n) == 0; }

void expect_same(const quant::Quantized4bit& a, const quant::Quantized4bit& b,
                 const std::string& what) {
  EXPECT_EQ(a.type, b.type) << what;
  EXPECT_EQ(a.block_size, b.block_size) << what;
  EXPECT_EQ(a.shape, b.shape) << what;
  EXPECT_EQ(a.packed, b.packed) << what;
  ASSERT_EQ(a.absmax.size(), b.absmax.size()) << what;
  EXPECT_TRUE(same_bits(a.absmax.data(), b.absmax.data(), a.absmax.size() * 4)) << what;
  ASSERT_EQ(a.nested.has_value(), b.nested.has_value()) << what;
  if (!a.nested) return;
  EXPECT_EQ(a.nested->codes, b.nested->codes) << what;
  ASSERT_EQ(a.nested->absmax.size(), b.nested->absmax.size()) << what;
  EXPECT_TRUE(
      same_bits(a.nested->absmax.data(), b.nested->absmax.data(), a.nested->absmax.size() * 4))
      << what;
  EXPECT_TRUE(same_bits(&a.nested->offset, &b.nested->offset, 4)) << what;
  EXPECT_TRUE(same_bits(a.nested->map.data(), b.nested->map.data(), 256 * 4)) << what;
}

void expect_same(const ckpt::Bnb4bitWeight& a, const ckpt::Bnb4bitWeight& b,
                 const std::string& what) {
  EXPECT_EQ(a.quant_type, b.quant_type) << what;
  EXPECT_EQ(a.block_size, b.block_size) << what;
  EXPECT_EQ(a.shape, b.shape) << what;
  EXPECT_EQ(a.dtype, b.dtype) << what;
  EXPECT_EQ(a.packed, b.packed) << what;
  ASSERT_EQ(a.absmax.size(), b.absmax.size()) << what;
  EXPECT_TRUE(same_bits(a.absmax.data(), b.absmax.data(), a.absmax.size() * 4)) << what;
  EXPECT_EQ(a.absmax_codes, b.absmax_codes) << what;
  EXPECT_TRUE(same_bits(a.quant_map.data(), b.quant_map.data(), 16 * 4)) << what;
  ASSERT_EQ(a.nested.has_value(), b.nested.has_value()) << what;
  if (!a.nested) return;
  ASSERT_EQ(a.nested->absmax.size(), b.nested->absmax.size()) << what;
  EXPECT_TRUE(
      same_bits(a.nested->absmax.data(), b.nested->absmax.data(), a.nested->absmax.size() * 4))
      << what;
  EXPECT_TRUE(same_bits(&a.nested->offset, &b.nested->offset, 4)) << what;
  EXPECT_TRUE(same_bits(a.nested->map.data(), b.nested->map.data(), 256 * 4)) << what;
  EXPECT_EQ(a.nested->block_size, b.nested->block_size) << what;
  EXPECT_EQ(a.nested->dtype, b.nested->dtype) << what;
  // The blob's text, offset included, is what a writer would write again.
  EXPECT_EQ(ckpt::bnb4bit_quant_state_json(a), ckpt::bnb4bit_quant_state_json(b)) << what;
}

// A LoRA model over the fixture's config, fp32 (or `dtype`) base.
std::unique_ptr<nn::Decoder> lora_model(const nn::DecoderConfig& c, DType dtype = DType::kF32) {
  nn::LoraConfig lora;
  lora.r = 2;
  lora.alpha = 4.0f;
  lora.modules = nn::lora_modules_for_targets(c, {"q_proj", "v_proj", "down_proj"});
  auto m = std::make_unique<nn::Decoder>(c, dtype, nn::GroupLayout{}, lora);
  m->init_weights(7);
  return m;
}

// ---- quant_io ----

class QuantIo : public ::testing::TestWithParam<quant::QuantOptions> {};

TEST_P(QuantIo, RoundTripIsExact) {
  TempDir tmp;
  testing::Bnb4bitModel f = testing::make_bnb4bit_model(tmp.path("m"), "", GetParam());
  ckpt::Bnb4bitDir d = ckpt::Bnb4bitDir::open(tmp.path("m"));
  ASSERT_EQ(d.quantized().size(), f.quantized.size());
  for (const auto& [name, q] : f.quantized) {
    // As read from the file: to lib/quant's and back gives every field again.
    const ckpt::Bnb4bitWeight w = d.read(name);
    const quant::Quantized4bit got = to_quantized4bit(w, name);
    expect_same(got, q, name);
    expect_same(to_bnb4bit(got, w.dtype), w, name);
    // And from lib/quant's: to the file's and back.
    expect_same(to_quantized4bit(to_bnb4bit(q, "bfloat16"), name), q, name);
  }
}

INSTANTIATE_TEST_SUITE_P(Options, QuantIo, ::testing::Values(nf4_64_dq(), fp4_128()), options_name);

TEST(QuantIoRefuses, TablesAndSettingsNotBitsandbytes) {
  const std::vector<float> v(300, 0.25f);
  const quant::Quantized4bit q = quant::quantize(v, {3, 100}, nf4_64_dq(), "w");
  const ckpt::Bnb4bitWeight good = to_bnb4bit(q, "float32");
  auto refused = [&](auto edit) {
    ckpt::Bnb4bitWeight w = good;
    edit(w);
    return error_of([&] { to_quantized4bit(w, "dir: 4-bit weight 'w'"); });
  };
  std::string e = refused([](ckpt::Bnb4bitWeight& w) { w.quant_map[3] += 0.001f; });
  EXPECT_NE(e.find("dir: 4-bit weight 'w': quant_map is not bitsandbytes' nf4 table (entry 3"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("re-save"), std::string::npos) << e;
  e = refused(
      [](ckpt::Bnb4bitWeight& w) { w.quant_map = quant::quant_map(quant::QuantType::kFP4); });
  EXPECT_NE(e.find("quant_map is not bitsandbytes' nf4 table"), std::string::npos) << e;
  e = refused([](ckpt::Bnb4bitWeight& w) { w.nested->map[200] = 0.5f; });
  EXPECT_NE(e.find("'w': nested_quant_map is not bitsandbytes' signed dynamic map (entry 200"),
            std::string::npos)
      << e;
  e = refused([](ckpt::Bnb4bitWeight& w) { w.nested->block_size = 128; });
  EXPECT_NE(e.find("nested block size 128 of float32"), std::string::npos) << e;
  e = refused([](ckpt::Bnb4bitWeight& w) { w.nested->dtype = "float16"; });
  EXPECT_NE(e.find("nested block size 256 of float16"), std::string::npos) << e;
  e = refused([](ckpt::Bnb4bitWeight& w) { w.block_size = 48; });
  EXPECT_NE(e.find("'w': block size 48; bitsandbytes' 4-bit block sizes are 32, 64"),
            std::string::npos)
      << e;
  e = refused([](ckpt::Bnb4bitWeight& w) { w.quant_type = "int4"; });
  EXPECT_NE(e.find("'w': quant type \"int4\""), std::string::npos) << e;
  e = refused([](ckpt::Bnb4bitWeight& w) { w.packed.pop_back(); });
  EXPECT_NE(e.find("the packed weight holds 149 values"), std::string::npos) << e;
}

// ---- WeightsSource over a 4-bit directory ----

class Bnb4bitSource : public ::testing::TestWithParam<quant::QuantOptions> {};

TEST_P(Bnb4bitSource, ReadsTheDequantizedTwin) {
  TempDir tmp;
  const testing::Bnb4bitModel f =
      testing::make_bnb4bit_model(tmp.path("m"), tmp.path("twin"), GetParam());
  auto model = lora_model(f.config);
  WeightsSource src(tmp.path("m"), *model, kWhere);
  WeightsSource twin(tmp.path("twin"), *model, kWhere);

  const std::optional<quant::QuantOptions> o = src.stored_quantization();
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->type, GetParam().type);
  EXPECT_EQ(o->block_size, GetParam().block_size);
  EXPECT_EQ(o->double_quant, GetParam().double_quant);
  EXPECT_FALSE(twin.stored_quantization().has_value());

  size_t quantized = 0, frozen = 0;
  for (const nn::Parameter* p : model->frozen_parameters()) {
    ++frozen;
    ASSERT_TRUE(src.fills(*p)) << p->name;
    EXPECT_FALSE(twin.stores_quantized(*p)) << p->name;
    const bool q = f.quantized.count(p->name) != 0;
    EXPECT_EQ(src.stores_quantized(*p), q) << p->name;
    const int64_t n = p->value.numel();
    // The whole tensor, fp32: the twin's values, bit for bit (gate/up/down, 18432 values, span
    // two of the 16384-value pieces read dequantizes in).
    Tensor got = Tensor::empty(p->value.shape(), DType::kF32, MemCategory::kOther, Device::cpu());
    Tensor want = Tensor::empty(p->value.shape(), DType::kF32, MemCategory::kOther, Device::cpu());
    src.read(*p, 0, n, got);
    twin.read(*p, 0, n, want);
    EXPECT_TRUE(same_bits(got.raw(), want.raw(), size_t(n) * 4)) << p->name;
    EXPECT_TRUE(same_bits(got.raw(), f.twin.at(p->name).raw(), size_t(n) * 4)) << p->name;
    // Ranges that start and end inside blocks (and within a byte: odd begin), as a ZeRO-3
    // shard does, and into bf16 (round to nearest even, as the twin converts).
    for (auto [begin, count] : {std::pair<int64_t, int64_t>{0, n / 3},
                                {n / 3, n - n / 3},
                                {7, std::min<int64_t>(n - 7, 131)},
                                {n - 1, 1}}) {
      Tensor part = Tensor::empty(Shape{count}, DType::kF32, MemCategory::kOther, Device::cpu());
      src.read(*p, begin, count, part);
      EXPECT_TRUE(same_bits(part.raw(), static_cast<float*>(want.raw()) + begin, size_t(count) * 4))
          << p->name << " [" << begin << ", +" << count << ")";
      Tensor half = Tensor::empty(Shape{count}, DType::kBF16, MemCategory::kOther, Device::cpu());
      Tensor half_want =
          Tensor::empty(Shape{count}, DType::kBF16, MemCategory::kOther, Device::cpu());
      src.read(*p, begin, count, half);
      twin.read(*p, begin, count, half_want);
      EXPECT_TRUE(same_bits(half.raw(), half_want.raw(), size_t(count) * 2)) << p->name;
    }
    if (q) {
      ++quantized;
      expect_same(src.read_quantized(*p), f.quantized.at(p->name), p->name);
    }
  }
  EXPECT_EQ(quantized, f.quantized.size());
  EXPECT_EQ(frozen, f.order.size());
  // The adapters are not the file's.
  for (const nn::Parameter* p : model->parameters()) EXPECT_FALSE(src.fills(*p)) << p->name;

  // load_weights into a model without adapters: every parameter the twin's.
  nn::Decoder plain(f.config, DType::kF32);
  load_weights(tmp.path("m"), plain, kWhere);
  for (const nn::Parameter* p : plain.parameters())
    EXPECT_TRUE(same_bits(p->value.raw(), f.twin.at(p->name).raw(), p->value.nbytes())) << p->name;

  // check_weights_fit reads the blobs' shapes.
  EXPECT_NO_THROW(check_weights_fit(tmp.path("m"), f.config, kWhere));
  nn::DecoderConfig other = f.config;
  other.intermediate_size = 256;
  const std::string e = error_of([&] { check_weights_fit(tmp.path("m"), other, kWhere); });
  EXPECT_NE(e.find(std::string(kWhere) + ": " + tmp.path("m") +
                   ": 4-bit weight 'model.layers.0.mlp.gate_proj.weight' has shape (288, 64) in "
                   "its quant_state"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("but (256, 64) in the model"), std::string::npos) << e;
}

INSTANTIATE_TEST_SUITE_P(Options, Bnb4bitSource, ::testing::Values(nf4_64_dq(), fp4_128()),
                         options_name);

// ---- hostile directories ----

// A tensor as stored, for building broken directories.
struct Raw {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

struct HostileBnb4bit : ::testing::Test {
  TempDir tmp;
  testing::Bnb4bitModel f;
  std::vector<Raw> tensors;
  std::string config;
  const std::string w = "model.layers.1.mlp.gate_proj.weight";  // 288 x 64
  const std::string blob = w + ".quant_state.bitsandbytes__nf4";

  void SetUp() override {
    f = testing::make_bnb4bit_model(tmp.path("m"), "", nf4_64_dq());
    ckpt::HfWeights hw = ckpt::HfWeights::open(tmp.path("m"));
    for (const std::string& name : hw.file_order()) {
      ckpt::RawTensorInfo i = hw.raw_info(name);
      tensors.push_back({name, i.dtype, i.shape, hw.read_raw(name)});
    }
    std::ifstream in(tmp.path("m/config.json"));
    std::stringstream ss;
    ss << in.rdbuf();
    config = ss.str();
  }
  Raw& find(const std::string& name) {
    for (Raw& r : tensors)
      if (r.name == name) return r;
    throw std::runtime_error("no tensor " + name);
  }
  void set_blob(const std::string& text) {
    Raw& b = find(blob);
    b.bytes.assign(text.begin(), text.end());
    b.shape = {int64_t(text.size())};
  }
  std::string blob_text() {
    const Raw& b = find(blob);
    return std::string(b.bytes.begin(), b.bytes.end());
  }
  // Writes the edited directory and returns the message WeightsSource refuses it with.
  std::string refusal() {
    const std::string dir = tmp.path("bad");
    fs::remove_all(dir);
    std::vector<std::pair<std::string, TensorBytes>> out;
    for (const Raw& r : tensors)
      out.emplace_back(r.name, TensorBytes{r.dtype, r.shape, r.bytes.data(), r.bytes.size()});
    ckpt::write_hf_tensors(dir, out, {{"format", "pt"}}, int64_t(1) << 30, true);
    std::ofstream(dir + "/config.json") << config;
    auto model = lora_model(f.config);
    const std::string e = error_of([&] { WeightsSource(dir, *model, kWhere); });
    EXPECT_EQ(e.rfind(std::string(kWhere) + ": " + dir, 0), 0u) << e;
    // check_weights_fit (headers only) refuses the same.
    const std::string e2 = error_of([&] { check_weights_fit(dir, f.config, kWhere); });
    EXPECT_EQ(e2.rfind(std::string(kWhere) + ": " + dir, 0), 0u) << e2;
    return e;
  }
};

TEST_F(HostileBnb4bit, TheUneditedDirectoryLoads) {
  const std::string dir = tmp.path("same");
  std::vector<std::pair<std::string, TensorBytes>> out;
  for (const Raw& t : tensors)
    out.emplace_back(t.name, TensorBytes{t.dtype, t.shape, t.bytes.data(), t.bytes.size()});
  ckpt::write_hf_tensors(dir, out, {{"format", "pt"}}, int64_t(1) << 30, true);
  std::ofstream(dir + "/config.json") << config;
  auto model = lora_model(f.config);
  EXPECT_NO_THROW(WeightsSource(dir, *model, kWhere));
}

TEST_F(HostileBnb4bit, TruncatedPackedWeight) {
  Raw& r = find(w);  // [9216, 1] bytes: stored as [9000, 1]
  r.bytes.resize(9000);
  r.shape = {9000, 1};
  const std::string e = refusal();
  EXPECT_NE(e.find("tensor \"" + w + "\" (packed weight) is U8 [9000, 1]; it must be U8 [9216, 1]"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("re-save or re-download"), std::string::npos) << e;
}

TEST_F(HostileBnb4bit, TruncatedFile) {
  // The file cut inside the last tensor's bytes: the safetensors layer refuses it at open.
  const std::string file = tmp.path("m/model.safetensors");
  fs::resize_file(file, fs::file_size(file) - 100);
  auto model = lora_model(f.config);
  const std::string e = error_of([&] { WeightsSource(tmp.path("m"), *model, kWhere); });
  EXPECT_EQ(e.rfind(std::string(kWhere) + ": " + file, 0), 0u) << e;
}

TEST_F(HostileBnb4bit, QuantStateShapeIsNotTheModels) {
  // The same element count transposed: every size in the files agrees, the model does not.
  std::string text = blob_text();
  const size_t at = text.find("[288, 64]");
  ASSERT_NE(at, std::string::npos) << text;
  text.replace(at, 9, "[64, 288]");
  set_blob(text);
  const std::string e = refusal();
  EXPECT_NE(e.find("4-bit weight '" + w + "' has shape (64, 288) in its quant_state (" + blob +
                   ") but (288, 64) in the model"),
            std::string::npos)
      << e;
}

TEST_F(HostileBnb4bit, UnknownQuantTypeInTheBlob) {
  std::string text = blob_text();
  const size_t at = text.find("\"nf4\"");
  ASSERT_NE(at, std::string::npos) << text;
  text.replace(at, 5, "\"nf5\"");
  set_blob(text);
  const std::string e = refusal();
  EXPECT_NE(e.find(blob), std::string::npos) << e;
  EXPECT_NE(e.find("nf5"), std::string::npos) << e;
}

TEST_F(HostileBnb4bit, QuantMapNotBitsandbytes) {
  Raw& m = find(w + ".quant_map");
  float x;
  std::memcpy(&x, m.bytes.data() + 4 * 5, 4);
  x = std::nextafter(x, 0.0f);
  std::memcpy(m.bytes.data() + 4 * 5, &x, 4);
  // WeightsSource reads the tables when it opens the directory (check_weights_fit reads
  // headers only and lets it pass).
  const std::string dir = tmp.path("bad");
  std::vector<std::pair<std::string, TensorBytes>> out;
  for (const Raw& r : tensors)
    out.emplace_back(r.name, TensorBytes{r.dtype, r.shape, r.bytes.data(), r.bytes.size()});
  ckpt::write_hf_tensors(dir, out, {{"format", "pt"}}, int64_t(1) << 30, true);
  std::ofstream(dir + "/config.json") << config;
  auto model = lora_model(f.config);
  const std::string e = error_of([&] { WeightsSource(dir, *model, kWhere); });
  EXPECT_EQ(e.rfind(std::string(kWhere) + ": " + dir + ": 4-bit weight '" + w +
                        "': quant_map is not bitsandbytes' nf4 table (entry 5 ",
                    0),
            0u)
      << e;
  EXPECT_NO_THROW(check_weights_fit(dir, f.config, kWhere));
}

TEST_F(HostileBnb4bit, BlockSizesThatDiffer) {
  // Another weight's blob says blocks of 128; its companions sized to match.
  const std::string v = "model.layers.0.self_attn.v_proj.weight";  // 32 x 64: 16 blocks of 128
  const std::vector<float> values(32 * 64, 0.5f);
  const quant::Quantized4bit q =
      quant::quantize(values, {32, 64}, {quant::QuantType::kNF4, 128, true}, v);
  const ckpt::Bnb4bitWeight b = to_bnb4bit(q, "float32");
  Raw& absmax = find(v + ".absmax");
  absmax.bytes = b.absmax_codes;
  absmax.shape = {int64_t(b.absmax_codes.size())};
  Raw& nested = find(v + ".nested_absmax");
  nested.bytes.assign(reinterpret_cast<const uint8_t*>(b.nested->absmax.data()),
                      reinterpret_cast<const uint8_t*>(b.nested->absmax.data()) + 4);
  const std::string text = ckpt::bnb4bit_quant_state_json(b);
  Raw& s = find(v + ".quant_state.bitsandbytes__nf4");
  s.bytes.assign(text.begin(), text.end());
  s.shape = {int64_t(text.size())};
  const std::string e = refusal();
  EXPECT_NE(e.find("blocks of 64"), std::string::npos) << e;
  EXPECT_NE(e.find("'" + v + "' (nf4, blocks of 128"), std::string::npos) << e;
  EXPECT_NE(e.find("one BitsAndBytesConfig"), std::string::npos) << e;
}

TEST_F(HostileBnb4bit, AWeightTheModelDoesNotHave) {
  // gate_proj's tensors again under a name the model does not have.
  const std::string extra = "model.layers.1.mlp.fourth_proj.weight";
  std::vector<Raw> copies;
  for (const Raw& r : tensors)
    if (r.name.rfind(w, 0) == 0)
      copies.push_back({extra + r.name.substr(w.size()), r.dtype, r.shape, r.bytes});
  ASSERT_EQ(copies.size(), 6u);  // the weight, absmax, quant_map, two nested, the blob
  tensors.insert(tensors.end(), copies.begin(), copies.end());
  const std::string e = refusal();
  EXPECT_NE(e.find("holds 4-bit weight '" + extra +
                   "' (288, 64), which the model of its config.json does not have"),
            std::string::npos)
      << e;
}

}  // namespace
}  // namespace fd::engine
