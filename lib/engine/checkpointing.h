// Checkpoint saving for the Trainer (the file format is lib/ckpt's,
// docs/FORMAT.md; finding, checking and loading one to resume: resume.h).
//
//   RUN/checkpoints/step_00000100/rank_00000.h5 ... manifest.json
//   RUN/checkpoints/latest            "step_00000100", written last
//
// Saving is collective and crash-safe: the step directory is written under a
// temporary name (.step_00000100.tmp), renamed into place by rank 0 only
// after every rank has written and fsync'ed its shard and the manifest is
// complete; then `latest` is replaced (temp file + rename); only then are
// checkpoints beyond keep_last deleted. A job killed at any point leaves
// `latest` naming the previous complete checkpoint, and no partial one under
// a step directory's name.
//
// Saves happen behind the step (DESIGN decision 20; CheckpointWriter): at a
// step boundary each rank copies what it saves into a staging buffer
// allocated once (MemCategory::kCheckpoint; page-locked host memory for GPU
// tensors) and goes back to training; a writer thread writes the shard and
// runs the commit above over a communicator of its own. The training loop
// waits only when a save is still running when the next one begins.
#pragma once

#include <array>
#include <condition_variable>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "lib/ckpt/export.h"
#include "lib/ckpt/shard.h"
#include "lib/dist/communicator.h"
#include "lib/dist/fault.h"
#include "lib/tensor/host_link.h"
#include "lib/zero/zero_engine.h"

namespace fd::engine {

// The flat layout of `model` in checkpoint form (names, segments, offsets, shapes).
std::vector<ckpt::ParamLayout> layout_of(const nn::Module& model);

struct SaveRequest {
  std::filesystem::path run_dir;
  int64_t step = 0;  // optimizer steps completed
  int keep_last = 1;
  ckpt::ShardMeta meta;   // everything but rank (filled per rank)
  dist::FaultSpec fault;  // test hook: ckptkill at a point of the write
  // The manifest's segments when rank 0's engine holds only some (a
  // pipeline's first stage): every segment with trainable elements, in
  // forward order, the same list on every rank (with tensor parallelism each
  // rank's numels are its tp rank's, and the manifest takes tp rank t's from
  // world rank t). Empty: rank 0's ranges.
  std::vector<ckpt::ManifestSegment> segments;
};
// Writes and commits the checkpoint of `ranges` (this rank's, CPU tensors or streams).
// Collective over `comm`, every failure agreed: the rank that failed throws (its message);
// the others return nullopt, with nothing committed and the partial step directory removed.
// Returns the step directory written.
// `times` (optional) receives where this rank's time went.
struct SaveTimes {
  double shard_s = 0;   // writing this rank's shard to its device, and its digest
  double commit_s = 0;  // the rest: agreements (waiting for the slowest rank), manifest, rename
};
std::optional<std::filesystem::path> write_checkpoint(const SaveRequest& request,
                                                      const std::vector<ckpt::SegmentRange>& ranges,
                                                      dist::Communicator& comm,
                                                      SaveTimes* times = nullptr);

// The ranges `engine` saves: its state, GPU tensors copied to host tensors.
std::vector<ckpt::SegmentRange> saved_ranges(const zero::ZeroEngine& engine);

// Whether `engine`'s saved state can be staged (none of it streams from a file).
bool staged_saves(const zero::ZeroEngine& engine);

// An asynchronous save's staging: host copies of the state a rank saves (master weights,
// Adam moments, parameters), allocated once (MemCategory::kCheckpoint; page-locked for a GPU's
// tensors; on Device::meta(), fdtrain estimate's counting device, only counted) and filled at
// each save. State streamed from a file (ZeRO-Infinity's NVMe optimizer) cannot be staged.
class CheckpointStaging {
 public:
  // Buffers for `engine`'s saved state on host `device` (cpu or meta).
  CheckpointStaging(const zero::ZeroEngine& engine, Device device);
  ~CheckpointStaging();
  int64_t bytes() const { return bytes_; }
  // Copies `engine`'s state into the buffers (which must match its layout) and returns the
  // ranges over them. Blocks until the copies are complete.
  std::vector<ckpt::SegmentRange> stage(const zero::ZeroEngine& engine);
  // The same from the state ZeroEngine::saved_state() returned (any thread: only its tensors'
  // memory is read, and it must not change until this returns).
  std::vector<ckpt::SegmentRange> stage(const std::vector<zero::ZeroEngine::SegmentState>& state);

