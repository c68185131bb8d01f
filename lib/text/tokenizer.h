// lib/text (namespace fd::text): tokenizers, on lib/base alone (with PCRE2 and utf8proc). This
// header is the contract the layers above use; hf_tokenizer.h and its parts (normalizer,
// pre-tokenizer, models, added tokens, decoder) and utf8.h are its pieces.
//
// Tokenizer: text to token ids and back, whichever tokenizer a model uses.
//
// Two implementations: ByteTokenizer (every byte a token; byte-level recipes)
// and HfTokenizer (a Hugging Face tokenizer.json, exact to Hugging Face's own
// implementation). load_tokenizer() opens a model directory's tokenizer.
//
// encode() is safe to call from several threads at once on one Tokenizer when
// each thread passes its own EncodeCache; everything else is const and
// thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace fd::text {

// Token ids a tokenizer file may use: [0, kMaxTokenIds). 2^24 is 64 times the
// largest vocabularies in use (Gemma 3: 262,144) and far inside what an int32,
// the uint32 token files (token_file.h) and an embedding table hold; a larger
// id is a damaged file, refused where it is read, never wrapped or truncated.
inline constexpr int64_t kMaxTokenIds = int64_t{1} << 24;

// An id read from a tokenizer file: `v` when it is an integer in
// [0, kMaxTokenIds), else nullopt (negative, too large, not an integer).
std::optional<int64_t> json_token_id(const nlohmann::json& v);

// Per-thread state of encode(): caches of recent words and scratch buffers.
// Opaque; default-constructed empty, filled by the tokenizer it is used with
// (one cache must stay with one tokenizer).
class EncodeCache {
 public:
  EncodeCache();
  EncodeCache(EncodeCache&&) noexcept;
  EncodeCache& operator=(EncodeCache&&) noexcept;
  ~EncodeCache();

  struct State;  // defined by the tokenizer that fills it
  State* state() { return state_.get(); }
  void reset(std::unique_ptr<State> s);

 private:
  std::unique_ptr<State> state_;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // "byte" or "tokenizer.json (BPE, byte-level, 128256 ids)": for logs and summaries.
  virtual std::string describe() const = 0;
  // Every id encode() can produce, special tokens included, is below this.
  virtual int64_t vocab_size() const = 0;

  // Appends the ids of `text` to `out`. Bytes that are not valid UTF-8 are
  // read as U+FFFD, as Hugging Face receives them. add_special: add the
  // tokens the tokenizer's post-processor adds (BOS, EOS) as Hugging Face's
  // encode(text) does; false is encode(text, add_special_tokens=False).
  virtual void encode(std::string_view text, bool add_special, std::vector<int32_t>& out,
                      EncodeCache& cache) const = 0;
  // Convenience for one-off calls (a fresh cache each time).
  std::vector<int32_t> encode(std::string_view text, bool add_special = false) const;
  // One piece of a document too long to hold whole (document_encoder.h cuts it):
  // encode(text, false) for the first piece; with `continuing`, the text
  // continues the piece before it, so nothing that marks the start of a text
  // (SentencePiece's "▁", a prefix space) is added. The default is encode().
  virtual void encode_piece(std::string_view text, bool continuing, std::vector<int32_t>& out,
                            EncodeCache& cache) const {
    (void)continuing;
    encode(text, false, out, cache);
  }

  // The text of `ids`, as Hugging Face's decode(ids) without clean-up of
  // tokenization spaces; skip_special drops special tokens first. An id
  // outside [0, vocab_size()) decodes as U+FFFD.
  virtual std::string decode(std::span<const int32_t> ids, bool skip_special = false) const = 0;

  // The document delimiters `fdtrain tokenize` wraps each document in, from
  // tokenizer_config.json's bos_token / eos_token (none for the byte tokenizer).
  virtual std::optional<int32_t> bos_id() const = 0;
  virtual std::optional<int32_t> eos_id() const = 0;
  // Every id that ends generation: eos_id and the model's other end-of-turn
  // tokens (generation_config.json's eos_token_id list, e.g. Llama 3 Instruct's
  // <|eot_id|> and <|end_of_text|>). Sorted, without duplicates.
  virtual std::vector<int32_t> stop_ids() const = 0;
  // The id of a token given as its text (a special token such as "<|eot_id|>"),
  // or nullopt.
  virtual std::optional<int32_t> token_id(std::string_view token) const = 0;
  // The texts of the special tokens (tokenizer.json's added tokens marked
  // special, such as "<|im_end|>"), in id order; none for the byte tokenizer.
  // Chat templates write them as text; a chat example's end of turn is the
  // first of them after an assistant's content (chat_template.h).
  virtual std::vector<std::string> special_tokens() const { return {}; }
};

// The tokenizer of a model directory: DIR/tokenizer.json (with
// tokenizer_config.json and generation_config.json when present). Throws
// fd::Error (kUsage) naming the file and the problem.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& dir);

}  // namespace fd::text
