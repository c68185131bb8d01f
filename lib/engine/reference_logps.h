// The reference model's log-probabilities of preference training (DPO; preference.h), computed
// once per pair and kept in the run directory so that a resume or a later epoch does not
// compute them again (docs/RUN_DIR.md):
//
//   RUN/cache/reference_logps-<key 16 hex>.bin
//
// The key is the SHA-256 of everything the values depend on (the data's digest, the
// reference's weights, the model, the compute dtype: reference_key()); a file whose key, counts
// or checksum disagree is not used (the caller recomputes and replaces it). Format: one JSON
// line {"format": "fdtrain reference logps", "version": 1, "key", "train_pairs", "val_pairs",
// "crc32c"} then (train_pairs + val_pairs) * 2 little-endian float64: each pair's chosen and
// rejected summed completion log-probs, training pairs first.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace fd::engine {

struct ReferenceLogps {
  std::vector<double> train;  // 2 per training pair: chosen, rejected
  std::vector<double> val;    // 2 per validation pair
};

// SHA-256 hex of `what` (a JSON object naming everything the values depend on), serialised.
std::string reference_key(const nlohmann::json& what);

// Where the values of `key` are kept in run directory `run_dir`.
std::filesystem::path reference_cache_path(const std::filesystem::path& run_dir,
                                           const std::string& key);

// The values kept at `path` for `key` and these counts, or nullopt when there is no such file
// or it does not hold them (`why`, if given, says why not: for the log). Never throws.
std::optional<ReferenceLogps> read_reference_cache(const std::filesystem::path& path,
                                                   const std::string& key, int64_t train_pairs,
                                                   int64_t val_pairs, std::string* why = nullptr);

// Writes `values` for `key` at `path` atomically (a temporary file, fsync, rename) and removes
// the other reference_logps-*.bin files beside it. Returns "" or what failed (one line).
std::string write_reference_cache(const std::filesystem::path& path, const std::string& key,
                                  const ReferenceLogps& values);

}  // namespace fd::engine
