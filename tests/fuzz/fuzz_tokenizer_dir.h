// Shared by the fuzz targets that read the files beside a tokenizer.json
// (hf_config_fuzz.cc, tokenizer_config_fuzz.cc): a fixed, small tokenizer.json
// that knows the special tokens of the real tokenizer_config.json files the
// seeds come from, so that their bos_token / eos_token resolve and their chat
// templates render with real end-of-turn tokens.
#pragma once

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "tests/fuzz/fuzz_util.h"

namespace fd::fuzz {

// recipes/tokenizers/chatml-bytes/tokenizer.json (259 ids: the 256 bytes,
// <|im_start|>, <|im_end|>, <|endoftext|>) plus the special tokens of the
// Llama 2/3, Mistral, Gemma and Qwen tokenizer_config.json files, from id 259.
// Found from this source file's path, so the targets run from any directory.
inline std::string tokenizer_json_with_specials() {
  const std::filesystem::path source =
      std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() / "recipes" /
      "tokenizers" / "chatml-bytes" / "tokenizer.json";
  std::ifstream in(source, std::ios::binary);
  if (!in) {
    std::perror(("fdfuzz: reading " + source.string()).c_str());
    std::abort();
  }
  std::ostringstream s;
  s << in.rdbuf();
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(s.str());
  int id = 259;
  for (const char* token :
       {"<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>",
        "<|end_header_id|>", "<|eom_id|>", "<s>", "</s>", "<unk>", "<pad>", "<bos>", "<eos>",
        "<start_of_turn>", "<end_of_turn>", "[INST]", "[/INST]", "<think>", "</think>"}) {
    j["added_tokens"].push_back({{"id", id++},
                                 {"content", token},
                                 {"single_word", false},
                                 {"lstrip", false},
                                 {"rstrip", false},
                                 {"normalized", false},
                                 {"special", true}});
  }
  return j.dump();
}

}  // namespace fd::fuzz
