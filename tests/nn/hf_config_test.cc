// read_hf_config: the config.json files of real checkpoints (as published on
// the hub) read field by field, parameter counts against the published ones,
// and the files fdtrain must refuse with a message naming the field.
#include "lib/nn/config/hf_config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include "lib/base/error.h"
#include "lib/nn/decoder.h"

namespace fd::nn {
namespace {

namespace fs = std::filesystem;

// <temp>/fd_hf_config_test_<pid>, removed when the test binary exits.
const fs::path& test_root() {
  struct Root {
    fs::path path = fs::temp_directory_path() / ("fd_hf_config_test_" + std::to_string(::getpid()));
    ~Root() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  };
  static const Root root;
  return root.path;
}

// Writes `text` as <test_root>/<name>/config.json and returns the directory.
std::string write_model_dir(const std::string& name, const std::string& text) {
  fs::path dir = test_root() / name;
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << text;
  return dir.string();
}

// The message of the usage error `text` is refused with ("" if accepted).
std::string refusal(const std::string& text) {
  try {
    parse_hf_config(text, "test/config.json");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    return e.what();
  }
  return "";
}

void expect_mentions(const std::string& message, std::initializer_list<const char*> parts) {
  EXPECT_FALSE(message.empty()) << "accepted";
  for (const char* p : parts)
    EXPECT_NE(message.find(p), std::string::npos) << p << " not in: " << message;
}

const char* kLlama32_1B = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

const char* kSmolLM2_135M = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 0,
  "eos_token_id": 0,
  "hidden_act": "silu",
  "hidden_size": 576,
  "initializer_range": 0.041666666666666664,
  "intermediate_size": 1536,
  "is_llama_config": true,
  "max_position_embeddings": 8192,
  "model_type": "llama",
  "num_attention_heads": 9,
  "num_hidden_layers": 30,
  "num_key_value_heads": 3,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_interleaved": false,
  "rope_scaling": null,
  "rope_theta": 100000,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1",
  "use_cache": true,
  "vocab_size": 49152
})";

// Mistral-7B-v0.1, with `sliding_window` substituted.
std::string mistral_7b(const std::string& sliding_window) {
  return R"({
  "architectures": ["MistralForCausalLM"],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mistral",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0,
  "sliding_window": )" +
         sliding_window + R"(,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.34.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
})";
}

const char* kQwen25_05B = R"({
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 32768,
  "max_window_layers": 24,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 32768,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

const char* kQwen3_06B = R"({
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

const char* kGpt2 = R"({
  "activation_function": "gelu_new",
  "architectures": ["GPT2LMHeadModel"],
  "attn_pdrop": 0.1,
  "bos_token_id": 50256,
  "embd_pdrop": 0.1,
  "eos_token_id": 50256,
  "initializer_range": 0.02,
  "layer_norm_epsilon": 1e-05,
  "model_type": "gpt2",
  "n_ctx": 1024,
  "n_embd": 768,
  "n_head": 12,
  "n_layer": 12,
  "n_positions": 1024,
  "resid_pdrop": 0.1,
  "summary_activation": null,
  "summary_first_dropout": 0.1,
  "summary_proj_to_labels": true,
  "summary_type": "cls_index",
  "summary_use_proj": true,
  "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}},
  "vocab_size": 50257
})";

// Replaces the first occurrence of `from` in `text` by `to` (which must exist).
std::string edit(std::string text, const std::string& from, const std::string& to) {
  size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

TEST(HfConfig, Llama32_1B) {
  DecoderConfig c = read_hf_config(write_model_dir("llama32_1b", kLlama32_1B));
  EXPECT_EQ(c.family, ModelFamily::kLlama);
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.intermediate_size, 8192);
  EXPECT_EQ(c.num_layers, 16);
  EXPECT_EQ(c.num_heads, 32);
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_EQ(c.norm, NormKind::kRmsNorm);
  EXPECT_DOUBLE_EQ(c.norm_eps, 1e-5);
  EXPECT_EQ(c.positions, PositionKind::kRope);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling.kind, RopeScalingKind::kLlama3);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 32.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.o_proj_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.mlp, MlpKind::kSwiGlu);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 128000);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{128001});
  EXPECT_EQ(c.num_params(), 1'235'814'400);
}

