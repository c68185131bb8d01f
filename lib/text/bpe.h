// Bpe: the byte-pair-encoding model of a tokenizer.json ("model": {"type": "BPE"}).
//
// A word (one pre-token) starts as one symbol per character (or per byte, for
// byte-level vocabularies) and the merges are applied lowest rank first, the
// leftmost pair among equal ranks, exactly as Hugging Face's BPE does;
// characters missing from the vocabulary become their <0xNN> byte tokens
// (byte_fallback) or the unknown token (fused when fuse_unk), or are dropped
// when the model has neither. ignore_merges (Llama 3) takes a word that is in
// the vocabulary whole. continuing_subword_prefix / end_of_word_suffix are
// added to non-first / last characters.
//
// Byte-level vocabularies (GPT-2, Llama 3, Qwen) spell each byte as a
// printable character (GPT-2's bytes_to_unicode). Their tokens are stored
// here as the raw bytes they stand for, so a word is encoded from its UTF-8
// bytes without mapping them first, and decoding is concatenation.
//
// Speed: merges live in an open-addressing table keyed by the pair of ids;
// words of up to kShortWord symbols use a scan (no heap, no allocation),
// longer ones a heap over a linked list (O(n log n)); SentencePiece-style
// tokenizers make a whole paragraph one word, which is cut before "▁" where
// the vocabulary proves no token can span the cut (see cut_before_space_); the
// encoded ids of recent words are cached per thread (Cache).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace fd::text {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class Bpe {
 public:
  // A thread's cache of encoded words and the merge scratch.
  struct Cache {
    std::unordered_map<std::string, std::pair<uint32_t, uint32_t>, StringHash, std::equal_to<>>
        words;                    // word -> (offset, count) in ids
    std::vector<int32_t> ids;     // the cached words' ids
    std::vector<int32_t> symbols;  // scratch
    std::vector<int32_t> ranks, prev, next;
    std::vector<uint64_t> heap;
  };

  // From the "model" object of a tokenizer.json. byte_level: the vocabulary
  // spells bytes as GPT-2's characters (the pre-tokenizer has a ByteLevel step).
  // Throws fd::Error (kUsage) naming the JSON path for anything malformed or
  // unsupported (dropout, a merge of tokens missing from the vocabulary).
  static Bpe from_json(const nlohmann::json& model, bool byte_level, const std::string& where);

  // One past the largest id of the vocabulary.
  int32_t size() const { return int32_t(tokens_.size()); }
  // The token's bytes (byte-level) or text; "" for an id with no token.
  const std::string& token(int32_t id) const { return tokens_[size_t(id)]; }
  // The id of a token spelled as stored (raw bytes for byte-level vocabularies).
  std::optional<int32_t> id(std::string_view token) const;
  bool byte_level() const { return byte_level_; }
  std::optional<int32_t> unk_id() const { return unk_id_; }

  // Appends the ids of `word` (valid UTF-8, non-empty) to out.
  void encode_word(std::string_view word, Cache& cache, std::vector<int32_t>& out) const;

  static constexpr size_t kShortWord = 64;

 private:
  struct Merge {
    int32_t rank;
    int32_t id;  // the merged token
  };
  // Open addressing, linear probing; the key is (left << 32 | right).
  struct PairTable {
    std::vector<uint64_t> keys;
    std::vector<Merge> values;
    uint64_t mask = 0;
    static constexpr uint64_t kEmpty = ~uint64_t{0};
    void build(const std::vector<std::pair<uint64_t, Merge>>& entries);
    const Merge* find(int32_t left, int32_t right) const {
      const uint64_t key = (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
      for (uint64_t h = mix(key) & mask;; h = (h + 1) & mask) {
        if (keys[h] == key) return &values[h];
        if (keys[h] == kEmpty) return nullptr;
      }
    }
    static uint64_t mix(uint64_t k) {
      k ^= k >> 33;
      k *= 0xff51afd7ed558ccdULL;
      k ^= k >> 33;
      return k;
    }
  };

  void encode_piece(std::string_view word, Cache& cache, std::vector<int32_t>& out) const;
  void initial_symbols(std::string_view word, std::vector<int32_t>& symbols) const;
  bool cut_allowed(std::string_view word, size_t at) const;
  void merge(std::vector<int32_t>& symbols, Cache& cache) const;
  void merge_long(std::vector<int32_t>& symbols, Cache& cache) const;

  bool byte_level_ = false;
  bool ignore_merges_ = false;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  std::optional<int32_t> unk_id_;
  std::string prefix_;  // continuing_subword_prefix
  std::string suffix_;  // end_of_word_suffix
  // SentencePiece-style vocabularies make a whole paragraph one word. A word
  // may be cut before a "▁" without changing the result when no token can
  // span the cut, i.e. no vocabulary token contains the character before it
  // followed by "▁" (checked at load: cut_before_space_, and the characters
  // after which a cut is not allowed). The pieces are then short and cached.
  bool cut_before_space_ = false;
  std::unordered_map<char32_t, bool> no_cut_after_;
  std::vector<std::string> tokens_;  // by id
  StringIdMap vocab_;                // token -> id
  int32_t byte_ids_[256];            // byte-level: the id of each byte's token, -1 if none
  int32_t ascii_ids_[128];           // character-level: the id of each ASCII character, -1 if none
  int32_t byte_fallback_ids_[256];   // <0xNN>, -1 if none
  PairTable merges_;
};

}  // namespace fd::text
