#include "lib/engine/checkpointing.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <csignal>
#include <vector>

#include "lib/base/error.h"
#include "lib/base/log.h"
#include "lib/base/strings.h"
#include "lib/ckpt/export.h"
#include "lib/ckpt/manifest.h"

namespace fd::engine {

namespace fs = std::filesystem;

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
      l.slice_dim = p.slice.dim;
      l.slice_offset = p.slice.offset;
      l.slice_global = p.slice.global;
      l.slice_blocks = p.slice.blocks;
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
                      host(s.exp_avg), host(s.exp_avg_sq), host(s.params), s.stream,
                      s.stream_params});
  }
  const std::string shard = (tmp / ckpt::shard_file_name(comm.rank())).string();
  try {
    ckpt::write_shard(shard, meta, ranges);
  } catch (const Error&) {
    // A partial checkpoint only takes space (a full disk stays full): rank 0
    // removes it before the job ends, so that the summary can still be written.
    if (rank0) fs::remove_all(tmp, ec);
    throw;
  }
  // Every shard's size and CRC-32 go into the manifest (read back from the
  // page cache: ~0.1 s per GiB), so a damaged shard is refused before HDF5
  // parses it. The gather is also the barrier after the writes.
  const ckpt::FileDigest digest = ckpt::file_digest(shard);
  maybe_kill(req.fault, comm.rank(), req.step, 2);
  const double mine[2] = {double(digest.bytes), double(digest.crc32)};  // both exact in a double
  std::vector<double> digests(2 * size_t(comm.size()));
  comm.all_gather_f64(mine, digests.data(), 2);
  // Tensor parallelism: each tp rank's segments are flat spaces of their own (the vocabulary's
  // rows may differ by one between them), and the manifest lists every tp rank's. Every rank
  // holds a range of every segment (ZeRO pads for equal shards), in the same order; world
  // rank t is tp rank t's replica 0 (of the first stage, with a pipeline). A pipeline's ranks
  // hold their stage's segments only, and name every segment in req.segments (the whole
  // model's groups, the same list on every rank): those are gathered instead.
  const int T = meta.tensor.size;
  std::vector<double> numels;
  if (T > 1 && !req.segments.empty()) {
    double n = double(req.segments.size());
    std::vector<double> counts(size_t(comm.size()));
    comm.all_gather_f64(&n, counts.data(), 1);
    FD_CHECK(std::all_of(counts.begin(), counts.end(), [&](double c) { return c == n; }),
             "tensor-parallel pipeline ranks name different numbers of segments");
    std::vector<double> mine_numel;
    for (const auto& s : req.segments) mine_numel.push_back(double(s.numel));
    numels.resize(req.segments.size() * size_t(comm.size()));
    comm.all_gather_f64(mine_numel.data(), numels.data(), req.segments.size());
  } else if (T > 1) {
    double n = double(ranges.size());
    std::vector<double> counts(size_t(comm.size()));
    comm.all_gather_f64(&n, counts.data(), 1);
    FD_CHECK(std::all_of(counts.begin(), counts.end(), [&](double c) { return c == n; }),
             "tensor-parallel ranks save different numbers of segments");
    std::vector<double> mine_numel;
    for (const auto& r : ranges) mine_numel.push_back(double(r.segment_numel));
    numels.resize(ranges.size() * size_t(comm.size()));
    comm.all_gather_f64(mine_numel.data(), numels.data(), ranges.size());
  }
  if (rank0) {
    ckpt::Manifest m;
    m.step = req.step;
    m.world_size = comm.size();
    m.zero_stage = meta.zero_stage;
    m.precision = meta.precision;
    for (int r = 0; r < comm.size(); ++r) m.files.push_back(ckpt::shard_file_name(r));
    if (T > 1 && !req.segments.empty()) {
      for (int t = 0; t < T; ++t)
        for (size_t i = 0; i < req.segments.size(); ++i)
          m.segments.push_back(
              {req.segments[i].name, int64_t(numels[size_t(t) * req.segments.size() + i]), t});
    } else if (T > 1) {
      for (int t = 0; t < T; ++t)
        for (size_t i = 0; i < ranges.size(); ++i)
          m.segments.push_back(
              {ranges[i].segment, int64_t(numels[size_t(t) * ranges.size() + i]), t});
    } else if (req.segments.empty()) {
      for (const auto& r : ranges) m.segments.push_back({r.segment, r.segment_numel});
    } else {
      m.segments = req.segments;
    }
    for (int r = 0; r < comm.size(); ++r)
      m.digests.push_back({uint64_t(digests[2 * size_t(r)]), uint32_t(digests[2 * size_t(r) + 1])});
    try {
      ckpt::write_manifest(tmp.string(), m);
      maybe_kill(req.fault, 0, req.step, 3);
      // A step saved again after a resume replaces the old directory atomically.
      ckpt::replace_directory(tmp.string(), final_dir.string());
      maybe_kill(req.fault, 0, req.step, 4);
      ckpt::write_latest(root.string(), req.step);
    } catch (const Error&) {
      // As for a shard: a partial checkpoint (or pointer) only takes space.
      fs::remove_all(tmp, ec);
      fs::remove(root / "latest.tmp", ec);
      throw;
    }
    // Only now that the new checkpoint is complete: drop the oldest beyond keep_last.
    std::vector<fs::path> steps = ckpt::step_dirs_newest_first(root);
    for (size_t i = size_t(std::max(req.keep_last, 0)); i < steps.size(); ++i)
      if (steps[i] != final_dir) fs::remove_all(steps[i], ec);
  }
  comm.barrier();
  return final_dir;
}

}  // namespace fd::engine
