// Whole-file writes that a crash cannot leave half done: a temporary file
// beside the target, written, fsync'ed, renamed over it, and the directory
// fsync'ed so that the rename itself survives.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace fd {

// Writes `content` to `path` through `tmp` (same directory as `path`). Returns
// "" on success, or one line saying what failed ("cannot write X: No space
// left on device"); on failure the temporary file is removed and `path` is as
// it was. Never throws for I/O errors: callers word their own message.
std::string write_file_atomically(const std::filesystem::path& path, std::string_view content,
                                  const std::filesystem::path& tmp);

// fsync of a directory, so that renames in it survive a crash (best effort).
void sync_directory(const std::filesystem::path& dir);

}  // namespace fd
