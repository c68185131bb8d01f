// UTF-8 helpers for the tokenizers: decoding one code point, encoding one, and
// making arbitrary bytes valid UTF-8 the way Hugging Face's tokenizers receive
// text (a Python str read with errors="replace", a JS TextDecoder): every
// maximal invalid subpart becomes U+FFFD (Unicode's "best practice", WHATWG's
// decoder), everything valid is kept as it is.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace fd::text {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// The length of the valid UTF-8 sequence starting at text[i], or 0 when the
// bytes there do not start one (an invalid, overlong, surrogate or truncated
// sequence). Requires i < text.size().
size_t utf8_sequence_length(std::string_view text, size_t i);

// True when every byte of `text` belongs to a valid UTF-8 sequence.
bool is_valid_utf8(std::string_view text);
// Where the first byte that does not belong to one is, or npos.
size_t first_invalid_utf8(std::string_view text);

// `text` with every maximal invalid subpart replaced by U+FFFD; `text` itself
// when it is valid (the common case costs one scan).
std::string to_valid_utf8(std::string_view text);

// The code point of the valid sequence of `len` bytes at p (len from
// utf8_sequence_length).
char32_t utf8_decode(const char* p, size_t len);

// Appends the UTF-8 encoding of `c` (a Unicode scalar value) to out.
void utf8_append(std::string& out, char32_t c);

}  // namespace fd::text
