#include "lib/engine/trainer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <ctime>
#include <limits>
#include <optional>

#include "lib/autograd/tape.h"
#include "lib/base/error.h"
#include "lib/base/host_name.h"
#include "lib/base/log.h"
#include "lib/base/rng.h"
#include "lib/base/strings.h"
#include "lib/base/version.h"
#include "lib/ckpt/export.h"
#include "lib/ckpt/lora_base.h"
#include "lib/ckpt/peft.h"
#include "lib/config/load.h"
#include "lib/config/paths.h"
#include "lib/data/sampler.h"
#include "lib/data/token_dataset.h"
#include "lib/dist/gpu_communicator.h"
#include "lib/engine/assemble.h"
#include "lib/engine/build_run.h"
#include "lib/engine/checkpointing.h"
#include "lib/engine/estimate.h"
#include "lib/engine/generate.h"
#include "lib/engine/process_memory.h"
#include "lib/engine/rank_agreement.h"
#include "lib/engine/report.h"
#include "lib/engine/resume.h"
#include "lib/engine/run_dir.h"
#include "lib/engine/step.h"
#include "lib/engine/tfevents.h"
#include "lib/engine/weights_digest.h"
#include "lib/engine/weights_io.h"
#include "lib/nn/config/hf_config.h"
#include "lib/nn/decoder.h"
#include "lib/ops/adamw.h"
#include "lib/ops/blas_setup.h"
#include "lib/optim/schedule.h"
#include "lib/precision/loss_scaler.h"
#include "lib/tensor/device.h"
#include "lib/zero/zero_engine.h"

namespace fd::engine {
namespace {

std::atomic<int> g_stop_requested{0};

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

const char* signal_name(int signo) {
  switch (signo) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGUSR1:
      return "SIGUSR1";
  }
  return "signal";
}

}  // namespace

Trainer::Trainer(const config::Recipe& recipe, const TrainOptions& options,
                 dist::Communicator& comm)
    : recipe_(recipe), options_(options), comm_(comm) {
  // Relative paths are recorded absolute (config.yaml, checkpoints), so that
  // the run's files name the same data from any working directory.
  if (options_.working_dir.empty()) options_.working_dir = std::filesystem::current_path().string();
  config::make_paths_absolute(recipe_, options_.working_dir);
  started_at_ = utc_now();
  // Setup is collective and in stages: every rank learns whether any rank
  // failed in a stage before the next begins, so that a problem seen by one
  // rank only (say, a locked run directory on rank 0) ends every rank cleanly
  // instead of leaving the others in a collective, and so that no rank reads
  // the run directory for resuming before rank 0 holds its lock and has tidied it.
  const int world = comm_.size();
  int first_failed = -1;
  double worst = 0.0;
  std::string message;
  auto agree = [&](const std::function<void()>& stage) {
    double code = 0.0;
    try {
      stage();
    } catch (const Error& e) {
      code = e.exit_code();
      message = e.what();
    }
    std::vector<double> codes(static_cast<size_t>(world));
    comm_.all_gather_f64(&code, codes.data(), 1);
    for (int r = 0; r < world; ++r) {
      worst = std::max(worst, codes[size_t(r)]);
      if (codes[size_t(r)] != 0.0 && first_failed < 0) first_failed = r;
    }
    return worst == 0.0;
  };
  const bool ok =
      agree([&] { open_run_directory(options_); }) && agree([&] { setup(options_); }) &&
      // Only now that every rank is set up is the run directory changed
      // (rank 0); then every rank logs to RUN/logs/rank<r>.log (appending
      // when it resumes).
      (finished() || (agree([&] { start_run_directory(options_); }) && agree([&] {
                        log::open_file(std::filesystem::path(options.run_dir) / "logs" /
                                           fmt::format("rank{}.log", comm_.rank()),
                                       !resumed_from_.empty());
                        log_file_open_ = true;
                        log::write_file_only(
                            log::Level::kInfo,
                            fmt::format("rank {} of {} on host {} (pid {}): {}", comm_.rank(),
                                        world, host_name(), int(getpid()), options.command_line));
                      }) &&
                      // The layout's first transfer between ranks (a pipeline's embedding,
                      // initial or loaded, to a tied head's copy) only now that every rank is
                      // set up: a rank whose setup failed (its offload file in use, say) is in
                      // the agreements above, not in a send its neighbour would wait on. Then
                      // preference training's reference log-probs, if still due.
                      agree([&] {
                        strategy_->sync();
                        finish_reference();
                      })));
  if (ok) {
    if (finished()) return;
    dist::set_abort_hook([this](const std::string& why) { record_failure(why); });
    return;
  }
  if (log_file_open_) log::close_file();
  const ErrorKind kind = worst == 2.0 ? ErrorKind::kUsage : ErrorKind::kRuntime;
  if (comm_.rank() != first_failed) throw Error(kind, "");
  throw Error(kind, world > 1 && comm_.rank() != 0
                        ? fmt::format("rank {}: {}", comm_.rank(), message)
                        : message);
}

nlohmann::json Trainer::summary_head(const std::string& status, const std::string& exit_reason,
                                     int64_t steps_done) const {
  return {{"fdtrain_version", version()},
          {"status", status},
          {"exit_reason", exit_reason},
          {"steps", steps_done},
          {"steps_planned", recipe_.steps},
          {"start_step", start_step_},
          {"resumed_from",
           resumed_from_.empty() ? nlohmann::json(nullptr) : nlohmann::json(resumed_from_)},
          {"world_size", comm_.size()},
          {"recipe", options_.recipe_path},
          {"overrides", options_.overrides},
          {"command", options_.command_line},
          {"working_dir", options_.working_dir},
          {"started_at", started_at_},
          {"ended_at", utc_now()}};
}

void Trainer::record_failure(const std::string& message) {
  if (failure_recorded_.exchange(true)) return;
  try {
    nlohmann::json s = summary_head("failed", "error", std::max(steps_done_, start_step_));
    s["error"] = message;
    s["failed_rank"] = comm_.rank();
    if (run_dir_) {
      run_dir_->write_summary(s);
    } else {
      write_summary_file(options_.run_dir, s);
    }
  } catch (...) {
    // Best effort: the failure itself is what the user must see.
  }
}

void Trainer::open_run_directory(const TrainOptions& options) {
  if (comm_.rank() != 0) return;
  run_dir_ = std::make_unique<RunDirectory>(options.run_dir);
  if (!options.resume.empty())
    for (const std::string& line : tidy_checkpoints(run_dir_->path() / "checkpoints"))
      log::warn("{}", line);
}

// This rank's GPU: its rank among the ranks on this node, from the launcher
// (Open MPI, MPICH/Hydra, Slurm), else its global rank (one node).
int local_gpu_ordinal(int rank) {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}) {
    if (const char* v = std::getenv(var)) return std::atoi(v);
  }
  return rank;
}

