// Where a command may write its output: the one rule every command that
// writes a path the user names goes through (`ckpt export --out`, `--hf-dir`,
// `--lora-adapter`, `tokenize --out`; docs/RUN_DIR.md, "Outputs").
//
//   check_output_path("runs/a/model.safetensors", OutputKind::kFile, "--out");  // fine
//   check_output_path("runs/a/config.yaml", OutputKind::kFile, "--out");        // refused
//
// 1. What is there must be what the command writes: a file output replaces
//    only a regular file, a directory output only a directory. A FIFO, a
//    device, a socket, or a directory where a file goes (and a file where a
//    directory goes) is refused, with --overwrite too.
// 2. A run directory's own files are never an output: inside a run directory
//    (one holding an fdtrain config.yaml, run_dir.h) an output may be a new
//    name directly in it (RUN/model.safetensors, RUN/hf, RUN/adapter: the
//    Makefile's demos write there), never RUN itself, one of the files the run
//    writes (config.yaml, command.txt, run.json, metrics.jsonl, summary.json,
//    .lock, .summary_reserve, their temporary files, events.out.tfevents.*),
//    nor anything under its checkpoints/ or logs/, which the run prunes and
//    --overwrite removes. A checkpoint step directory (manifest.json), wherever
//    it is, is never written into either.
// Symbolic links are followed: the rule applies to what the path names.
// Whether an existing output may be replaced at all (--overwrite) is the
// command's own check, made after this one.
#pragma once

#include <filesystem>
#include <string_view>

namespace fd::engine {

enum class OutputKind {
  kFile,       // a file written whole and renamed into place
  kDirectory,  // a directory staged beside it and renamed into place
};

// Throws fd::Error (kUsage) naming `option` ("--out"), `path`, why and what to
// do, when the rule above refuses `path`; changes nothing.
void check_output_path(const std::filesystem::path& path, OutputKind kind, std::string_view option);

}  // namespace fd::engine