TEST(HfConfig, Llama32_1B_FileAndEosList) {
  // The file itself, not its directory; an instruct-style eos list.
  std::string dir =
      write_model_dir("llama32_1b_eos", edit(kLlama32_1B, R"("eos_token_id": 128001)",
                                             R"("eos_token_id": [128001, 128008, 128009])"));
  DecoderConfig c = read_hf_config(dir + "/config.json");
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
}

TEST(HfConfig, SmolLM2_135M) {
  DecoderConfig c = read_hf_config(write_model_dir("smollm2_135m", kSmolLM2_135M));
  EXPECT_EQ(c.family, ModelFamily::kLlama);
  EXPECT_EQ(c.hidden_size, 576);
  EXPECT_EQ(c.intermediate_size, 1536);
  EXPECT_EQ(c.num_layers, 30);
  EXPECT_EQ(c.num_heads, 9);
  EXPECT_EQ(c.num_kv_heads, 3);
  EXPECT_EQ(c.head_dim, 64);  // 576 / 9: no head_dim in the file
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_EQ(c.max_position_embeddings, 8192);
  EXPECT_DOUBLE_EQ(c.rope_theta, 100000.0);
  EXPECT_EQ(c.rope_scaling.kind, RopeScalingKind::kDefault);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 0);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{0});
  EXPECT_EQ(c.num_params(), 134'515'008);
}

TEST(HfConfig, Mistral7BSlidingWindowIsRefused) {
  expect_mentions(refusal(mistral_7b("4096")),
                  {"test/config.json", "sliding_window", "4096", "not supported"});
}

TEST(HfConfig, Mistral7BWithoutSlidingWindow) {
  DecoderConfig c = parse_hf_config(mistral_7b("null"), "mistral");
  EXPECT_EQ(c.family, ModelFamily::kMistral);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 14336);
  EXPECT_EQ(c.num_layers, 32);
  EXPECT_EQ(c.num_heads, 32);
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.vocab_size, 32000);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{2});
  EXPECT_EQ(c.num_params(), 7'241'732'096);  // Mistral-7B-v0.1's published count
}

TEST(HfConfig, Qwen25_05B) {
  DecoderConfig c = read_hf_config(write_model_dir("qwen25_05b", kQwen25_05B));
  EXPECT_EQ(c.family, ModelFamily::kQwen2);
  EXPECT_EQ(c.hidden_size, 896);
  EXPECT_EQ(c.intermediate_size, 4864);
  EXPECT_EQ(c.num_layers, 24);
  EXPECT_EQ(c.num_heads, 14);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_DOUBLE_EQ(c.norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_TRUE(c.attention_bias);  // always, though the file does not say
  EXPECT_FALSE(c.o_proj_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.num_params(), 494'032'768);
}

TEST(HfConfig, Qwen2SlidingWindowOnIsRefused) {
  expect_mentions(
      refusal(edit(kQwen25_05B, R"("use_sliding_window": false)", R"("use_sliding_window": true)")),
      {"use_sliding_window", "true", "not supported"});
}

TEST(HfConfig, Qwen3_06B) {
  DecoderConfig c = read_hf_config(write_model_dir("qwen3_06b", kQwen3_06B));
  EXPECT_EQ(c.family, ModelFamily::kQwen3);
  EXPECT_EQ(c.hidden_size, 1024);
  EXPECT_EQ(c.intermediate_size, 3072);
  EXPECT_EQ(c.num_layers, 28);
  EXPECT_EQ(c.num_heads, 16);
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(c.head_dim, 128);  // not 1024 / 16
  EXPECT_EQ(c.max_position_embeddings, 40960);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{151645});
  EXPECT_EQ(c.num_params(), 596'049'920);
}

