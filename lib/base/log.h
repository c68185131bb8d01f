// Minimal leveled logging to stderr, fmt-formatted.
//
// Messages carry a "fdtrain:" prefix (and "[rank r]" once a rank is set) so
// that interleaved output from several ranks stays attributable.
#pragma once

#include <fmt/format.h>

#include <string_view>

namespace fd::log {

enum class Level { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

void set_level(Level level);
Level level();
// Rank shown in every message; -1 (the default) shows none.
void set_rank(int rank);
void write(Level level, std::string_view message);

template <typename... Args>
void info(fmt::format_string<Args...> f, Args&&... args) {
  if (level() <= Level::kInfo) write(Level::kInfo, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) {
  if (level() <= Level::kWarn) write(Level::kWarn, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void debug(fmt::format_string<Args...> f, Args&&... args) {
  if (level() <= Level::kDebug) write(Level::kDebug, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace fd::log
