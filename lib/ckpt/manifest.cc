#include "lib/ckpt/manifest.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <stdio.h>  // renameat2
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "lib/base/atomic_file.h"
#include "lib/base/check.h"
#include "lib/base/crc32c.h"
#include "lib/base/error.h"
#include "lib/base/input_file.h"
#include "lib/base/strings.h"

namespace fd::ckpt {

namespace fs = std::filesystem;

namespace {

// Writes `text` to `path` atomically (lib/base/atomic_file.h) through `path`.tmp.
void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string failed = fd::write_file_atomically(path, text, path + ".tmp");
  if (!failed.empty()) runtime_error("{}; is the disk full or read-only?", failed);
}

// Only a regular file, of at most 64 MiB (a FIFO in a checkpoint is refused, not waited on).
std::string read_text(const std::string& path) { return read_input_file(path, "checkpoint file"); }

}  // namespace

FileDigest file_digest(const std::string& path, bool castagnoli) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) runtime_error("cannot open {} to check it: {}", path, std::strerror(errno));
  FileDigest d;
  d.castagnoli = castagnoli;
  uLong crc = crc32(0L, Z_NULL, 0);
  uint32_t crc_c = 0;
  std::vector<unsigned char> buf(size_t(1) << 20);
  for (;;) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      runtime_error("cannot read {} to check it: {}", path, std::strerror(err));
    }
    if (n == 0) break;
    if (castagnoli)
      crc_c = crc32c(buf.data(), size_t(n), crc_c);
    else
      crc = crc32(crc, buf.data(), uInt(n));
    d.bytes += uint64_t(n);
  }
  ::close(fd);
  d.crc32 = castagnoli ? crc_c : uint32_t(crc);
  return d;
}

std::string step_dir_name(int64_t step) { return fmt::format("step_{:08d}", step); }
std::string shard_file_name(int rank) { return fmt::format("rank_{:05d}.h5", rank); }

void write_manifest(const std::string& dir, const Manifest& m) {
  nlohmann::ordered_json j;
  j["format_version"] = m.format_version;
  j["step"] = m.step;
  j["world_size"] = m.world_size;
  j["zero_stage"] = m.zero_stage;
  j["precision"] = m.precision;
  j["files"] = m.files;
  j["segments"] = nlohmann::ordered_json::array();
  const bool tensor_parallel = std::any_of(m.segments.begin(), m.segments.end(),
                                           [](const ManifestSegment& s) { return s.tp != 0; });
  for (const ManifestSegment& s : m.segments) {
    nlohmann::ordered_json e = {{"name", s.name}, {"numel", s.numel}};
    if (tensor_parallel) e["tp"] = s.tp;
    j["segments"].push_back(std::move(e));
  }
  if (!m.digests.empty()) {
    FD_CHECK(m.digests.size() == m.files.size(), "{} digests for {} files", m.digests.size(),
             m.files.size());
    // One kind per manifest: CRC-32C from format version 2 on, zlib's CRC-32 before.
    const bool castagnoli = m.digests.front().castagnoli;
    const char* key = castagnoli ? "file_crc32c" : "file_crc32";
    j["file_bytes"] = nlohmann::ordered_json::array();
    j[key] = nlohmann::ordered_json::array();
    for (const FileDigest& d : m.digests) {
      FD_CHECK(d.castagnoli == castagnoli, "digests of two kinds in one manifest");
      j["file_bytes"].push_back(d.bytes);
      j[key].push_back(fmt::format("{:08x}", d.crc32));
    }
  }
  write_file_atomically((fs::path(dir) / "manifest.json").string(), j.dump(2) + "\n");
}

