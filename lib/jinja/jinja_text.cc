#include "lib/jinja/jinja_text.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>

namespace fd::jinja::text {

uint32_t next_code_point(std::string_view s, size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  int len = 0;
  uint32_t cp = 0, min = 0;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2, cp = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, cp = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    ++i;
    return 0xFFFD;
  }
  if (i + len > s.size()) {
    ++i;
    return 0xFFFD;
  }
  for (int k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) {
      ++i;
      return 0xFFFD;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    ++i;
    return 0xFFFD;
  }
  i += len;
  return cp;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool is_space(uint32_t cp) {
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
    case 0xFEFF:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

size_t space_at(std::string_view s, size_t i) {
  if (i >= s.size()) return 0;
  const auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) return (b == ' ' || (b >= 0x09 && b <= 0x0D)) ? 1 : 0;
  size_t j = i;
  const uint32_t cp = next_code_point(s, j);
  return is_space(cp) ? j - i : 0;
}

size_t trim_start(std::string_view s) {
  size_t i = 0;
  while (size_t n = space_at(s, i)) i += n;
  return i;
}

size_t trim_end(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    // Step back over one code point (at most 4 bytes; continuation bytes first).
    size_t start = end - 1;
    while (start > 0 && end - start < 4 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80)
      --start;
    if (space_at(s, start) != end - start) break;
    end = start;
  }
  return end;
}

bool is_ascii(std::string_view s) {
  for (const char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

int64_t utf16_length(std::string_view s) {
  int64_t n = 0;
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
      ++i, ++n;
      continue;
    }
    n += next_code_point(s, i) >= 0x10000 ? 2 : 1;
  }
  return n;
}

int utf16_at(std::string_view s, int64_t index, size_t& begin, size_t& end) {
  if (index < 0) index += utf16_length(s);
  if (index < 0) return 0;
  int64_t unit = 0;
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    const uint32_t cp = next_code_point(s, i);
    const int64_t width = cp >= 0x10000 ? 2 : 1;
    if (index < unit + width) {
      begin = start, end = i;
      return width == 2 ? 2 : 1;
    }
    unit += width;
  }
  return 0;
}

int compare_utf16(std::string_view a, std::string_view b) {
  // UTF-8 byte order is code point order; UTF-16 differs only in putting
  // supplementary code points (surrogates, 0xD800..) below U+E000..U+FFFF.
  auto key = [](uint32_t cp) -> uint32_t {
    if (cp >= 0x10000) return 0xD800 + ((cp - 0x10000) >> 10);
    return cp;
  };
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const uint32_t ca = next_code_point(a, i), cb = next_code_point(b, j);
    if (ca == cb) continue;
    const uint32_t ka = key(ca), kb = key(cb);
    if (ka != kb) return ka < kb ? -1 : 1;
    // Both supplementary with the same high surrogate: compare the low ones.
    const uint32_t la = 0xDC00 + ((ca - 0x10000) & 0x3FF), lb = 0xDC00 + ((cb - 0x10000) & 0x3FF);
    return la < lb ? -1 : 1;
  }
  if (i < a.size()) return 1;
  if (j < b.size()) return -1;
  return 0;
}