void Trainer::setup_device() {
  if (recipe_.device != config::DeviceName::kCuda) return;
  const int ordinal = local_gpu_ordinal(comm_.rank());
  // Every rank must get its GPU before any starts NCCL (a collective): agree first.
  std::optional<Error> failure;
  try {
    const int count = cuda_device_count();
    if (count > 0 && ordinal >= count)
      usage_error(
          "{}: device: cuda with {} ranks on this node, but it has {} GPU{}; start at "
          "most one rank per GPU (mpirun -n {} per node)",
          recipe_.where("device"), ordinal + 1, count, count == 1 ? "" : "s", count);
    init_cuda_device(ordinal);
  } catch (const Error& e) {
    failure = e;
  }
  double ok = failure ? 0.0 : 1.0;
  std::vector<double> oks(static_cast<size_t>(comm_.size()));
  comm_.all_gather_f64(&ok, oks.data(), 1);
  if (failure) throw *failure;
  for (int r = 0; r < comm_.size(); ++r)
    if (oks[size_t(r)] == 0.0) runtime_error("rank {} could not start its GPU", r);
  device_scope_ = std::make_unique<DeviceScope>(Device::cuda(ordinal));
  set_cuda_tf32(recipe_.tf32 && recipe_.precision == config::Precision::kFp32);
  gpu_comm_ = dist::make_gpu_communicator(comm_);
  gpu_comm_->set_timeout(recipe_.dist.timeout_s);
}

void Trainer::setup(const TrainOptions& options) {
  const int world = comm_.size();
  // One program and one recipe on every rank (hosts with another build or recipe file), before
  // anything depends on either.
  check_ranks_agree(comm_, recipe_);
  config::check_world_size(recipe_, world);
  // How the run starts, decided before anything is built: a refusal (a run
  // already there, a damaged checkpoint) costs nothing, and a finished run is
  // left as it is.
  ResumePlan plan = plan_resume(options.resume, options.run_dir, options.overwrite, recipe_.steps);
  if (comm_.rank() == 0)
    for (const std::string& w : plan.warnings) log::warn("{}", w);
  if (plan.kind == ResumePlan::Kind::kFinished) {
    finished_message_ = fmt::format(
        "{}: the run is finished: its checkpoint {} is at step {} of steps = {}; nothing to do, "
        "nothing was changed. To train further, resume with a larger steps=N",
        options.run_dir, plan.checkpoint->dir().string(), plan.step, recipe_.steps);
    return;
  }
  if (options.resume == "auto" && plan.kind == ResumePlan::Kind::kFresh && comm_.rank() == 0)
    log::info("--resume auto: no checkpoint in {}; starting fresh",
              (std::filesystem::path(options.run_dir) / "checkpoints").string());
  setup_device();
  ops::set_blas_threads(recipe_.threads);
  ops::set_adamw_threads(recipe_.threads);  // the CPU AdamW, in memory or streamed from NVMe
  comm_.set_timeout(recipe_.dist.timeout_s);

  const int64_t rss_before_data = current_rss_bytes();
  data_ = open_dataset(recipe_);
  if (const int64_t after = current_rss_bytes(); rss_before_data >= 0 && after >= 0)
    data_bytes_ = std::max<int64_t>(0, after - rss_before_data);
  assembly_ = assemble(recipe_, world);
  const Assembly& a = assembly_;
  const nn::DecoderConfig& mc = a.model;
  const nn::LoraConfig& lora = a.lora;
  // model.init_from against the model from its headers, before the model is allocated: sizes
  // that disagree with the weights are refused naming the tensor, not after gigabytes.
  if (!recipe_.model.init_from.empty())
    check_weights_fit(recipe_.model.init_from, a.model,
                      fmt::format("{}: model.init_from", recipe_.where("model.init_from")));
  RunEnv env;
  env.init.seed = a.seed;
  if (!recipe_.model.init_from.empty()) {
    env.init.init_from = recipe_.model.init_from;
    env.init.init_from_where = fmt::format("{}: model.init_from", recipe_.where("model.init_from"));
  }
  if (recipe_.lora && !recipe_.lora->adapter.empty()) {
    env.init.adapter = recipe_.lora->adapter;
    env.init.adapter_where = fmt::format("{}: lora.adapter", recipe_.where("lora.adapter"));
    env.init.adapter_targets = recipe_.lora->targets;
  }
  env.offload_link = options_.offload_link;
  if (gpu_comm_) {
    env.device_world = gpu_comm_.get();
    env.make_device_comm = [this](dist::Communicator& host) {
      std::unique_ptr<dist::Communicator> c = dist::make_gpu_communicator(host);
      c->set_timeout(recipe_.dist.timeout_s);
      return c;
    };
  }
  if (!env.init.init_from.empty() && lora.enabled())
    base_sha256_ = ckpt::file_sha256(recipe_.model.init_from);
  if (a.objective && a.objective->objective == objective::Objective::kDpo) {
    // What the values depend on, hashed by rank 0 alone (which reads and writes the cache).
    if (comm_.rank() == 0) reference_key_ = reference_key(env);
    reference_ready_ = read_reference_cache();
    // A reference the training model cannot compute (another directory's weights, or the
    // initial weights of a full fine-tuning run that resumes) is built now, used and freed
    // before the training run is built: the two never hold memory at the same time. Otherwise
    // the training model computes it (finish_reference).
    const bool other_weights =
        !recipe_.objective->reference.empty() || (!lora.enabled() && plan.checkpoint);
    // Full fine-tuning against its initial weights: a resume must name the same ones.
    if (plan.checkpoint && !lora.enabled() && recipe_.objective->reference.empty()) {
      const config::LoadResult saved = config::try_parse_recipe(
          plan.checkpoint->meta().recipe_yaml, plan.checkpoint->dir().string() + " (saved recipe)");
      if (saved.ok() &&
          (saved.recipe.model.init_from != recipe_.model.init_from ||
           (saved.recipe.model.init_from.empty() && saved.recipe.seed != recipe_.seed)))
        usage_error(
            "{}: objective dpo without objective.reference compares with the initial weights "
            "the run started from ({}), but the recipe now says {}: resume with the saved "
            "model.init_from and seed, or set objective.reference to a directory",
            recipe_.where("objective"),
            saved.recipe.model.init_from.empty()
                ? fmt::format("a random init with seed {}", saved.recipe.seed)
                : saved.recipe.model.init_from,
            recipe_.model.init_from.empty()
                ? fmt::format("a random init with seed {}", recipe_.seed)
                : recipe_.model.init_from);
    }
    if (!reference_ready_ && other_weights) {
      RunEnv ref_env = env;
      ref_env.init.adapter.clear();
      if (!recipe_.objective->reference.empty()) {
        ref_env.init.init_from = recipe_.objective->reference;
        ref_env.init.init_from_where =
            fmt::format("{}: objective.reference", recipe_.where("objective.reference"));
      }
      BuiltRun ref = build_run(a, comm_, ref_env);
      ref.strategy->sync();
      ref.model->set_adapters_enabled(false);
      PreferenceHead head(*a.objective);
      reference_pass(*ref.strategy, *ref.model, head);
    }
  }
  BuiltRun run = build_run(a, comm_, env);
  model_ = std::move(run.model);
  strategy_ = std::move(run.strategy);
  node_comm_ = std::move(run.node_comm);
  zero_ = std::move(run.engine);
  if (a.objective) {
    preference_ = std::make_unique<PreferenceHead>(*a.objective);
    preference_->install(*model_);
    if (preference_->uses_reference() && !env.init.adapter.empty() &&
        recipe_.objective->reference.empty() && comm_.rank() == 0)
      log::warn(
          "{}: lora.adapter with DPO: the reference is the base with the adapters off, so "
          "without these adapters too (as TRL's PEFT reference); to compare against the "
          "adapted model, merge them into a base directory first (fdtrain ckpt export RUN "
          "--merge-lora --hf-dir DIR) and train new adapters on it",
          recipe_.where("lora.adapter"));
  }
  if (lora.enabled() && comm_.rank() == 0) {
    const int64_t trainable = lora.num_params(mc);
    log::info(
        "LoRA r={} alpha={} on {} of {} blocks: {} trainable parameters "
        "(sum of r*(in+out) over adapted modules), {:.3f}% of the {} frozen base "
        "parameters{}",
        lora.r, lora.alpha, fmt::join(lora.modules, ", "),
        lora.layers.empty() ? mc.num_layers : int(lora.layers.size()), trainable,
        100.0 * double(trainable) / double(mc.num_params()), mc.num_params(),
        recipe_.model.init_from.empty() ? "; WARNING: no model.init_from, the base is a "
                                          "random init"
                                        : "");
    if (a.quantize)
      log::info(
          "QLoRA: the blocks' base linears in 4 bits ({}, block {}, {}): {} bytes per rank in "
          "their 4-bit form (docs/QUANTIZATION.md)",
          quant::quant_type_name(a.quantize->type), a.quantize->block_size,
          a.quantize->double_quant ? "double quant" : "fp32 absmax",
          frozen_bytes_estimate(/*quantized=*/true));
  }
  if (a.loss_scaler) scaler_ = std::make_unique<precision::DynamicLossScaler>(*a.loss_scaler);
  schedule_ = a.schedule;

  if (plan.checkpoint) {
    const Resumed r =
        load_for_resume(*plan.checkpoint, recipe_, *model_, *zero_, scaler_.get(), base_sha256_);
    start_step_ = r.step;
    skipped_at_start_ = r.skipped_steps;
    resumed_from_ = r.dir;
    if (comm_.rank() == 0) {
      for (const std::string& w : r.warnings) log::warn("{}", w);
      log::info("{}", r.info);
    }
  }

  // Peaks count from here: what the steps hold, not setup's transient buffers
  // (a tensor being read from model.init_from and converted, say). Those go
  // back to the system: the caching allocator would keep them for sizes the
  // steps never ask for (under ZeRO-3 parameter offload, every partition that
  // setup filled before the optimizer's file took them).
  MemoryAccountant::global().reset_peaks();
  cpu_allocator::empty_cache();
  // Batches are assembled on the host (ops copy them to the GPU when the model is there).
  batch_ = make_batch(a, Device::cpu());

  resume_in_place_ = plan.in_place;
  discard_on_start_ = plan.newer;
  if (comm_.rank() == 0) {
    log::info("model: {}, {:.2f}M parameters; {}", mc.summary(), double(mc.num_params()) / 1e6,
              data_.summary());
    log::info("{} rank{} ({} backend), ZeRO stage {}, device {}; run directory: {}", world,
              world == 1 ? "" : "s", model_comm().backend(), recipe_.zero.stage,
              device_scope_ ? cuda_device_name() : std::string("cpu"), run_dir_->path().string());
    if (const std::string layout = strategy_->describe(); !layout.empty()) log::info("{}", layout);
  }
}