TEST(HfConfig, RopeParametersOfNewerTransformers) {
  std::string text = edit(kLlama32_1B, R"("rope_theta": 500000.0,)", "");
  text = edit(text, R"("rope_scaling": {)",
              R"("rope_parameters": {
    "rope_theta": 500000.0,)");
  DecoderConfig c = parse_hf_config(text, "v5");
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling.kind, RopeScalingKind::kLlama3);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 32.0);
}

// Both rope_scaling and rope_parameters: accepted when they agree, refused when
// they do not (which one transformers reads would decide the model).
TEST(HfConfig, RopeScalingAndRopeParametersMustAgree) {
  const std::string both = edit(kLlama32_1B, R"("rope_theta": 500000.0,)",
                                R"("rope_theta": 500000.0,
  "rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 32.0,
    "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},)");
  EXPECT_EQ(parse_hf_config(both, "both").rope_scaling.factor, 32.0);
  expect_mentions(refusal(edit(both, R"("factor": 32.0,
    "low_freq_factor")",
                               R"("factor": 8.0,
    "low_freq_factor")")),
                  {"rope_parameters", "disagrees with rope_scaling"});
}

TEST(HfConfig, Gpt2) {
  DecoderConfig c = read_hf_config(write_model_dir("gpt2", kGpt2));
  EXPECT_EQ(c.family, ModelFamily::kGpt2);
  EXPECT_EQ(c.hidden_size, 768);
  EXPECT_EQ(c.intermediate_size, 3072);
  EXPECT_EQ(c.num_layers, 12);
  EXPECT_EQ(c.num_heads, 12);
  EXPECT_EQ(c.num_kv_heads, 12);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.vocab_size, 50257);
  EXPECT_EQ(c.max_position_embeddings, 1024);
  EXPECT_EQ(c.norm, NormKind::kLayerNorm);
  EXPECT_DOUBLE_EQ(c.norm_eps, 1e-5);
  EXPECT_EQ(c.positions, PositionKind::kLearned);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_TRUE(c.o_proj_bias);
  EXPECT_EQ(c.mlp, MlpKind::kGeluTanh);
  EXPECT_TRUE(c.mlp_bias);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 50256);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{50256});
  EXPECT_EQ(c.num_params(), 124'439'808);
}

TEST(HfConfig, Gpt2ConfigMatchesGpt) {
  GptConfig g;
  g.n_layer = 12;
  g.n_head = 12;
  g.d_model = 768;
  g.vocab_size = 50257;
  g.max_seq_len = 1024;
  DecoderConfig c = gpt2_config(g);
  EXPECT_NO_THROW(c.validate());
  EXPECT_EQ(c.num_params(), 124'439'808);
  DecoderConfig hf = parse_hf_config(kGpt2, "gpt2");
  EXPECT_EQ(c.num_params(), hf.num_params());
  // Every switch agrees with the config.json reading.
  EXPECT_EQ(c.summary(), hf.summary());
  EXPECT_EQ(c.norm, hf.norm);
  EXPECT_EQ(c.positions, hf.positions);
  EXPECT_EQ(c.mlp, hf.mlp);
  EXPECT_EQ(c.attention_bias, hf.attention_bias);
  EXPECT_EQ(c.o_proj_bias, hf.o_proj_bias);
  EXPECT_EQ(c.mlp_bias, hf.mlp_bias);
  EXPECT_EQ(c.tie_word_embeddings, hf.tie_word_embeddings);
}

TEST(HfConfig, UnknownKeyIsRefused) {
  expect_mentions(refusal(edit(kQwen3_06B, R"("head_dim": 128,)",
                               R"("head_dim": 128, "partial_rotary_factor": 0.5,)")),
                  {"test/config.json", "partial_rotary_factor", "0.5", "unknown key"});
  // A key of another family's config class is unknown here too.
  expect_mentions(
      refusal(edit(mistral_7b("null"), R"("rope_theta")", R"("mlp_bias": true, "rope_theta")")),
      {"mlp_bias", "unknown key"});
  // ... and inside rope_scaling.
  expect_mentions(refusal(edit(kLlama32_1B, R"("factor": 32.0,)",
                               R"("factor": 32.0, "attention_factor": 2.0,)")),
                  {"rope_scaling", "attention_factor", "unknown key"});
}

