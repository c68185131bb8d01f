#include "lib/engine/checkpointing.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <functional>
#include <thread>
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

std::vector<ckpt::SegmentRange> saved_ranges(const zero::ZeroEngine& engine) {
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
  return ranges;
}

std::optional<fs::path> write_checkpoint(const SaveRequest& req,
                                         const std::vector<ckpt::SegmentRange>& ranges,
                                         dist::Communicator& comm, SaveTimes* times) {
  const auto t_begin = std::chrono::steady_clock::now();
  SaveTimes unused;
  SaveTimes& t = times ? *times : unused;
  const fs::path root = req.run_dir / "checkpoints";
  const std::string name = ckpt::step_dir_name(req.step);
  const fs::path tmp = root / ("." + name + ".tmp");
  const fs::path final_dir = root / name;
  const bool rank0 = comm.rank() == 0;
  const int world = comm.size();
  std::error_code ec;
  // Every stage's failure is agreed (one gather of a flag per stage), so that a rank whose
  // write failed never leaves its peers waiting in a collective and rank 0 removes what was
  // written: the failing rank throws its error, the others return nullopt.
  std::exception_ptr failure;
  auto attempt = [&](const std::function<void()>& stage) {
    try {
      stage();
    } catch (...) {  // fd::Error, and anything else (out of memory, a filesystem_error)
      failure = std::current_exception();
    }
  };
  // Rank 0's failure, agreed: rank 0 rethrows, the others learn it.
  auto rank0_failed = [&] {
    const double mine = failure ? 1.0 : 0.0;
    std::vector<double> all(static_cast<size_t>(world));
    comm.all_gather_f64(&mine, all.data(), 1);
    if (failure) std::rethrow_exception(failure);
    return all[0] != 0.0;
  };
  if (rank0)
    attempt([&] {
      fs::create_directories(root, ec);
      fs::remove_all(tmp, ec);
      fs::create_directories(tmp, ec);
      if (ec)
        runtime_error(
            "cannot save the checkpoint of step {}: cannot create {}: {}; make {} writable (or "
            "free space on its disk), then resume with --resume auto",
            req.step, tmp.string(), ec.message(), root.string());
    });
  if (rank0_failed()) return std::nullopt;  // also the barrier before the writes
  maybe_kill(req.fault, comm.rank(), req.step, 1);
  ckpt::ShardMeta meta = req.meta;
  meta.rank = comm.rank();
  meta.world_size = world;
  const std::string shard = (tmp / ckpt::shard_file_name(comm.rank())).string();
  // Every shard's size and CRC-32C go into the manifest (write_shard's, from memory and a read
  // of its metadata), so a damaged shard is refused before HDF5 parses it. The gather is also
  // the barrier after the writes.
  ckpt::FileDigest digest;
  if (dist::fault_fires(req.fault, dist::FaultSpec::kCkptSlow, comm.rank(), req.step))
    std::this_thread::sleep_for(std::chrono::milliseconds(req.fault.ms));
  attempt([&] {
    if (dist::fault_fires(req.fault, dist::FaultSpec::kCkptFail, comm.rank(), req.step)) {
      std::FILE* f = std::fopen(shard.c_str(), "wb");
      if (f) std::fclose(f);
      runtime_error("cannot write checkpoint shard {}: injected I/O failure (FDTRAIN_FAULT)",
                    shard);
    }
    const auto t0 = std::chrono::steady_clock::now();
    digest = ckpt::write_shard(shard, meta, ranges);
    t.shard_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  });
  maybe_kill(req.fault, comm.rank(), req.step, 2);
  const double mine[3] = {double(digest.bytes), double(digest.crc32),  // both exact in a double
                          failure ? 1.0 : 0.0};
  std::vector<double> digests(3 * size_t(world));
  comm.all_gather_f64(mine, digests.data(), 3);
  // Tensor parallelism: each tp rank's segments are flat spaces of their own (the vocabulary's
  // rows may differ by one between them), and the manifest lists every tp rank's. Every rank
  // holds a range of every segment (ZeRO pads for equal shards), in the same order; world
  // rank t is tp rank t's replica 0 (of the first stage, with a pipeline). A pipeline's ranks
  // hold their stage's segments only, and name every segment in req.segments (the whole
  // model's groups, the same list on every rank): those are gathered instead.
  const int T = meta.tensor.size;
  std::vector<double> numels;
  if (T > 1) {
    const bool listed = !req.segments.empty();
    double n = double(listed ? req.segments.size() : ranges.size());
    std::vector<double> counts(static_cast<size_t>(world));
    comm.all_gather_f64(&n, counts.data(), 1);
    FD_CHECK(std::all_of(counts.begin(), counts.end(), [&](double c) { return c == n; }),
             "tensor-parallel ranks save different numbers of segments");
    std::vector<double> mine_numel;
    if (listed)
      for (const auto& s : req.segments) mine_numel.push_back(double(s.numel));
    else
      for (const auto& r : ranges) mine_numel.push_back(double(r.segment_numel));
    numels.resize(mine_numel.size() * size_t(world));
    comm.all_gather_f64(mine_numel.data(), numels.data(), int64_t(mine_numel.size()));
  }
  bool any_failed = false;
  for (int r = 0; r < world; ++r) any_failed |= digests[3 * size_t(r) + 2] != 0.0;
  if (any_failed) {
    // A partial checkpoint only takes space (a full disk stays full): rank 0 removes it, so
    // that the summary can still be written.
    if (rank0) fs::remove_all(tmp, ec);
    if (failure) std::rethrow_exception(failure);
    return std::nullopt;
  }
  if (rank0)
    attempt([&] {
      ckpt::Manifest m;
      m.step = req.step;
      m.world_size = world;
      m.zero_stage = meta.zero_stage;
      m.precision = meta.precision;
      for (int r = 0; r < world; ++r) m.files.push_back(ckpt::shard_file_name(r));
      if (T > 1) {
        const bool listed = !req.segments.empty();
        const size_t n = listed ? req.segments.size() : ranges.size();
        for (int t = 0; t < T; ++t)
          for (size_t i = 0; i < n; ++i)
            m.segments.push_back({listed ? req.segments[i].name : ranges[i].segment,
                                  int64_t(numels[size_t(t) * n + i]), t});
      } else if (req.segments.empty()) {
        for (const auto& r : ranges) m.segments.push_back({r.segment, r.segment_numel});
      } else {
        m.segments = req.segments;
      }
      for (int r = 0; r < world; ++r)
        m.digests.push_back(
            {uint64_t(digests[3 * size_t(r)]), uint32_t(digests[3 * size_t(r) + 1])});
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
    });
  if (rank0_failed()) return std::nullopt;  // also the barrier after the commit
  t.commit_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_begin).count() - t.shard_s;
  return final_dir;
}

