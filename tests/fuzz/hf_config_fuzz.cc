// Fuzz target: Hugging Face config.json and generation_config.json
// (lib/nn/config/hf_config.h: read_hf_config, read_hf_token_ids,
// hf_config_json; lib/config/model_dir.h: model_options; the stop ids
// HfTokenizer::load reads from both files).
//
// Input: config.json, a NUL byte, then generation_config.json:
//   <config.json> \0 <generation_config.json>
// (no NUL: there is no generation_config.json). Both are written into a
// scratch model directory beside a fixed tokenizer.json (fuzz_tokenizer_dir.h).
// Checked: every reader either succeeds or throws fd::Error, and a config
// that reads means what the file says: each integer the file states for a
// size, a count or a token id is the config's value (not truncated to int),
// the config validates, and hf_config_json writes it back (the writer checks
// that the text parses to the same config). A tokenizer's stop ids lie inside
// its vocabulary and are ids the files state.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "lib/config/model_dir.h"
#include "lib/text/hf_tokenizer.h"
#include "lib/nn/config/hf_config.h"
#include "tests/fuzz/fuzz_tokenizer_dir.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using nlohmann::json;

[[noreturn]] void broken(const std::string& what) {
  std::fprintf(stderr, "hf_config_fuzz: %s\n", what.c_str());
  std::abort();
}

bool same(const json& v, int64_t x) {
  if (v.is_number_unsigned()) return x >= 0 && v.get<uint64_t>() == static_cast<uint64_t>(x);
  return v.is_number_integer() && v.get<int64_t>() == x;
}

// The integers `text` states for `c`'s fields must be c's (a config that
// loads means what its file says).
void check_integers(const std::string& text, const fd::nn::DecoderConfig& c) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) broken("a config that is not a JSON object was read");
  const bool gpt2 = c.family == fd::nn::ModelFamily::kGpt2;
  const std::pair<const char*, int64_t> fields[] = {
      {gpt2 ? "n_embd" : "hidden_size", c.hidden_size},
      {gpt2 ? "n_inner" : "intermediate_size", c.intermediate_size},
      {gpt2 ? "n_layer" : "num_hidden_layers", c.num_layers},
      {gpt2 ? "n_head" : "num_attention_heads", c.num_heads},
      {gpt2 ? "n_head" : "num_key_value_heads", c.num_kv_heads},
      {gpt2 ? "n_positions" : "max_position_embeddings", c.max_position_embeddings},
      {"vocab_size", c.vocab_size},
      {gpt2 ? "n_embd" : "head_dim", gpt2 ? c.hidden_size : c.head_dim},
  };
  for (const auto& [key, value] : fields) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number_integer()) continue;
    if (!same(*it, value))
      broken(std::string(key) + " = " + it->dump() + " was read as " + std::to_string(value));
  }
  if (auto it = j.find("bos_token_id"); it != j.end() && it->is_number_integer()) {
    if (!c.bos_token_id || !same(*it, *c.bos_token_id))
      broken("bos_token_id = " + it->dump() + " was read as another id");
  }
  if (auto it = j.find("eos_token_id"); it != j.end()) {
    const json list = it->is_array() ? *it : json::array({*it});
    if (!it->is_null()) {
      if (list.size() != c.eos_token_ids.size()) broken("eos_token_id lost ids");
      for (size_t i = 0; i < list.size(); ++i)
        if (!same(list[i], c.eos_token_ids[i]))
          broken("eos_token_id " + list[i].dump() + " was read as another id");
    }
  }
}

void check_config(const std::string& dir, const std::string& text) {
  const fd::nn::DecoderConfig c = fd::nn::read_hf_config(dir);
  check_integers(text, c);
  try {
    c.validate();
    const std::string back = fd::nn::hf_config_json(c, "float32");
    if (!(fd::nn::parse_hf_config(back, "written config.json") == c))
      broken("hf_config_json wrote a config that reads back differently");
  } catch (const fd::Error& e) {
    broken(std::string("a config that was read cannot be written back: ") + e.what());
  }
  // The recipe's model section of a model.init_from directory (a kUsage refusal is fine).
  fd::fuzz::expect_clean([&] { (void)fd::config::model_options(c, dir); });
  // The token-id keys as the file states them, written back.
  fd::fuzz::expect_clean([&] {
    const fd::nn::HfTokenIds ids = fd::nn::read_hf_token_ids(dir);
    (void)fd::nn::hf_config_json(c, "bfloat16", ids);
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = [] {
    std::string d = fd::fuzz::scratch_dir() + "/model";
    std::filesystem::create_directories(d);
    fd::fuzz::write_file(d + "/tokenizer.json", fd::fuzz::tokenizer_json_with_specials());
    return d;
  }();
  const std::string_view in = fd::fuzz::as_view(data, size);
  const size_t nul = in.find('\0');
  const std::string config(in.substr(0, nul));
  fd::fuzz::write_file(dir + "/config.json", config);
  const std::string generation = dir + "/generation_config.json";
  if (nul == std::string_view::npos) {
    std::filesystem::remove(generation);
  } else {
    fd::fuzz::write_file(generation, in.substr(nul + 1));
  }
  fd::fuzz::expect_clean([&] { check_config(dir, config); });
  // The tokenizer beside them reads eos_token_id from both files: each stop id
  // is one the files state (or the tokenizer's own EOS), inside the vocabulary.
  fd::fuzz::expect_clean([&] {
    const auto tok = fd::text::HfTokenizer::load(dir + "/tokenizer.json");
    std::vector<json> stated;
    for (const std::string_view file :
         {in.substr(0, nul),
          nul == std::string_view::npos ? std::string_view() : in.substr(nul + 1)}) {
      const json j = json::parse(file, nullptr, /*allow_exceptions=*/false);
      if (!j.is_object() || !j.contains("eos_token_id")) continue;
      const json& e = j["eos_token_id"];
      if (e.is_array())
        stated.insert(stated.end(), e.begin(), e.end());
      else
        stated.push_back(e);
    }
    for (const int32_t id : tok->stop_ids()) {
      if (id < 0 || id >= tok->vocab_size())
        broken("stop id " + std::to_string(id) + " outside the vocabulary");
      bool found = tok->eos_id() == id;
      for (const json& v : stated) found = found || same(v, id);
      if (!found) broken("stop id " + std::to_string(id) + " is not an id the files state");
    }
  });
  return 0;
}
