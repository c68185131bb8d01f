#include "lib/engine/trainer.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "lib/autograd/tape.h"
#include "lib/base/error.h"
#include "lib/base/log.h"
#include "lib/config/load.h"
#include "lib/data/byte_tokenizer.h"
#include "lib/data/sampler.h"
#include "lib/data/token_dataset.h"
#include "lib/engine/generate.h"
#include "lib/engine/progress.h"
#include "lib/engine/run_dir.h"
#include "lib/engine/weights_digest.h"
#include "lib/nn/gpt.h"
#include "lib/ops/blas_setup.h"
#include "lib/optim/adamw.h"
#include "lib/optim/clip.h"
#include "lib/optim/schedule.h"

namespace fd::engine {
namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kVersion = "0.1.0";

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// World size from the launcher's environment (Open MPI, PMIx, Slurm, MPICH).
// This build trains on one process; a multi-rank launch must fail clearly
// instead of running N independent copies that overwrite each other.
int launcher_world_size() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE", "SLURM_NTASKS"}) {
    if (const char* v = std::getenv(var)) {
      int n = std::atoi(v);
      if (n > 0) return n;
    }
  }
  return 1;
}

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

nlohmann::json number_or_null(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

// Opens the dataset; on a bad file, names the recipe entry that brought it in.
std::unique_ptr<data::TokenDataset> open_dataset(const config::Recipe& r) {
  data::DatasetOptions o;
  o.train_files = r.data.train;
  o.val_files = r.data.val;
  o.format = r.data.format == config::DataFormat::kTokens ? data::TokenFormat::kLlmc
                                                          : data::TokenFormat::kText;
  o.val_fraction = r.data.val_fraction;
  o.seq_len = r.data.seq_len;
  o.vocab_size = r.model.vocab_size;
  try {
    return std::make_unique<data::TokenDataset>(o);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kUsage) throw;
    // Find the file at fault to point at its line in the recipe.
    auto locate = [&](const std::vector<std::string>& files, const char* key) -> std::string {
      for (size_t i = 0; i < files.size(); ++i) {
        try {
          data::TokenFile::open(files[i], o.format, o.vocab_size);
        } catch (const Error&) {
          return fmt::format("{}: {}[{}]: ", r.where(fmt::format("{}[{}]", key, i)), key, i);
        }
      }
      return "";
    };
    std::string where = locate(o.train_files, "data.train");
    if (where.empty()) where = locate(o.val_files, "data.val");
    if (where.empty()) where = fmt::format("{}: ", r.where("data"));
    throw Error(ErrorKind::kUsage, where + e.what());
  }
}

}  // namespace

Trainer::Trainer(const config::Recipe& recipe, const TrainOptions& options)
    : recipe_(recipe), options_(options) {
  world_size_ = launcher_world_size();
  if (world_size_ != 1) {
    usage_error(
        "launched as {} ranks, but this build of fdtrain trains on one process only "
        "(distributed training and ZeRO are not supported yet); run with `mpirun -n 1` or "
        "without mpirun",
        world_size_);
  }
  config::check_world_size(recipe_, world_size_);
  ops::set_blas_threads(recipe_.threads);

  dataset_ = open_dataset(recipe_);
  sampler_ = std::make_unique<data::Sampler>(*dataset_, uint64_t(recipe_.seed));

  nn::GptConfig mc;
  mc.n_layer = recipe_.model.n_layer;
  mc.n_head = recipe_.model.n_head;
  mc.d_model = recipe_.model.d_model;
  mc.vocab_size = recipe_.model.vocab_size;
  mc.max_seq_len = recipe_.model.max_seq_len;
  model_ = std::make_unique<nn::Gpt>(mc, DType::kF32);
  model_->init_gpt2(uint64_t(recipe_.seed));

  optim::AdamWOptions ao;
  ao.lr = float(recipe_.optimizer.lr);
  ao.beta1 = float(recipe_.optimizer.betas[0]);
  ao.beta2 = float(recipe_.optimizer.betas[1]);
  ao.eps = float(recipe_.optimizer.eps);
  ao.weight_decay = float(recipe_.optimizer.weight_decay);
  optimizer_ = std::make_unique<optim::AdamW>(model_->groups(), ao);
  schedule_.kind = recipe_.schedule.name == config::ScheduleName::kCosine
                       ? optim::ScheduleKind::kCosine
                       : optim::ScheduleKind::kConstant;
  schedule_.peak_lr = ao.lr;
  schedule_.warmup_steps = recipe_.schedule.warmup_steps;
  schedule_.total_steps = recipe_.steps;
  schedule_.min_lr = float(recipe_.schedule.min_lr);

  tokens_ = Tensor::empty(Shape{recipe_.batch.micro, recipe_.data.seq_len}, DType::kI32,
                          MemCategory::kOther);
  targets_ = Tensor::empty(Shape{recipe_.batch.micro, recipe_.data.seq_len}, DType::kI32,
                           MemCategory::kOther);

  run_dir_ = std::make_unique<RunDirectory>(options_.run_dir, options_.overwrite);
  run_dir_->write_config(config::to_yaml(recipe_));
  run_dir_->write_command(options_.command_line);
  log::info("model: GPT-2 L{} H{} C{} V{} T{}, {:.2f}M parameters; {}", mc.n_layer, mc.n_head,
            mc.d_model, mc.vocab_size, mc.max_seq_len, double(mc.num_params()) / 1e6,
            dataset_->summary());
  log::info("run directory: {}", run_dir_->path().string());
}

