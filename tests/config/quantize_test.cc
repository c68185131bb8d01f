// model.quantize (QLoRA's 4-bit base): the nested map, its defaults (bitsandbytes'), printing
// and overrides; every combination that cannot run refused with a reason; and a Hugging Face
// 4-bit directory (bitsandbytes, load_in_4bit) as model.init_from, whose quantization the recipe
// must state.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "lib/base/error.h"
#include "lib/config/model_dir.h"
#include "lib/nn/config/hf_config.h"
#include "tests/config/test_util.h"

namespace fd::config {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kBase = "data: {train: tests/config/data/tiny.txt}\nsteps: 1\n";

LoadResult parse(const std::string& extra, const std::vector<std::string>& overrides = {}) {
  return try_parse_recipe(std::string(kBase) + extra, "inline.yaml", overrides);
}

// to_yaml -> load again: equal, and printing again gives the same text.
void expect_round_trip(const Recipe& recipe) {
  const std::string text = to_yaml(recipe);
  LoadResult again = try_parse_recipe(text, "resolved.yaml");
  ASSERT_TRUE(again.ok()) << ::testing::PrintToString(again.errors) << "\n" << text;
  EXPECT_TRUE(again.recipe == recipe) << text;
  EXPECT_EQ(to_yaml(again.recipe), text);
}

TEST_F(ConfigTest, QuantizeIsOffByDefaultAndDefaultsToBitsandbytes) {
  LoadResult off = parse("");
  ASSERT_TRUE(off.ok()) << ::testing::PrintToString(off.errors);
  EXPECT_FALSE(off.recipe.model.quantize.has_value());
  LoadResult null = parse("model: {quantize: null}\n");
  ASSERT_TRUE(null.ok()) << ::testing::PrintToString(null.errors);
  EXPECT_FALSE(null.recipe.model.quantize.has_value());
  // An empty map turns it on with bitsandbytes' (and QLoRA's) defaults: nf4, 64, double quant.
  LoadResult on = parse("model: {quantize: {}}\nlora: {r: 2}\n");
  ASSERT_TRUE(on.ok()) << ::testing::PrintToString(on.errors);
  ASSERT_TRUE(on.recipe.model.quantize.has_value());
  EXPECT_EQ(on.recipe.model.quantize->type, QuantTypeName::kNf4);
  EXPECT_EQ(on.recipe.model.quantize->block_size, 64);
  EXPECT_TRUE(on.recipe.model.quantize->double_quant);
}

TEST_F(ConfigTest, QuantizePrintsAsANestedMapAndRoundTrips) {
  LoadResult r = parse(
      "model:\n  quantize:\n    type: fp4\n    block_size: 4096\n    double_quant: false\n"
      "lora: {r: 2}\n");
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  EXPECT_EQ(r.recipe.model.quantize, (QuantizeOptions{QuantTypeName::kFp4, 4096, false}));
  const std::string y = to_yaml(r.recipe);
  EXPECT_NE(y.find("  init_from: \"\"\n  quantize:\n    type: fp4\n    block_size: 4096\n"
                   "    double_quant: false\ndata:\n"),
            std::string::npos)
      << y;
  expect_round_trip(r.recipe);
  // Absent: written as null, as lora is, and read back as absent.
  LoadResult off = parse("");
  ASSERT_TRUE(off.ok());
  const std::string y_off = to_yaml(off.recipe);
  EXPECT_NE(y_off.find("  init_from: \"\"\n  quantize: null\ndata:\n"), std::string::npos) << y_off;
  expect_round_trip(off.recipe);
  // Every block size bitsandbytes supports loads and round-trips.
  for (int b : kQuantBlockSizes) {
    LoadResult s = parse("lora: {r: 2}\n", {"model.quantize.block_size=" + std::to_string(b)});
    ASSERT_TRUE(s.ok()) << b << ": " << ::testing::PrintToString(s.errors);
    EXPECT_EQ(s.recipe.model.quantize->block_size, b);
    expect_round_trip(s.recipe);
  }
}

TEST_F(ConfigTest, QuantizeOverridesReachNestedKeys) {
  LoadResult r = parse("lora: {r: 2}\n", {"model.quantize.type=fp4"});
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  EXPECT_EQ(r.recipe.model.quantize, (QuantizeOptions{QuantTypeName::kFp4, 64, true}));
  LoadResult off = parse("model: {quantize: {}}\nlora: {r: 2}\n", {"model.quantize=null"});
  ASSERT_TRUE(off.ok()) << ::testing::PrintToString(off.errors);
  EXPECT_FALSE(off.recipe.model.quantize.has_value());
  EXPECT_EQ(parse("lora: {r: 2}\n", {"model.quantize.blocksize=128"}).errors,
            (Lines{"override 'model.quantize.blocksize=128': model.quantize.blocksize: unknown "
                   "key; did you mean 'block_size'?"}));
}

TEST_F(ConfigTest, QuantizeBadValues) {
  auto errors = [](const std::string& quantize) {
    return parse("model: {quantize: " + quantize + "}\nlora: {r: 2}\n").errors;
  };
  EXPECT_EQ(errors("{type: int8}"),
            (Lines{"inline.yaml:3:26: model.quantize.type: expected one of nf4, fp4, got "
                   "'int8'"}));
  EXPECT_EQ(errors("{type: nf5}"),
            (Lines{"inline.yaml:3:26: model.quantize.type: expected one of nf4, fp4, got "
                   "'nf5'; did you mean 'nf4'?"}));
  const std::string sizes =
      "use one of 32, 64, 128, 256, 512, 1024, 2048, 4096 (64 is bitsandbytes' and QLoRA's "
      "default)";
  EXPECT_EQ(errors("{block_size: 100}"),
            (Lines{"inline.yaml:3:32: model.quantize.block_size: 100 is not a block size of "
                   "bitsandbytes' 4-bit kernels; " +
                   sizes}));
  EXPECT_EQ(errors("{block_size: 16}"),
            (Lines{"inline.yaml:3:32: model.quantize.block_size: 16 is not a block size of "
                   "bitsandbytes' 4-bit kernels; " +
                   sizes}));
  EXPECT_EQ(errors("{block_size: 8192}").size(), 1u);
  EXPECT_EQ(errors("{block_size: -64}").size(), 1u);
  EXPECT_EQ(errors("{block_size: big}"),
            (Lines{"inline.yaml:3:32: model.quantize.block_size: expected an integer, got "
                   "'big'"}));
  EXPECT_EQ(errors("{double_quant: maybe}"),
            (Lines{"inline.yaml:3:34: model.quantize.double_quant: expected true or false, got "
                   "'maybe'"}));
  EXPECT_EQ(errors("{typ: nf4}"),
            (Lines{"inline.yaml:3:20: model.quantize.typ: unknown key; did you mean 'type'?"}));
  EXPECT_EQ(errors("nf4"),
            (Lines{"inline.yaml:3:19: model.quantize: expected a map ({type: nf4 | fp4, "
                   "block_size: N, double_quant: true | false}) or null, got 'nf4'"}));
  // A bad value is one message: the refusals that need model.quantize do not add a second.
  EXPECT_EQ(parse("model: {quantize: {block_size: 3}}\n").errors.size(), 1u);
}

TEST_F(ConfigTest, QuantizeWithoutLoraIsRefused) {
  EXPECT_EQ(parse("model:\n  quantize: {type: nf4}\n").errors,
            (Lines{"inline.yaml:4:13: model.quantize: the 4-bit base is frozen: QLoRA trains "
                   "adapters over it; add a lora section (lora: {r: 16}, say) or remove "
                   "model.quantize"}));
  EXPECT_EQ(parse("model: {quantize: {}}\n", {"lora=null"}).errors.size(), 1u);
  EXPECT_TRUE(parse("model: {quantize: {}}\n", {"lora={r: 4}"}).ok());
}

TEST_F(ConfigTest, QuantizeWithParameterOffloadIsRefused) {
  const std::string offload =
      "zero:\n  stage: 3\n  offload_optimizer: {device: nvme, path: tests/config/data}\n"
      "  offload_params: {device: nvme}\n";
  // Without model.quantize the layout loads; with it, parameter offload is refused and the
  // message points at the optimizer offload that does work with it.
  ASSERT_TRUE(parse(offload + "lora: {r: 2}\n").ok());
  const std::vector<std::string> e =
      parse(offload + "lora: {r: 2}\nmodel: {quantize: {}}\n").errors;
  ASSERT_EQ(e.size(), 1u) << ::testing::PrintToString(e);
  EXPECT_EQ(e[0],
            "inline.yaml:6:28: zero.offload_params.device: nvme with model.quantize: parameter "
            "offload of a 4-bit base is not supported; the base in 4 bits is small enough to keep "
            "resident (about a quarter of its bf16 size; fdtrain estimate says how large), and "
            "only the adapters train: remove zero.offload_params and, to save memory, offload "
            "the adapters' optimizer state (zero.offload_optimizer), which is supported");
  // The optimizer's offload alone is fine.
  EXPECT_TRUE(parse("zero: {stage: 2, offload_optimizer: {device: nvme, path: tests/config/data}}\n"
                    "lora: {r: 2}\nmodel: {quantize: {}}\n")
                  .ok());
}

TEST_F(ConfigTest, QuantizeOnCudaIsAccepted) {
  // The 4-bit base dequantizes on the GPU (kernels/quant_4bit.cu): QLoRA trains there too.
  EXPECT_TRUE(parse("model: {quantize: {}}\nlora: {r: 2}\ndevice: cuda\n").ok());
  EXPECT_TRUE(parse("model: {quantize: {type: fp4, double_quant: false}}\nlora: {r: 2}\n"
                    "device: cuda\nzero: {stage: 3}\n")
                  .ok());
  // The other refusals still apply on the GPU.
  EXPECT_FALSE(parse("model: {quantize: {}}\ndevice: cuda\n").ok());
}

// A 4-bit Hugging Face directory: tests/golden/llama/llama3's config.json with the
// quantization_config transformers saved in tests/ckpt/bnb4bit_python/nf4_dq (nf4, double
// quantization). Only config.json is read when the recipe is loaded; the weights are checked
// when they are loaded (ckpt::Bnb4bitDir).
class Bnb4bitDirTest : public ConfigTest {
 protected:
  void SetUp() override {
    ConfigTest::SetUp();
    // One directory per test: ctest runs the tests of this binary in parallel processes.
    dir_ = (fs::path(::testing::TempDir()) /
            ("fdtrain_bnb4bit_" +
             std::string(::testing::UnitTest::GetInstance()->current_test_info()->name())))
               .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    write_config([](json&) {});
  }
  void TearDown() override { fs::remove_all(dir_); }

