#include "lib/engine/checkpointing.h"

#include <fmt/format.h>

#include <algorithm>
#include <csignal>
#include <map>
#include <vector>

#include "lib/base/error.h"
#include "lib/base/log.h"
#include "lib/base/strings.h"
#include "lib/ckpt/export.h"
#include "lib/config/load.h"

namespace fd::engine {

namespace fs = std::filesystem;

namespace {

// "key.path: value" for every leaf of a resolved recipe, from its YAML text.
std::map<std::string, std::string> flatten(const std::string& yaml) {
  std::map<std::string, std::string> out;
  std::string section;
  std::string list_key;
  for (const std::string& raw : split(yaml, '\n')) {
    if (raw.empty() || raw[0] == '#') continue;
    const bool indented = raw[0] == ' ';
    std::string line = raw.substr(raw.find_first_not_of(' '));
    if (line.rfind("- ", 0) == 0) {  // block list item
      out[list_key] += (out[list_key].empty() ? "" : ", ") + line.substr(2);
      continue;
    }
    size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    std::string value = colon + 1 < line.size() ? line.substr(colon + 2) : "";
    std::string path = indented ? section + "." + key : key;
    if (!indented && value.empty()) {
      section = key;
      continue;
    }
    list_key = path;
    out[path] = value;
  }
  return out;
}

}  // namespace

std::optional<fs::path> resolve_resume(const std::string& resume, const std::string& run_dir) {
  if (resume == "auto") {
    const fs::path dir = fs::path(run_dir) / "checkpoints";
    std::optional<std::string> latest =
        fs::is_directory(dir) ? ckpt::read_latest(dir.string()) : std::nullopt;
    if (!latest) log::info("--resume auto: no checkpoint in {}; starting fresh", dir.string());
    if (!latest) return std::nullopt;
    return fs::path(*latest);
  }
  if (!fs::exists(resume))
    usage_error("--resume {}: no such file or directory; give a checkpoint step directory, a "
                "run's checkpoints/ directory, or --resume auto",
                resume);
  return fs::path(ckpt::resolve_step_dir(resume));
}

OpenCheckpoint::OpenCheckpoint(const fs::path& step_dir)
    : dir_(step_dir), checkpoint_(ckpt::open_checkpoint(step_dir.string())) {}

void OpenCheckpoint::read(const std::string& segment, const std::string& field, int64_t offset,
                          int64_t count, const Tensor& out) const {
  out.zero_();
  bool found = false;
  for (const ckpt::ShardReader& r : checkpoint_.shards) {
    for (const ckpt::ShardReader::RangeInfo& ri : r.ranges()) {
      if (ri.segment != segment) continue;
      found = true;
      const int64_t lo = std::max(offset, ri.offset);
      const int64_t hi = std::min({offset + count, ri.offset + ri.count, ri.segment_numel});
      if (lo >= hi) continue;
      r.read(segment, field, lo, hi - lo, out.flat_slice(lo - offset, hi - lo));
    }
  }
  if (!found)
    usage_error("{}: holds no segment '{}'; the checkpoint is of a different model",
                dir_.string(), segment);
}

RecipeDiff diff_recipes(const config::Recipe& saved, const config::Recipe& now) {
  RecipeDiff d;
  auto a = flatten(config::to_yaml(saved)), b = flatten(config::to_yaml(now));
  std::vector<std::string> keys;
  for (const auto& [k, v] : a) keys.push_back(k);
  for (const auto& [k, v] : b)
    if (!a.count(k)) keys.push_back(k);
  for (const std::string& k : keys) {
    std::string va = a.count(k) ? a[k] : "(absent)", vb = b.count(k) ? b[k] : "(absent)";
    if (va == vb) continue;
    std::string line = fmt::format("{}: {} -> {}", k, va, vb);
    // Shapes and the trainable set: the model's dimensions and the adapters'
    // rank, targets and layers. Which base file (model.init_from) is checked by
    // its digest instead; alpha, dropout and the adapter directory may change.
    const bool shape = (k.rfind("model.", 0) == 0 && k != "model.init_from") || k == "lora" ||
                       k == "lora.r" || k == "lora.targets" || k == "lora.layers";
    (shape ? d.refused : d.warnings).push_back(line);
  }
  return d;
}

std::vector<ckpt::ParamLayout> layout_of(const nn::Module& model) {
  std::vector<ckpt::ParamLayout> out;
  for (const nn::FlatParamGroup* g : model.groups()) {
    for (const nn::Parameter& p : g->params()) {
      ckpt::ParamLayout l;
      l.name = p.name;
      l.segment = g->name();
      l.offset = p.offset;
      for (int i = 0; i < p.value.shape().ndim(); ++i) l.shape.push_back(p.value.shape()[i]);
      l.decay = p.decay;
      out.push_back(std::move(l));
    }
  }
  return out;
}

namespace {
void maybe_kill(const dist::FaultSpec& f, int rank, int64_t step, int point) {
  if (dist::fault_fires(f, dist::FaultSpec::kCkptKill, rank, step) && f.point == point) {
    std::fprintf(stderr,
                 "fdtrain: rank %d: injected fault: SIGKILL while writing the checkpoint of step "
                 "%lld (point %d)\n",
                 rank, (long long)step, point);
    std::fflush(stderr);
    std::raise(SIGKILL);
  }
}
}  // namespace

fs::path save_checkpoint(const SaveRequest& req, const zero::ZeroEngine& engine,
                         dist::Communicator& comm) {
  const fs::path root = req.run_dir / "checkpoints";
  const std::string name = ckpt::step_dir_name(req.step);
  const fs::path tmp = root / ("." + name + ".tmp");
  const fs::path final_dir = root / name;
  const bool rank0 = comm.rank() == 0;
  std::error_code ec;
  if (rank0) {
    fs::create_directories(root, ec);
    fs::remove_all(tmp, ec);
    fs::create_directories(tmp, ec);
    if (ec)
      runtime_error(
          "cannot save the checkpoint of step {}: cannot create {}: {}; make {} writable (or "
          "free space on its disk), then resume with --resume auto",
          req.step, tmp.string(), ec.message(), root.string());
  }
  comm.barrier();
  maybe_kill(req.fault, comm.rank(), req.step, 1);
  ckpt::ShardMeta meta = req.meta;
  meta.rank = comm.rank();
  meta.world_size = comm.size();
  std::vector<ckpt::SegmentRange> ranges;
  // GPU state is staged through host copies (HDF5 reads and writes host memory).
  auto host = [](const Tensor& t) {
    return t.defined() && t.is_cuda() ? t.to_device(Device::cpu(), MemCategory::kOther) : t;
  };
  for (const zero::ZeroEngine::SegmentState& s : engine.saved_state()) {
    ranges.push_back({s.segment, s.segment_numel, s.offset, s.count, host(s.master),
                      host(s.exp_avg), host(s.exp_avg_sq), host(s.params)});
  }
  const std::string shard = (tmp / ckpt::shard_file_name(comm.rank())).string();
  ckpt::write_shard(shard, meta, ranges);
  // Every shard's size and CRC-32 go into the manifest (read back from the
  // page cache: ~0.1 s per GiB), so a damaged shard is refused before HDF5
  // parses it. The gather is also the barrier after the writes.
  const ckpt::FileDigest digest = ckpt::file_digest(shard);
  maybe_kill(req.fault, comm.rank(), req.step, 2);
  const double mine[2] = {double(digest.bytes), double(digest.crc32)};  // both exact in a double
  std::vector<double> digests(2 * size_t(comm.size()));
  comm.all_gather_f64(mine, digests.data(), 2);
  if (rank0) {
    ckpt::Manifest m;
    m.step = req.step;
    m.world_size = comm.size();
    m.zero_stage = meta.zero_stage;
    m.precision = meta.precision;
    for (int r = 0; r < comm.size(); ++r) m.files.push_back(ckpt::shard_file_name(r));
    for (const auto& r : ranges) m.segments.push_back({r.segment, r.segment_numel});
    for (int r = 0; r < comm.size(); ++r)
      m.digests.push_back(
          {uint64_t(digests[2 * size_t(r)]), uint32_t(digests[2 * size_t(r) + 1])});
    ckpt::write_manifest(tmp.string(), m);
    maybe_kill(req.fault, 0, req.step, 3);
    // A step saved again after a resume replaces the old directory atomically.
    ckpt::replace_directory(tmp.string(), final_dir.string());
    maybe_kill(req.fault, 0, req.step, 4);
    ckpt::write_latest(root.string(), req.step);
    // Only now that the new checkpoint is complete: drop the oldest beyond keep_last.
    std::vector<fs::path> steps;
    for (const auto& e : fs::directory_iterator(root, ec))
      if (e.is_directory() && e.path().filename().string().rfind("step_", 0) == 0)
        steps.push_back(e.path());
    std::sort(steps.begin(), steps.end());
    while (int(steps.size()) > req.keep_last) {
      if (steps.front() != final_dir) fs::remove_all(steps.front(), ec);
      steps.erase(steps.begin());
    }
  }
  comm.barrier();
  return final_dir;
}

}  // namespace fd::engine
