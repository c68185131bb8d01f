#include "lib/engine/process_memory.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "lib/base/atomic_file.h"
#include "lib/base/build_id.h"
#include "lib/base/error.h"
#include "lib/base/host_name.h"
#include "lib/base/version.h"
#include "lib/ckpt/shard.h"
#include "lib/engine/assemble.h"
#include "lib/nn/kv_decoder.h"

namespace fd::engine {

namespace fs = std::filesystem;

namespace {

// A "VmXXX:   1234 kB" line of /proc/self/status, bytes; -1 when absent.
int64_t status_kib(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const size_t n = std::char_traits<char>::length(key);
  while (std::getline(in, line)) {
    if (line.compare(0, n, key) == 0 && line.size() > n && line[n] == ':')
      return std::strtoll(line.c_str() + n + 1, nullptr, 10) * 1024;
  }
  return -1;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        std::string v = line.substr(colon + 1);
        v.erase(0, v.find_first_not_of(' '));
        return v;
      }
    }
  }
  return "unknown";
}

// What a calibration must match to be used.
nlohmann::json identity() {
  return {{"host", host_name()},
          {"cpu", cpu_model()},
          {"fdtrain_version", version()},
          {"build_id", build_id()}};
}

constexpr const char* kHowTo =
    "run `fdtrain calibrate` (and under mpirun -n 2 and -n 4), as `make` does, to measure it";

}  // namespace

int64_t current_rss_bytes() { return status_kib("VmRSS"); }
int64_t peak_rss_bytes_now() { return status_kib("VmHWM"); }

std::optional<int64_t> RuntimeCalibration::at(int ranks) const {
  if (!problem.empty() || bytes_by_ranks.empty()) return std::nullopt;
  if (auto it = bytes_by_ranks.find(ranks); it != bytes_by_ranks.end()) return it->second;
  if (bytes_by_ranks.size() == 1) return bytes_by_ranks.begin()->second;
  // The two measured counts around `ranks`, else the nearest two.
  auto hi = bytes_by_ranks.upper_bound(ranks);
  if (hi == bytes_by_ranks.end()) --hi;
  if (hi == bytes_by_ranks.begin()) ++hi;
  auto lo = std::prev(hi);
  const double slope = double(hi->second - lo->second) / double(hi->first - lo->first);
  return int64_t(double(lo->second) + slope * double(ranks - lo->first));
}

std::string calibration_path() {
  if (const char* p = std::getenv("FDTRAIN_MEMORY_CALIBRATION"); p != nullptr && *p != '\0')
    return p;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ((ec ? fs::current_path() : exe.parent_path()) / "fdtrain.memory.json").string();
}

RuntimeCalibration read_calibration() {
  RuntimeCalibration c;
  c.path = calibration_path();
  std::ifstream in(c.path);
  if (!in) {
    c.problem = fmt::format("no runtime calibration at {}: {}", c.path, kHowTo);
    return c;
  }
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("runtime_bytes") ||
      !j["runtime_bytes"].is_object()) {
    c.problem = fmt::format("{} is not a runtime calibration: {}", c.path, kHowTo);
    return c;
  }
  const nlohmann::json want = identity();
  for (const auto& [key, value] : want.items()) {
    if (!j.contains(key) || j[key] != value) {
      c.problem = fmt::format(
          "the runtime calibration {} was measured for {} {}, not this {} ({}): {}", c.path, key,
          j.contains(key) ? j[key].dump() : std::string("(none)"), key, value.dump(), kHowTo);
      return c;
    }
  }
  for (const auto& [ranks, bytes] : j["runtime_bytes"].items()) {
    const int n = std::atoi(ranks.c_str());
    if (n >= 1 && bytes.is_number_integer() && bytes.get<int64_t>() > 0)
      c.bytes_by_ranks[n] = bytes.get<int64_t>();
  }
  if (c.bytes_by_ranks.empty())
    c.problem = fmt::format("{} holds no measurement: {}", c.path, kHowTo);
  return c;
}

void write_calibration(int ranks, int64_t bytes) {
  const std::string path = calibration_path();
  nlohmann::json j = identity();
  j["runtime_bytes"] = nlohmann::json::object();
  const RuntimeCalibration old = read_calibration();  // this host's and build's, else none
  if (old.problem.empty())
    for (const auto& [n, b] : old.bytes_by_ranks) j["runtime_bytes"][std::to_string(n)] = b;
  j["runtime_bytes"][std::to_string(ranks)] = bytes;
  j["what"] =
      "fdtrain calibrate: per number of ranks on this host, the peak resident memory of a rank "
      "less its tensors and data (lib/engine/process_memory.h)";
  const std::string failed =
      write_file_atomically(path, j.dump(2) + "\n", path + fmt::format(".tmp-{}", int(getpid())));
  if (!failed.empty())
    runtime_error("cannot record the runtime calibration: {}; make {} writable", failed,
                  fs::path(path).parent_path().string());
}

int64_t measure_data_bytes(const config::Recipe& r) {
  const int64_t before = current_rss_bytes();
  int64_t grown = 0;
  {
    TrainingData data = open_dataset(r);
    const int64_t after = current_rss_bytes();
    if (before >= 0 && after >= 0) grown = std::max<int64_t>(0, after - before);
  }
  return grown;
}

int64_t save_buffer_bytes(const Assembly& a, const zero::ZeroEngine& engine) {
  if (!a.saves_checkpoints) return 0;
  int64_t most = 0;
  for (const zero::ZeroEngine::SegmentState& s : engine.saved_state())
    most = std::max(
        most, ckpt::write_buffer_bytes(s.count, bool(s.stream),
                                       s.stream_params ? int(dtype_size(*s.stream_params)) : 0));
  return most;
}

int64_t sample_bytes(const Assembly& a, const nn::Decoder& full_model) {
  if (a.sample_rows <= 0) return 0;
  return nn::KvDecoder::host_bytes(full_model, a.seq_len, a.sample_rows);
}

std::string calibration_recipe_yaml(const std::string& data_path) {
  return fmt::format(
      R"(model: {{n_layer: 2, n_head: 2, d_model: 64, vocab_size: 256, max_seq_len: 64}}
data:
  format: text
  train: [{}]
  val_fraction: 0.1
  seq_len: 64
batch: {{micro: 2}}
optimizer: {{lr: 1.0e-3}}
zero: {{stage: 2}}
steps: 4
logging: {{every: 1, eval_batches: 2, sample_tokens: 16}}
checkpoint: {{every: 2, keep_last: 1}}
)",
      data_path);
}

}  // namespace fd::engine
