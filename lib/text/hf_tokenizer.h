// HfTokenizer: a Hugging Face tokenizer.json, encoding and decoding exactly as
// Hugging Face's own implementation does (tests/text/tokenizer compares every
// id with @huggingface/tokenizers over real files).
//
// The pipeline, in Hugging Face's order: added tokens are cut out of the raw
// text; the text between them is normalized (TextNormalizer), cut again by the
// added tokens that match normalized text, pre-tokenized into words
// (PreTokenizer) and each word encoded by the model (Bpe); the post-processor
// (TemplateProcessing) adds BOS/EOS when asked. Decoding maps ids to tokens
// and runs the decoder (TokenDecoder). A component fdtrain does not implement
// is refused at load, naming its JSON path and type, never approximated.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lib/text/added_tokens.h"
#include "lib/text/bpe.h"
#include "lib/text/pre_tokenizer.h"
#include "lib/text/text_normalizer.h"
#include "lib/text/token_decoder.h"
#include "lib/text/tokenizer.h"

namespace fd::text {

class HfTokenizer : public Tokenizer {
 public:
  // Reads `tokenizer_json` (a path) and, when given and present, the
  // tokenizer_config.json and generation_config.json / config.json beside it
  // for BOS, EOS and stop tokens. Throws fd::Error (kUsage): a missing file,
  // JSON syntax errors as file:line:column, unsupported components by JSON path.
  static std::unique_ptr<HfTokenizer> load(const std::string& tokenizer_json);
  // From the JSON texts (tests); config_json may be "" (no tokenizer_config.json).
  static std::unique_ptr<HfTokenizer> from_strings(const std::string& tokenizer_json,
                                                   const std::string& config_json,
                                                   const std::string& where);

  std::string describe() const override;
  int64_t vocab_size() const override { return vocab_size_; }
  void encode(std::string_view text, bool add_special, std::vector<int32_t>& out,
              EncodeCache& cache) const override;
  using Tokenizer::encode;
  void encode_piece(std::string_view text, bool continuing, std::vector<int32_t>& out,
                    EncodeCache& cache) const override;
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const override;
  std::optional<int32_t> bos_id() const override { return bos_; }
  std::optional<int32_t> eos_id() const override { return eos_; }
  std::vector<int32_t> stop_ids() const override { return stop_; }
  std::optional<int32_t> token_id(std::string_view token) const override;
  std::vector<std::string> special_tokens() const override;

 private:
  HfTokenizer() = default;
  void read_post_processor(const nlohmann::json& j, const std::string& where);
  void read_config(const nlohmann::json& config, const std::string& where);
  void encode_text(std::string_view text, bool add_special, bool continuing,
                   std::vector<int32_t>& out, EncodeCache& cache) const;

  std::string where_;
  TextNormalizer normalizer_;
  PreTokenizer pre_tokenizer_;
  Bpe model_;
  AddedTokens added_;
  TokenDecoder decoder_;
  std::vector<int32_t> prefix_ids_, suffix_ids_;  // what add_special puts around the text
  int64_t vocab_size_ = 0;
  std::optional<int32_t> bos_, eos_;
  std::vector<int32_t> stop_;
};

}  // namespace fd::text
