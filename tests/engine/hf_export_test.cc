// write_hf_model: a model written as a Hugging Face directory and read back
// by name (ckpt::HfWeights, nn::read_hf_config) into a fresh Decoder is the
// same model, bit for bit; LoRA adapters are merged as W + (alpha / r) B A
// ([out, in]) or its transpose (GPT-2's Conv1D), against a float64 reference,
// and nn::KvDecoder's merge gives the same weights.
#include "lib/engine/hf_export.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "lib/base/error.h"
#include "lib/ckpt/hf_dir.h"
#include "lib/engine/weights_io.h"
#include "lib/nn/config/hf_config.h"
#include "lib/nn/kv_decoder.h"

namespace fd::engine {
namespace {

namespace fs = std::filesystem;

// <temp>/fd_hf_export_test_<pid>/<name>, empty; the root is removed when the binary exits.
fs::path test_dir(const std::string& name) {
  struct Root {
    fs::path path = fs::temp_directory_path() / ("fd_hf_export_test_" + std::to_string(::getpid()));
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

nn::DecoderConfig tiny_llama() {
  nn::DecoderConfig c;
  c.family = nn::ModelFamily::kLlama;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.vocab_size = 40;
  c.max_position_embeddings = 64;
  c.rope_theta = 50000.0;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  return c;
}

nn::DecoderConfig tiny_qwen3() {  // tied, q/k norm, head_dim * heads != hidden
  nn::DecoderConfig c = tiny_llama();
  c.family = nn::ModelFamily::kQwen3;
  c.head_dim = 16;
  c.qk_norm = true;
  c.tie_word_embeddings = true;
  return c;
}

nn::DecoderConfig tiny_gpt2() {
  nn::GptConfig g;
  g.n_layer = 2;
  g.n_head = 2;
  g.d_model = 16;
  g.vocab_size = 32;
  g.max_seq_len = 8;
  return nn::gpt2_config(g);
}

std::vector<uint32_t> bits(const Tensor& t) {
  std::vector<float> v = t.to_vector();
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

// Writes a random model of `c`, reads it back into a fresh one, expects every bit equal.
void expect_round_trip(const nn::DecoderConfig& c, int64_t max_shard_bytes) {
  nn::Decoder model(c);
  model.init_weights(11);
  const fs::path dir = test_dir(nn::family_name(c.family) + std::to_string(max_shard_bytes));
  HfExportOptions o;
  o.max_shard_bytes = max_shard_bytes;
  write_hf_model(model, dir.string(), o);

  EXPECT_TRUE(nn::read_hf_config(dir.string()) == c) << "config.json does not read back";
  ckpt::HfWeights w = ckpt::HfWeights::open(dir.string());
  std::set<std::string> want;
  for (const nn::Parameter* p : model.parameters()) want.insert(p->name);
  const std::vector<std::string> names = w.names();
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), want);
  EXPECT_EQ(w.contains("lm_head.weight"), !c.tie_word_embeddings);
  EXPECT_EQ(fs::exists(dir / ckpt::kHfIndexFile), max_shard_bytes < kDefaultMaxShardBytes);

  nn::Decoder fresh(c);
  const auto mine = model.parameters(), theirs = fresh.parameters();
  ASSERT_EQ(mine.size(), theirs.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    ASSERT_EQ(mine[i]->name, theirs[i]->name);
    EXPECT_EQ(w.info(mine[i]->name).dtype, DType::kF32);
    w.read(theirs[i]->name, theirs[i]->value);
    EXPECT_TRUE(bits(mine[i]->value) == bits(theirs[i]->value)) << mine[i]->name << " differs";
  }
}

TEST(HfExport, LlamaReadsBackBitwise) { expect_round_trip(tiny_llama(), kDefaultMaxShardBytes); }
TEST(HfExport, Qwen3TiedReadsBackBitwise) {
  expect_round_trip(tiny_qwen3(), kDefaultMaxShardBytes);
}
TEST(HfExport, Gpt2ReadsBackBitwise) { expect_round_trip(tiny_gpt2(), kDefaultMaxShardBytes); }
TEST(HfExport, ShardedLlamaReadsBackBitwise) { expect_round_trip(tiny_llama(), 8000); }

// A LoRA model's merged weights against W + s B A computed here in float64.
void expect_merged(const nn::DecoderConfig& c, const std::vector<std::string>& targets) {
  nn::LoraConfig lora;
  lora.r = 2;
  lora.alpha = 6.0f;
  lora.modules = nn::lora_modules_for_targets(c, targets);
  lora.layers = {1};
  nn::Decoder model(c, DType::kF32, {}, lora);
  model.init_weights(5);
  for (const nn::Parameter* p : model.parameters()) {  // B is zero at init: make it count
    std::vector<float> v = p->value.to_vector();
    for (size_t i = 0; i < v.size(); ++i) v[i] = 0.01f * float(int(i % 7) - 3) + 0.003f;
    p->value.copy_from(Tensor::from_vector(v, p->value.shape(), DType::kF32, MemCategory::kOther));
  }
  std::map<std::string, const nn::Parameter*> by_name;
  for (const nn::Parameter* p : model.parameters()) by_name[p->name] = p;
  for (const nn::Parameter* p : model.frozen_parameters()) by_name[p->name] = p;

  const auto out = hf_tensors(model, DType::kF32);
  ASSERT_EQ(out.size(), model.frozen_parameters().size());  // no adapters in the output
  const bool conv1d = c.family == nn::ModelFamily::kGpt2;
  int merged = 0;
  double worst = 0;
  for (const auto& [name, t] : out) {
    const std::string stem = name.substr(0, name.size() - std::string(".weight").size());
    auto a_it = by_name.find(stem + ".lora_A.weight");
    const std::vector<float> w = by_name.at(name)->value.to_vector(), got = t.to_vector();
    if (a_it == by_name.end()) {
      EXPECT_TRUE(w == got) << name << " changed though it has no adapter";
      continue;
    }
    ++merged;
    const std::vector<float> a = a_it->second->value.to_vector();
    const std::vector<float> b = by_name.at(stem + ".lora_B.weight")->value.to_vector();
    const int64_t r = 2, in = a_it->second->value.shape()[1], n_out = int64_t(b.size()) / r;
    for (int64_t o = 0; o < n_out; ++o)
      for (int64_t i = 0; i < in; ++i) {
        double d = 0;
        for (int64_t q = 0; q < r; ++q) d += double(b[size_t(o * r + q)]) * a[size_t(q * in + i)];
        const size_t at = conv1d ? size_t(i * n_out + o) : size_t(o * in + i);
        const double want = double(w[at]) + 3.0 * d;
        worst = std::max(worst, std::fabs(got[at] - want) / std::max(1e-6, std::fabs(want)));
      }
  }
  EXPECT_EQ(merged, int(lora.modules.size()));  // layer 1 only
  EXPECT_LT(worst, 1e-6) << "largest relative difference " << worst;
  std::printf("%s merged: largest relative difference %.3e\n", nn::family_name(c.family), worst);

  // The KV-cached decoder (generate) merges with the same function: on the LoRA model it gives
  // the logits of a plain model holding the exported weights, bit for bit.
  nn::Decoder plain(c);
  std::map<std::string, Tensor> exported(out.begin(), out.end());
  for (const nn::Parameter* p : plain.parameters()) p->value.copy_from(exported.at(p->name));
  nn::KvDecoder from_lora(model, 8), from_export(plain, 8);
  const std::vector<int32_t> tokens = {3, 1, 4, 1, 5, 9, 2, 6};
  const std::span<const float> got = from_lora.append(tokens, /*all_logits=*/true);
  const std::vector<float> lora_logits(got.begin(), got.end());
  const std::span<const float> want = from_export.append(tokens, /*all_logits=*/true);
  ASSERT_EQ(lora_logits.size(), want.size());
  EXPECT_TRUE(std::memcmp(lora_logits.data(), want.data(), want.size() * sizeof(float)) == 0)
      << "KvDecoder's merge differs from the export's";
}

TEST(HfExport, LlamaLoraIsMergedAsLinear) {
  expect_merged(tiny_llama(), {"q_proj", "v_proj", "down_proj"});
}
TEST(HfExport, Gpt2LoraIsMergedAsConv1D) { expect_merged(tiny_gpt2(), {"c_attn", "c_fc"}); }

TEST(HfExport, ExistingDirectoryIsRefusedWithoutOverwrite) {
  nn::Decoder model(tiny_llama());
  model.init_weights(1);
  const fs::path dir = test_dir("existing");
  fs::create_directories(dir);
  HfExportOptions o;
  write_hf_model(model, dir.string(), o);  // an empty directory is fine
  try {
    write_hf_model(model, dir.string(), o);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find("--overwrite"), std::string::npos) << e.what();
  }
  std::ofstream(dir / "stale.txt") << "x";
  o.overwrite = true;
  write_hf_model(model, dir.string(), o);
  EXPECT_FALSE(fs::exists(dir / "stale.txt"));  // replaced as a whole
  EXPECT_TRUE(fs::exists(dir / "config.json"));
  EXPECT_FALSE(fs::exists(dir.string() + ".tmp"));
}

// The staging directory is a fresh DIR.tmp-XXXXXX: a directory of the user's called DIR.tmp is
// never emptied or removed, and nothing is left beside DIR once the export is in place.
TEST(HfExport, StagingNeverTouchesAUsersTmpDirectory) {
  nn::Decoder model(tiny_llama());
  model.init_weights(1);
  const fs::path dir = test_dir("staged");
  const fs::path users = dir.string() + ".tmp";
  fs::create_directories(users);
  std::ofstream(users / "notes.txt") << "mine";
  write_hf_model(model, dir.string(), HfExportOptions{});
  EXPECT_TRUE(fs::exists(dir / "config.json"));
  EXPECT_TRUE(fs::exists(users / "notes.txt"));
  for (const auto& e : fs::directory_iterator(dir.parent_path()))
    EXPECT_EQ(e.path().filename().string().rfind("staged.tmp-", 0), std::string::npos)
        << "left behind: " << e.path();
}

// bos_token_id / eos_token_id: carried from the run's source directory as they are there (a
// value, a list, null, or absent), else GPT-2's 50256 for GPT-2's vocabulary, else null.
nlohmann::json written_config(const nn::DecoderConfig& c, const nn::HfTokenIds& ids,
                              const std::string& name) {
  nn::Decoder model(c);
  model.init_weights(1);
  HfExportOptions o;
  o.token_ids = ids;
  const fs::path dir = test_dir(name);
  write_hf_model(model, dir.string(), o);
  std::ifstream in(dir / "config.json");
  return nlohmann::json::parse(in);
}

fs::path source_dir(const std::string& name, const std::string& token_keys) {
  const fs::path dir = test_dir(name);
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << "{\"model_type\": \"llama\"" << token_keys << "}";
  return dir;
}

TEST(HfExport, TokenIdsComeFromTheSourceDirectoryAsTheyAre) {
  nn::DecoderConfig c = tiny_llama();  // as a recipe builds it: no ids
  c.bos_token_id.reset();
  c.eos_token_ids.clear();

  // Ids and a list of ids.
  nn::HfTokenIds ids = export_token_ids(
      c, source_dir("src_ids", ", \"bos_token_id\": 1, \"eos_token_id\": [2, 3]").string());
  EXPECT_EQ(ids.bos_token_id, "1");
  EXPECT_EQ(ids.eos_token_id, "[2,3]");
  nlohmann::json j = written_config(c, ids, "out_ids");
  EXPECT_EQ(j["bos_token_id"], 1);
  EXPECT_EQ(j["eos_token_id"], nlohmann::json::array({2, 3}));

  // A single eos id stays an integer; null stays null.
  ids = export_token_ids(
      c, source_dir("src_null", ", \"bos_token_id\": null, \"eos_token_id\": 2").string());
  j = written_config(c, ids, "out_null");
  EXPECT_TRUE(j.contains("bos_token_id") && j["bos_token_id"].is_null()) << j.dump();
  EXPECT_EQ(j["eos_token_id"], 2);

  // Absent keys stay absent: transformers gives the export the defaults it gave the source.
  ids = export_token_ids(c, source_dir("src_absent", "").string());
  EXPECT_FALSE(ids.bos_token_id.has_value());
  EXPECT_FALSE(ids.eos_token_id.has_value());
  j = written_config(c, ids, "out_absent");
  EXPECT_FALSE(j.contains("bos_token_id")) << j.dump();
  EXPECT_FALSE(j.contains("eos_token_id")) << j.dump();

  // Ids the model's vocabulary does not have are refused, naming the id.
  ids = export_token_ids(c, source_dir("src_big", ", \"eos_token_id\": 40").string());
  try {
    written_config(c, ids, "out_big");
    ADD_FAILURE() << "accepted eos 40 for a vocabulary of 40";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("eos_token_id = 40: expected an integer in [0, 39]"),
              std::string::npos)
        << e.what();
  }
}

TEST(HfExport, TokenIdsWithoutASourceDirectory) {
  nn::DecoderConfig llama = tiny_llama();
  llama.bos_token_id.reset();
  llama.eos_token_ids.clear();
  // Not known: null, never transformers' LlamaConfig defaults (1, 2) by omission.
  for (const std::string& init_from : {std::string(), std::string("/no/such/dir")}) {
    const nn::HfTokenIds ids = export_token_ids(llama, init_from);
    EXPECT_EQ(ids.bos_token_id, "null");
    EXPECT_EQ(ids.eos_token_id, "null");
    const nlohmann::json j = written_config(llama, ids, "out_llama");
    EXPECT_TRUE(j.contains("bos_token_id") && j["bos_token_id"].is_null()) << j.dump();
    EXPECT_TRUE(j.contains("eos_token_id") && j["eos_token_id"].is_null()) << j.dump();
  }
  // A directory without a config.json any more: null too (with a warning).
  const fs::path gone = test_dir("src_gone");
  fs::create_directories(gone);
  EXPECT_EQ(export_token_ids(llama, gone.string()).bos_token_id, "null");

  // GPT-2 with GPT-2's vocabulary: <|endoftext|> for both, as GPT-2's config.json.
  nn::DecoderConfig gpt2 = tiny_gpt2();
  gpt2.vocab_size = 50257;
  nn::HfTokenIds ids = export_token_ids(gpt2, "");
  EXPECT_EQ(ids.bos_token_id, "50256");
  EXPECT_EQ(ids.eos_token_id, "50256");
  const nlohmann::json j = written_config(gpt2, ids, "out_gpt2");
  EXPECT_EQ(j["bos_token_id"], 50256);
  EXPECT_EQ(j["eos_token_id"], 50256);
  // Another vocabulary is not GPT-2's tokenizer.
  gpt2.vocab_size = 300;
  EXPECT_EQ(export_token_ids(gpt2, "").eos_token_id, "null");
}

// check_weights_fit reads headers only: a config.json whose vocab_size disagrees with the
// embedding is refused naming the tensor, before a model of that size would be allocated.
TEST(HfExport, WeightsAreCheckedAgainstTheConfigBeforeBuilding) {
  nn::Decoder model(tiny_llama());
  model.init_weights(1);
  const fs::path dir = test_dir("fit");
  write_hf_model(model, dir.string(), HfExportOptions{});
  check_weights_fit(dir.string(), tiny_llama(), "where");  // fits
  nn::DecoderConfig big = tiny_llama();
  big.vocab_size = 5'000'000;
  try {
    check_weights_fit(dir.string(), big, "where");
    ADD_FAILURE() << "accepted vocab_size 5000000";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("where: "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tensor 'model.embed_tokens.weight' has shape (40, 32) "
                                         "in the files but (5000000, 32)"),
              std::string::npos)
        << e.what();
  }
  nn::DecoderConfig deeper = tiny_llama();
  deeper.num_layers = 3;
  try {
    check_weights_fit(dir.string(), deeper, "");
    ADD_FAILURE() << "accepted 3 layers";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no tensor 'model.layers.2."), std::string::npos)
        << e.what();
  }
}

