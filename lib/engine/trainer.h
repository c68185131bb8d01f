// Trainer: builds a training run from a Recipe and runs it to the end, on one
// rank or many (every rank constructs its own Trainer with the same recipe).
//
// Assembles the dataset, sampler, model, ZeRO engine and schedule the recipe
// describes, trains for recipe.steps optimizer steps, and (rank 0) leaves a
// run directory (run_dir.h) with config.yaml, command.txt, run.json,
// metrics.jsonl, summary.json and a TensorBoard event file (tfevents.h); every
// rank logs to RUN/logs/rank<r>.log (lib/base/log.h) once setup has succeeded.
//
// Failure behaviour:
//   - construction is collective: if any rank fails (bad data file, an
//     existing run directory on rank 0, a batch that does not fit the world
//     size), every rank throws fd::Error with the highest exit code; the
//     lowest failing rank's error carries the message, the others' an empty
//     one (callers print only non-empty messages);
//   - a non-finite loss, a loss above max_loss, or an fp16
//     overflow at the minimum loss scale (all ranks agree), ends the run on
//     every rank: run() returns a summary with status "diverged" and an
//     "error" message;
//   - a stop request (SIGUSR1, SIGTERM, SIGINT on any rank; request_stop())
//     ends the run at the next step boundary on every rank, after saving a
//     checkpoint when checkpoints are enabled: status "interrupted";
//   - any other failure during training is rank-local: the caller records it
//     (record_failure()) and ends the job with Communicator::abort() (see
//     apps/fdtrain/main.cc); an abort from elsewhere (a collective's
//     timeout) records it through the abort hook (communicator.h).
//
// Run directory (run_dir.h, docs/RUN_DIR.md): rank 0 locks it first, then
// tidies what an interrupted job left; every rank then decides from the same
// files how the run starts (resume.h, plan_resume); nothing is changed
// until every rank has set up. A resume of a finished run (its checkpoint at
// the last step) changes nothing: finished() is true and run() returns at once.
#pragma once

#include <atomic>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lib/config/recipe.h"
#include "lib/dist/communicator.h"
#include "lib/dist/fault.h"
#include "lib/engine/assemble.h"
#include "lib/engine/build_run.h"
#include "lib/engine/checkpointing.h"
#include "lib/engine/preference.h"
#include "lib/engine/reference_logps.h"
#include "lib/engine/report.h"
#include "lib/engine/step.h"
#include "lib/engine/strategy.h"
#include "lib/optim/schedule.h"
#include "lib/tensor/host_link.h"
#include "lib/tensor/tensor.h"

namespace fd::data {
class TokenDataset;
class Sampler;
}  // namespace fd::data
namespace fd::nn {
class Decoder;
struct LoraConfig;
}  // namespace fd::nn
namespace fd::zero {
class ZeroEngine;
}
namespace fd::precision {
class DynamicLossScaler;
}

