// The checkpoint directory layout, its manifest and the `latest` pointer.
//
//   RUN/checkpoints/
//     latest                   one line: the name of the newest complete step directory
//     step_00000100/
//       manifest.json          which shards exist (Manifest)
//       rank_00000.h5 ...      one shard per rank (shard.h)
//
// A step directory is written under a temporary name and renamed into place
// when complete; `latest` is written last, via a temporary file and rename
// (write_latest). Everything here is JSON or plain text; see docs/FORMAT.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace fd::ckpt {

// The version of the checkpoint format (shards and manifest) this build
// writes and reads; bumped on any incompatible change (docs/FORMAT.md).
inline constexpr int kFormatVersion = 2;
// The oldest version this build still reads (1: HDF5's Fletcher32 on the state's datasets and
// zlib's CRC-32 of whole shards in the manifest; 2: CRC-32C of every chunk and of whole shards).
inline constexpr int kOldestFormatVersion = 1;

// "step_00000100": the directory of the checkpoint taken after `step` steps.
std::string step_dir_name(int64_t step);
// "rank_00003.h5": rank's shard file within a step directory.
std::string shard_file_name(int rank);

// Size and CRC-32 (zlib's) of a whole shard file. Recorded in the manifest
// when the checkpoint is written and checked before HDF5 opens the shard, so
// a damaged shard is refused without HDF5 ever parsing it: HDF5's metadata
// checksums do not cover every structure (global heaps, v1 B-trees), and
// HDF5 1.10 does not survive every damaged file (bench/RELIABILITY.md).
// Format version 2 records CRC-32C (Castagnoli: the SSE4.2 instruction, ~10 GB/s), version 1
// zlib's CRC-32; `castagnoli` says which `crc32` is.
struct FileDigest {
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
  bool castagnoli = true;
  bool operator==(const FileDigest&) const = default;
};

// The digest of the file at `path` (CRC-32C, or zlib's CRC-32 with castagnoli false). Throws
// fd::Error kRuntime if it cannot be read.
FileDigest file_digest(const std::string& path, bool castagnoli = true);

struct ManifestSegment {
  std::string name;  // "embed", "h.0", ..., "final"
  int64_t numel;     // padded numel of the segment's flat space in the writer's layout
  // Tensor parallelism: the tp rank whose flat space this is (each tp rank's segments are
  // different flat spaces under the same names, and their numel may differ). Stored in the
  // manifest only when some segment's tp is not 0.
  int tp = 0;
};

// RUN/checkpoints/step_XXXXXXXX/manifest.json.
struct Manifest {
  int format_version = kFormatVersion;
  int64_t step = 0;
  int world_size = 1;
  int zero_stage = 0;
  std::string precision;                  // "fp32" | "bf16" | "fp16"
  std::vector<std::string> files;         // shard file names, rank order: "rank_00000.h5", ...
  std::vector<ManifestSegment> segments;  // forward order; tensor-parallel: tp rank 0's, then
                                          // tp rank 1's, ...
  // One per file, in the same order; empty in checkpoints written before
  // digests were recorded (then nothing is checked).
  std::vector<FileDigest> digests;
};

// Writes `dir`/manifest.json (via a temporary file, renamed, fsync'ed).
// Throws fd::Error kRuntime on I/O failure.
void write_manifest(const std::string& dir, const Manifest& manifest);

// Reads and validates `dir`/manifest.json and checks that every shard it
// lists exists. Throws fd::Error kUsage naming the file (or the missing
// shard) and what to do.
Manifest read_manifest(const std::string& dir);

// Checks every shard `manifest` lists in `dir` against its recorded digest
// (nothing when the manifest records none). Throws fd::Error kUsage naming
// the damaged or truncated shard and what to do.
void verify_shard_files(const std::string& dir, const Manifest& manifest);

// Moves the complete directory `tmp` to `final_dir` (same file system). A
// directory already at `final_dir` (a step saved again after a resume, an
// adapter saved over) is swapped out atomically (renameat2 RENAME_EXCHANGE)
// and only then removed, so at every moment `final_dir` is the old or the new
// complete directory. Where the file system cannot exchange, the old one is
// first moved aside to a fresh `final_dir`.tmp-XXXXXX (make_temp_dir_beside),
// never over a directory of the user's. Throws fd::Error kRuntime on failure.
void replace_directory(const std::string& tmp, const std::string& final_dir);

// Writes `checkpoints_dir`/latest = step_dir_name(step) via a temporary file
// and rename, so that a reader sees the old or the new pointer, never a
// partial one. Throws fd::Error kRuntime on I/O failure.
void write_latest(const std::string& checkpoints_dir, int64_t step);

// The step directory `checkpoints_dir`/latest names, as a path; nullopt if
// there is no `latest`. Throws fd::Error kUsage if it names a directory that
// does not exist.
std::optional<std::string> read_latest(const std::string& checkpoints_dir);

// Resolves what a user passes as a checkpoint: a step directory (has
// manifest.json), a checkpoints directory (its `latest`) or a run directory
// (its checkpoints/latest). Throws fd::Error kUsage when it is none of these.
std::string resolve_step_dir(const std::string& path);

// The complete step directories (step_XXXXXXXX, not a .step_N.tmp being
// written) of `checkpoints_dir`, newest first; none when it does not exist.
std::vector<std::filesystem::path> step_dirs_newest_first(
    const std::filesystem::path& checkpoints_dir);

}  // namespace fd::ckpt
