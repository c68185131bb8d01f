// PreTokenizer: a tokenizer.json "pre_tokenizer", which cuts normalized text
// into the words BPE then encodes one by one.
//
// Supported, as Hugging Face's tokenizers define them: Split (String or Regex
// pattern; behaviours Removed, Isolated, MergedWithPrevious, MergedWithNext,
// Contiguous; invert), ByteLevel (add_prefix_space, use_regex with GPT-2's
// pattern; the byte-to-character mapping itself is folded into the BPE
// vocabulary, see bpe.h, so ByteLevel must come last), Metaspace (replacement,
// prepend_scheme always/first/never, split), Digits (individual_digits) and
// Sequence of these. Anything else is refused, naming its JSON path and type.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "lib/text/regex.h"

namespace fd::text {

// A word: bytes [begin, end) of the pre-tokenizer's output text.
struct Span {
  uint32_t begin;
  uint32_t end;
};

class PreTokenizer {
 public:
  struct Step;

  // Scratch buffers of one thread.
  struct Scratch {
    Regex::Matcher matcher;
    std::string text[2];
    std::vector<Span> spans[2];
  };

  // From the "pre_tokenizer" value of a tokenizer.json (null: the whole text
  // is one word).
  static PreTokenizer from_json(const nlohmann::json& j, const std::string& where);

  PreTokenizer();
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;
  ~PreTokenizer();

  // True when the pipeline has a ByteLevel step (the model's vocabulary is then byte-level).
  bool byte_level() const { return byte_level_; }

  // Where a text sits in the input.
  enum Place : int {
    kInside = 0,
    kAtStart = 1,       // it begins the input (Metaspace's prepend_scheme "first")
    kContinuing = 2,    // it continues the text before it (a long document cut in
                        // pieces): no prefix space or "▁" is added to its first word
  };

  // Splits `text` into words. Returns the text the spans index into: `text`
  // itself, or a buffer in `scratch` when a step rewrote it; `words` is replaced.
  std::string_view split(std::string_view text, Place place, Scratch& scratch,
                         std::vector<Span>& words) const;

 private:
  std::vector<std::unique_ptr<Step>> steps_;
  bool byte_level_ = false;
};

}  // namespace fd::text
