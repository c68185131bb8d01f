// Minimal leveled logging, fmt-formatted: to the terminal (stderr) and, once
// opened, to a log file.
//
// Messages carry a "fdtrain:" prefix (and "[rank r]" once a rank r > 0 is
// set) so that interleaved output from several ranks stays attributable.
//
// What reaches the terminal: with no rank or rank 0 set, every message at or
// above level(); on any other rank only warnings and errors, so that a
// multi-rank job shows rank 0's log plus every rank's problems. The log file
// (open_file) gets every message at or above level() whatever the terminal
// shows, each line stamped with the UTC time.
//
// Thread-safe: messages may come from any thread.
#pragma once

#include <fmt/format.h>

#include <filesystem>
#include <string_view>

namespace fd::log {

enum class Level { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

void set_level(Level level);
Level level();
// Rank shown in every message; -1 (the default) or 0 shows none.
void set_rank(int rank);
int rank();
void write(Level level, std::string_view message);
// To the log file only (nothing when none is open), e.g. step lines that the
// terminal shows as a progress line instead.
void write_file_only(Level level, std::string_view message);
// A status line drawn in place at the bottom of the terminal (a progress
// line, engine/progress.h): `line` replaces the one shown, without a newline;
// "" erases it. While one is shown, a message printed to the terminal first
// erases it and then draws it again below, so that the two never share a line.
void set_status_line(std::string_view line);

// Opens `path` (creating its parent directories) as the log file: truncated,
// or appended to when `append`. Messages logged since the process started,
// before any file was open, are written first (up to 64 KiB of them), so the
// file holds the whole run. Replaces a file already open. Throws fd::Error
// (runtime) when the file cannot be opened.
void open_file(const std::filesystem::path& path, bool append);
// Flushes and closes the log file; later messages go to the terminal only.
void close_file();

template <typename... Args>
void info(fmt::format_string<Args...> f, Args&&... args) {
  if (level() <= Level::kInfo) write(Level::kInfo, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) {
  if (level() <= Level::kWarn) write(Level::kWarn, fmt::format(f, std::forward<Args>(args)...));
}
// A warning every rank would give alike (about the recipe or the data, which all ranks
// read): given by rank 0 (or a process with no rank) only, so a job shows it once.
template <typename... Args>
void warn_shared(fmt::format_string<Args...> f, Args&&... args) {
  if (rank() <= 0) warn(f, std::forward<Args>(args)...);
}
template <typename... Args>
void error(fmt::format_string<Args...> f, Args&&... args) {
  write(Level::kError, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void debug(fmt::format_string<Args...> f, Args&&... args) {
  if (level() <= Level::kDebug) write(Level::kDebug, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace fd::log