 private:
  std::vector<std::array<Tensor, 4>> buffers_;  // per segment: master, exp_avg, exp_avg_sq, params
  std::unique_ptr<HostLink> link_;              // GPU state: the copies' stream
  int64_t bytes_ = 0;
};

// A save committed (or, synchronously, written) by a CheckpointWriter.
struct SavedCheckpoint {
  int64_t step = 0;
  std::filesystem::path dir;
  double blocked_s = 0;  // the training loop's time in save() and before_update(), or the save
  double waited_s = 0;   // of blocked_s, waiting for the previous save to finish
  double write_s = 0;    // from the hand-over to the commit (asynchronous saves; else blocked_s)
  SaveTimes times;       // of write_s
  int64_t bytes = 0;     // this rank's shard file
};

// Saves checkpoints, synchronously or behind the step (the file's top).
//
//   CheckpointWriter writer(comm, engine, async);    // collective
//   writer.save(request, engine);                    // collective, at a step boundary
//   for (const SavedCheckpoint& s : writer.poll()) ...   // each step: saves committed since
//   writer.wait();                                   // before the summary, and on a stop
//
// Every rank saves at the same steps; poll() may see a commit a step earlier on one rank than
// on another (no decision depends on it). A failed save surfaces from poll() or wait() on the
// rank whose write failed (its message); the other ranks see nothing and are ended by that
// rank's abort, as when a synchronous save fails.
class CheckpointWriter {
 public:
  // With `async`, stages `engine`'s state in buffers allocated now and splits a communicator
  // for the writer thread from `comm` (collective); otherwise saves on `comm`, in save().
  CheckpointWriter(dist::Communicator& comm, const zero::ZeroEngine& engine, bool async);
  // Waits for the save in flight (its outcome is dropped); never throws.
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  bool async() const { return async_; }
  int64_t staging_bytes() const { return staging_ ? staging_->bytes() : 0; }
  // Collective. Synchronous: writes and commits (poll() then returns it). Asynchronous: waits
  // for the save in flight, if any (and logs that it did; rethrows its error if it failed on this
  // rank, as poll() would), and hands this rank's state to the
  // writer thread, which copies it into the staging buffers (host state; a GPU's is copied
  // here, before returning), then writes and commits it.
  void save(const SaveRequest& request, const zero::ZeroEngine& engine);
  // Before the engine's state changes (its optimizer step): waits until the state handed to
  // the last save() is staged. The copy runs beside the next step's forward and backward, which
  // only read the state; a wait here is the save's stall (its blocked_s). Returns the seconds
  // waited.
  double before_update();
  // The saves committed since the last call, oldest first. Rethrows a failed save's error on
  // the rank that failed. Never blocks.
  std::vector<SavedCheckpoint> poll();
  // Blocks until no save is in flight, then poll().
  std::vector<SavedCheckpoint> wait();
  // On a failure elsewhere in the run: lets the save in flight finish (its commit needs only
  // the ranks' writer threads, not their training loops) for up to `timeout_s`, so that a save
  // staged before the failure is committed as a synchronous one would have been. Never throws
  // (a failed save's error is dropped). True when no save is in flight at return.
  bool settle(double timeout_s) noexcept;
  // The step of the save in flight; nullopt when none.
  std::optional<int64_t> in_flight() const;

 private:
  struct Job {
    SaveRequest request;
    std::vector<ckpt::SegmentRange> ranges;
    std::vector<zero::ZeroEngine::SegmentState> state;  // to stage first (else ranges is staged)
    double blocked_s = 0, waited_s = 0;
  };
  void writer_loop();
  void finish(SavedCheckpoint saved, std::exception_ptr error);

  dist::Communicator& comm_;
  const bool async_;
  std::unique_ptr<CheckpointStaging> staging_;
  std::unique_ptr<dist::Communicator> writer_comm_;  // the writer thread's (async)
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Job> job_;                  // handed over, not yet taken by the thread
  std::optional<int64_t> in_flight_;        // the step being saved (handed over until committed)
  bool staged_ = true;                      // no state handed over waits to be copied
  double stage_wait_s_ = 0;                 // before_update()'s wait for the save in flight
  std::vector<SavedCheckpoint> committed_;  // not yet returned by poll()
  std::exception_ptr error_;                // a failed save's, not yet rethrown
  bool stop_ = false;
  std::thread thread_;  // last: started once the members above exist
};

}  // namespace fd::engine