TEST(HfConfig, UnsupportedValuesAreRefused) {
  expect_mentions(
      refusal(edit(kLlama32_1B, R"("model_type": "llama")", R"("model_type": "gemma")")),
      {"model_type", "gemma", "gpt2, llama, mistral, qwen2, qwen3"});
  expect_mentions(refusal(edit(kLlama32_1B, R"("rope_type": "llama3")", R"("rope_type": "yarn")")),
                  {"rope_type", "yarn", "default, linear and llama3"});
  expect_mentions(refusal(edit(kLlama32_1B, R"("hidden_act": "silu")", R"("hidden_act": "gelu")")),
                  {"hidden_act", "gelu", "silu"});
  expect_mentions(refusal(edit(kGpt2, R"("gelu_new")", R"("relu")")),
                  {"activation_function", "relu", "gelu_new"});
  expect_mentions(refusal(edit(kLlama32_1B, R"("pretraining_tp": 1)", R"("pretraining_tp": 2)")),
                  {"pretraining_tp", "2"});
  expect_mentions(
      refusal(edit(kSmolLM2_135M, R"("rope_interleaved": false)", R"("rope_interleaved": true)")),
      {"rope_interleaved", "true"});
  expect_mentions(
      refusal(edit(kQwen3_06B, R"("attention_dropout": 0.0)", R"("attention_dropout": 0.1)")),
      {"attention_dropout", "0.1"});
  expect_mentions(refusal(edit(kLlama32_1B, R"("hidden_size": 2048)", R"("hidden_size": "2048")")),
                  {"hidden_size", "\"2048\"", "integer"});
}

TEST(HfConfig, MissingFieldIsRefused) {
  expect_mentions(refusal(edit(kLlama32_1B, R"("intermediate_size": 8192,)", "")),
                  {"test/config.json", "intermediate_size", "missing"});
  expect_mentions(refusal(edit(kGpt2, R"("n_embd": 768,)", "")), {"n_embd", "missing"});
  expect_mentions(refusal(R"({"hidden_size": 8})"), {"model_type", "missing"});
}

TEST(HfConfig, MalformedJsonIsRefused) {
  std::string text = kLlama32_1B;
  text.resize(200);
  expect_mentions(refusal(text), {"test/config.json", "not valid JSON", "line 9, column"});
  expect_mentions(refusal("[1, 2]"), {"not a JSON object"});
  try {
    read_hf_config(write_model_dir("empty_dir_has_no_config", "{}") + "/missing.json");
    ADD_FAILURE() << "accepted a missing file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing.json"), std::string::npos) << e.what();
  }
}

