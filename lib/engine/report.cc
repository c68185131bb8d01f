#include "lib/engine/report.h"

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "lib/base/log.h"
#include "lib/base/strings.h"
#include "lib/engine/checkpointing.h"
#include "lib/engine/run_dir.h"
#include "lib/engine/tfevents.h"
#include "lib/tensor/device.h"
#include "lib/tensor/memory.h"
#include "lib/text/byte_tokenizer.h"
#include "lib/text/tokenizer.h"

namespace fd::engine {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The TensorBoard scalars of one metrics.jsonl record (docs/RUN_DIR.md). No
// MFU: that needs the hardware's peak FLOP/s, which fdtrain does not know;
// effective GFLOP/s is the model arithmetic per second (summary.json's
// effective_gflops, per log window).
std::vector<std::pair<std::string, double>> tensorboard_scalars(const nlohmann::json& rec,
                                                                double flops_per_token) {
  std::vector<std::pair<std::string, double>> out;
  auto add = [&](const char* tag, const char* key, double scale = 1.0) {
    auto it = rec.find(key);
    if (it != rec.end() && it->is_number()) out.emplace_back(tag, it->get<double>() * scale);
  };
  add("train/loss", "loss");
  add("train/lr", "lr");
  add("train/grad_norm", "grad_norm");
  add("train/loss_scale", "loss_scale");
  add("train/tokens_per_s", "tokens_per_s");
  add("train/effective_gflops", "tokens_per_s", flops_per_token / 1e9);
  add("eval/loss", "eval_loss");
  // Preference training's metrics (TRL's names), training and evaluation.
  for (const char* m :
       {"rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
        "logps/chosen", "logps/rejected", "nll_loss", "log_odds_ratio", "log_odds_chosen"}) {
    const std::string train_tag = std::string("train/") + m, eval_tag = std::string("eval/") + m;
    const std::string eval_key = std::string("eval_") + m;
    add(train_tag.c_str(), m);
    add(eval_tag.c_str(), eval_key.c_str());
  }
  add("memory/peak_tracked_mib", "peak_memory_bytes", 1.0 / (1024.0 * 1024.0));
  add("memory/peak_rss_mib", "peak_rss_bytes", 1.0 / (1024.0 * 1024.0));
  return out;
}

}  // namespace

nlohmann::json number_or_null(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

int64_t peak_rss_bytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return int64_t(ru.ru_maxrss) * 1024;
}

void Phases::add(const Phases& o) {
  data += o.data;
  forward += o.forward;
  backward += o.backward;
  comm_wait += o.comm_wait;
  optimizer += o.optimizer;
  checkpoint += o.checkpoint;
  total += o.total;
  steps += o.steps;
}

PhaseClock::PhaseClock(bool on, const dist::Communicator& comm) : on_(on), comm_(comm) {
  if (on_) {
    t_ = Clock::now();
    w_ = comm_.wait_seconds();
  }
}

void PhaseClock::lap(double& phase, double& wait) {
  if (!on_) return;
  // A GPU queues kernels and returns: the phase ends when its work is done.
  cuda_synchronize();
  const auto now = Clock::now();
  const double w = comm_.wait_seconds();
  phase += std::chrono::duration<double>(now - t_).count() - (w - w_);
  wait += w - w_;
  t_ = now;
  w_ = w;
}

RunReport::RunReport(const config::Recipe& recipe, bool rank0, int world, int64_t start_step,
                     double flops_per_token, const dist::Communicator& model_comm,
                     RunDirectory* run_dir, EventFileWriter* events, bool progress,
                     bool force_progress, bool profile)
    : recipe_(recipe),
      rank0_(rank0),
      world_(world),
      start_step_(start_step),
      flops_per_token_(flops_per_token),
      tokens_per_step_(int64_t(recipe.batch.micro) * recipe.batch.accumulation *
                       recipe.data.seq_len * world),
      comm_(model_comm),
      run_dir_(run_dir),
      events_(events),
      progress_(progress && rank0, recipe.steps, force_progress),
      profile_(profile),
      eval_loss_(std::nan("")) {
  t_start_ = t_window_ = t_after_first_ = t_step_ = t_end_ = Clock::now();
}

