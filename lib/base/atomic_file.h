// Whole-file writes that a crash cannot leave half done: a temporary file
// beside the target, written, fsync'ed, renamed over it, and the directory
// fsync'ed so that the rename itself survives.
//
// Temporary names for outputs a user chose (exports, token files) are made
// fresh: `<target>.tmp-XXXXXX` with a unique suffix (mkstemp / mkdtemp), so
// that no file or directory of the user's that happens to be called
// `<target>.tmp` is ever truncated or deleted. A crash can leave such a
// `.tmp-XXXXXX` behind; nothing removes it automatically (it might be
// another job's), and it is safe to delete by hand (docs/RUN_DIR.md).
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

// A new, empty directory `<target>.tmp-XXXXXX` beside `target` (mkdtemp: a
// name nothing had), to stage a directory that is then renamed onto `target`.
// Throws fd::Error (kRuntime) naming the path when it cannot be made.
std::filesystem::path make_temp_dir_beside(const std::filesystem::path& target);

// A directory staged beside its target (make_temp_dir_beside), removed with
// its contents when this goes out of scope (a failed write leaves nothing),
// unless committed() was called once it was renamed onto the target. Only a
// crash leaves it behind.
class StagingDir {
 public:
  explicit StagingDir(const std::filesystem::path& target);
  ~StagingDir();
  StagingDir(const StagingDir&) = delete;
  StagingDir& operator=(const StagingDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  void committed() { committed_ = true; }

 private:
  std::filesystem::path path_;
  bool committed_ = false;
};

// A new, empty file `<target>.tmp-XXXXXX` beside `target` (mkstemp), mode
// 0644, open for writing: returns its descriptor (the caller closes it) and
// sets *tmp to its path. Throws fd::Error (kRuntime) naming the path.
int make_temp_file_beside(const std::filesystem::path& target, std::filesystem::path* tmp);

}  // namespace fd
