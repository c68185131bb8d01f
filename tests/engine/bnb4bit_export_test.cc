// write_bnb4bit_model: a QLoRA model whose base was read from a transformers
// 4-bit directory writes that directory back byte for byte (model.safetensors
// and config.json, NF4/64 with double quantization and FP4/128 without); a
// base quantized at load is written as the model holds it (read back, the
// same codes, absmax and nested state); a model without a 4-bit base is
// refused.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "lib/base/error.h"
#include "lib/engine/hf_export.h"
#include "lib/engine/quant_io.h"
#include "lib/engine/weights_io.h"
#include "lib/nn/decoder.h"
#include "tests/engine/bnb4bit_model_fixture.h"

namespace fd::engine {
namespace {

namespace fs = std::filesystem;

// <temp>/fd_bnb4bit_export_test_<pid>/<name>, empty; the root is removed when the binary exits.
fs::path test_dir(const std::string& name) {
  struct Root {
    fs::path path =
        fs::temp_directory_path() / ("fd_bnb4bit_export_test_" + std::to_string(::getpid()));
    ~Root() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  };
  static const Root root;
  fs::path p = root.path / name;
  fs::remove_all(p);
  return p;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A QLoRA model (adapters on every linear) of the fixture's config, in `dtype`.
std::unique_ptr<nn::Decoder> qlora_model(const nn::DecoderConfig& c, DType dtype,
                                         const std::optional<quant::QuantOptions>& quantize) {
  nn::LoraConfig lora;
  lora.r = 2;
  lora.alpha = 4.0f;
  lora.modules = nn::lora_modules_for_targets(c, {"all-linear"});
  return std::make_unique<nn::Decoder>(c, dtype, nn::GroupLayout{}, lora, nn::GroupLayout{},
                                       std::function<bool(int)>{}, quantize);
}

class Bnb4bitExport : public ::testing::TestWithParam<quant::QuantOptions> {};

TEST_P(Bnb4bitExport, A4bitDirectoryIsWrittenBackByteForByte) {
  const quant::QuantOptions o = GetParam();
  const std::string name = std::string(quant::quant_type_name(o.type)) + "_" +
                           std::to_string(o.block_size) + (o.double_quant ? "_dq" : "");
  const fs::path src = test_dir("src_" + name), out = test_dir("out_" + name);
  const testing::Bnb4bitModel m = testing::make_bnb4bit_model(src.string(), "", o);
  // The fixture stores the plain tensors in bf16: a bf16 run holds them as they are.
  std::unique_ptr<nn::Decoder> model = qlora_model(m.config, DType::kBF16, o);
  load_weights(src.string(), *model, "");

  HfExportOptions options;
  options.dtype = DType::kBF16;
  Bnb4bitExportOptions q;
  q.config.compute_dtype = "bfloat16";
  q.default_blob_dtype = "float32";  // the fixture's blobs (quantized from fp32 values)
  write_bnb4bit_model(*model, out.string(), options, q);
  EXPECT_EQ(slurp(src / "model.safetensors"), slurp(out / "model.safetensors"));
  EXPECT_EQ(slurp(src / "config.json"), slurp(out / "config.json"));
}

INSTANTIATE_TEST_SUITE_P(Settings, Bnb4bitExport,
                         ::testing::Values(quant::QuantOptions{quant::QuantType::kNF4, 64, true},
                                           quant::QuantOptions{quant::QuantType::kFP4, 128,
                                                               false}));

TEST(Bnb4bitExportModel, ABaseQuantizedAtLoadIsWrittenAsHeld) {
  const fs::path src = test_dir("q"), twin = test_dir("twin"), out = test_dir("out");
  const quant::QuantOptions o;  // nf4, 64, double quantization
  const testing::Bnb4bitModel m = testing::make_bnb4bit_model(src.string(), twin.string(), o);
  std::unique_ptr<nn::Decoder> model = qlora_model(m.config, DType::kF32, o);
  load_weights(twin.string(), *model, "");  // fp32 values, quantized here
  write_bnb4bit_model(*model, out.string(), HfExportOptions{}, Bnb4bitExportOptions{});

  const ckpt::Bnb4bitDir d = ckpt::Bnb4bitDir::open(out.string());
  EXPECT_EQ(d.config().quant_type, "nf4");
  EXPECT_TRUE(d.config().double_quant);
  int quantized = 0;
  for (const nn::Parameter* p : model->frozen_parameters()) {
    const quant::QuantizedWeight* w = model->quantized(*p);
    if (w == nullptr) continue;
    ++quantized;
    const quant::Quantized4bit held = w->to_quantized4bit();
    const ckpt::Bnb4bitWeight stored = d.read(p->name);
    EXPECT_EQ(stored.dtype, "bfloat16") << p->name;  // Bnb4bitExportOptions' default
    const quant::Quantized4bit back = to_quantized4bit(stored, p->name);
    EXPECT_EQ(back.packed, held.packed) << p->name;
    ASSERT_TRUE(back.nested.has_value() && held.nested.has_value()) << p->name;
    EXPECT_EQ(back.nested->codes, held.nested->codes) << p->name;
    EXPECT_EQ(back.nested->absmax, held.nested->absmax) << p->name;
    EXPECT_EQ(back.nested->offset, held.nested->offset) << p->name;
  }
  EXPECT_EQ(quantized, 14);         // 7 linears x 2 blocks
  EXPECT_EQ(d.plain().size(), 7u);  // embedding, 2 x 2 norms, final norm, lm_head
}

// GPT-2's Conv1D weights are (in, out); transformers quantizes their transpose, [out, in]. The
// export writes them so, and a model with a plain base reads the directory back as the values the
// 4-bit model computes with (Decoder::dequantized), and a QLoRA model as the same 4-bit weights.
TEST(Bnb4bitExportModel, Gpt2Conv1DIsStoredTransposedAndReadBack) {
  const nn::DecoderConfig c = nn::gpt2_config({/*n_layer=*/2, /*n_head=*/2, /*d_model=*/64,
                                               /*vocab_size=*/80, /*max_seq_len=*/32});
  const quant::QuantOptions o;
  auto lora = [&] {
    nn::LoraConfig l;
    l.r = 2;
    l.modules = nn::lora_modules_for_targets(c, {"c_attn"});
    return l;
  };
  auto quantized = std::make_unique<nn::Decoder>(c, DType::kF32, nn::GroupLayout{}, lora(),
                                                 nn::GroupLayout{}, std::function<bool(int)>{}, o);
  quantized->init_weights(3);
  const fs::path dir = test_dir("gpt2");
  write_bnb4bit_model(*quantized, dir.string(), HfExportOptions{}, Bnb4bitExportOptions{});
  const ckpt::Bnb4bitDir d = ckpt::Bnb4bitDir::open(dir.string());
  EXPECT_EQ(d.header("h.0.attn.c_attn.weight").shape, (std::vector<int64_t>{192, 64}));
  EXPECT_EQ(d.header("h.1.mlp.c_fc.weight").shape, (std::vector<int64_t>{256, 64}));

  auto plain = std::make_unique<nn::Decoder>(c, DType::kF32, nn::GroupLayout{}, lora());
  load_weights(dir.string(), *plain, "");
  auto again = std::make_unique<nn::Decoder>(c, DType::kF32, nn::GroupLayout{}, lora(),
                                             nn::GroupLayout{}, std::function<bool(int)>{}, o);
  load_weights(dir.string(), *again, "");
  const std::vector<const nn::Parameter*> q = quantized->frozen_parameters(),
                                          p = plain->frozen_parameters(),
                                          a = again->frozen_parameters();
  ASSERT_EQ(q.size(), p.size());
  ASSERT_EQ(q.size(), a.size());
  int transposed = 0;
  for (size_t i = 0; i < q.size(); ++i) {
    ASSERT_EQ(q[i]->name, p[i]->name);
    if (quantized->quantized(*q[i]) == nullptr) continue;
    ++transposed;
    EXPECT_EQ(p[i]->value.to_vector(), quantized->dequantized(*q[i])) << q[i]->name;
    EXPECT_EQ(again->quantized(*a[i])->to_quantized4bit().packed,
              quantized->quantized(*q[i])->to_quantized4bit().packed)
        << q[i]->name;
  }
  EXPECT_EQ(transposed, 8);  // c_attn, attn.c_proj, c_fc, mlp.c_proj x 2 blocks
}

TEST(Bnb4bitExportModel, AModelWithoutA4bitBaseIsRefused) {
  std::unique_ptr<nn::Decoder> model =
      qlora_model(testing::bnb4bit_tiny_llama(), DType::kF32, std::nullopt);
  try {
    write_bnb4bit_model(*model, test_dir("none").string(), HfExportOptions{},
                        Bnb4bitExportOptions{});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find("no 4-bit base"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(test_dir("none")));
}

}  // namespace
}  // namespace fd::engine