// ---------------------------------------------------------------------------
// Staging

bool staged_saves(const zero::ZeroEngine& engine) {
  for (const zero::ZeroEngine::SegmentState& s : engine.saved_state())
    if (s.stream) return false;
  return true;
}

CheckpointStaging::CheckpointStaging(const zero::ZeroEngine& engine, Device device) {
  FD_CHECK(device.is_cpu() || device.is_meta(), "checkpoint staging on {}", device.str());
  for (const zero::ZeroEngine::SegmentState& s : engine.saved_state()) {
    FD_CHECK(!s.stream, "segment {}: state streamed from a file cannot be staged", s.segment);
    const bool gpu = s.master.defined() && s.master.is_cuda();
    if (gpu && !link_) link_ = make_host_link(s.master.device(), 1);
    std::array<Tensor, 4> b;
    const Tensor* src[4] = {&s.master, &s.exp_avg, &s.exp_avg_sq, &s.params};
    for (int f = 0; f < 4; ++f) {
      if (!src[f]->defined()) continue;
      // Zero-filled now, so that a run that cannot hold the staging fails at its start (and the
      // first save does not pay the page faults).
      b[size_t(f)] =
          gpu ? link_->host_buffer(s.count, src[f]->dtype(), MemCategory::kCheckpoint)
              : Tensor::zeros(Shape{s.count}, src[f]->dtype(), MemCategory::kCheckpoint, device);
      bytes_ += int64_t(b[size_t(f)].nbytes());
    }
    buffers_.push_back(std::move(b));
  }
}