Trainer::~Trainer() = default;

double Trainer::train_step(int64_t step) {
  const int B = recipe_.batch.micro, T = recipe_.data.seq_len;
  const int accum = recipe_.batch.accumulation;
  model_->zero_grads();
  double loss_sum = 0.0;
  for (int micro = 0; micro < accum; ++micro) {
    sampler_->sample_train(step, micro, 0, world_size_, B, T, tokens_.i32(), targets_.i32());
    autograd::Tape tape;
    autograd::TapeScope scope(tape);
    autograd::Variable loss = model_->loss(tokens_, targets_);
    loss_sum += loss.value().to_vector()[0];
    tape.backward(loss, 1.0f / float(accum));
  }
  double loss = loss_sum / accum;
  if (!std::isfinite(loss)) return loss;  // caller stops the run before updating
  auto groups = model_->groups();
  last_grad_norm_ = optim::global_grad_norm(groups);
  optim::clip_grad_norm(groups, last_grad_norm_, float(recipe_.optimizer.grad_clip));
  optimizer_->step(optim::lr_at(schedule_, step));
  return loss;
}

double Trainer::evaluate() {
  if (!dataset_->has_val()) return std::nan("");
  autograd::NoGradGuard no_grad;
  const int B = recipe_.batch.micro, T = recipe_.data.seq_len;
  double sum = 0.0;
  for (int i = 0; i < recipe_.logging.eval_batches; ++i) {
    sampler_->sample_val(i, 0, world_size_, B, T, tokens_.i32(), targets_.i32());
    sum += model_->loss(tokens_, targets_).value().to_vector()[0];
  }
  return sum / recipe_.logging.eval_batches;
}

nlohmann::json Trainer::memory_json() const {
  const MemoryAccountant& acct = MemoryAccountant::global();
  nlohmann::json m;
  for (int c = 0; c < kNumMemCategories; ++c) {
    auto cat = static_cast<MemCategory>(c);
    m[std::string(mem_category_name(cat))] = acct.peak(cat);
  }
  m["total"] = acct.peak_total();
  return m;
}