void Trainer::start_run_directory(const TrainOptions& options) {
  if (comm_.rank() != 0) return;
  const RunDirectory::Start start = resume_in_place_              ? RunDirectory::Start::kResume
                                    : run_dir_->state().holds_run ? RunDirectory::Start::kReplace
                                                                  : RunDirectory::Start::kFresh;
  run_dir_->begin(start, start_step_);
  if (resume_in_place_)
    for (const std::string& line :
         discard_newer(discard_on_start_, start_step_, run_dir_->path() / "checkpoints"))
      log::warn("{}", line);
  run_dir_->write_config(config::to_yaml(recipe_));
  run_dir_->write_command(options.command_line);
  run_dir_->write_run_info({{"command", options.command_line},
                            {"recipe", options.recipe_path},
                            {"overrides", options.overrides},
                            {"resume", options.resume},
                            {"working_dir", options.working_dir},
                            {"world_size", comm_.size()},
                            {"host", host_name()},
                            {"started_at", started_at_},
                            {"fdtrain_version", version()}});
  events_ = std::make_unique<EventFileWriter>(run_dir_->path());
}

Trainer::~Trainer() {
  dist::set_abort_hook(nullptr);
  if (log_file_open_) log::close_file();
}

void Trainer::request_stop(int signo) { g_stop_requested.store(signo); }
int Trainer::stop_signal() { return g_stop_requested.load(); }

int64_t Trainer::frozen_bytes_estimate(bool quantized) const {
  // Offloaded with the parameters (stage 3): its buffers alone are resident.
  if (zero_->frozen_file_bytes() > 0) return quantized ? 0 : zero_->frozen_resident_bytes();
  int64_t bytes = 0;
  for (const nn::FlatParamGroup* g : model_->frozen_groups())  // a 4-bit segment is bytes (kU8)
    if ((g->dtype() == DType::kU8) == quantized)
      bytes += g->numel() * int64_t(dtype_size(g->dtype()));
  // hpZ: the base's secondary partitions too.
  const zero::ZeroEngine::SecondaryBytes sec = zero_->secondary_partition_bytes();
  return (assembly_.zero.stage >= 3 ? bytes / zero_->world() : bytes) +
         (quantized ? sec.quantized : sec.frozen);
}