void RunReport::begin_step() {
  phases_ = Phases{};
  if (profile_) t_profile_ = Clock::now();
  bytes0_ = comm_.bytes_sent();
  wait0_ = comm_.wait_seconds();
  if (world_comm_ != nullptr) {
    network0_ = world_comm_->family_bytes();
    inter0_ = world_comm_->family_inter_node_bytes();
  }
}

void RunReport::end_train_step() {
  train_comm_bytes_ += comm_.bytes_sent() - bytes0_;
  train_wait_s_ += comm_.wait_seconds() - wait0_;
  if (world_comm_ != nullptr) {
    train_network_bytes_ += world_comm_->family_bytes() - network0_;
    train_inter_bytes_ += world_comm_->family_inter_node_bytes() - inter0_;
  }
}

void RunReport::step_done(int64_t done, const StepRecord& s,
                          const std::function<double()>& evaluate) {
  const int64_t steps = recipe_.steps;
  ++window_steps_;
  const auto now = Clock::now();
  if (done == start_step_ + 1) t_after_first_ = now;
  const double train_s = seconds_between(t_start_, now) - eval_seconds_;
  // Step times of small models are noisy: the line shows a moving average
  // (over about 20 steps), saves and evaluation excluded.
  const double step_s = seconds_between(t_step_, now);
  step_s_avg_ = step_s_avg_ < 0 ? step_s : 0.95 * step_s_avg_ + 0.05 * step_s;
  progress_.update(done, s.loss, double(tokens_per_step_) / std::max(step_s_avg_, 1e-12),
                   train_s / double(done - start_step_) * double(steps - done));
  const bool last = done == steps;
  const bool eval_now =
      last || (recipe_.logging.eval_every > 0 && done % recipe_.logging.eval_every == 0);
  if (!(done % recipe_.logging.every == 0 || last || eval_now || s.skipped)) return;
  const double window_s = seconds_between(t_window_, now);
  const double tok_s = double(tokens_per_step_ * window_steps_) / std::max(window_s, 1e-9);
  nlohmann::json rec = {{"step", done},
                        {"loss", s.loss},
                        {"lr", s.lr},
                        {"grad_norm", number_or_null(s.grad_norm)},
                        {"tokens_per_s", tok_s},
                        {"elapsed_s", seconds_between(t_start_, now)},
                        {"skipped", s.skipped},
                        {"skipped_total", s.skipped_total}};
  if (s.loss_scale) rec["loss_scale"] = *s.loss_scale;
  for (const auto& [k, v] : s.metrics.items()) rec[k] = v;
  rec["peak_memory_bytes"] = MemoryAccountant::global().peak_total();
  rec["peak_rss_bytes"] = peak_rss_bytes();
  if (eval_now) {
    const auto t_eval = Clock::now();
    eval_loss_ = evaluate();
    eval_seconds_ += seconds_between(t_eval, Clock::now());
    rec["eval_loss"] = number_or_null(eval_loss_);
    if (eval_metrics_ != nullptr)
      for (const auto& [k, v] : eval_metrics_->items()) rec["eval_" + k] = v;
  }
  if (rank0_) {
    run_dir_->append_metrics(rec);
    events_->add_scalars(done, tensorboard_scalars(rec, flops_per_token_));
    events_->flush();
    // The progress line stands in for the step lines on the terminal; the log has them.
    const std::string line = fmt::format(
        "step {}/{} | loss {:.4f} | lr {:.3e} | grad norm {:.3f} | {:.0f} tok/s{}{}", done, steps,
        s.loss, s.lr, s.grad_norm, tok_s,
        s.metrics.contains("rewards/accuracies")
            ? fmt::format(" | reward accuracy {:.3f} margin {:.4f}",
                          s.metrics["rewards/accuracies"].get<double>(),
                          s.metrics["rewards/margins"].get<double>())
            : std::string(),
        eval_now && std::isfinite(eval_loss_) ? fmt::format(" | eval loss {:.4f}", eval_loss_)
                                              : std::string());
    if (progress_.enabled())
      log::write_file_only(log::Level::kInfo, line);
    else
      log::info("{}", line);
  }
  t_window_ = Clock::now();  // the next window starts after evaluation and logging
  window_steps_ = 0;
}

