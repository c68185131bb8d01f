#include "lib/engine/reference_logps.h"

#include <fmt/format.h>

#include <bit>
#include <cstring>
#include <fstream>
#include <sstream>

#include "lib/base/atomic_file.h"
#include "lib/base/crc32c.h"
#include "lib/base/input_file.h"
#include "lib/base/sha256.h"

namespace fd::engine {
namespace {

constexpr const char* kFormat = "fdtrain reference logps";
constexpr int kVersion = 1;
constexpr const char* kPrefix = "reference_logps-";

static_assert(std::endian::native == std::endian::little, "the cache is little-endian float64");

}  // namespace

std::string reference_key(const nlohmann::json& what) {
  const std::string text = what.dump();
  Sha256 h;
  h.update(text.data(), text.size());
  return h.hex_digest();
}

std::filesystem::path reference_cache_path(const std::filesystem::path& run_dir,
                                           const std::string& key) {
  return run_dir / "cache" / (kPrefix + key.substr(0, 16) + ".bin");
}

std::optional<ReferenceLogps> read_reference_cache(const std::filesystem::path& path,
                                                   const std::string& key, int64_t train_pairs,
                                                   int64_t val_pairs, std::string* why) {
  auto fail = [&](const std::string& reason) -> std::optional<ReferenceLogps> {
    if (why != nullptr) *why = reason;
    return std::nullopt;
  };
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return fail("no cached values");
  std::ifstream in(path, std::ios::binary);
  std::string line;
  if (!in || !std::getline(in, line)) return fail("unreadable");
  nlohmann::json head;
  if (!try_parse_json(line, head).empty() || !head.is_object()) return fail("not a cache file");
  const size_t n = size_t(2 * (train_pairs + val_pairs));
  try {
    if (head.value("format", "") != kFormat || head.value("version", 0) != kVersion)
      return fail("another format");
    if (head.value("key", "") != key) return fail("computed for other data or another reference");
    if (head.value("train_pairs", int64_t(-1)) != train_pairs ||
        head.value("val_pairs", int64_t(-1)) != val_pairs)
      return fail("other pair counts");
  } catch (const nlohmann::json::exception&) {
    return fail("not a cache file");
  }
  std::vector<double> all(n);
  in.read(reinterpret_cast<char*>(all.data()), std::streamsize(n * sizeof(double)));
  if (!in || in.peek() != std::char_traits<char>::eof()) return fail("truncated or too long");
  if (head.value("crc32c", int64_t(-1)) != int64_t(crc32c(all.data(), n * sizeof(double))))
    return fail("checksum mismatch");
  ReferenceLogps out;
  out.train.assign(all.begin(), all.begin() + 2 * train_pairs);
  out.val.assign(all.begin() + 2 * train_pairs, all.end());
  return out;
}

std::string write_reference_cache(const std::filesystem::path& path, const std::string& key,
                                  const ReferenceLogps& values) {
  std::vector<double> all(values.train);
  all.insert(all.end(), values.val.begin(), values.val.end());
  const nlohmann::json head = {
      {"format", kFormat},
      {"version", kVersion},
      {"key", key},
      {"train_pairs", int64_t(values.train.size() / 2)},
      {"val_pairs", int64_t(values.val.size() / 2)},
      {"crc32c", int64_t(crc32c(all.data(), all.size() * sizeof(double)))}};
  std::string content = head.dump() + "\n";
  content.append(reinterpret_cast<const char*>(all.data()), all.size() * sizeof(double));
  std::error_code ec;
  const std::filesystem::path dir = path.parent_path();
  std::filesystem::create_directories(dir, ec);
  if (ec) return fmt::format("cannot create {}: {}", dir.string(), ec.message());
  const std::string err =
      write_file_atomically(path, content, std::filesystem::path(path.string() + ".tmp"));
  if (!err.empty()) return err;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (e.path() != path && name.rfind(kPrefix, 0) == 0) std::filesystem::remove(e.path(), ec);
  }
  return "";
}

}  // namespace fd::engine