// Every integer is checked to fit its type and its meaning before use: nothing
// is narrowed (2^32 + 2 layers read as 2) or wraps (2^64 - 1 read as -1).
TEST(HfConfig, IntegersOutOfRangeAreRefused) {
  const std::pair<const char*, const char*> llama[] = {
      {R"("num_hidden_layers": 16)", R"("num_hidden_layers": 4294967298)"},
      {R"("num_hidden_layers": 16)", R"("num_hidden_layers": 0)"},
      {R"("num_attention_heads": 32)", R"("num_attention_heads": 4294967300)"},
      {R"("num_key_value_heads": 8)", R"("num_key_value_heads": 64)"},
      {R"("head_dim": 64)", R"("head_dim": -64)"},
      {R"("hidden_size": 2048)", R"("hidden_size": 18446744073709551615)"},
      {R"("intermediate_size": 8192)", R"("intermediate_size": 1000000000000)"},
      {R"("max_position_embeddings": 131072)", R"("max_position_embeddings": 4294967360)"},
      {R"("max_position_embeddings": 131072)", R"("max_position_embeddings": 1000000000000)"},
      {R"("vocab_size": 128256)", R"("vocab_size": 1000000000000)"},
      {R"("original_max_position_embeddings": 8192)",
       R"("original_max_position_embeddings": 9223372036854775808)"},
      {R"("bos_token_id": 128000)", R"("bos_token_id": -1)"},
      {R"("bos_token_id": 128000)", R"("bos_token_id": 128256)"},
      {R"("eos_token_id": 128001)", R"("eos_token_id": [128001, 1099511627776])"},
      {R"("eos_token_id": 128001)", R"("eos_token_id": 18446744073709551615)"},
  };
  for (const auto& [from, to] : llama) {
    const std::string key = std::string(to).substr(1, std::string(to).find('"', 1) - 1);
    const std::string value = std::string(to).substr(std::string(to).find(": ") + 2);
    const std::string why = refusal(edit(kLlama32_1B, from, to));
    expect_mentions(why, {"test/config.json", key.c_str(), "expected an integer in ["});
    // The value as the file has it (a list: its bad element), never a wrapped one.
    EXPECT_TRUE(why.find(value) != std::string::npos ||
                why.find("1099511627776") != std::string::npos)
        << why;
  }
  expect_mentions(refusal(edit(kGpt2, R"("n_layer": 12)", R"("n_layer": 4294967308)")),
                  {"n_layer", "4294967308", "[1, 4096]"});
  expect_mentions(
      refusal(edit(edit(kGpt2, R"("n_positions": 1024)", R"("n_positions": 4294968320)"),
                   R"("n_ctx": 1024)", R"("n_ctx": 4294968320)")),
      {"n_positions", "4294968320", "positions are 32-bit"});
  expect_mentions(refusal(edit(kGpt2, R"("vocab_size": 50257)", R"("vocab_size": 50257.5)")),
                  {"vocab_size", "50257.5", "expected an integer"});
  // Each in range, together too large to hold: refused by its count, before any allocation.
  std::string huge = edit(kLlama32_1B, R"("hidden_size": 2048)", R"("hidden_size": 1048576)");
  huge = edit(huge, R"("intermediate_size": 8192)", R"("intermediate_size": 4194304)");
  huge = edit(huge, R"("num_hidden_layers": 16)", R"("num_hidden_layers": 4096)");
  expect_mentions(refusal(huge), {"test/config.json", "parameters", "more than the"});
}

TEST(HfConfig, NumbersOutOfRangeAreRefused) {
  // 1e999 is no double: a clean error naming the file, not the parser's exception.
  const std::string inf = refusal(edit(kLlama32_1B, "500000.0", "1e999"));
  expect_mentions(inf, {"test/config.json", "1e999"});
  EXPECT_EQ(inf.find("json.exception"), std::string::npos) << inf;
  expect_mentions(refusal(edit(kLlama32_1B, "500000.0", "1e300")),
                  {"rope_theta", "1e+300", "expected a number in (0, "});
  expect_mentions(refusal(edit(kLlama32_1B, R"("rms_norm_eps": 1e-05)", R"("rms_norm_eps": -1)")),
                  {"rms_norm_eps", "-1"});
  expect_mentions(refusal(edit(kLlama32_1B, R"("factor": 32.0)", R"("factor": 0)")),
                  {"factor", "0"});
  expect_mentions(refusal(edit(kLlama32_1B, R"("factor": 32.0)", R"("factor": 1e300)")),
                  {"factor", "1e+300"});
}

TEST(HfConfig, NonRegularConfigJsonIsNamed) {
  const fs::path dir = test_root() / "config_is_a_dir";
  fs::create_directories(dir / "config.json");
  try {
    read_hf_config(dir.string());
    ADD_FAILURE() << "accepted a directory as config.json";
  } catch (const Error& e) {
    expect_mentions(e.what(), {"config.json", "is a directory"});
  }
}

