#include "lib/text/utf8.h"

namespace fd::text {
namespace {

inline bool is_continuation(unsigned char b) { return (b & 0xC0) == 0x80; }

// The length of the longest prefix of a sequence starting at text[i] that could
// still become valid ("maximal subpart"), at least 1: what one U+FFFD replaces.
size_t maximal_subpart(std::string_view text, size_t i) {
  const auto b0 = static_cast<unsigned char>(text[i]);
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return 1;
  }
  size_t n = 1;
  for (; n < need && i + n < text.size(); ++n) {
    const auto b = static_cast<unsigned char>(text[i + n]);
    if (n == 1 ? (b < lo || b > hi) : !is_continuation(b)) break;
  }
  return n;  // == need exactly when the sequence is valid
}

}  // namespace

size_t utf8_sequence_length(std::string_view text, size_t i) {
  const auto b0 = static_cast<unsigned char>(text[i]);
  if (b0 < 0x80) return 1;
  if (b0 < 0xC2 || b0 > 0xF4) return 0;
  const size_t need = b0 >= 0xF0 ? 4 : b0 >= 0xE0 ? 3 : 2;
  return maximal_subpart(text, i) == need ? need : 0;
}

size_t first_invalid_utf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t n = utf8_sequence_length(text, i);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

bool is_valid_utf8(std::string_view text) {
  return first_invalid_utf8(text) == std::string_view::npos;
}

std::string to_valid_utf8(std::string_view text) {
  std::string out;
  size_t copied = 0;  // text[0, copied) is in out
  for (size_t i = 0; i < text.size();) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t n = utf8_sequence_length(text, i);
    if (n != 0) {
      i += n;
      continue;
    }
    if (out.empty()) out.reserve(text.size() + 16);
    out.append(text.substr(copied, i - copied));
    out.append(kReplacementChar);
    i += maximal_subpart(text, i);
    copied = i;
  }
  if (copied == 0) return std::string(text);
  out.append(text.substr(copied));
  return out;
}

char32_t utf8_decode(const char* p, size_t len) {
  const auto* b = reinterpret_cast<const unsigned char*>(p);
  switch (len) {
    case 1:
      return b[0];
    case 2:
      return (char32_t(b[0] & 0x1F) << 6) | (b[1] & 0x3F);
    case 3:
      return (char32_t(b[0] & 0x0F) << 12) | (char32_t(b[1] & 0x3F) << 6) | (b[2] & 0x3F);
    default:
      return (char32_t(b[0] & 0x07) << 18) | (char32_t(b[1] & 0x3F) << 12) |
             (char32_t(b[2] & 0x3F) << 6) | (b[3] & 0x3F);
  }
}

void utf8_append(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

}  // namespace fd::text