namespace {

// Maps cp through the run table; returns cp itself when unmapped.
uint32_t map_runs(const tables::CaseRun* runs, size_t n, uint32_t cp) {
  const tables::CaseRun* end = runs + n;
  const tables::CaseRun* it = std::upper_bound(
      runs, end, cp, [](uint32_t c, const tables::CaseRun& r) { return c < r.start; });
  if (it == runs) return cp;
  --it;
  const uint32_t off = cp - it->start;
  if (off / it->stride < it->count && off % it->stride == 0)
    return static_cast<uint32_t>(static_cast<int64_t>(cp) + it->delta);
  return cp;
}

const char* find_special(const tables::CaseSpecial* sp, size_t n, uint32_t cp) {
  const tables::CaseSpecial* end = sp + n;
  const tables::CaseSpecial* it = std::lower_bound(
      sp, end, cp, [](const tables::CaseSpecial& s, uint32_t c) { return s.cp < c; });
  return it != end && it->cp == cp ? it->utf8 : nullptr;
}

bool in_ranges(const tables::CpRange* r, size_t n, uint32_t cp) {
  const tables::CpRange* end = r + n;
  const tables::CpRange* it = std::upper_bound(
      r, end, cp, [](uint32_t c, const tables::CpRange& x) { return c < x.first; });
  return it != r && cp <= (it - 1)->last;
}

bool is_cased(uint32_t cp) { return in_ranges(tables::kCased, tables::kCasedCount, cp); }
bool is_case_ignorable(uint32_t cp) {
  return in_ranges(tables::kCaseIgnorable, tables::kCaseIgnorableCount, cp);
}

// Unicode's Final_Sigma: a cased letter (then case-ignorables) before, and no
// case-ignorables-then-cased-letter after.
bool final_sigma(std::string_view s, size_t begin, size_t end) {
  bool before = false;
  for (size_t pos = begin; pos > 0;) {
    size_t start = pos - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t k = start;
    const uint32_t cp = next_code_point(s, k);
    pos = start;
    if (is_case_ignorable(cp)) continue;
    before = is_cased(cp);
    break;
  }
  if (!before) return false;
  for (size_t k = end; k < s.size();) {
    const uint32_t cp = next_code_point(s, k);
    if (is_case_ignorable(cp)) continue;
    return !is_cased(cp);
  }
  return true;
}

}  // namespace

std::string to_upper(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
      out += static_cast<char>(b >= 'a' && b <= 'z' ? b - 32 : b);
      ++i;
      continue;
    }
    const size_t start = i;
    const uint32_t cp = next_code_point(s, i);
    if (cp == 0xFFFD && i - start == 1) {
      out += s[start];  // a bad byte passes through
      continue;
    }
    if (const char* sp = find_special(tables::kUpperSpecials, tables::kUpperSpecialCount, cp)) {
      out += sp;
      continue;
    }
    append_utf8(out, map_runs(tables::kUpperRuns, tables::kUpperRunCount, cp));
  }
  return out;
}

std::string to_lower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
      out += static_cast<char>(b >= 'A' && b <= 'Z' ? b + 32 : b);
      ++i;
      continue;
    }
    const size_t start = i;
    const uint32_t cp = next_code_point(s, i);
    if (cp == 0xFFFD && i - start == 1) {
      out += s[start];
      continue;
    }
    if (cp == 0x3A3) {
      append_utf8(out, final_sigma(s, start, i) ? 0x3C2 : 0x3C3);
      continue;
    }
    if (const char* sp = find_special(tables::kLowerSpecials, tables::kLowerSpecialCount, cp)) {
      out += sp;
      continue;
    }
    append_utf8(out, map_runs(tables::kLowerRuns, tables::kLowerRunCount, cp));
  }
  return out;
}

std::string number_to_string(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  if (d == 0) return "0";
  std::string out;
  if (d < 0) {
    out += '-';
    d = -d;
  }
  // Shortest round-trip digits in scientific form: D[.DDD]e[+-]X.
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  const std::string_view sci(buf, static_cast<size_t>(res.ptr - buf));
  const size_t e = sci.find('e');
  std::string digits;
  for (size_t i = 0; i < e; ++i)
    if (sci[i] != '.') digits += sci[i];
  const int exp10 = std::atoi(std::string(sci.substr(e + 1)).c_str());
  const int k = static_cast<int>(digits.size());
  const int n = exp10 + 1;  // the decimal point sits after n digits
  if (k <= n && n <= 21) {
    out += digits;
    out.append(static_cast<size_t>(n - k), '0');
  } else if (0 < n && n <= 21) {
    out += digits.substr(0, static_cast<size_t>(n));
    out += '.';
    out += digits.substr(static_cast<size_t>(n));
  } else if (-6 < n && n <= 0) {
    out += "0.";
    out.append(static_cast<size_t>(-n), '0');
    out += digits;
  } else {
    out += digits[0];
    if (k > 1) {
      out += '.';
      out += digits.substr(1);
    }
    out += 'e';
    out += n - 1 >= 0 ? '+' : '-';
    out += std::to_string(std::abs(n - 1));
  }
  return out;
}