void RunReport::begin_checkpoint() { t_save_ = Clock::now(); }

void RunReport::end_checkpoint() {
  const auto now = Clock::now();
  const double seconds = seconds_between(t_save_, now);
  checkpoint_seconds_ += seconds;
  eval_seconds_ += seconds;  // not training time
  ++checkpoints_begun_;
  t_window_ += now - t_save_;  // a save is not training time of the log window
}

void RunReport::add_save_stall(double seconds) {
  if (seconds <= 0) return;
  checkpoint_seconds_ += seconds;
  eval_seconds_ += seconds;  // not training time
  t_window_ += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

void RunReport::checkpoint_saved(const SavedCheckpoint& s, bool async) {
  last_checkpoint_ = s.dir.string();
  ++checkpoints_saved_;
  checkpoint_write_seconds_ += s.write_s;
  checkpoint_wait_seconds_ += s.waited_s;
  checkpoint_bytes_ = s.bytes;
  checkpoint_async_ = async;
  if (!rank0_) return;
  // Where rank 0's time went, in its log file.
  log::write_file_only(
      log::Level::kInfo,
      fmt::format("checkpoint of step {}: {} shard written, synced and "
                  "digested in {:.3f} s, commit (the other ranks, manifest) "
                  "{:.3f} s",
                  s.step, format_bytes(double(s.bytes)), s.times.shard_s, s.times.commit_s));
  if (async)
    log::info(
        "checkpoint of step {} saved to {}: written behind the step in {:.2f} s ({}/s per "
        "rank); training blocked {:.3f} s",
        s.step, last_checkpoint_, s.write_s,
        format_bytes(double(s.bytes) / std::max(s.write_s, 1e-9)), s.blocked_s);
  else
    log::info("checkpoint of step {} saved to {} in {:.2f} s", s.step, last_checkpoint_,
              s.blocked_s);
}

void RunReport::end_step(int64_t step) {
  if (profile_) {
    phases_.total = seconds_between(t_profile_, Clock::now());
    phases_.steps = 1;
    (step == start_step_ ? profile_first_ : profile_rest_).add(phases_);
  }
  t_step_ = Clock::now();
}

void RunReport::finish_loop() {
  progress_.finish();
  t_end_ = Clock::now();
}

double RunReport::elapsed_s() const { return seconds_between(t_start_, t_end_); }

void RunReport::add_to_summary(nlohmann::json& summary, int64_t done) {
  const double elapsed = elapsed_s();
  const int64_t ran = done - start_step_;  // steps this process trained
  // Steady-state throughput excludes step 1 (allocator and cache warm-up)
  // when there is more than one step.
  const double steady_s =
      (ran > 1 ? seconds_between(t_after_first_, t_end_) : elapsed) - eval_seconds_;
  const int64_t steady_steps = ran > 1 ? ran - 1 : ran;
  tokens_per_s_ = double(tokens_per_step_ * steady_steps) / std::max(steady_s, 1e-9);
  summary.update({
      {"tokens_per_s", tokens_per_s_},
      {"ms_per_step", steady_steps > 0 ? 1e3 * steady_s / double(steady_steps) : 0.0},
      {"effective_gflops", tokens_per_s_ * flops_per_token_ / 1e9},
      {"elapsed_s", elapsed},
      {"last_checkpoint",
       last_checkpoint_.empty() ? nlohmann::json(nullptr) : nlohmann::json(last_checkpoint_)},
      {"checkpoint_s_per_save",
       checkpoints_begun_ > 0 ? checkpoint_seconds_ / double(checkpoints_begun_) : 0.0},
      {"checkpoints",
       {{"async", checkpoint_async_},
        {"saved", checkpoints_saved_},
        {"blocked_s_per_save",
         checkpoints_begun_ > 0 ? checkpoint_seconds_ / double(checkpoints_begun_) : 0.0},
        {"waited_s", checkpoint_wait_seconds_},
        {"write_s_per_save",
         checkpoints_saved_ > 0 ? checkpoint_write_seconds_ / double(checkpoints_saved_) : 0.0},
        {"shard_bytes", checkpoint_bytes_}}},
      {"tokens_per_step", tokens_per_step_},
      {"comm_bytes_per_step", ran > 0 ? train_comm_bytes_ / ran : 0},
      {"comm_wait_s_per_step", ran > 0 ? train_wait_s_ / double(ran) : 0.0},
  });
}

void RunReport::add_sample(
    nlohmann::json& summary, bool print,
    const std::function<std::vector<int32_t>(const std::vector<int32_t>&)>& generate) {
  if (recipe_.logging.sample_tokens <= 0) return;
  const bool text = recipe_.data.format == config::DataFormat::kText;
  // The run's tokenizer: data.tokenizer's tokenizer.json, else bytes.
  std::unique_ptr<text::Tokenizer> hf;
  if (text && !recipe_.data.tokenizer.empty()) hf = text::load_tokenizer(recipe_.data.tokenizer);
  text::ByteTokenizer bytes;
  std::vector<int32_t> prompt;
  if (hf) {
    if (const auto bos = hf->bos_id()) prompt.push_back(*bos);
    const std::vector<int32_t> ids = hf->encode(recipe_.logging.sample_prompt, false);
    prompt.insert(prompt.end(), ids.begin(), ids.end());
  } else if (text) {
    prompt = bytes.encode(recipe_.logging.sample_prompt);
  }
  const std::vector<int32_t> out = generate(prompt);
  if (text) {
    std::string sample =
        recipe_.logging.sample_prompt + (hf ? hf->decode(out, true) : bytes.decode(out));
    summary["sample"] = sample;
    if (print && rank0_)
      std::printf("--- sample (%d tokens, temperature %.2f) ---\n%s\n---\n",
                  recipe_.logging.sample_tokens, recipe_.logging.sample_temperature,
                  sample.c_str());
  } else {
    summary["sample_tokens"] = out;
  }
}

void RunReport::add_profile(nlohmann::json& summary) {
  if (!profile_) return;
  // Steps after the first of this run; the first alone when only one ran.
  const bool warm = profile_rest_.steps > 0;
  const Phases& p = warm ? profile_rest_ : profile_first_;
  const double phases_s =
      p.data + p.forward + p.backward + p.comm_wait + p.optimizer + p.checkpoint;
  summary["profile"] = {{"data_s", p.data},
                        {"forward_s", p.forward},
                        {"backward_s", p.backward},
                        {"comm_wait_s", p.comm_wait},
                        {"optimizer_s", p.optimizer},
                        {"checkpoint_s", p.checkpoint},
                        {"other_s", std::max(0.0, p.total - phases_s)},
                        {"total_s", p.total},
                        {"steps", p.steps},
                        {"first_step_excluded", warm}};
  if (!rank0_) return;
  const double n = double(std::max<int64_t>(p.steps, 1));
  const double total = std::max(p.total, 1e-12);
  std::string table = fmt::format(
      "profile (rank 0, {} step{}{}; wall time, each phase less the communication wait "
      "inside it):\n  {:<12} {:>10} {:>12} {:>7}\n",
      p.steps, p.steps == 1 ? "" : "s", warm ? ", first step excluded" : "", "phase", "total s",
      "ms/step", "%");
  auto row = [&](const char* name, double v) {
    table += fmt::format("  {:<12} {:>10.3f} {:>12.2f} {:>6.1f}%\n", name, v, 1e3 * v / n,
                         100.0 * v / total);
  };
  row("data", p.data);
  row("forward", p.forward);
  row("backward", p.backward);
  row("comm wait", p.comm_wait);
  row("optimizer", p.optimizer);
  row("checkpoint", p.checkpoint);
  row("other", std::max(0.0, p.total - phases_s));
  row("step total", p.total);
  table.pop_back();
  log::info("{}", table);
}

}  // namespace fd::engine
