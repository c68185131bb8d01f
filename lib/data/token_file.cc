#include "lib/data/token_file.h"

#include <algorithm>
#include <cstring>

#include "lib/base/check.h"
#include "lib/base/error.h"

namespace fd::data {
namespace {

// A file read as tokens that is not a token file: how to read it as text
// instead. TokenFile serves both a recipe's data and fdtrain eval's --data,
// so the hint names the setting of each.
constexpr const char* kAsText =
    "to read it as raw text, set data.format: text in a recipe or --format text for fdtrain eval";

int32_t header_word(const MappedFile& f, int i) {
  int32_t v;
  std::memcpy(&v, f.data() + 4 * i, 4);
  return v;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

TokenFormat detect(const MappedFile& f) {
  if (f.size() >= 4) {
    int32_t magic = header_word(f, 0);
    if (magic == kLlmcMagic || magic == kLlmcLlama3Magic) return TokenFormat::kLlmc;
  }
  return ends_with(f.path(), ".bin") ? TokenFormat::kLlmc : TokenFormat::kText;
}

// Validates the llm.c header and size; returns the token count and sets *width (bytes per token).
int64_t check_llmc_header(const MappedFile& f, int* width) {
  const std::string& path = f.path();
  if (f.size() < kLlmcHeaderBytes)
    usage_error(
        "{}: {} bytes, shorter than the {}-byte llm.c token-file header; the file is "
        "truncated or not a token file ({})",
        path, f.size(), kLlmcHeaderBytes, kAsText);
  const int32_t magic = header_word(f, 0);
  const int32_t version = header_word(f, 1);
  if (magic == kLlmcLlama3Magic) {
    if (version != kLlmcLlama3Version)
      usage_error("{}: llm.c LLaMA-3 token file version {}, expected {}; regenerate it", path,
                  version, kLlmcLlama3Version);
    *width = 4;
  } else if (magic == kLlmcMagic) {
    if (version != kLlmcVersion && version != kLlmcVersionU32)
      usage_error(
          "{}: llm.c token file version {}; fdtrain reads version {} (uint16 tokens) and {} "
          "(uint32 tokens); regenerate it with fdtrain tokenize",
          path, version, kLlmcVersion, kLlmcVersionU32);
    *width = version == kLlmcVersion ? 2 : 4;
  } else {
    usage_error(
        "{}: not an llm.c token file (magic {}, expected {}); write it with fdtrain tokenize or "
        "llm.c's data scripts (dev/data/*.py) or, {}",
        path, magic, kLlmcMagic, kAsText);
  }
  int64_t count = header_word(f, 2);
  if (count <= 0)
    usage_error("{}: header says {} tokens; the file is corrupt or holds no data", path, count);
  uint64_t expected = kLlmcHeaderBytes + uint64_t(*width) * uint64_t(count);
  if (f.size() != expected) {
    int64_t held = int64_t((f.size() - kLlmcHeaderBytes) / uint64_t(*width));
    usage_error(
        "{}: header says {} tokens but the file holds {} (file size {} bytes, expected "
        "{}); {}",
        path, count, held, f.size(), expected,
        f.size() < expected ? "the file is truncated or not a token file"
                            : "the file has trailing bytes or is not a token file");
  }
  return count;
}

}  // namespace

std::string_view token_format_name(TokenFormat f) {
  switch (f) {
    case TokenFormat::kAuto:
      return "auto";
    case TokenFormat::kText:
      return "text";
    case TokenFormat::kLlmc:
      return "llmc";
  }
  return "?";
}

std::optional<TokenFormat> token_format_from_name(std::string_view name) {
  for (TokenFormat f : {TokenFormat::kAuto, TokenFormat::kText, TokenFormat::kLlmc})
    if (token_format_name(f) == name) return f;
  return std::nullopt;
}

TokenFile TokenFile::open(const std::string& path, TokenFormat format, int64_t vocab_size) {
  FD_CHECK(vocab_size > 0, "vocab_size {}", vocab_size);
  TokenFile t;
  t.file_ = std::make_shared<const MappedFile>(path);
  t.path_ = path;
  const MappedFile& f = *t.file_;
  t.format_ = format == TokenFormat::kAuto ? detect(f) : format;
  if (t.format_ == TokenFormat::kLlmc) {
    t.size_ = check_llmc_header(f, &t.width_);
    t.tokens_ = f.data() + kLlmcHeaderBytes;
  } else {
    t.size_ = int64_t(f.size());
    t.tokens_ = f.data();
    t.width_ = 1;
  }

  // One pass for the largest id; only a file that fails looks for where.
  int64_t max_id = 0;
  if (t.width_ == 1) {
    if (vocab_size < 256)
      for (int64_t i = 0; i < t.size_; ++i) max_id = std::max<int64_t>(max_id, t.tokens_[i]);
  } else if (t.width_ == 2) {
    if (vocab_size < 65536) {
      uint16_t m = 0;
      for (int64_t i = 0; i < t.size_; ++i) m = std::max(m, t.u16_at(i));
      max_id = m;
    }
  } else {
    // uint32 ids: a negative int32 (>= 2^31 as stored) is out of range too.
    uint32_t m = 0;
    for (int64_t i = 0; i < t.size_; ++i) {
      uint32_t v;
      std::memcpy(&v, t.tokens_ + 4 * i, 4);
      m = std::max(m, v);
    }
    max_id = int64_t(m);
  }
  if (max_id >= vocab_size) {
    int64_t pos = 0;
    while (t[pos] >= 0 && t[pos] < vocab_size) ++pos;
    usage_error(
        "{}: token id {} at position {} is not below model.vocab_size = {}; the data was "
        "tokenized for a larger vocabulary (raise model.vocab_size or re-tokenize){}",
        path, t[pos], pos, vocab_size,
        t.format_ == TokenFormat::kText ? "; text files use byte tokens 0..255" : "");
  }
  return t;
}

uint16_t TokenFile::u16_at(int64_t i) const {
  uint16_t v;
  std::memcpy(&v, tokens_ + 2 * i, 2);  // little-endian, possibly unaligned in principle
  return v;
}

TokenFile TokenFile::from_tokens(std::string path, std::vector<int32_t> tokens,
                                 int64_t vocab_size) {
  TokenFile t;
  t.path_ = std::move(path);
  if (tokens.empty()) usage_error("{}: no tokens (the file is empty)", t.path_);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab_size) {
      usage_error(
          "{}: token id {} at position {} is not below model.vocab_size = {}; the "
          "tokenizer has more ids than the model",
          t.path_, tokens[i], i, vocab_size);
    }
  }
  t.owned_ = std::make_shared<const std::vector<int32_t>>(std::move(tokens));
  t.format_ = TokenFormat::kText;
  t.tokens_ = reinterpret_cast<const uint8_t*>(t.owned_->data());
  t.width_ = 4;
  t.size_ = int64_t(t.owned_->size());
  return t;
}

int32_t TokenFile::u32_at(int64_t i) const {
  int32_t v;
  std::memcpy(&v, tokens_ + 4 * i, 4);
  return v;
}

void TokenFile::copy(int64_t begin, int64_t count, int32_t* out) const {
  FD_CHECK(begin >= 0 && count >= 0 && begin + count <= size_, "copy [{}, {}) of {} tokens", begin,
           begin + count, size_);
  if (width_ == 1) {
    const uint8_t* p = tokens_ + begin;
    for (int64_t i = 0; i < count; ++i) out[i] = p[i];
  } else if (width_ == 2) {
    for (int64_t i = 0; i < count; ++i) out[i] = u16_at(begin + i);
  } else {
    std::memcpy(out, tokens_ + 4 * begin, size_t(count) * 4);
  }
}

}  // namespace fd::data
