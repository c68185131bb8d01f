// RunReport: what a training run tells the user while it trains and when it
// ends, kept beside Trainer::run's loop so that the loop reads as one step
// after another (llm.c's train_gpt2.c is the model).
//
//   RunReport report(...);
//   for (step ...) {
//     report.begin_step();
//     StepStats st = train_step(step);            // laps a PhaseClock into report.phases()
//     report.end_train_step();                    // communication traffic and wait of the step
//     report.step_done(done, {...}, evaluate);    // progress line; metrics.jsonl, TensorBoard
//     ...save: report.checkpoint_saved(...)...    // and the log, every logging.every steps
//     report.end_step(step);                      // --profile: the step's phases
//   }
//   nlohmann::json summary = ...;  report.add_to_summary(summary, done);
//
// It owns the clocks (throughput excludes evaluation, saves and the first
// step's warm-up), the progress line, the metrics records (docs/RUN_DIR.md),
// the --profile breakdown and the end-of-run sample. Rank 0 writes; every
// rank keeps the same clocks (evaluation is collective, so every rank calls
// step_done()).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "lib/config/recipe.h"
#include "lib/dist/communicator.h"
#include "lib/engine/progress.h"

namespace fd::engine {

struct SavedCheckpoint;  // checkpointing.h

class RunDirectory;
class EventFileWriter;

// A number for summary.json and metrics.jsonl: null when not finite.
nlohmann::json number_or_null(double v);
// This process's peak resident set size (getrusage), bytes.
int64_t peak_rss_bytes();

// Wall seconds per phase of one step (--profile); each phase excludes the
// communication wait inside it, which goes to comm_wait.
struct Phases {
  double data = 0, forward = 0, backward = 0, comm_wait = 0, optimizer = 0, checkpoint = 0;
  double total = 0;  // wall time of the whole step, logging and evaluation included
  int64_t steps = 0;
  void add(const Phases& o);
};

// Laps the wall clock for --profile: each lap adds its time, less the
// communication wait inside it, to one phase, and that wait to `wait`. On a
// GPU each lap first waits for the work queued so far (cuda_synchronize), so
// a phase is charged with its kernels' time. Off, it reads no clock.
class PhaseClock {
 public:
  PhaseClock(bool on, const dist::Communicator& comm);
  void lap(double& phase, double& wait);
  bool on() const { return on_; }

 private:
  bool on_;
  const dist::Communicator& comm_;
  std::chrono::steady_clock::time_point t_;
  double w_ = 0.0;
};

// What one optimizer step produced, for the progress line and metrics.
struct StepRecord {
  double loss = 0.0;       // mean over micro-batches and ranks
  float lr = 0.0f;         // the learning rate the step used
  double grad_norm = 0.0;  // global, before clipping
  bool skipped = false;    // non-finite gradients: no update
  int64_t skipped_total = 0;
  std::optional<double> loss_scale;  // fp16: the scaler's scale after the step
  // Preference training: the objective's metrics under TRL's names ("rewards/chosen", ...),
  // written into the record as they are.
  nlohmann::json metrics = nlohmann::json::object();
};

class RunReport {
 public:
  // `model_comm` carries the model's collectives (its traffic and waits are
  // reported); `run_dir` and `events` are rank 0's (null elsewhere).
  RunReport(const config::Recipe& recipe, bool rank0, int world, int64_t start_step,
            double flops_per_token, const dist::Communicator& model_comm, RunDirectory* run_dir,
            EventFileWriter* events, bool progress, bool force_progress, bool profile);

  // Before a step: the profile clock starts, traffic counters are read.
  void begin_step();
  // After the step's micro-batches and optimizer update.
  void end_train_step();
  // The phases of the step in progress, for PhaseClock laps.
  Phases& phases() { return phases_; }

  // Step `done` (1-based) finished without ending the run: redraws the
  // progress line and, every logging.every steps, at evaluation steps, the
  // last step and a skipped step, writes the metrics record (rank 0), with
  // the validation loss from `evaluate` (collective: every rank calls this)
  // at evaluation steps and the last one.
  void step_done(int64_t done, const StepRecord& s, const std::function<double()>& evaluate);
  // A save starts / hands the loop back (synchronous: written; asynchronous: staged): the
  // time between is not training time (throughput, the log window) and is the save's stall.
  void begin_checkpoint();
  void end_checkpoint();
  // Time a step waited for the last save (its staging copy): the save's, not training time.
  void add_save_stall(double seconds);
  // A save is committed (asynchronous saves: behind the step, a step or more later): logged
  // (rank 0) and counted in the summary.
  void checkpoint_saved(const SavedCheckpoint& saved, bool async);
  // `seconds` of the loop that were not training (waiting for a save at the end or a stop).
  void exclude_from_training(double seconds) { eval_seconds_ += seconds; }
  // End of the step that started at begin_step() (--profile).
  void end_step(int64_t step);
  // The run's loop is over: ends the progress line and stops the run's clock.
  void finish_loop();