Manifest read_manifest(const std::string& dir) {
  std::string path = (fs::path(dir) / "manifest.json").string();
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    usage_error("checkpoint directory {} does not exist; check the path", dir);
  if (!fs::exists(path, ec))
    usage_error(
        "{} is missing: {} is not a complete checkpoint (was its write interrupted?); "
        "resume from another checkpoint",
        path, dir);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text(path));
  } catch (const nlohmann::json::parse_error& e) {
    usage_error(
        "{} is not valid JSON (at byte {}); the checkpoint is corrupt; resume from another "
        "checkpoint",
        path, e.byte);
  } catch (const nlohmann::json::exception&) {
    usage_error("{} is not valid JSON; the checkpoint is corrupt; resume from another checkpoint",
                path);
  }
  Manifest m;
  try {
    m.format_version = j.at("format_version").get<int>();
    m.step = j.at("step").get<int64_t>();
    m.world_size = j.at("world_size").get<int>();
    m.zero_stage = j.at("zero_stage").get<int>();
    m.precision = j.at("precision").get<std::string>();
    m.files = j.at("files").get<std::vector<std::string>>();
    for (const auto& s : j.at("segments")) {
      const int tp = s.contains("tp") ? s.at("tp").get<int>() : 0;
      if (tp < 0 || tp >= m.world_size)
        usage_error(
            "{}: segment '{}' has tp rank {} of world size {}; the checkpoint is "
            "corrupt; resume from another checkpoint",
            path, s.at("name").get<std::string>(), tp, m.world_size);
      m.segments.push_back({s.at("name").get<std::string>(), s.at("numel").get<int64_t>(), tp});
    }
    if (j.contains("file_bytes") || j.contains("file_crc32") || j.contains("file_crc32c")) {
      // Version 1 records zlib's CRC-32 (file_crc32), version 2 CRC-32C (file_crc32c).
      const bool castagnoli = m.format_version >= 2;
      const char* key = castagnoli ? "file_crc32c" : "file_crc32";
      auto bytes = j.at("file_bytes").get<std::vector<uint64_t>>();
      auto crcs = j.at(key).get<std::vector<std::string>>();
      if (bytes.size() != m.files.size() || crcs.size() != m.files.size())
        usage_error(
            "{}: file_bytes and {} must list one entry per file ({}); the "
            "checkpoint is corrupt; resume from another checkpoint",
            path, key, m.files.size());
      for (size_t i = 0; i < bytes.size(); ++i) {
        const std::string& c = crcs[i];
        if (c.size() != 8 || c.find_first_not_of("0123456789abcdef") != std::string::npos)
          usage_error(
              "{}: {} entry '{}' is not 8 hex digits; the checkpoint is "
              "corrupt; resume from another checkpoint",
              path, key, c);
        m.digests.push_back({bytes[i], uint32_t(std::stoul(c, nullptr, 16)), castagnoli});
      }
    }
  } catch (const nlohmann::json::exception& e) {
    usage_error(
        "{}: missing or malformed field ({}); the checkpoint is corrupt; resume from "
        "another checkpoint",
        path, e.what());
  }
  if (m.world_size < 1 || int(m.files.size()) != m.world_size)
    usage_error("{}: lists {} shard files for world size {}; the checkpoint is corrupt", path,
                m.files.size(), m.world_size);
  for (const std::string& f : m.files) {
    if (f.empty() || f.find('/') != std::string::npos)
      usage_error("{}: invalid shard file name '{}'", path, f);
    fs::path shard = fs::path(dir) / f;
    if (!fs::exists(shard, ec))
      usage_error(
          "checkpoint shard {} is missing (the manifest {} lists {} shards); the "
          "checkpoint is incomplete; resume from another checkpoint",
          shard.string(), path, m.files.size());
  }
  return m;
}

void verify_shard_files(const std::string& dir, const Manifest& m) {
  for (size_t i = 0; i < m.digests.size() && i < m.files.size(); ++i) {
    std::string shard = (fs::path(dir) / m.files[i]).string();
    FileDigest want = m.digests[i], got = file_digest(shard, want.castagnoli);
    if (got.bytes != want.bytes)
      usage_error(
          "checkpoint shard {} is {} bytes, but the manifest says {}: the file is {}; resume "
          "from an earlier checkpoint",
          shard, got.bytes, want.bytes, got.bytes < want.bytes ? "truncated" : "damaged");
    if (got.crc32 != want.crc32)
      usage_error(
          "checkpoint shard {} is damaged: its {} is {:08x}, but the manifest says {:08x}; "
          "resume from an earlier checkpoint",
          shard, want.castagnoli ? "CRC-32C" : "CRC-32", got.crc32, want.crc32);
  }
}

