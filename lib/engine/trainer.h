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
//   - a non-finite loss, or an fp16 overflow at the minimum loss scale (all
//     ranks agree), ends the run on every rank: run() returns a summary with
//     exit_reason "diverged" / "loss_scale_at_minimum" and an "error" message;
//   - any other failure during training is rank-local: the caller must end
//     the job with Communicator::abort() (see apps/fdtrain/main.cc).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/config/recipe.h"
#include "lib/dist/communicator.h"
#include "lib/dist/fault.h"
#include "lib/optim/schedule.h"
#include "lib/tensor/tensor.h"

namespace fd::data {
class TokenDataset;
class Sampler;
}  // namespace fd::data
namespace fd::nn {
class Gpt;
struct LoraConfig;
}
namespace fd::zero {
class ZeroEngine;
}
namespace fd::precision {
class DynamicLossScaler;
}

namespace fd::engine {

class RunDirectory;
class EventFileWriter;

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
  std::string resume;                  // "": fresh; "auto": RUN/checkpoints/latest if any; or a path
  bool profile = false;                // per-phase wall-time breakdown (log + summary.json "profile")
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

  const nn::Gpt& model() const { return *model_; }
  // Runs fn with every parameter of the model resident and current (ZeRO-3 gathers).
  void with_full_parameters(const std::function<void()>& fn);
  // The step (0-based) in progress, for failure messages.
  int64_t current_step() const { return current_step_; }
  // The step (0-based) this run started at: 0, or the checkpoint's step when resuming.
  int64_t start_step() const { return start_step_; }

  // Makes the next step boundary save a checkpoint and end the run (exit_reason
  // "signal"). Async-signal-safe: sets a flag (SIGUSR1 handler).
  static void request_stop();

 private:
  void setup(const TrainOptions& options);
  struct StepStats {
    double loss;  // mean over micro-batches and ranks
    double grad_norm;
    bool skipped;
    double loss_scale;  // the scale this step used (1 without loss scaling)
    bool scale_exhausted = false;  // fp16: overflow at the minimum loss scale; the run must end
    bool stop_requested = false;   // some rank got SIGUSR1 (agreed by all ranks)
  };
  // Wall seconds per phase of one step (--profile); each phase excludes the
  // communication wait inside it, which goes to comm_wait.
  struct Phases {
    double data = 0, forward = 0, backward = 0, comm_wait = 0, optimizer = 0, checkpoint = 0;
    double total = 0;  // wall time of the whole step, logging and evaluation included
    int64_t steps = 0;
    void add(const Phases& o);
  };
  StepStats train_step(int64_t step);
  double evaluate();  // mean validation loss over ranks (NaN when there is no split)
  nlohmann::json memory_json();  // collective
  // Bytes of frozen base (LoRA) per rank: all of it, or a 1/N shard under ZeRO-3.
  int64_t frozen_bytes_estimate() const;
  void load_adapter(const std::string& dir, const nn::LoraConfig& lora);
  void resume_from(const std::string& step_dir);
  std::string save(int64_t steps_done);  // collective; returns the step directory

  // device: cuda: picks this rank's GPU, opens the device scope for every
  // tensor the run makes and starts the NCCL communicator.
  void setup_device();
  // The communicator of the model's collectives: NCCL on the GPU, else comm_.
  dist::Communicator& model_comm() { return gpu_comm_ ? *gpu_comm_ : comm_; }

  config::Recipe recipe_;
  TrainOptions options_;
  dist::Communicator& comm_;  // host collectives (f64 helpers, barriers, abort)
  std::unique_ptr<DeviceScope> device_scope_;      // GPU runs: new tensors go to the GPU
  std::unique_ptr<dist::Communicator> gpu_comm_;  // GPU runs: NCCL over comm_
  std::unique_ptr<data::TokenDataset> dataset_;
  std::unique_ptr<data::Sampler> sampler_;
  std::unique_ptr<nn::Gpt> model_;
  std::unique_ptr<zero::ZeroEngine> zero_;
  std::unique_ptr<precision::DynamicLossScaler> scaler_;  // fp16 only
  std::unique_ptr<RunDirectory> run_dir_;  // rank 0 only
  std::unique_ptr<EventFileWriter> events_;  // rank 0 only: TensorBoard scalars
  bool log_file_open_ = false;  // this rank logs to RUN/logs/rank<r>.log
  Tensor tokens_;   // (micro, seq_len) i32, reused every micro-batch
  Tensor targets_;  // (micro, seq_len) i32
  optim::ScheduleOptions schedule_;
  int64_t current_step_ = -1;
  int64_t start_step_ = 0;
  int64_t skipped_at_start_ = 0;
  std::string resumed_from_;
  std::string base_sha256_;  // LoRA: SHA-256 of the frozen base's file
  int64_t skipped_total_ = 0;
  Phases phases_;  // the step in progress (--profile)
};

}  // namespace fd::engine
