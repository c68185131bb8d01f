// JavaScript's string and number semantics on UTF-8 text, as the Jinja
// interpreter (jinja.h) needs them: JavaScript's whitespace (String.trim,
// the regex \s), UTF-16 lengths and indices, Number::toString, JSON.stringify
// of a string, toUpperCase/toLowerCase (full Unicode case mapping, tables
// generated from Node.js by tests/jinja/make_case_table.mjs), parseInt,
// parseFloat and the string-to-number conversion of loose equality.
//
// Invalid UTF-8 counts one unit per bad byte and is otherwise passed through.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace fd::jinja::text {

// Decodes the code point at s[i] and advances i (a bad byte: U+FFFD, one byte).
uint32_t next_code_point(std::string_view s, size_t& i);
void append_utf8(std::string& out, uint32_t cp);

// JavaScript's WhiteSpace and LineTerminator code points (trim, \s).
bool is_space(uint32_t cp);
// Bytes of whitespace at s[i] (0 if none).
size_t space_at(std::string_view s, size_t i);
// Index of the first byte that is not leading whitespace / one past the last
// byte that is not trailing whitespace (trimStart / trimEnd).
size_t trim_start(std::string_view s);
size_t trim_end(std::string_view s);

bool is_ascii(std::string_view s);
// String.length: UTF-16 code units.
int64_t utf16_length(std::string_view s);
// The code point holding UTF-16 unit `index` (negative: from the end, as
// String.prototype.at): its byte range [begin, end). Returns 0 if out of
// range, 1 on success, 2 when the unit is half of a surrogate pair.
int utf16_at(std::string_view s, int64_t index, size_t& begin, size_t& end);
// Compares as JavaScript's < on strings (UTF-16 code unit order).
int compare_utf16(std::string_view a, std::string_view b);

std::string to_upper(std::string_view s);
std::string to_lower(std::string_view s);

// Number.prototype.toString() (shortest round trip, JavaScript's layout).
std::string number_to_string(double d);
// Number.prototype.toFixed(1) for an integral d (below 1e21: exact digits).
std::string number_to_fixed1(double d);
// JSON.stringify(s): quotes, \" \\ \b \f \n \r \t, other controls \u00xx;
// ensure_ascii then writes every UTF-16 unit from 0x7F up as \uxxxx.
void append_json_string(std::string& out, std::string_view s, bool ensure_ascii);

// parseInt(s, 10), parseFloat(s), Number(s): NaN when there is no number.
double parse_int(std::string_view s);
double parse_float(std::string_view s);
double string_to_number(std::string_view s);

namespace tables {
struct CaseRun {
  uint32_t start;
  uint32_t count;
  uint32_t stride;
  int32_t delta;
};
struct CaseSpecial {
  uint32_t cp;
  const char* utf8;
};
struct CpRange {
  uint32_t first, last;
};
extern const CaseRun kUpperRuns[];
extern const size_t kUpperRunCount;
extern const CaseSpecial kUpperSpecials[];
extern const size_t kUpperSpecialCount;
extern const CaseRun kLowerRuns[];
extern const size_t kLowerRunCount;
extern const CaseSpecial kLowerSpecials[];
extern const size_t kLowerSpecialCount;
extern const CpRange kCased[];
extern const size_t kCasedCount;
extern const CpRange kCaseIgnorable[];
extern const size_t kCaseIgnorableCount;
}  // namespace tables

}  // namespace fd::jinja::text
