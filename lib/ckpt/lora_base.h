// The base model of a LoRA checkpoint.
//
// A LoRA checkpoint holds only the adapters: deltas to one exact base file,
// the run's model.init_from, which it identifies by the file's SHA-256
// (ShardMeta::base_sha256). Merged into any other file the adapters give a
// wrong model without any error, so every command that combines a checkpoint's
// adapters with a base (resume, `ckpt export --merge-lora`, `eval`,
// `generate`) first checks the file with check_lora_base_digest().
//
// model.init_from is stored as the run was given it, possibly relative to
// the directory the run was started in; find_lora_base() says so when such a
// path does not resolve from here.
#pragma once

#include <string>
#include <string_view>

namespace fd::ckpt {

// Lower-case hex SHA-256 of the file at `path`; of a Hugging Face model
// directory, the SHA-256 of the lines "<name> <file SHA-256>\n" of its
// config.json and weight files (model*.safetensors, the index), in name
// order. Throws fd::Error kUsage when it cannot be read.
std::string file_sha256(const std::string& path);

// Throws fd::Error kUsage unless `base_sha256` (the digest of the base file at
// `base_path`, as file_sha256() gives it; "" when there is no base) equals
// `recorded_sha256` (the checkpoint's ShardMeta::base_sha256; "" when it
// records none). The message is one line:
//   "<where>: the checkpoint's LoRA adapters were trained on a base with
//    SHA-256 <recorded>, but model.init_from (<base_path>) has <base_sha256>;
//    <remedy>"
// `where` names the checkpoint (its step directory); `remedy` says what to do
// in the caller's terms (resume: "resume with the same base file").
void check_lora_base_digest(const std::string& where, const std::string& recorded_sha256,
                            const std::string& base_path, const std::string& base_sha256,
                            std::string_view remedy);

// For commands that read a stored LoRA checkpoint (not resume, whose recipe
// is the user's): checks that `init_from` (the checkpoint's stored
// model.init_from) names a file from the current directory and that it is the
// file the adapters were trained on (check_lora_base_digest() against
// `recorded_sha256`), and returns `init_from`. `where` names the checkpoint.
// Throws fd::Error kUsage: no init_from, no such file (for a relative path,
// the message says it is resolved from the directory the run was started in),
// or another file.
std::string find_lora_base(const std::string& where, const std::string& init_from,
                           const std::string& recorded_sha256);

}  // namespace fd::ckpt