void replace_directory(const std::string& tmp, const std::string& final_dir) {
  std::error_code ec;
  if (!fs::exists(final_dir, ec)) {
    fs::rename(tmp, final_dir, ec);
    if (ec) runtime_error("cannot rename {} to {}: {}", tmp, final_dir, ec.message());
  } else if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) ==
             0) {
    fs::remove_all(tmp, ec);  // now the old directory
  } else if (errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP) {
    // No RENAME_EXCHANGE here (e.g. some network file systems): move the old
    // directory aside first, onto a fresh empty final_dir.tmp-XXXXXX (never a
    // directory of the user's); a crash in between leaves it there.
    const std::string old = make_temp_dir_beside(final_dir).string();
    fs::rename(final_dir, old, ec);
    if (ec) runtime_error("cannot move {} aside to {}: {}", final_dir, old, ec.message());
    fs::rename(tmp, final_dir, ec);
    if (ec) {
      std::error_code back;
      fs::rename(old, final_dir, back);
      runtime_error("cannot rename {} to {}: {}", tmp, final_dir, ec.message());
    }
    fs::remove_all(old, ec);
  } else {
    runtime_error("cannot put {} in place of {}: {}", tmp, final_dir, std::strerror(errno));
  }
  sync_directory(fs::path(final_dir).parent_path());
}

void write_latest(const std::string& checkpoints_dir, int64_t step) {
  write_file_atomically((fs::path(checkpoints_dir) / "latest").string(),
                        step_dir_name(step) + "\n");
}

std::optional<std::string> read_latest(const std::string& checkpoints_dir) {
  fs::path latest = fs::path(checkpoints_dir) / "latest";
  std::error_code ec;
  if (!fs::exists(latest, ec)) return std::nullopt;
  if (!fs::is_regular_file(fs::symlink_status(latest, ec)))
    usage_error(
        "{} is not the plain file fdtrain writes (a directory or a link); delete it or "
        "write the name of a complete step directory into a file of that name",
        latest.string());
  std::string name = read_text(latest.string());
  while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
  const bool plain = name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
                       return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.';
                     });
  if (name.empty() || !plain)
    usage_error(
        "{} does not name a step directory (it holds {}); delete it or write the name "
        "of a complete step directory into it",
        latest.string(),
        plain ? "nothing" : fmt::format("{} bytes of something else", name.size()));
  fs::path dir = fs::path(checkpoints_dir) / name;
  if (!fs::is_directory(dir, ec))
    usage_error(
        "{} names {}, which does not exist; the checkpoints directory was modified; "
        "write the name of a complete step directory into it",
        latest.string(), dir.string());
  return dir.string();
}

std::string resolve_step_dir(const std::string& path) {
  std::error_code ec;
  fs::path p(path);
  if (!fs::exists(p, ec)) usage_error("checkpoint {} does not exist; check the path", path);
  if (fs::exists(p / "manifest.json", ec)) return p.string();
  for (const fs::path& dir : {p, p / "checkpoints"}) {
    if (std::optional<std::string> latest = read_latest(dir.string())) return *latest;
  }
  usage_error(
      "{} is not a checkpoint: expected a step directory (with manifest.json), a "
      "checkpoints directory or a run directory (with a `latest` pointer)",
      path);
}

std::vector<std::filesystem::path> step_dirs_newest_first(
    const std::filesystem::path& checkpoints_dir) {
  namespace fs = std::filesystem;
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(checkpoints_dir, ec))
    if (e.is_directory(ec) && e.path().filename().string().rfind("step_", 0) == 0 &&
        e.path().extension().empty())
      out.push_back(e.path());
  std::sort(out.rbegin(), out.rend());  // zero-padded names sort by step
  return out;
}

}  // namespace fd::ckpt
