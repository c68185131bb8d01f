#include "lib/ckpt/lora_base.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <vector>

#include "lib/base/error.h"
#include "lib/base/sha256.h"

namespace fd::ckpt {

namespace fs = std::filesystem;

namespace {
std::string one_file_sha256(const std::string& path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) usage_error("{}: cannot read the file", path);
  Sha256 sha;
  std::vector<char> buf(size_t(1) << 20);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f.get())) > 0) sha.update(buf.data(), n);
  if (std::ferror(f.get())) usage_error("{}: read error while computing its SHA-256", path);
  return sha.hex_digest();
}
}  // namespace

std::string file_sha256(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return one_file_sha256(path);
  // A Hugging Face model directory: what decides the model, config.json and
  // the weight files, by name.
  std::vector<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(path, ec)) {
    const std::string n = e.path().filename().string();
    if (n == "config.json" || (n.rfind("model", 0) == 0 && (n.ends_with(".safetensors") ||
                                                           n.ends_with(".safetensors.index.json"))))
      names.push_back(n);
  }
  if (ec) usage_error("{}: cannot list the directory: {}", path, ec.message());
  std::sort(names.begin(), names.end());
  Sha256 sha;
  for (const std::string& n : names) {
    const std::string line = n + " " + one_file_sha256((fs::path(path) / n).string()) + "\n";
    sha.update(line.data(), line.size());
  }
  return sha.hex_digest();
}

void check_lora_base_digest(const std::string& where, const std::string& recorded_sha256,
                            const std::string& base_path, const std::string& base_sha256,
                            std::string_view remedy) {
  if (recorded_sha256 == base_sha256) return;
  usage_error(
      "{}: the checkpoint's LoRA adapters were trained on a base with SHA-256 {}, but "
      "model.init_from ({}) has {}; {}",
      where, recorded_sha256.empty() ? "(none)" : recorded_sha256,
      base_path.empty() ? "none" : base_path, base_sha256.empty() ? "(none)" : base_sha256, remedy);
}

std::string find_lora_base(const std::string& where, const std::string& init_from,
                           const std::string& recorded_sha256) {
  if (init_from.empty())
    usage_error(
        "{}: the checkpoint's recipe has no model.init_from, so there is no base model to "
        "combine its LoRA adapters with; the checkpoint is inconsistent",
        where);
  std::error_code ec;
  if (!fs::exists(init_from, ec)) {
    if (fs::path(init_from).is_relative())
      usage_error(
          "{}: model.init_from '{}' (the base the LoRA adapters were trained on) is a relative "
          "path, resolved against the directory the run was started in, and there is no such "
          "file from here ({}); run this command from the run's starting directory",
          where, init_from, fs::current_path(ec).string());
    usage_error(
        "{}: model.init_from '{}' (the base the LoRA adapters were trained on) does not exist; "
        "put the base file the run was trained on back at that path",
        where, init_from);
  }
  check_lora_base_digest(where, recorded_sha256, init_from, file_sha256(init_from),
                         "put back the file the run was trained on: the adapters merged into "
                         "another base give a wrong model");
  return init_from;
}

}  // namespace fd::ckpt