TEST(HfConfig, InconsistentModelIsRefused) {
  expect_mentions(
      refusal(edit(kQwen25_05B, R"("num_key_value_heads": 2)", R"("num_key_value_heads": 4)")),
      {"test/config.json", "num_kv_heads (4) does not divide num_heads (14)"});
  expect_mentions(refusal(edit(kQwen3_06B, R"("head_dim": 128)", R"("head_dim": 127)")),
                  {"head_dim is 127", "even"});
  expect_mentions(
      refusal(edit(kSmolLM2_135M, R"("num_attention_heads": 9)", R"("num_attention_heads": 7)")),
      {"num_attention_heads", "does not divide hidden_size"});
  expect_mentions(
      refusal(edit(kLlama32_1B, R"("eos_token_id": 128001)", R"("eos_token_id": 128256)")),
      {"eos_token_id = 128256", "expected an integer in [0, 128255]", "below vocab_size"});
}

// hf_config_json: read back, every family gives the configuration it was written from.
void expect_round_trip(const DecoderConfig& c) {
  const std::string text = hf_config_json(c, "bfloat16");
  DecoderConfig back = parse_hf_config(text, "written");
  EXPECT_TRUE(back == c) << c.summary() << " came back as " << back.summary() << " from\n" << text;
  // As transformers writes it: sorted keys, 2-space indent, final newline.
  EXPECT_EQ(text.substr(0, 4), "{\n  ");
  EXPECT_EQ(text.back(), '\n');
  std::vector<std::string> keys;
  for (size_t at = text.find("\n  \""); at != std::string::npos; at = text.find("\n  \"", at + 1))
    keys.push_back(text.substr(at + 4, text.find('"', at + 4) - at - 4));
  EXPECT_TRUE(std::is_sorted(keys.begin(), keys.end())) << text;
  EXPECT_NE(text.find("\"torch_dtype\": \"bfloat16\""), std::string::npos) << text;
}

TEST(HfConfigJson, Gpt2RoundTrips) {
  DecoderConfig c = parse_hf_config(kGpt2, "gpt2");
  expect_round_trip(c);
  const std::string text = hf_config_json(c);
  for (const char* key :
       {"\"model_type\": \"gpt2\"", "\"GPT2LMHeadModel\"", "\"n_embd\": 768", "\"n_layer\": 12",
        "\"n_head\": 12", "\"n_positions\": 1024", "\"n_inner\": 3072",
        "\"activation_function\": \"gelu_new\"", "\"torch_dtype\": \"float32\""})
    EXPECT_NE(text.find(key), std::string::npos) << key << " not in\n" << text;
  expect_round_trip(gpt2_config(GptConfig{}));  // no BOS/EOS: null
}

TEST(HfConfigJson, LlamaWithLlama3ScalingRoundTrips) {
  DecoderConfig c = parse_hf_config(kLlama32_1B, "llama");
  ASSERT_EQ(c.rope_scaling.kind, RopeScalingKind::kLlama3);
  expect_round_trip(c);
  const std::string text = hf_config_json(c);
  for (const char* key : {"\"LlamaForCausalLM\"", "\"rope_type\": \"llama3\"",
                          "\"hidden_act\": \"silu\"", "\"tie_word_embeddings\": true"})
    EXPECT_NE(text.find(key), std::string::npos) << key << " not in\n" << text;
  c.eos_token_ids = {128001, 128008, 128009};  // a list
  c.bos_token_id.reset();
  c.tie_word_embeddings = false;
  expect_round_trip(c);
}

TEST(HfConfigJson, LinearScalingAndBiasesRoundTrip) {
  DecoderConfig c = parse_hf_config(kSmolLM2_135M, "smollm");
  c.rope_scaling.kind = RopeScalingKind::kLinear;
  c.rope_scaling.factor = 2.5;
  c.attention_bias = c.o_proj_bias = true;
  c.mlp_bias = true;
  c.norm_eps = 1e-6;
  expect_round_trip(c);
  EXPECT_NE(hf_config_json(c).find("\"rope_type\": \"linear\""), std::string::npos);
}