  static json read(const std::string& path) {
    std::ifstream in(path);
    return json::parse(in);
  }
  // Writes DIR/config.json, its quantization_config edited by `edit`.
  template <typename F>
  void write_config(F edit) {
    json c = read("tests/golden/llama/llama3/config.json");
    c["quantization_config"] =
        read("tests/ckpt/bnb4bit_python/nf4_dq/config.json")["quantization_config"];
    edit(c["quantization_config"]);
    std::ofstream(dir_ + "/config.json") << c.dump(2) << "\n";
  }
  // A recipe starting from the directory; `model_keys` (", quantize: {}") go in its model
  // section, `extra` after it.
  LoadResult load(const std::string& model_keys, const std::string& extra,
                  const std::vector<std::string>& overrides = {}) {
    return try_parse_recipe(
        "model: {init_from: " + dir_ + model_keys + "}\n" +
            "data: {format: tokens, train: tests/config/data/tiny.txt, seq_len: 32}\nsteps: 1\n" +
            extra,
        "inline.yaml", overrides);
  }
  std::string dir_;
};

TEST_F(Bnb4bitDirTest, LoadsWithLoraAndTheSameQuantization) {
  LoadResult r = load(", quantize: {type: nf4, double_quant: true}", "lora: {r: 2}\n");
  ASSERT_TRUE(r.ok()) << ::testing::PrintToString(r.errors);
  // The model section is config.json's (without its quantization_config); the recipe's
  // quantize section is kept.
  EXPECT_EQ(r.recipe.model.arch, Arch::kLlama);
  EXPECT_EQ(r.recipe.model.n_layer, 2);
  EXPECT_EQ(r.recipe.model.d_ff, 88);
  EXPECT_EQ(r.recipe.model.init_from, dir_);
  EXPECT_EQ(r.recipe.model.quantize, (QuantizeOptions{QuantTypeName::kNf4, 64, true}));
  expect_round_trip(r.recipe);
  // The defaults are the directory's here: `quantize: {}` says the same.
  EXPECT_TRUE(load(", quantize: {}", "lora: {r: 2}\n").ok());
}

TEST_F(Bnb4bitDirTest, WithoutLoraIsRefused) {
  const std::vector<std::string> e = load(", quantize: {}", "").errors;
  ASSERT_EQ(e.size(), 1u) << ::testing::PrintToString(e);
  EXPECT_EQ(e[0], "inline.yaml:1:20: model.init_from: " + dir_ +
                      " is a 4-bit (bitsandbytes) model directory: its base can only be trained "
                      "with LoRA adapters over it (QLoRA); add a lora section (lora: {r: 16}, "
                      "say)");
}

TEST_F(Bnb4bitDirTest, WithoutModelQuantizeIsRefusedWithTheSectionToAdd) {
  const std::vector<std::string> e = load("", "lora: {r: 2}\n").errors;
  ASSERT_EQ(e.size(), 1u) << ::testing::PrintToString(e);
  EXPECT_EQ(e[0], "inline.yaml:1:20: model.init_from: " + dir_ +
                      " is a 4-bit (bitsandbytes) model directory: its weights are used as "
                      "stored, in 4 bits, so the recipe must say so: add to the model section "
                      "`quantize: {type: nf4, double_quant: true}` (as its config.json's "
                      "quantization_config says; block_size is the weights' own, checked when "
                      "they are loaded)");
  // fp4 without double quantization: the section to add says so.
  write_config([](json& q) {
    q["bnb_4bit_quant_type"] = "fp4";
    q["bnb_4bit_use_double_quant"] = false;
  });
  const std::vector<std::string> fp4 = load("", "lora: {r: 2}\n").errors;
  ASSERT_EQ(fp4.size(), 1u) << ::testing::PrintToString(fp4);
  EXPECT_NE(fp4[0].find("`quantize: {type: fp4, double_quant: false}`"), std::string::npos)
      << fp4[0];
  // BitsAndBytesConfig's defaults (fp4, no double quantization) for keys the file leaves out.
  write_config([](json& q) {
    q.erase("bnb_4bit_quant_type");
    q.erase("bnb_4bit_use_double_quant");
  });
  EXPECT_TRUE(load(", quantize: {type: fp4, double_quant: false}", "lora: {r: 2}\n").ok());
  // Neither lora nor model.quantize: both are said.
  EXPECT_EQ(load("", "").errors.size(), 2u);
}

TEST_F(Bnb4bitDirTest, QuantizationThatDisagreesIsRefusedWithBoth) {
  const std::vector<std::string> e =
      load("", "lora: {r: 2}\n", {"model.quantize={type: fp4, double_quant: false}"}).errors;
  ASSERT_EQ(e.size(), 2u) << ::testing::PrintToString(e);
  EXPECT_EQ(e[0],
            "override 'model.quantize={type: fp4, double_quant: false}': "
            "model.quantize.type: is fp4 but " +
                dir_ +
                "/config.json's quantization_config says bnb_4bit_quant_type nf4: a 4-bit "
                "directory's weights are used as stored, never re-quantized; set type: nf4");
  EXPECT_EQ(e[1],
            "override 'model.quantize={type: fp4, double_quant: false}': "
            "model.quantize.double_quant: is false but " +
                dir_ +
                "/config.json's quantization_config says bnb_4bit_use_double_quant true: "
                "a 4-bit directory's weights are used as stored, never re-quantized; set "
                "double_quant: true");
  // A value left to its default that disagrees is named at the section.
  write_config([](json& q) { q["bnb_4bit_quant_type"] = "fp4"; });
  const std::vector<std::string> d = load(", quantize: {}", "lora: {r: 2}\n").errors;
  ASSERT_EQ(d.size(), 1u) << ::testing::PrintToString(d);
  EXPECT_EQ(d[0].rfind("inline.yaml:1:", 0), 0u) << d[0];
  EXPECT_NE(d[0].find("model.quantize.type: is nf4 but"), std::string::npos) << d[0];
  EXPECT_NE(d[0].find("set type: fp4"), std::string::npos) << d[0];
}

TEST_F(Bnb4bitDirTest, OtherQuantizationsAreRefusedByName) {
  auto only_error = [&] {
    const std::vector<std::string> e = load(", quantize: {}", "lora: {r: 2}\n").errors;
    EXPECT_EQ(e.size(), 1u) << ::testing::PrintToString(e);
    return e.empty() ? std::string() : e[0];
  };
  const std::string at = "inline.yaml:1:20: model.init_from: " + dir_ + "/config.json: ";
  write_config([](json& q) {
    q["load_in_4bit"] = q["_load_in_4bit"] = false;
    q["load_in_8bit"] = q["_load_in_8bit"] = true;
  });
  EXPECT_EQ(only_error(),
            at + "quantization_config says load_in_8bit (bitsandbytes LLM.int8()): 8-bit weights "
                 "cannot be read; fdtrain reads bitsandbytes 4-bit directories (load_in_4bit) as "
                 "a QLoRA base; give the model in bf16/fp32 (model.quantize quantizes it) or "
                 "saved with load_in_4bit");
  write_config([](json& q) { q = json{{"quant_method", "gptq"}, {"bits", 4}}; });
  EXPECT_EQ(only_error(),
            at + "quantization_config.quant_method is \"gptq\": a model quantized that way "
                 "cannot be read; fdtrain reads bitsandbytes 4-bit directories (load_in_4bit) "
                 "as a QLoRA base; give the model in bf16/fp32 (model.quantize quantizes it) or "
                 "saved with load_in_4bit");
  write_config([](json& q) { q["load_in_4bit"] = q["_load_in_4bit"] = false; });
  EXPECT_NE(only_error().find("quantization_config does not say load_in_4bit: true"),
            std::string::npos);
  write_config([](json& q) { q["bnb_4bit_quant_type"] = "int4"; });
  EXPECT_EQ(only_error(), at + "quantization_config.bnb_4bit_quant_type = \"int4\": expected "
                               "\"nf4\" or \"fp4\" (bitsandbytes' 4-bit types)");
  write_config([](json& q) { q["bnb_4bit_use_double_quant"] = "yes"; });
  EXPECT_EQ(only_error(), at + "quantization_config.bnb_4bit_use_double_quant = \"yes\": "
                               "expected true or false");
  write_config([](json& q) { q = 4; });
  EXPECT_NE(only_error().find("quantization_config = 4: expected an object"), std::string::npos);
}

// Outside a recipe (eval, generate, an export's source), a quantized config.json is refused
// by name, not as an unknown key to remove; read_model_directory reads it without the key.
TEST_F(Bnb4bitDirTest, TheModelReaderNamesTheQuantization) {
  try {
    nn::read_hf_config(dir_);
    FAIL() << "a quantized config.json was read as a plain model";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_NE(std::string(e.what()).find(dir_ + "/config.json: has a quantization_config: the "
                                                "weights are quantized, not plain tensors"),
              std::string::npos)
        << e.what();
  }
  const ModelDirectory d = read_model_directory(dir_);
  EXPECT_EQ(d.model.n_layer, 2);
  ASSERT_TRUE(d.quantization.has_value());
  EXPECT_EQ(d.quantization->type, QuantTypeName::kNf4);
  EXPECT_TRUE(d.quantization->double_quant);
  EXPECT_FALSE(read_model_directory("tests/golden/llama/llama3").quantization.has_value());
}

}  // namespace
}  // namespace fd::config