std::string number_to_fixed1(double d) {
  if (!(std::fabs(d) < 1e21)) return number_to_string(d);
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::fixed, 1);
  std::string out(buf, static_cast<size_t>(res.ptr - buf));
  if (out == "-0.0") out = "0.0";  // (-0).toFixed(1) is "0.0"
  return out;
}

void append_json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  static const char* kHex = "0123456789abcdef";
  auto unit = [&](uint32_t u) {
    out += "\\u";
    for (int shift = 12; shift >= 0; shift -= 4) out += kHex[(u >> shift) & 0xF];
  };
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
      ++i;
      switch (b) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\b':
          out += "\\b";
          break;
        case '\f':
          out += "\\f";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        default:
          if (b < 0x20 || (ensure_ascii && b == 0x7F)) {
            unit(b);
          } else {
            out += static_cast<char>(b);
          }
      }
      continue;
    }
    const size_t start = i;
    const uint32_t cp = next_code_point(s, i);
    if (!ensure_ascii) {
      out.append(s.substr(start, i - start));
    } else if (cp >= 0x10000) {
      unit(0xD800 + ((cp - 0x10000) >> 10));
      unit(0xDC00 + ((cp - 0x10000) & 0x3FF));
    } else {
      unit(cp);
    }
  }
  out += '"';
}

namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// The longest prefix of s[i..] that is a StrUnsignedDecimalLiteral without
// "Infinity" (digits, '.', exponent); returns its end, or i if none.
size_t decimal_end(std::string_view s, size_t i) {
  size_t j = i;
  bool digits = false;
  while (j < s.size() && is_digit(s[j])) ++j, digits = true;
  if (j < s.size() && s[j] == '.') {
    size_t k = j + 1;
    bool frac = false;
    while (k < s.size() && is_digit(s[k])) ++k, frac = true;
    if (digits || frac) {
      j = k;
      digits = true;
    }
  }
  if (!digits) return i;
  if (j < s.size() && (s[j] == 'e' || s[j] == 'E')) {
    size_t k = j + 1;
    if (k < s.size() && (s[k] == '+' || s[k] == '-')) ++k;
    if (k < s.size() && is_digit(s[k])) {
      while (k < s.size() && is_digit(s[k])) ++k;
      j = k;
    }
  }
  return j;
}

double to_double(std::string_view digits) {
  return std::strtod(std::string(digits).c_str(), nullptr);
}

}  // namespace

double parse_int(std::string_view s) {
  size_t i = trim_start(s);
  bool neg = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  const size_t start = i;
  while (i < s.size() && is_digit(s[i])) ++i;
  if (i == start) return std::numeric_limits<double>::quiet_NaN();
  const double v = to_double(s.substr(start, i - start));
  return neg ? -v : v;
}

double parse_float(std::string_view s) {
  size_t i = trim_start(s);
  bool neg = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  if (s.substr(i, 8) == "Infinity") return neg ? -HUGE_VAL : HUGE_VAL;
  const size_t end = decimal_end(s, i);
  if (end == i) return std::numeric_limits<double>::quiet_NaN();
  const double v = to_double(s.substr(i, end - i));
  return neg ? -v : v;
}

double string_to_number(std::string_view s) {
  const size_t b = trim_start(s), e = std::max(b, trim_end(s));
  s = s.substr(b, e - b);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (s.empty()) return 0;
  if (s.size() > 2 && s[0] == '0') {
    int base = 0;
    if (s[1] == 'x' || s[1] == 'X') base = 16;
    if (s[1] == 'o' || s[1] == 'O') base = 8;
    if (s[1] == 'b' || s[1] == 'B') base = 2;
    if (base != 0) {
      double v = 0;
      for (size_t i = 2; i < s.size(); ++i) {
        const char c = s[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : 99;
        if (d >= base) return nan;
        v = v * base + d;
      }
      return v;
    }
  }
  size_t i = 0;
  bool neg = false;
  if (s[0] == '+' || s[0] == '-') neg = s[i++] == '-';
  if (s.substr(i) == "Infinity") return neg ? -HUGE_VAL : HUGE_VAL;
  const size_t end = decimal_end(s, i);
  if (end == i || end != s.size()) return nan;
  const double v = to_double(s.substr(i));
  return neg ? -v : v;
}

}  // namespace fd::jinja::text