// Token ids kept as config.json states them: absent, null, an id or a list, and written so.
TEST(HfConfigJson, TokenIdsAsTheSourceStatesThem) {
  const std::string dir = write_model_dir("token_ids", kLlama32_1B);
  const HfTokenIds ids = read_hf_token_ids(dir);
  EXPECT_EQ(ids.bos_token_id, "128000");
  EXPECT_EQ(ids.eos_token_id, "128001");
  DecoderConfig c = read_hf_config(dir);
  c.bos_token_id.reset();  // as a recipe knows the model: no ids
  c.eos_token_ids.clear();
  std::string text = hf_config_json(c, "float32", HfTokenIds{"null", "[128001, 128009]"});
  EXPECT_NE(text.find("\"bos_token_id\": null"), std::string::npos) << text;
  EXPECT_NE(text.find("\"eos_token_id\": [\n    128001,\n    128009\n  ]"), std::string::npos)
      << text;
  EXPECT_EQ(parse_hf_config(text, "written").eos_token_ids, (std::vector<int64_t>{128001, 128009}));
  text = hf_config_json(c, "float32", HfTokenIds{});
  EXPECT_EQ(text.find("bos_token_id"), std::string::npos) << text;
  EXPECT_EQ(text.find("eos_token_id"), std::string::npos) << text;
  for (const char* bad : {"\"<s>\"", "[1, \"x\"]", "{", "128256"}) {
    std::string msg;
    try {
      hf_config_json(c, "float32", HfTokenIds{std::nullopt, bad});
    } catch (const Error& e) {
      msg = e.what();
    }
    EXPECT_NE(msg.find("eos"), std::string::npos) << bad << ": " << msg;
    EXPECT_NE(msg.find("cannot write a config.json"), std::string::npos) << bad << ": " << msg;
  }
  expect_mentions(
      [] {
        try {
          read_hf_token_ids(write_model_dir("string_bos", R"({"bos_token_id": "<s>"})"));
        } catch (const Error& e) {
          return std::string(e.what());
        }
        return std::string();
      }(),
      {"bos_token_id", "expected an integer"});
}

TEST(HfConfigJson, MistralMqaRoundTrips) {
  DecoderConfig c = parse_hf_config(mistral_7b("null"), "mistral");
  c.num_kv_heads = 1;  // multi-query attention
  expect_round_trip(c);
  EXPECT_NE(hf_config_json(c).find("\"MistralForCausalLM\""), std::string::npos);
}

TEST(HfConfigJson, Qwen2TiedRoundTrips) {
  DecoderConfig c = parse_hf_config(kQwen25_05B, "qwen2");
  ASSERT_TRUE(c.tie_word_embeddings);
  ASSERT_TRUE(c.attention_bias);
  expect_round_trip(c);
  EXPECT_NE(hf_config_json(c).find("\"Qwen2ForCausalLM\""), std::string::npos);
}

TEST(HfConfigJson, Qwen3WithWideHeadsRoundTrips) {
  DecoderConfig c = parse_hf_config(kQwen3_06B, "qwen3");
  ASSERT_NE(int64_t(c.num_heads) * c.head_dim, c.hidden_size);
  expect_round_trip(c);
  EXPECT_NE(hf_config_json(c).find("\"Qwen3ForCausalLM\""), std::string::npos);
}

TEST(HfConfigJson, InexpressibleSwitchIsRefused) {
  DecoderConfig c = parse_hf_config(mistral_7b("null"), "mistral");
  c.attention_bias = true;  // Mistral's config.json has no attention_bias
  try {
    hf_config_json(c);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    expect_mentions(e.what(), {"mistral", "attention_bias"});
  }
}

TEST(DecoderConfig, ValidateNamesTheField) {
  DecoderConfig c = parse_hf_config(kQwen3_06B, "qwen3");
  c.num_layers = 0;
  try {
    c.validate();
    ADD_FAILURE() << "accepted num_layers 0";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find("num_layers"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fd::nn