// A run trained with data.tokenizer (and no init_from directory): the tokenizer's bos_token /
// eos_token (chatml-bytes: no BOS, <|im_end|> = 257), so generation stops where it should.
TEST(HfExport, TokenIdsFromTheRunsTokenizer) {
  nn::DecoderConfig llama = tiny_llama();
  llama.vocab_size = 260;
  const std::string tok = std::string(FD_SOURCE_DIR) + "/recipes/tokenizers/chatml-bytes";
  const nn::HfTokenIds ids = export_token_ids(llama, "", tok);
  EXPECT_EQ(ids.bos_token_id, "null");
  EXPECT_EQ(ids.eos_token_id, "257");
  const nlohmann::json j = written_config(llama, ids, "out_tokenizer");
  EXPECT_TRUE(j["bos_token_id"].is_null()) << j.dump();
  EXPECT_EQ(j["eos_token_id"], 257);
}

TEST(HfExport, TokenizerFilesAreCopied) {
  const fs::path src = test_dir("source");
  fs::create_directories(src);
  std::ofstream(src / "tokenizer.json") << "{\"version\": \"1.0\"}";
  std::ofstream(src / "tokenizer_config.json") << "{}";
  std::ofstream(src / "unrelated.bin") << "x";
  nn::Decoder model(tiny_llama());
  model.init_weights(1);
  const fs::path dir = test_dir("with_tokenizer");
  HfExportOptions o;
  o.tokenizer_from = src.string();
  const std::vector<std::string> copied = write_hf_model(model, dir.string(), o);
  EXPECT_EQ(copied, (std::vector<std::string>{"tokenizer.json", "tokenizer_config.json"}));
  EXPECT_TRUE(fs::exists(dir / "tokenizer.json"));
  EXPECT_FALSE(fs::exists(dir / "unrelated.bin"));
  o.tokenizer_from = (src / "tokenizer.json").string();  // a file: nothing to copy
  o.overwrite = true;
  EXPECT_TRUE(write_hf_model(model, dir.string(), o).empty());
}

TEST(HfExport, ShardSizes) {
  EXPECT_EQ(parse_shard_size("5GB"), 5'000'000'000);
  EXPECT_EQ(parse_shard_size("500mb"), 500'000'000);
  EXPECT_EQ(parse_shard_size("2GiB"), int64_t(2) << 30);
  EXPECT_EQ(parse_shard_size("12345"), 12345);
  EXPECT_EQ(parse_shard_size("1.5KB"), 1500);
  for (const char* bad : {"", "0", "-5", "5 TB", "GB", "1.5"})
    EXPECT_THROW(parse_shard_size(bad), Error) << bad;
}

}  // namespace
}  // namespace fd::engine
