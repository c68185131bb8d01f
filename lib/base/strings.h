// Small string utilities shared by the config loader and the CLI.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace fd {

// Levenshtein edit distance.
size_t edit_distance(std::string_view a, std::string_view b);

// The candidate closest to `word`, or "" when none is plausibly meant
// (distance more than about a third of the word's length).
std::string nearest(std::string_view word, const std::vector<std::string>& candidates);

std::vector<std::string> split(std::string_view s, char sep);

// Human-readable byte count: "1.50 MiB".
std::string format_bytes(double bytes);

}  // namespace fd