nlohmann::json Trainer::run() {
  const int64_t steps = recipe_.steps;
  const int64_t tokens_per_step = int64_t(recipe_.batch.micro) * recipe_.batch.accumulation *
                                  recipe_.data.seq_len * world_size_;
  const double flops_per_token = model_->config().flops_per_token(recipe_.data.seq_len);

  Progress progress(options_.progress, steps);
  const std::string started_at = utc_now();
  const auto t_start = Clock::now();
  auto t_window = t_start;
  auto t_after_first = t_start;
  int64_t window_steps = 0;
  double loss = std::nan(""), eval_loss = std::nan("");
  std::string exit_reason = "completed";
  int64_t done = 0;

  double eval_seconds = 0.0;  // evaluation time, excluded from throughput
  auto t_step = t_start;
  for (int64_t step = 0; step < steps; ++step) {
    const float lr = optim::lr_at(schedule_, step);
    loss = train_step(step);
    ++window_steps;
    if (!std::isfinite(loss)) {
      exit_reason = "diverged";
      break;
    }
    done = step + 1;
    const auto now = Clock::now();
    if (step == 0) t_after_first = now;
    const double train_s = seconds_between(t_start, now) - eval_seconds;
    progress.update(done, loss, double(tokens_per_step) / seconds_between(t_step, now),
                    train_s / double(done) * double(steps - done));
    const bool last = done == steps;
    const bool eval_now =
        last || (recipe_.logging.eval_every > 0 && done % recipe_.logging.eval_every == 0);
    if (done % recipe_.logging.every == 0 || last || eval_now) {
      const double window_s = seconds_between(t_window, now);
      const double tok_s = double(tokens_per_step * window_steps) / std::max(window_s, 1e-9);
      nlohmann::json rec = {{"step", done},
                            {"loss", loss},
                            {"lr", lr},
                            {"grad_norm", last_grad_norm_},
                            {"tokens_per_s", tok_s},
                            {"elapsed_s", seconds_between(t_start, now)}};
      if (eval_now) {
        const auto t_eval = Clock::now();
        eval_loss = evaluate();
        eval_seconds += seconds_between(t_eval, Clock::now());
        rec["eval_loss"] = number_or_null(eval_loss);
      }
      run_dir_->append_metrics(rec);
      if (!progress.enabled()) {
        log::info("step {}/{} | loss {:.4f} | lr {:.3e} | grad norm {:.3f} | {:.0f} tok/s{}", done,
                  steps, loss, lr, last_grad_norm_, tok_s,
                  eval_now && std::isfinite(eval_loss)
                      ? fmt::format(" | eval loss {:.4f}", eval_loss)
                      : std::string());
      }
      t_window = Clock::now();  // the next window starts after evaluation and logging
      window_steps = 0;
    }
    t_step = Clock::now();
  }
  progress.finish();
  const auto t_end = Clock::now();
  const double elapsed = seconds_between(t_start, t_end);
  // Steady-state throughput excludes step 1 (allocator and cache warm-up)
  // when there is more than one step.
  const double steady_s =
      (done > 1 ? seconds_between(t_after_first, t_end) : elapsed) - eval_seconds;
  const int64_t steady_steps = done > 1 ? done - 1 : done;
  const double tokens_per_s = double(tokens_per_step * steady_steps) / std::max(steady_s, 1e-9);

  nlohmann::json summary = {
      {"fdtrain_version", kVersion},
      {"exit_reason", exit_reason},
      {"steps", done},
      {"steps_planned", steps},
      {"final_loss", number_or_null(loss)},
      {"eval_loss", number_or_null(eval_loss)},
      {"tokens_per_s", tokens_per_s},
      {"ms_per_step", steady_steps > 0 ? 1e3 * steady_s / double(steady_steps) : 0.0},
      {"effective_gflops", tokens_per_s * flops_per_token / 1e9},
      {"elapsed_s", elapsed},
      {"world_size", world_size_},
      {"precision", std::string(config::to_string(recipe_.precision))},
      {"zero_stage", recipe_.zero.stage},
      {"skipped_steps", 0},
      {"num_params", model_->config().num_params()},
      {"tokens_per_step", tokens_per_step},
      {"weights_sha256", weights_sha256(*model_)},
      {"memory", memory_json()},
      {"recipe", options_.recipe_path},
      {"overrides", options_.overrides},
      {"command", options_.command_line},
      {"started_at", started_at},
  };
  if (exit_reason == "completed" && recipe_.logging.sample_tokens > 0) {
    data::ByteTokenizer tok;
    SampleOptions so2;
    so2.max_new_tokens = recipe_.logging.sample_tokens;
    so2.temperature = float(recipe_.logging.sample_temperature);
    so2.top_k = recipe_.logging.sample_top_k;
    so2.seed = uint64_t(recipe_.seed);
    std::vector<int32_t> prompt;
    if (recipe_.data.format == config::DataFormat::kText)
      prompt = tok.encode(recipe_.logging.sample_prompt);
    std::vector<int32_t> out = generate(*model_, prompt, so2);
    if (recipe_.data.format == config::DataFormat::kText) {
      std::string text = recipe_.logging.sample_prompt + tok.decode(out);
      summary["sample"] = text;
      if (options_.print_sample)
        std::printf("--- sample (%d tokens, temperature %.2f) ---\n%s\n---\n",
                    recipe_.logging.sample_tokens, recipe_.logging.sample_temperature,
                    text.c_str());
    } else {
      summary["sample_tokens"] = out;
    }
  }
  run_dir_->write_summary(summary);
  if (exit_reason == "diverged") {
    runtime_error(
        "the loss became {} at step {}; the run stopped before updating the weights (summary in "
        "{}). Lower optimizer.lr, raise schedule.warmup_steps or set optimizer.grad_clip",
        loss, done + 1, run_dir_->path().string());
  }
  log::info(
      "done: {} steps in {:.1f} s | final loss {:.4f} | eval loss {:.4f} | {:.0f} tok/s | "
      "weights {}",
      done, elapsed, loss, eval_loss, tokens_per_s,
      summary["weights_sha256"].get<std::string>().substr(0, 16));
  return summary;
}

}  // namespace fd::engine
