// Fuzz target: the tokenizer.json reader and the encoder (lib/text: HfTokenizer).
//
// Input: a tokenizer.json, a NUL byte, then text (any bytes). Checked: loading
// either succeeds or throws fd::Error; a tokenizer that loads encodes the
// text (with and without special tokens, and as a continuing piece) into ids
// below its vocab_size, decodes them to valid UTF-8, and encodes the same
// text to the same ids a second time (with the word cache warm).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "lib/text/hf_tokenizer.h"
#include "lib/text/utf8.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

void check(const std::vector<int32_t>& ids, int64_t vocab) {
  for (const int32_t id : ids) {
    if (id < 0 || id >= vocab) {
      std::fprintf(stderr, "tokenizer_fuzz: id %d not in [0, %lld)\n", id,
                   static_cast<long long>(vocab));
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input = fd::fuzz::as_view(data, size);
  const size_t nul = input.find('\0');
  const std::string json(input.substr(0, nul));
  const std::string_view text = nul == std::string_view::npos ? "" : input.substr(nul + 1);
  fd::fuzz::expect_clean([&] {
    const auto tok = fd::text::HfTokenizer::from_strings(json, "", "fuzz/tokenizer.json");
    fd::text::EncodeCache cache;
    for (const bool special : {true, false}) {
      std::vector<int32_t> a, b;
      tok->encode(text, special, a, cache);
      tok->encode(text, special, b, cache);
      check(a, tok->vocab_size());
      if (a != b) {
        std::fprintf(stderr, "tokenizer_fuzz: a second encoding differs\n");
        std::abort();
      }
      const std::string decoded = tok->decode(a);
      if (!fd::text::is_valid_utf8(decoded)) {
        std::fprintf(stderr, "tokenizer_fuzz: decode gave invalid UTF-8\n");
        std::abort();
      }
    }
    std::vector<int32_t> piece;
    tok->encode_piece(text, true, piece, cache);
    check(piece, tok->vocab_size());
  });
  return 0;
}