std::string Trainer::reference_key(const RunEnv& env) {
  const config::ObjectiveOptions& o = *recipe_.objective;
  std::string weights;
  if (!o.reference.empty()) {
    weights = "directory " + ckpt::file_sha256(o.reference);
    reference_source_ = fmt::format("objective.reference {}", o.reference);
  } else if (!env.init.init_from.empty()) {
    weights =
        "initial " + (base_sha256_.empty() ? ckpt::file_sha256(env.init.init_from) : base_sha256_);
    reference_source_ = assembly_.lora.enabled()
                            ? fmt::format("the base {} with the adapters off", env.init.init_from)
                            : fmt::format("the initial weights {}", env.init.init_from);
  } else {
    weights = fmt::format("random init, seed {}", assembly_.seed);
    reference_source_ = assembly_.lora.enabled()
                            ? std::string("the (randomly initialised) base with the adapters off")
                            : std::string("the (random) initial weights");
  }
  const nlohmann::json what = {
      {"scheme", 1},
      {"data", data_.preference->digest()},
      {"weights", weights},
      {"model", nn::hf_config_json(assembly_.model)},  // every field the forward reads
      {"dtype", std::string(dtype_name(assembly_.dtype))},
      {"quantize",
       assembly_.quantize
           ? fmt::format("{} {} {}", quant::quant_type_name(assembly_.quantize->type),
                         assembly_.quantize->block_size, assembly_.quantize->double_quant)
           : std::string("none")}};
  return engine::reference_key(what);
}

bool Trainer::read_reference_cache() {
  const data::PreferenceDataset& d = *data_.preference;
  const int64_t nt = d.num_pairs(false), nv = d.num_pairs(true);
  double found = 0.0;
  if (comm_.rank() == 0) {
    std::string why;
    const std::filesystem::path path = reference_cache_path(run_dir_->path(), reference_key_);
    if (std::optional<ReferenceLogps> c =
            engine::read_reference_cache(path, reference_key_, nt, nv, &why)) {
      reference_ = std::move(*c);
      found = 1.0;
      log::info("reference log-probs of {} + {} pairs read from {}", nt, nv, path.string());
    } else if (std::filesystem::exists(path)) {
      log::info("reference log-probs in {} not used ({}); computing them", path.string(), why);
    }
  }
  comm_.all_reduce_f64(&found, 1);
  if (found == 0.0) return false;
  // Rank 0's values to every rank (the others add zeros).
  if (comm_.rank() != 0) {
    reference_.train.assign(size_t(2 * nt), 0.0);
    reference_.val.assign(size_t(2 * nv), 0.0);
  }
  if (nt > 0) comm_.all_reduce_f64(reference_.train.data(), 2 * nt);
  if (nv > 0) comm_.all_reduce_f64(reference_.val.data(), 2 * nv);
  return true;
}