  // Preference training: where evaluate() leaves the objective's metrics; each is written as
  // "eval_<name>" beside eval_loss (TRL's naming). Not owned; null: none.
  void set_eval_metrics(const nlohmann::json* metrics) { eval_metrics_ = metrics; }
  // The validation loss last measured (NaN before the first evaluation).
  double eval_loss() const { return eval_loss_; }
  void set_eval_loss(double v) { eval_loss_ = v; }
  // Wall seconds from the loop's start to finish_loop().
  double elapsed_s() const;
  double train_wait_s() const { return train_wait_s_; }
  // The world communicator, whose family totals (Communicator::family_bytes: every group's
  // traffic) the training steps' network figures are read from. Not owned; null: none.
  void set_world(const dist::Communicator* world) { world_comm_ = world; }
  // Bytes this rank sent over all its groups in training steps, and of them to other nodes.
  int64_t train_network_bytes() const { return train_network_bytes_; }
  int64_t train_inter_node_bytes() const { return train_inter_bytes_; }

  // Adds the run's timing fields to `summary` (tokens_per_s, ms_per_step,
  // effective_gflops, elapsed_s, checkpoint_s_per_save, last_checkpoint,
  // comm_bytes_per_step, comm_wait_s_per_step, tokens_per_step), measured to
  // finish_loop(). `done`: steps completed in all.
  void add_to_summary(nlohmann::json& summary, int64_t done);
  // --profile: adds "profile" to `summary` and prints the table (rank 0).
  void add_profile(nlohmann::json& summary);
  // Steady-state throughput after add_to_summary (tokens per second).
  double tokens_per_s() const { return tokens_per_s_; }

  // The end-of-run sample (logging.sample_tokens > 0): `generate` returns the
  // tokens after the prompt (collective under ZeRO-3). Adds "sample" (text)
  // or "sample_tokens" (token files) to `summary`; prints the text on rank 0
  // when `print`.
  void add_sample(nlohmann::json& summary, bool print,
                  const std::function<std::vector<int32_t>(const std::vector<int32_t>&)>& generate);

 private:
  using Clock = std::chrono::steady_clock;
  const nlohmann::json* eval_metrics_ = nullptr;
  const config::Recipe& recipe_;
  bool rank0_;
  int world_;
  int64_t start_step_;
  double flops_per_token_;
  int64_t tokens_per_step_;
  const dist::Communicator& comm_;
  RunDirectory* run_dir_;
  EventFileWriter* events_;
  Progress progress_;
  bool profile_;

  Clock::time_point t_start_, t_window_, t_after_first_, t_step_, t_profile_, t_end_, t_save_;
  double step_s_avg_ = -1.0;  // moving average of step time, for the progress line
  int64_t window_steps_ = 0;
  double eval_loss_;
  double eval_seconds_ = 0.0;        // evaluation and save time, excluded from throughput
  double checkpoint_seconds_ = 0.0;  // the loop's time blocked by saves
  int64_t checkpoints_begun_ = 0;
  int64_t checkpoints_saved_ = 0;
  double checkpoint_write_seconds_ = 0.0;  // committed saves' write time (behind the step)
  double checkpoint_wait_seconds_ = 0.0;   // of checkpoint_seconds_, waiting for a save in flight
  int64_t checkpoint_bytes_ = 0;           // this rank's last shard
  bool checkpoint_async_ = false;
  std::string last_checkpoint_;
  int64_t bytes0_ = 0;
  double wait0_ = 0.0;
  const dist::Communicator* world_comm_ = nullptr;
  int64_t network0_ = 0, inter0_ = 0;
  int64_t train_network_bytes_ = 0, train_inter_bytes_ = 0;
  int64_t train_comm_bytes_ = 0;  // model traffic of training steps (not evaluation)
  double train_wait_s_ = 0.0;     // compute-thread time blocked on communication
  double tokens_per_s_ = 0.0;
  Phases phases_;                        // the step in progress
  Phases profile_first_, profile_rest_;  // the first step of this run (warm-up) apart
};

}  // namespace fd::engine
