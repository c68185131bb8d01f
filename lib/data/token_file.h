// TokenFile: the tokens of one data file, validated once at open.
//
// Two formats:
//  - text: the file's bytes are the tokens (ByteTokenizer), ids 0..255;
//  - llmc: llm.c / nanoGPT token files: a 256 x int32 header ([0] magic
//    20240520, [1] version, [2] token count) then the tokens: version 1 holds
//    uint16 tokens (GPT-2 and other vocabularies up to 65536), version 2 uint32
//    (Llama 3, Qwen: `fdtrain tokenize` writes it for larger vocabularies); llm.c's
//    own LLaMA-3 files (magic 20240801, version 7, uint32) are read too. The
//    file is exactly 1024 + width * count bytes.
// Both are memory-mapped read-only, never copied. open() checks the header,
// the size and that every id is below the model's vocab_size, so a sampler
// reading the file later cannot meet a bad token.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lib/data/mapped_file.h"

namespace fd::data {

enum class TokenFormat {
  kAuto,  // llmc if the file starts with the llm.c magic or is named *.bin, else text
  kText,
  kLlmc,
};
std::string_view token_format_name(TokenFormat f);  // "auto", "text", "llmc"
// The format named `name`, or nullopt for an unknown name.
std::optional<TokenFormat> token_format_from_name(std::string_view name);

// llm.c token-file header constants.
constexpr int32_t kLlmcMagic = 20240520;
constexpr int32_t kLlmcVersion = 1;             // uint16 tokens
constexpr int32_t kLlmcVersionU32 = 2;          // uint32 tokens
constexpr int32_t kLlmcLlama3Magic = 20240801;  // llm.c's LLaMA-3 files: uint32 tokens
constexpr int32_t kLlmcLlama3Version = 7;
constexpr size_t kLlmcHeaderBytes = 256 * sizeof(int32_t);

class TokenFile {
 public:
  // Maps and validates `path`. vocab_size is the model's: every token id must
  // be below it. Throws fd::Error (kUsage) with the file, the problem and the
  // fix for every malformed, truncated, missing or empty file.
  static TokenFile open(const std::string& path, TokenFormat format, int64_t vocab_size);
  // Tokens already in memory (a text file encoded by a tokenizer), named `path`
  // in messages. Throws fd::Error (kUsage) when an id is not below vocab_size
  // or there are no tokens.
  static TokenFile from_tokens(std::string path, std::vector<int32_t> tokens, int64_t vocab_size);

  const std::string& path() const { return path_; }
  TokenFormat format() const { return format_; }  // kText or kLlmc, never kAuto
  int64_t size() const { return size_; }          // number of tokens

  int32_t operator[](int64_t i) const {
    return width_ == 1 ? int32_t(tokens_[i]) : width_ == 2 ? int32_t(u16_at(i)) : u32_at(i);
  }
  // Writes tokens [begin, begin + count) to out; requires begin + count <= size().
  void copy(int64_t begin, int64_t count, int32_t* out) const;

 private:
  TokenFile() = default;
  uint16_t u16_at(int64_t i) const;
  int32_t u32_at(int64_t i) const;

  std::string path_;
  std::shared_ptr<const MappedFile> file_;             // a file's tokens, or
  std::shared_ptr<const std::vector<int32_t>> owned_;  // tokens in memory
  TokenFormat format_ = TokenFormat::kText;
  const uint8_t* tokens_ = nullptr;  // first token byte
  int width_ = 1;                    // bytes per token: 1 (text), 2 or 4 (llmc)
  int64_t size_ = 0;
};

}  // namespace fd::data