void Trainer::reference_pass(Strategy& strategy, nn::Decoder& model, PreferenceHead& head) {
  const auto t0 = std::chrono::steady_clock::now();
  const data::PreferenceDataset& d = *data_.preference;
  const int B = assembly_.micro, T = assembly_.seq_len;
  Batch batch = make_batch(assembly_, Device::cpu());
  head.install(model);
  head.set_mode(PreferenceHead::Mode::kReference);
  for (bool val : {false, true}) {
    std::vector<double>& v = val ? reference_.val : reference_.train;
    v.assign(size_t(2 * d.num_pairs(val)), 0.0);
    head.set_reference(&v);
    const int64_t n = d.reference_batches(val, data_world(), B);
    for (int64_t i = 0; i < n; ++i) {
      // A stop asked for now ends the run here: the pass can be long, and nothing is lost.
      double stop = double(g_stop_requested.load());
      comm_.all_reduce_f64(&stop, 1, dist::ReduceOp::kMax);
      if (stop > 0.0)
        runtime_error(
            "stopped by {} while computing the reference log-probs ({} of {} batches), before "
            "the first step: nothing was trained or saved; run the command again to start",
            signal_name(int(stop)), i, n);
      d.reference_batch(val, i, data_rank(), data_world(), B, T, batch_buffers(batch));
      head.register_batch(batch);
      strategy.eval(batch);
    }
    // Each pair was computed by one rank (its data rank's loss rank); the others hold 0.
    if (!v.empty()) comm_.all_reduce_f64(v.data(), int64_t(v.size()));
  }
  head.set_mode(PreferenceHead::Mode::kTrain);
  head.set_reference(nullptr);
  reference_ready_ = reference_computed_ = true;
  reference_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void Trainer::finish_reference() {
  if (!preference_ || !preference_->uses_reference()) return;
  if (!reference_ready_) {
    // LoRA: the base is the reference, the adapters switched off; full fine-tuning from the
    // start: the weights are still the initial ones.
    model_->set_adapters_enabled(false);
    reference_pass(*strategy_, *model_, *preference_);
    model_->set_adapters_enabled(true);
    // Its buffers are setup's, not the steps' (summary.json's memory counts from here).
    MemoryAccountant::global().reset_peaks();
    cpu_allocator::empty_cache();
  }
  if (comm_.rank() != 0) return;
  const std::filesystem::path path = reference_cache_path(run_dir_->path(), reference_key_);
  if (reference_computed_) {
    const std::string err = write_reference_cache(path, reference_key_, reference_);
    reference_kept_ = err.empty();
    log::info("reference log-probs of {} + {} pairs computed with {} in {:.1f} s{}",
              reference_.train.size() / 2, reference_.val.size() / 2, reference_source_,
              reference_seconds_, reference_kept_ ? ", kept in " + path.string() : "");
    if (!reference_kept_)
      log::warn("the reference log-probs were not kept ({}): a resume will compute them again",
                err);
  } else {
    reference_kept_ = true;  // read from there
  }
}

int64_t Trainer::step_nll_tokens(int64_t step) {
  const int B = assembly_.micro, T = assembly_.seq_len;
  const int accum = assembly_.zero.accumulation;
  double n = 0.0;
  if (strategy_->computes_loss()) {
    for (int m = 0; m < accum; ++m) {
      const data::MicroBatch mb{.step = step,
                                .micro = m,
                                .rank = data_rank(),
                                .world = data_world(),
                                .batch = B,
                                .accumulation = accum};
      data_.source().train_batch(mb, T, batch_buffers(batch_));
      const int32_t* roles = batch_.roles.data<int32_t>();
      for (int64_t i = 0; i < batch_.roles.numel(); ++i)
        n += roles[i] >= 0 && (roles[i] % 4 == 0 || roles[i] % 4 == 2);
    }
  }
  comm_.all_reduce_f64(&n, 1);
  return int64_t(n);
}

void Trainer::save(int64_t steps_done) {
  SaveRequest req;
  req.run_dir = options_.run_dir;
  req.step = steps_done;
  req.keep_last = recipe_.checkpoint.keep_last;
  req.fault = options_.fault;
  ckpt::ShardMeta& m = req.meta;
  m.step = steps_done;
  m.zero_stage = recipe_.zero.stage;
  m.precision = std::string(config::to_string(recipe_.precision));
  m.recipe_yaml = config::to_yaml(recipe_);
  m.optimizer_step = zero_->optimizer_steps();
  m.seed = recipe_.seed;
  m.skipped_steps = skipped_total_;
  m.layout = layout_of(*model_);
  m.fdtrain_version = version();
  m.base_sha256 = base_sha256_;
  if (scaler_) {
    precision::LossScalerState st = scaler_->state();
    m.loss_scaler =
        ckpt::LossScalerState{st.scale, st.iter, st.last_overflow_iter, st.hysteresis_left};
  }
  strategy_->describe_save(req);
  writer_->save(req, *zero_);
}

void Trainer::settle_saves() noexcept {
  if (!writer_ || !writer_->in_flight()) return;
  // Well within the peers' own collective timeout, which would end the job first.
  const double timeout = std::min(recipe_.dist.timeout_s / 2, 60.0);
  if (!writer_->settle(timeout))
    log::write_file_only(log::Level::kWarn,
                         fmt::format("the checkpoint save in flight did not finish within {} s of "
                                     "the failure; it is not committed",
                                     timeout));
}

void Trainer::report_saves(RunReport& report, bool wait, bool exclude) {
  if (!writer_) return;
  const auto t0 = std::chrono::steady_clock::now();
  for (const SavedCheckpoint& s : wait ? writer_->wait() : writer_->poll())
    report.checkpoint_saved(s, writer_->async());
  // Waiting for a save is not training time (throughput).
  if (wait && exclude)
    report.exclude_from_training(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

void Trainer::with_full_model(const std::function<void(const nn::Decoder& model)>& fn) {
  strategy_->with_full_model(fn);
}

Trainer::StepStats Trainer::train_step(int64_t step, Phases& ph) {
  const int B = assembly_.micro, T = assembly_.seq_len;
  const int accum = assembly_.zero.accumulation;
  // Ranks that read distinct data: the mesh's dp axis (every rank that
  // shares a dp coordinate reads the same micro-batches).
  const int world = data_world();
  const int data_rank = this->data_rank();
  const data::BatchSource& source = data_.source();
  // The step's loss is the mean over all its target positions, on every rank and in every
  // micro-batch: micro-batch m's mean is weighted by its share of them (data/batch_source.h),
  // so the gradient does not depend on how the rows are split. Every position of a token
  // stream is a target: the weight is then 1 / (accum * world), exactly as a division.
  const int64_t step_targets = source.train_targets(step, int64_t(B) * world * accum, T);
  if (preference_) {
    // The objective's loss is a mean over the step's pairs (step_targets counts pairs), and
    // its NLL term over the step's chosen NLL tokens.
    objective::StepTotals totals{.pairs = step_targets, .nll_tokens = 0};
    if (preference_->uses_nll()) totals.nll_tokens = step_nll_tokens(step);
    preference_->set_mode(PreferenceHead::Mode::kTrain);
    preference_->set_reference(&reference_.train);
    preference_->set_totals(totals);
  }
  const double scale = scaler_ ? scaler_->scale() : 1.0;  // fp16 scales the loss
  const bool overflow = dist::fault_fires(options_.fault, dist::FaultSpec::kInf, comm_.rank(),
                                          step);  // test hook: this rank's gradients overflow
  PhaseClock clock(options_.profile, model_comm());
  double other = 0.0;  // the loss all-reduce's own time (not a phase of its own)
  MicroFns fns;
  fns.load = [&](int micro, Batch& b) {
    const data::MicroBatch mb{.step = step,
                              .micro = micro,
                              .rank = data_rank,
                              .world = world,
                              .batch = B,
                              .accumulation = accum};
    source.train_batch(mb, T, batch_buffers(b));
    if (preference_) preference_->register_batch(b);
    return count_targets(b);
  };
  fns.grad_seed = [&](int, int64_t targets) {
    float seed = step_targets > 0 ? float(scale * double(targets) / double(step_targets)) : 0.0f;
    if (overflow) seed = std::numeric_limits<float>::infinity();
    return seed;
  };
  // Adapter dropout masks: a function of (seed, step, micro-batch, data rank).
  fns.dropout_seed = [&](int micro) {
    return hash_words(assembly_.seed, uint64_t(step), uint64_t(micro), uint64_t(data_rank));
  };
  fns.new_batch = [&] { return make_batch(assembly_, Device::cpu()); };
  const double loss_sum = strategy_->train(accum, fns, batch_, clock, ph);
  // One small all-reduce carries the loss, which signals asked some rank to stop and, in
  // preference training, the objective's metrics.
  const int sig = g_stop_requested.load();
  PreferenceTally tally = preference_ ? preference_->take_tally() : PreferenceTally();
  double agreed[4 + PreferenceTally::kFields] = {loss_sum, double(sig == SIGTERM),
                                                 double(sig == SIGINT), double(sig == SIGUSR1)};
  std::copy(tally.v, tally.v + PreferenceTally::kFields, agreed + 4);
  comm_.all_reduce_f64(agreed, preference_ ? 4 + PreferenceTally::kFields : 4);
  if (preference_) {
    std::copy(agreed + 4, agreed + 4 + PreferenceTally::kFields, tally.v);
    train_metrics_ = tally.to_json(preference_->options());
  }
  clock.lap(other, ph.comm_wait);
  StepStats st;
  st.loss = step_targets > 0 ? agreed[0] / double(step_targets) : 0.0;
  st.stop_signal = agreed[1] > 0.0   ? SIGTERM
                   : agreed[2] > 0.0 ? SIGINT
                   : agreed[3] > 0.0 ? SIGUSR1
                                     : 0;
  st.grad_norm = 0.0;
  st.skipped = false;
  st.loss_scale = scale;
  // The caller ends the run as diverged, before updating the weights.
  if (!std::isfinite(st.loss) || (recipe_.max_loss > 0 && st.loss > recipe_.max_loss)) return st;
  // A save handed over at the last step boundary copies the state beside this step's forward
  // and backward, which only read it; the update waits for the copy.
  if (writer_) {
    st.save_stall_s = writer_->before_update();
    clock.lap(ph.checkpoint, ph.comm_wait);
  }
  zero::StepResult r = zero_->step(optim::lr_at(schedule_, step), scale);
  strategy_->sync();  // e.g. a pipeline's updated embedding to the tied head's copy
  clock.lap(ph.optimizer, ph.comm_wait);
  st.grad_norm = r.grad_norm;
  st.skipped = r.skipped;
  if (scaler_) {
    // Every rank saw the same norm, so every rank makes the same decision.
    precision::UpdateResult u = scaler_->update(r.skipped);
    st.scale_exhausted = u.fatal;
  }
  return st;
}

double Trainer::evaluate() {
  const data::BatchSource& source = data_.source();
  if (!source.has_val()) return std::nan("");
  if (preference_) return evaluate_pairs();
  const int B = assembly_.micro, T = assembly_.seq_len;
  // The mean over every target position of the evaluation batches (as training weighs them).
  double sums[2] = {0.0, 0.0};  // loss * targets, targets
  for (int i = 0; i < recipe_.logging.eval_batches; ++i) {
    source.val_batch(i, data_rank(), data_world(), B, T, batch_buffers(batch_));
    // Every rank runs every batch (ZeRO-3 gathers are collective), targets or not;
    // the loss is that of the ranks that compute it (a pipeline's last stage).
    const int64_t targets = strategy_->computes_loss() ? count_targets(batch_) : 0;
    const double loss = strategy_->eval(batch_);
    sums[0] += loss * double(targets);
    sums[1] += double(targets);
  }
  comm_.all_reduce_f64(sums, 2);
  return sums[1] > 0.0 ? sums[0] / sums[1] : std::nan("");
}

// Preference training's evaluation: the objective over logging.eval_batches batches of
// validation pairs, normalised over all of them (as a step is over its pairs), with its metrics.
double Trainer::evaluate_pairs() {
  const data::BatchSource& source = data_.source();
  const int B = assembly_.micro, T = assembly_.seq_len;
  const int batches = recipe_.logging.eval_batches;
  // The totals first: pairs and chosen NLL tokens over every rank's batches.
  double totals[2] = {0.0, 0.0};
  if (strategy_->computes_loss()) {
    for (int i = 0; i < batches; ++i) {
      source.val_batch(i, data_rank(), data_world(), B, T, batch_buffers(batch_));
      totals[0] += double(batch_.pairs->count);
      const int32_t* roles = batch_.roles.data<int32_t>();
      for (int64_t k = 0; k < batch_.roles.numel(); ++k)
        totals[1] += roles[k] >= 0 && (roles[k] % 4 == 0 || roles[k] % 4 == 2);
    }
  }
  comm_.all_reduce_f64(totals, 2);
  preference_->set_mode(PreferenceHead::Mode::kEval);
  preference_->set_reference(&reference_.val);
  preference_->set_totals({.pairs = int64_t(totals[0]), .nll_tokens = int64_t(totals[1])});
  for (int i = 0; i < batches; ++i) {
    source.val_batch(i, data_rank(), data_world(), B, T, batch_buffers(batch_));
    preference_->register_batch(batch_);
    strategy_->eval(batch_);
  }
  PreferenceTally tally = preference_->take_tally();
  comm_.all_reduce_f64(tally.v, PreferenceTally::kFields);
  preference_->set_mode(PreferenceHead::Mode::kTrain);
  eval_metrics_ = tally.to_json(preference_->options());
  return tally.loss();
}

// Peak bytes by category: {"max": over ranks, "per_rank": [...]} (collective).
nlohmann::json Trainer::memory_json() {
  const MemoryAccountant& acct = MemoryAccountant::global();
  const int world = comm_.size();
  std::vector<double> mine;
  for (int c = 0; c < kNumMemCategories; ++c) mine.push_back(double(acct.peak(MemCategory(c))));
  mine.push_back(double(acct.peak_total()));
  std::vector<double> all(mine.size() * size_t(world));
  comm_.all_gather_f64(mine.data(), all.data(), int64_t(mine.size()));
  auto row = [&](int r) {
    nlohmann::json m;
    for (int c = 0; c < kNumMemCategories; ++c)
      m[std::string(mem_category_name(MemCategory(c)))] = int64_t(all[r * mine.size() + c]);
    m["total"] = int64_t(all[r * mine.size() + kNumMemCategories]);
    return m;
  };
  nlohmann::json per_rank = nlohmann::json::array();
  nlohmann::json max = row(0);
  for (int r = 0; r < world; ++r) {
    nlohmann::json m = row(r);
    for (auto& [k, v] : m.items()) max[k] = std::max(max[k].get<int64_t>(), v.get<int64_t>());
    per_rank.push_back(m);
  }
  return {{"max", max}, {"per_rank", per_rank}};
}

int64_t Trainer::transient_bytes() const {
  FD_CHECK(assembly_.stages == 1 && assembly_.mesh.size("tp") == 1,
           "transient_bytes of a run whose ranks hold parts of the model");
  return save_buffer_bytes(assembly_, *zero_) + sample_bytes(assembly_, *model_);
}

// summary.json's `process_memory` (docs/RUN_DIR.md): every rank's peak RSS so far and its
// tensors' and data's parts, the largest of each, and the calibrated runtime (collective).
nlohmann::json Trainer::process_json() {
  const int world = comm_.size();
  const double mine[3] = {double(peak_rss_bytes_now()),
                          double(cpu_allocator::peak_reserved_bytes()), double(data_bytes_)};
  std::vector<double> all(3 * size_t(world));
  comm_.all_gather_f64(mine, all.data(), 3);
  nlohmann::json per_rank = nlohmann::json::array();
  int64_t most[3] = {0, 0, 0};
  for (int r = 0; r < world; ++r) {
    const double* v = &all[3 * size_t(r)];
    per_rank.push_back({{"peak_rss_bytes", int64_t(v[0])},
                        {"tensors_bytes", int64_t(v[1])},
                        {"data_bytes", int64_t(v[2])}});
    for (int i = 0; i < 3; ++i) most[i] = std::max(most[i], int64_t(v[i]));
  }
  const RuntimeCalibration cal = read_calibration();
  const std::optional<int64_t> runtime = cal.at(world / std::max(comm_.num_nodes(), 1));
  return {{"peak_rss_bytes", most[0]},
          {"tensors_bytes", most[1]},
          {"data_bytes", most[2]},
          {"runtime_bytes", runtime ? nlohmann::json(*runtime) : nlohmann::json(nullptr)},
          {"per_rank", per_rank}};
}

// Every group's traffic per training step, and of it across nodes: {"nodes", "bytes_per_step",
// "inter_node_bytes_per_step" (the largest over ranks), "per_rank": [[bytes, inter], ...]}
// (collective).
nlohmann::json Trainer::network_json(const RunReport& report, int64_t steps) {
  const int world = comm_.size();
  const double n = double(std::max<int64_t>(steps, 1));
  const double mine[2] = {std::floor(double(report.train_network_bytes()) / n),
                          std::floor(double(report.train_inter_node_bytes()) / n)};
  std::vector<double> all(2 * size_t(world));
  comm_.all_gather_f64(mine, all.data(), 2);
  int64_t most = 0, most_inter = 0;
  nlohmann::json per_rank = nlohmann::json::array();
  for (int r = 0; r < world; ++r) {
    const int64_t b = int64_t(all[2 * size_t(r)]), i = int64_t(all[2 * size_t(r) + 1]);
    most = std::max(most, b);
    most_inter = std::max(most_inter, i);
    per_rank.push_back({b, i});
  }
  return {{"nodes", comm_.num_nodes()},
          {"bytes_per_step", most},
          {"inter_node_bytes_per_step", most_inter},
          {"per_rank", per_rank}};
}

nlohmann::json Trainer::run() {
  const int64_t steps = recipe_.steps;
  const bool rank0 = comm_.rank() == 0;
  // Tokens per step are the dp axis's (ranks that share a dp coordinate work
  // on the same micro-batches); the communication counted here is the
  // engine's group's traffic (a pipeline's summary section has the rest).
  RunReport report(recipe_, rank0, data_world(), start_step_,
                   model_->config().flops_per_token(assembly_.seq_len), zero_->comm(),
                   run_dir_.get(), events_.get(), options_.progress, options_.force_progress,
                   options_.profile);
  if (preference_) report.set_eval_metrics(&eval_metrics_);
  report.set_world(&comm_);
  {
    // Saves behind the step (checkpoint.async) when there are saves between steps to hide;
    // state streamed from a file (ZeRO-Infinity) is saved as it streams, synchronously.
    // Agreed by every rank: the writer's communicator is split collectively.
    double streamed = assembly_.async_checkpoints && !staged_saves(*zero_) ? 1.0 : 0.0;
    comm_.all_reduce_f64(&streamed, 1);
    const bool async = assembly_.async_checkpoints && streamed == 0.0;
    writer_ = std::make_unique<CheckpointWriter>(comm_, *zero_, async);
    if (rank0 && async)
      log::info("checkpoints are written behind the step: {} per rank staged in memory",
                format_bytes(double(writer_->staging_bytes())));
  }
  double loss = std::nan(""), grad_norm = 0.0;
  std::string status = "completed", exit_reason = "completed";
  int stop_signal = 0;  // the signal that stopped the run, agreed by all ranks
  std::string fatal_message;
  int64_t done = start_step_;
  skipped_total_ = skipped_at_start_;
  for (int64_t step = start_step_; step < steps; ++step) {
    current_step_ = step;
    report.begin_step();
    dist::inject_fault(options_.fault, comm_.rank(), step);
    const float lr = optim::lr_at(schedule_, step);
    StepStats st = train_step(step, report.phases());
    report.end_train_step();
    report.add_save_stall(st.save_stall_s);
    loss = st.loss;
    grad_norm = st.grad_norm;
    if (!std::isfinite(loss) || (recipe_.max_loss > 0 && loss > recipe_.max_loss)) {
      status = "diverged";
      exit_reason = std::isfinite(loss) ? "loss_above_max" : "diverged";
      break;
    }
    if (st.scale_exhausted) {
      status = "diverged";
      exit_reason = "loss_scale_at_minimum";
      fatal_message = fmt::format(
          "step {}: the gradients overflowed with the loss scale already at its minimum "
          "(loss_scale.min_loss_scale = {}): {}. The run is diverging in fp16; lower "
          "optimizer.lr, or use precision: bf16",
          step + 1, recipe_.loss_scale.min_loss_scale, precision::DynamicLossScaler::kFatalMessage);
      break;
    }
    done = step + 1;
    steps_done_ = done;
    if (st.skipped) {
      ++skipped_total_;
      if (rank0)
        log::warn("step {} skipped: non-finite gradients (global norm {}); no update made{}", done,
                  grad_norm,
                  scaler_ ? fmt::format("; loss scale {} -> {}", st.loss_scale, scaler_->scale())
                          : std::string());
    }
    StepRecord rec;
    rec.loss = loss;
    rec.lr = lr;
    rec.grad_norm = grad_norm;
    rec.skipped = st.skipped;
    rec.skipped_total = skipped_total_;
    if (scaler_) rec.loss_scale = scaler_->scale();
    if (preference_) rec.metrics = train_metrics_;
    report.step_done(done, rec, [this] { return evaluate(); });
    // Saved: every N steps, and at the end (the last step, or a stop asked
    // for by a signal) unless checkpoint.at_end is off; with every > 0 and
    // at_end off, a signal still saves (as it always has).
    const bool enabled = recipe_.checkpoint.every > 0 || recipe_.checkpoint.at_end;
    const bool at_end = done == steps || st.stop_signal != 0;
    const bool save_now = (recipe_.checkpoint.every > 0 && done % recipe_.checkpoint.every == 0) ||
                          (at_end && recipe_.checkpoint.at_end) || (st.stop_signal != 0 && enabled);
    if (save_now) {
      report.begin_checkpoint();
      PhaseClock clock(options_.profile, model_comm());
      save(done);
      // A stop waits for its save (and the one before it), inside the save's own time.
      if (st.stop_signal != 0) report_saves(report, /*wait=*/true, /*exclude=*/false);
      clock.lap(report.phases().checkpoint, report.phases().comm_wait);
      report.end_checkpoint();
    }
    // The saves committed behind the steps so far (a failed one ends the run here).
    report_saves(report, /*wait=*/false);
    report.end_step(step);
    if (st.stop_signal != 0) {
      status = "interrupted";
      exit_reason = "signal";
      stop_signal = st.stop_signal;
      if (rank0)
        log::info("stopping after step {} as asked ({}){}", done, signal_name(stop_signal),
                  save_now
                      ? fmt::format("; resume with --resume auto --run-dir {}", options_.run_dir)
                      : std::string("; no checkpoint saved (checkpoints are off)"));
      break;
    }
  }
  if (done == start_step_ && start_step_ == steps) {
    // Resumed at the last step (a run killed after its final save): nothing
    // trained, so the summary takes the last logged loss and measures the
    // validation loss once (collective: the same on every rank).
    if (rank0 && run_dir_->last_metrics()) {
      const nlohmann::json& m = *run_dir_->last_metrics();
      if (m.contains("loss") && m["loss"].is_number()) loss = m["loss"].get<double>();
    }
    report.set_eval_loss(evaluate());
  }
  // The summary names only committed checkpoints: the last save is waited for.
  report_saves(report, /*wait=*/true);
  report.finish_loop();
  return finish(report, {status, exit_reason, stop_signal, fatal_message, loss, done});
}

nlohmann::json Trainer::finish(RunReport& report, const Ending& end) {
  const bool rank0 = comm_.rank() == 0;
  const std::string& status = end.status;
  const std::string& exit_reason = end.exit_reason;
  const double loss = end.loss;
  const int64_t done = end.done;
  std::string digest;
  with_full_model([&](const nn::Decoder& m) { digest = weights_sha256(m); });
  // Rank 0's engine (over its group, whose size pads it: under a pipeline the
  // first stage's segments over its replicas, not the whole world).
  const int64_t P = zero_->padded_params();
  zero::ModelStateBytes est =
      zero::model_state_bytes(assembly_.zero.stage, zero_->world(), assembly_.zero.accumulation, P,
                              int(dtype_size(assembly_.dtype)),
                              zero_->optimizer_offloaded() ? zero_->optimizer_state_bytes() : -1,
                              zero_->params_offloaded() ? zero_->params_staging_bytes() : -1);
  // hpZ's secondary partitions are parameters held too (docs/ZERO.md, ZeRO++).
  est.params += zero_->secondary_partition_bytes().params;
  nlohmann::json memory = memory_json();
  const nlohmann::json network = network_json(report, done - start_step_);
  {
    // Each rank's own account, for its log (rank 0's terminal has the summary).
    const MemoryAccountant& acct = MemoryAccountant::global();
    std::string parts;
    for (int c = 0; c < kNumMemCategories; ++c)
      if (acct.peak(MemCategory(c)) > 0)
        parts +=
            fmt::format("{}{} {}", parts.empty() ? "" : ", ", mem_category_name(MemCategory(c)),
                        format_bytes(double(acct.peak(MemCategory(c)))));
    const int64_t ran = done - start_step_;
    const std::string line =
        fmt::format("rank {}: {} steps; peak memory {} ({}); communication wait {:.3f} s per step",
                    comm_.rank(), ran, format_bytes(double(acct.peak_total())), parts,
                    ran > 0 ? report.train_wait_s() / double(ran) : 0.0);
    if (rank0)
      log::write_file_only(log::Level::kInfo, line);
    else
      log::info("{}", line);  // the log file only: other ranks show warnings and errors alone
  }
  const double eval_loss = report.eval_loss();
  nlohmann::json summary = summary_head(status, exit_reason, done);
  summary["signal"] =
      end.signal != 0 ? nlohmann::json(signal_name(end.signal)) : nlohmann::json(nullptr);
  report.add_to_summary(summary, done);
  summary.update({
      {"final_loss", number_or_null(loss)},
      {"eval_loss", number_or_null(eval_loss)},
      {"world_size", comm_.size()},
      {"precision", std::string(config::to_string(recipe_.precision))},
      {"zero_stage", recipe_.zero.stage},
      {"skipped_steps", skipped_total_},
      {"loss_scale", scaler_ ? nlohmann::json(scaler_->scale()) : nlohmann::json(nullptr)},
      {"num_params", model_->parameter_count()},
      {"frozen_params", recipe_.lora ? model_->config().num_params() : 0},
      {"frozen_bytes_estimate", frozen_bytes_estimate(false)},
      {"quantized_base_bytes", frozen_bytes_estimate(true)},
      {"padded_params", P},
      {"data", data_.stats_json()},
      {"weights_sha256", digest},
      {"memory", memory["max"]},
      {"memory_per_rank", memory["per_rank"]},
      {"network", network},
      {"offload",
       {{"optimizer", std::string(config::to_string(recipe_.zero.offload_optimizer.device))},
        {"optimizer_file_bytes", zero_->offload_file_bytes()},
        {"optimizer_host_bytes", zero_->offload_host_bytes()},
        {"optimizer_pinned_bytes", zero_->offload_pinned_bytes()},
        {"optimizer_buffer_bytes",
         zero_->optimizer_offloaded() ? zero_->optimizer_state_bytes() : 0},
        {"params", std::string(config::to_string(recipe_.zero.offload_params.device))},
        {"params_staging_bytes", zero_->params_offloaded() ? zero_->params_staging_bytes() : 0},
        {"frozen_file_bytes", zero_->frozen_file_bytes()}}},
      {"model_state_bytes_estimate",
       {{"params", est.params},
        {"grads", est.grads},
        {"master", est.master},
        {"optimizer", est.optimizer},
        {"total", est.total()}}},
  });
  // The head + loss's chunk plan (the last training step's; null where rank 0 runs no head).
  summary["head_plan"] = head_plan_json(model_->head_plan());
  // GPU runs: which kernels ran (rank 0's process): the device check proves its paths with it.
  if (recipe_.device == config::DeviceName::kCuda) {
    const CudaAttentionLaunches a = cuda_attention_launches();
    summary["gpu"] = {{"device", cuda_device_name()},
                      {"attention_launches",
                       {{"forward_tensor_cores", a.forward_tensor_cores},
                        {"forward_simt", a.forward_simt},
                        {"backward_tensor_cores", a.backward_tensor_cores},
                        {"backward_simt", a.backward_simt}}},
                      {"graph_capture", false}};
  } else {
    summary["gpu"] = nullptr;
  }
  if (status == "completed") {
    const SampleOptions so = sample_options(recipe_);
    // Every rank generates (identical weights, identical sampling), so that
    // stage 3's parameter gathers stay collective.
    report.add_sample(summary, options_.print_sample, [&](const std::vector<int32_t>& prompt) {
      std::vector<int32_t> out;
      with_full_model([&](const nn::Decoder& m) {
        autograd::NoGradGuard no_grad;
        out = generate(m, prompt, so);  // the decoder reads GPU weights into host fp32
      });
      return out;
    });
  }
  report.add_profile(summary);
  strategy_->add_to_summary(summary);
  if (preference_) {
    const config::ObjectiveOptions& o = *recipe_.objective;
    nlohmann::json reference = nullptr;
    if (preference_->uses_reference())
      reference = {{"source", reference_source_},
                   {"computed", reference_computed_},
                   {"seconds", reference_seconds_},
                   {"cache", rank0 && reference_kept_ ? nlohmann::json(reference_cache_path(
                                                            run_dir_->path(), reference_key_))
                                                      : nlohmann::json(nullptr)},
                   {"key", reference_key_}};
    summary["objective"] = {
        {"name", std::string(config::to_string(o.name))},
        {"loss_type", o.name == config::ObjectiveName::kDpo
                          ? nlohmann::json(std::string(config::to_string(o.loss_type)))
                          : nlohmann::json(nullptr)},
        {"beta", o.beta},
        {"train", train_metrics_.is_null() ? nlohmann::json(nullptr) : train_metrics_},
        {"eval", eval_metrics_.is_null() ? nlohmann::json(nullptr) : eval_metrics_},
        {"reference", reference}};
  }
  if (!end.message.empty()) summary["error"] = end.message;
  if (exit_reason == "diverged" || exit_reason == "loss_above_max") {
    summary["error"] = fmt::format(
        "the loss became {} at step {}{}; the run stopped before updating the weights{}. Lower "
        "optimizer.lr, raise schedule.warmup_steps or set optimizer.grad_clip",
        loss, done + 1,
        exit_reason == "loss_above_max"
            ? fmt::format(", above max_loss = {} (set max_loss=0 to train on)", recipe_.max_loss)
            : std::string(),
        rank0 ? fmt::format(" (summary in {})", run_dir_->path().string()) : std::string());
  }
  cpu_allocator::empty_cache();                  // generation allocates one size per context length
  summary["peak_rss_bytes"] = peak_rss_bytes();  // rank 0's process
  summary["process_memory"] = process_json();
  if (rank0) run_dir_->write_summary(summary);
  failure_recorded_ = true;  // the run's own summary stands
  if (status != "completed") return summary;
  if (rank0) {
    log::info(
        "done: {} steps in {:.1f} s | final loss {:.4f} | eval loss {} | {:.0f} tok/s | "
        "weights {}",
        done, report.elapsed_s(), loss,
        std::isfinite(eval_loss) ? fmt::format("{:.4f}", eval_loss) : std::string("n/a"),
        report.tokens_per_s(), digest.substr(0, 16));
  }
  return summary;
}

}  // namespace fd::engine