CheckpointStaging::~CheckpointStaging() = default;

std::vector<ckpt::SegmentRange> CheckpointStaging::stage(const zero::ZeroEngine& engine) {
  return stage(engine.saved_state());
}

std::vector<ckpt::SegmentRange> CheckpointStaging::stage(
    const std::vector<zero::ZeroEngine::SegmentState>& state) {
  FD_CHECK(state.size() == buffers_.size(), "staging for {} segments, {} saved", buffers_.size(),
           state.size());
  std::vector<ckpt::SegmentRange> ranges;
  for (size_t i = 0; i < state.size(); ++i) {
    const zero::ZeroEngine::SegmentState& s = state[i];
    const Tensor* src[4] = {&s.master, &s.exp_avg, &s.exp_avg_sq, &s.params};
    std::array<Tensor, 4>& b = buffers_[i];
    for (int f = 0; f < 4; ++f) {
      FD_CHECK(src[f]->defined() == b[size_t(f)].defined() &&
                   (!src[f]->defined() || (src[f]->numel() == b[size_t(f)].numel() &&
                                           src[f]->dtype() == b[size_t(f)].dtype())),
               "segment {}: the saved state's layout changed", s.segment);
      if (!src[f]->defined()) continue;
      if (link_ && src[f]->is_cuda())
        link_->copy(0, b[size_t(f)], *src[f]);
      else
        b[size_t(f)].copy_from(*src[f]);
    }
    ranges.push_back(
        {s.segment, s.segment_numel, s.offset, s.count, b[0], b[1], b[2], b[3], {}, std::nullopt});
  }
  if (link_) link_->wait(0);
  return ranges;
}

// ---------------------------------------------------------------------------
// The writer

namespace {
// A wait for the previous save shorter than this is not logged.
constexpr double kWaitWorthSaying = 0.1;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

CheckpointWriter::CheckpointWriter(dist::Communicator& comm, const zero::ZeroEngine& engine,
                                   bool async)
    : comm_(comm), async_(async) {
  if (!async_) return;
  staging_ = std::make_unique<CheckpointStaging>(engine, Device::cpu());
  writer_comm_ = comm_.split(dist::SplitPlan::whole(comm_.size()));
  // Its messages (a save's collective that times out) name it and the ranks' hosts, as the
  // world's do: the same ranks in the same order.
  writer_comm_->set_name("the checkpoint writer's communicator");
  if (!comm_.nodes().empty()) writer_comm_->set_nodes(comm_.nodes(), comm_.node_names());
  thread_ = std::thread([this] { writer_loop(); });
}

CheckpointWriter::~CheckpointWriter() {
  if (!thread_.joinable()) return;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !in_flight_; });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::optional<int64_t> CheckpointWriter::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_flight_;
}

