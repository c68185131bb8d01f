// Reading the files a user hands us: configuration files, tokenizers, chat
// messages, records. Every such reader goes through here so that one set of
// rules holds everywhere:
//  - only a regular file is read: a directory, FIFO, device or socket is
//    refused by name before it is opened (opening a FIFO would block, reading
//    /dev/zero would never end);
//  - the size is capped: a file larger than the cap is refused with the cap
//    named, never read into memory first;
//  - JSON is parsed with a nesting limit (kMaxJsonDepth), checked before any
//    code walks the tree, so that no consumer recursing over it can overflow
//    the stack; a syntax error names the file, line and column.
// Failures throw fd::Error (usage, exit 2) whose message names the file.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace fd {

// Default caps. Configuration-sized JSON (config.json, tokenizer_config.json,
// generation_config.json, a safetensors index, a --messages file) is small;
// tokenizer.json of a 256k vocabulary is tens of MB.
inline constexpr int64_t kMaxConfigFileBytes = int64_t(64) << 20;    // 64 MiB
inline constexpr int64_t kMaxTokenizerFileBytes = int64_t(1) << 30;  // 1 GiB
// Deeper than any real file (Hugging Face's tokenizer.json nests ~8 levels,
// config.json 3), shallow enough for any recursive walk over the tree.
inline constexpr int kMaxJsonDepth = 128;

// "a directory" etc. when `path` exists and is not a regular file (following
// links), "" when it is one or does not exist.
std::string non_regular_kind(const std::string& path);

// The whole content of the regular file `path`. `what` names it in messages
// ("the model's config.json", "--messages"). Refuses a path that does not
// exist, is not a regular file, cannot be read, or holds more than max_bytes.
std::string read_input_file(const std::string& path, std::string_view what,
                            int64_t max_bytes = kMaxConfigFileBytes);

// The deepest nesting of arrays and objects in JSON text, scanning no further
// than the first point deeper than `limit` (then limit + 1). Strings (with
// their escapes) are skipped; the text need not be valid JSON.
int json_nesting_depth(std::string_view text, int limit);

// Parses JSON text named `where` (a path, or "path, line 12"). Refuses text
// nested deeper than max_depth ("nested deeper than 128 levels") and invalid
// JSON ("where: line L, column C: not valid JSON: ..."), as usage errors.
nlohmann::json parse_json_input(std::string_view text, const std::string& where,
                                int max_depth = kMaxJsonDepth);

// The same without throwing: the empty string on success, else the reason
// (without `where`), for readers that collect errors per line (JSONL).
std::string try_parse_json(std::string_view text, nlohmann::json& out,
                           int max_depth = kMaxJsonDepth);
// The same keeping each object's keys in the text's order (what a chat template's tojson
// writes back).
std::string try_parse_json(std::string_view text, nlohmann::ordered_json& out,
                           int max_depth = kMaxJsonDepth);

// read_input_file + parse_json_input.
nlohmann::json read_json_file(const std::string& path, std::string_view what,
                              int64_t max_bytes = kMaxConfigFileBytes,
                              int max_depth = kMaxJsonDepth);

}  // namespace fd