namespace fd::engine {

class RunDirectory;
class EventFileWriter;
class RunReport;

struct TrainOptions {
  std::string recipe_path;             // as given on the command line
  std::vector<std::string> overrides;  // key.path=value / ~key.path, as given
  std::string run_dir;                 // where config.yaml, metrics.jsonl, summary.json go
  bool overwrite = false;              // replace a run already in run_dir
  bool progress = true;                // progress line when stderr is a terminal (rank 0)
  bool force_progress = false;         // progress line even when stderr is not a terminal
  bool print_sample = true;            // print the generated sample to stdout at the end (rank 0)
  std::string command_line;            // recorded in command.txt and summary.json
  dist::FaultSpec fault;               // fault injection for tests (FDTRAIN_FAULT)
  std::string resume;                  // "": fresh; "auto": RUN's newest checkpoint; or a path
  std::string working_dir;             // relative recipe paths are read from here (run.json)
  bool profile = false;  // per-phase wall-time breakdown (log + summary.json "profile")
  // Tests: an offloaded optimizer of a CPU run reaches its shards through
  // this link (make_thread_link), as a GPU run's does through the GPU's, so
  // the ordering of the GPU's host tier is exercised without a GPU.
  std::shared_ptr<HostLink> offload_link;
};

class Trainer {
 public:
  // `comm` must outlive the trainer. Collective: see the top of this file.
  Trainer(const config::Recipe& recipe, const TrainOptions& options, dist::Communicator& comm);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Trains for recipe.steps steps; returns the summary (written to summary.json by
  // rank 0). Collective.
  nlohmann::json run();

  const nn::Decoder& model() const { return *model_; }
  // Runs fn with the whole model, every parameter resident, current and whole (ZeRO-3
  // gathers; tensor parallelism assembles the slices). Collective.
  void with_full_model(const std::function<void(const nn::Decoder& model)>& fn);
  // The growth of this process's RSS while the training data was opened (setup), bytes: the
  // data part of its memory (process_memory.h).
  int64_t data_bytes() const { return data_bytes_; }
  // The saves and sample parts of this rank's memory (process_memory.h), for a run whose ranks
  // hold the whole model (no pipeline, no tensor parallelism): `fdtrain calibrate`.
  int64_t transient_bytes() const;
  // The step (0-based) in progress, for failure messages.
  int64_t current_step() const { return current_step_; }
  // The step (0-based) this run started at: 0, or the checkpoint's step when resuming.
  int64_t start_step() const { return start_step_; }

  // Makes the next step boundary save a checkpoint (when checkpoints are
  // enabled) and end the run (status "interrupted", exit_reason "signal",
  // summary "signal": the signal's name). Async-signal-safe: sets a flag.
  // signo: SIGUSR1, SIGTERM or SIGINT.
  static void request_stop(int signo);
  // The signal of a pending stop request, 0 when none.
  static int stop_signal();

  // True when there is nothing to train: a resume whose checkpoint is at the
  // recipe's last step. run() then returns {"status": "finished_already"}
  // without touching the run directory; finished_message() says why.
  bool finished() const { return !finished_message_.empty(); }
  const std::string& finished_message() const { return finished_message_; }

  // A failure is ending the run: lets a checkpoint save in flight commit first (for up to
  // half of dist.timeout_s, 60 s at most; CheckpointWriter::settle). Never throws.
  void settle_saves() noexcept;
  bool save_in_flight() const { return writer_ && writer_->in_flight().has_value(); }

  // Records a failure that ends the job (summary.json with status "failed"),
  // once: later calls do nothing. Rank 0 writes through its RunDirectory,
  // another rank writes summary.json itself (the job ends, so nobody else
  // will). Best effort, never throws. Safe to call from the abort hook.
  void record_failure(const std::string& message);

 private:
  void setup(const TrainOptions& options);
  void open_run_directory(const TrainOptions& options);   // rank 0: lock and tidy
  void start_run_directory(const TrainOptions& options);  // rank 0: begin, config, run.json
  // The fields every summary.json has, however the run ended.
  nlohmann::json summary_head(const std::string& status, const std::string& exit_reason,
                              int64_t steps_done) const;
  struct StepStats {
    double loss;  // mean over micro-batches and ranks
    double grad_norm;
    bool skipped;
    double loss_scale;             // the scale this step used (1 without loss scaling)
    bool scale_exhausted = false;  // fp16: overflow at the minimum loss scale; the run must end
    int stop_signal = 0;           // a signal asked some rank to stop (agreed by all ranks), else 0
    double save_stall_s = 0;       // the update's wait for the last save's staging copy
  };
  // One optimizer step; --profile laps go to `phases`.
  StepStats train_step(int64_t step, Phases& phases);
  // How the loop ended, for finish().
  struct Ending {
    std::string status;       // completed, interrupted, diverged
    std::string exit_reason;  // completed, signal, diverged, loss_above_max, loss_scale_at_minimum
    int signal = 0;           // the signal that stopped the run (interrupted)
    std::string message;      // an error to report (loss scale exhausted)
    double loss = 0.0;        // the last step's loss
    int64_t done = 0;         // steps completed in all
  };
  // After the loop: the weights digest, memory, the sample and the summary
  // (written by rank 0). Collective.
  nlohmann::json finish(RunReport& report, const Ending& end);
  double evaluate();        // mean validation loss over ranks (NaN when there is no split)
  double evaluate_pairs();  // evaluate() of preference training (its metrics: eval_metrics_)
  // Preference training (an objective section). DPO's reference log-probs: found in the run
  // directory's cache or computed (reference_logps.h), on `model` through `strategy`.
  // Collective.
  std::string reference_key(const RunEnv& env);
  bool read_reference_cache();
  void reference_pass(Strategy& strategy, nn::Decoder& model, PreferenceHead& head);
  void finish_reference();  // after start_run_directory: the pass if still due, the cache written
  // The step's chosen NLL tokens over every rank (ORPO; SimPO with cpo_alpha). Collective.
  int64_t step_nll_tokens(int64_t step);
  nlohmann::json memory_json();   // collective
  nlohmann::json process_json();  // collective: summary.json's process_memory
  // summary.json's `network` block from the training steps' traffic (collective).
  nlohmann::json network_json(const RunReport& report, int64_t steps);
  // Bytes of frozen base (LoRA) per rank: all of it, or a 1/N shard under ZeRO-3.
  // quantized: the base's 4-bit segments (QLoRA, MemCategory::kQuantized) instead of the rest.
  int64_t frozen_bytes_estimate(bool quantized) const;
  // Collective: saves the checkpoint of `steps_done` steps (asynchronous saves: stages it).
  void save(int64_t steps_done);
  // The saves committed since the last call into `report` (wait: blocks for the one in flight).
  // A failed save throws here, on the rank whose write failed.
  // exclude: a wait is not training time (false inside a save's own begin/end interval).
  void report_saves(RunReport& report, bool wait, bool exclude = true);

  // device: cuda: picks this rank's GPU, opens the device scope for every
  // tensor the run makes and starts the NCCL communicator.
  void setup_device();
  // The communicator of the model's collectives: NCCL on the GPU, else comm_.
  dist::Communicator& model_comm() { return gpu_comm_ ? *gpu_comm_ : comm_; }
  // The ranks that read distinct data and this rank's index among them: the
  // mesh's dp axis (the world without a pipeline, a pipeline's replicas).
  int data_world() const { return assembly_.mesh.size("dp"); }
  int data_rank() const { return assembly_.mesh.coord(comm_.rank(), "dp"); }

  config::Recipe recipe_;
  TrainOptions options_;
  dist::Communicator& comm_;                      // host collectives (f64 helpers, barriers, abort)
  std::unique_ptr<DeviceScope> device_scope_;     // GPU runs: new tensors go to the GPU
  std::unique_ptr<dist::Communicator> gpu_comm_;  // GPU runs: NCCL over comm_
  TrainingData data_;  // the batches: a token stream's windows or fine-tuning examples
  std::unique_ptr<nn::Decoder> model_;
  std::unique_ptr<Strategy> strategy_;                         // the parallel layout (strategy.h)
  std::unique_ptr<dist::HierarchicalCommunicator> node_comm_;  // BuiltRun::node_comm
  std::unique_ptr<zero::ZeroEngine> zero_;
  std::unique_ptr<precision::DynamicLossScaler> scaler_;  // fp16 only
  std::unique_ptr<CheckpointWriter> writer_;              // made by run() (collective)
  std::unique_ptr<PreferenceHead> preference_;            // preference training: the model's head
  ReferenceLogps reference_;                              // DPO: the reference's per-pair log-probs
  std::string reference_key_;                             // DPO: what reference_ was computed for
  std::string reference_source_;                          // DPO: the reference, in words
  bool reference_ready_ = false;                          // reference_ holds the values
  bool reference_computed_ = false;                       // ... computed by this run (not read)
  bool reference_kept_ = false;  // rank 0: ... in the run directory's cache (written or read)
  double reference_seconds_ = 0.0;
  nlohmann::json train_metrics_, eval_metrics_;  // the last step's and evaluation's (objective)
  std::unique_ptr<RunDirectory> run_dir_;        // rank 0 only
  std::unique_ptr<EventFileWriter> events_;      // rank 0 only: TensorBoard scalars
  bool log_file_open_ = false;                   // this rank logs to RUN/logs/rank<r>.log
  Assembly assembly_;                            // what the recipe builds (assemble.h)
  Batch batch_;                                  // the micro-batch buffers, on the host
  optim::ScheduleOptions schedule_;
  int64_t current_step_ = -1;
  int64_t steps_done_ = 0;  // steps finished (for a failure's summary)
  int64_t start_step_ = 0;
  int64_t skipped_at_start_ = 0;
  std::string resumed_from_;
  std::string base_sha256_;                              // LoRA: SHA-256 of the frozen base's file
  std::string finished_message_;                         // see finished()
  bool resume_in_place_ = false;                         // the run continues in its own directory
  std::vector<std::filesystem::path> discard_on_start_;  // ResumePlan::newer
  std::atomic<bool> failure_recorded_{false};
  std::string started_at_;
  int64_t skipped_total_ = 0;
  int64_t data_bytes_ = 0;  // see data_bytes()
};

}  // namespace fd::engine