void CheckpointWriter::save(const SaveRequest& req, const zero::ZeroEngine& engine) {
  const auto t0 = std::chrono::steady_clock::now();
  if (!async_) {
    const std::vector<ckpt::SegmentRange> ranges = saved_ranges(engine);
    SavedCheckpoint saved;
    std::optional<fs::path> dir = write_checkpoint(req, ranges, comm_, &saved.times);
    saved.step = req.step;
    saved.blocked_s = saved.write_s = seconds_since(t0);
    if (dir) {
      saved.dir = *dir;
      std::error_code ec;
      saved.bytes = int64_t(fs::file_size(*dir / ckpt::shard_file_name(comm_.rank()), ec));
      std::lock_guard<std::mutex> lock(mu_);
      committed_.push_back(std::move(saved));
    }
    return;
  }
  double waited = 0;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (in_flight_) {
      const int64_t previous = *in_flight_;
      cv_.wait(lock, [&] { return !in_flight_; });
      waited = seconds_since(t0);
      // Said in the log when it is worth a line (summary.json counts every wait: waited_s).
      if (comm_.rank() == 0 && waited >= kWaitWorthSaying)
        log::info(
            "checkpoint of step {}: waited {:.2f} s for the save of step {} to finish (saves "
            "come faster than the disk takes them; raise checkpoint.every)",
            req.step, waited, previous);
    }
    // A save that failed on this rank ends the run before another is begun (its peers' saves
    // of it returned quietly: they learn of it when this rank fails).
    if (error_) {
      std::exception_ptr e = error_;
      error_ = nullptr;
      std::rethrow_exception(e);
    }
  }
  Job job{req, {}, engine.saved_state(), 0.0, waited};
  // Host state is copied by the writer thread, beside the next step's forward and backward
  // (before_update() waits for it); a GPU's is copied here, on its stream.
  const bool on_device = std::any_of(job.state.begin(), job.state.end(), [](const auto& s) {
    return (s.master.defined() && s.master.is_cuda()) || (s.params.defined() && s.params.is_cuda());
  });
  if (on_device) {
    job.ranges = staging_->stage(job.state);
    job.state.clear();
  }
  job.blocked_s = seconds_since(t0);
  {
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_ = req.step;
    staged_ = on_device;
    stage_wait_s_ = 0;
    job_ = std::move(job);
  }
  cv_.notify_all();
}

double CheckpointWriter::before_update() {
  if (!async_) return 0.0;
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  if (staged_) return 0.0;
  cv_.wait(lock, [&] { return staged_; });
  const double waited = seconds_since(t0);
  // The save's stall: added to its record, whether it is still being written or done.
  if (in_flight_)
    stage_wait_s_ += waited;
  else if (!committed_.empty())
    committed_.back().blocked_s += waited;
  return waited;
}

void CheckpointWriter::writer_loop() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || job_; });
      if (!job_) return;  // stop_
      job = std::move(*job_);
      job_.reset();
    }
    const auto t0 = std::chrono::steady_clock::now();
    SavedCheckpoint saved;
    saved.step = job.request.step;
    saved.blocked_s = job.blocked_s;
    saved.waited_s = job.waited_s;
    std::exception_ptr error;
    try {
      if (!job.state.empty()) {
        job.ranges = staging_->stage(job.state);
        job.state.clear();  // the views of the engine's state: not to be read past this point
        {
          std::lock_guard<std::mutex> lock(mu_);
          staged_ = true;
        }
        cv_.notify_all();
      }
      std::optional<fs::path> dir =
          write_checkpoint(job.request, job.ranges, *writer_comm_, &saved.times);
      if (dir) {
        saved.dir = *dir;
        std::error_code ec;
        saved.bytes = int64_t(fs::file_size(*dir / ckpt::shard_file_name(comm_.rank()), ec));
      }
    } catch (...) {
      error = std::current_exception();
    }
    saved.write_s = seconds_since(t0);
    finish(std::move(saved), error);
  }
}

void CheckpointWriter::finish(SavedCheckpoint saved, std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    staged_ = true;  // also when staging failed
    saved.blocked_s += stage_wait_s_;
    stage_wait_s_ = 0;
    try {
      if (error)
        error_ = error;
      else if (!saved.dir.empty())
        committed_.push_back(std::move(saved));
    } catch (...) {  // out of memory recording it: the save is on disk, its report is lost
      error_ = std::current_exception();
    }
    in_flight_.reset();
  }
  cv_.notify_all();
}

std::vector<SavedCheckpoint> CheckpointWriter::poll() {
  std::lock_guard<std::mutex> lock(mu_);
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
  std::vector<SavedCheckpoint> out;
  out.swap(committed_);
  return out;
}

bool CheckpointWriter::settle(double timeout_s) noexcept {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return !in_flight_; });
}

std::vector<SavedCheckpoint> CheckpointWriter::wait() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !in_flight_; });
  }
  return poll();
}

}  // namespace fd::engine
