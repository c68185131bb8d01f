// fdtrain train RECIPE [overrides...] [--run-dir DIR] [--overwrite] [--resume auto|DIR]
//               [--no-progress] [--progress] [--profile]
// fdtrain RECIPE ...                       (shorthand for train)
// fdtrain calibrate                        (also under mpirun -n N)
//
// calibrate measures the runtime part of a rank's memory on this host for this build
// (lib/engine/process_memory.h): it trains a small recipe for real in a temporary directory and
// records the ranks' peak RSS less their tensors and data beside the binary; `make` runs it at
// 1, 2 and 4 ranks, and `fdtrain estimate` adds it to its prediction of peak RSS.
//
// Trains on every rank of the job (mpirun -n N fdtrain train ...): joins the
// job (lib/engine/process.h), builds the run (engine::Trainer) and turns how
// it ended into the exit code: 0, or 128 + SIGTERM / SIGINT when a signal
// stopped it (a checkpoint is saved first), 1 for a failure. Setup errors are
// agreed by every rank and end the job cleanly; a failure while training is
// local to one rank and takes the whole job down (Communicator::abort), or its
// peers would wait for it forever.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "apps/fdtrain/subcommand.h"
#include "lib/base/error.h"
#include "lib/base/log.h"
#include "lib/engine/process.h"
#include "lib/engine/process_memory.h"
#include "lib/engine/trainer.h"
#include "lib/tensor/storage.h"

namespace fd::cli {
namespace {

struct TrainArgs {
  std::string recipe;
  std::vector<std::string> overrides;
  std::string run_dir;
  bool overwrite = false;
  bool no_progress = false;
  bool force_progress = false;
  std::string resume;
  bool profile = false;
  int* argc = nullptr;  // main's, for the command line and MPI's initialisation
  char*** argv = nullptr;
};

// A stop request for the trainer (Trainer::request_stop). A second SIGINT or
// SIGTERM while the first is pending means "now": the default action.
void on_stop_signal(int signo) {
  if ((signo == SIGINT || signo == SIGTERM) && engine::Trainer::stop_signal() == signo) {
    std::signal(signo, SIG_DFL);
    std::raise(signo);
    return;
  }
  engine::Trainer::request_stop(signo);
  if (signo == SIGINT) {
    static const char kMsg[] =
        "\nfdtrain: stopping at the next step boundary (a checkpoint is saved); press Ctrl-C "
        "again to stop at once\n";
    ssize_t n = write(STDERR_FILENO, kMsg, sizeof kMsg - 1);
    (void)n;
  }
}

// SIGUSR1 (mpirun forwards it to every rank), SIGTERM (a scheduler's
// preemption: Slurm, Kubernetes) and SIGINT (Ctrl-C): checkpoint at the next
// step boundary and end with status "interrupted" (exit 0, 143, 130). A
// second SIGINT or SIGTERM ends the process at once.
void install_stop_handlers() {
  struct sigaction sa = {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int s : {SIGUSR1, SIGTERM, SIGINT}) sigaction(s, &sa, nullptr);
}

std::string join_command_line(int argc, char** argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    bool plain = a.find_first_of(" \t\"'$`\\") == std::string::npos && !a.empty();
    s += (i ? " " : "") + (plain ? a : "'" + a + "'");
  }
  return s;
}

engine::TrainOptions train_options(const TrainArgs& a) {
  engine::TrainOptions options;
  options.recipe_path = a.recipe;
  options.overrides = a.overrides;
  options.run_dir =
      a.run_dir.empty()
          ? (std::filesystem::path("runs") / std::filesystem::path(a.recipe).stem()).string()
          : a.run_dir;
  options.overwrite = a.overwrite;
  options.progress = !a.no_progress;
  options.force_progress = a.force_progress;
  options.command_line = join_command_line(*a.argc, *a.argv);
  options.fault = engine::injected_fault();
  options.resume = a.resume;
  options.profile = a.profile;
  return options;
}

// The exit code of a run that ended: 1 when it failed (rank 0 prints why),
// 128 + the signal when SIGTERM or SIGINT interrupted it, else 0.
int exit_code(const nlohmann::json& summary, const dist::Communicator& comm) {
  if (summary.contains("error")) {
    if (comm.rank() == 0) print_error(summary["error"].get<std::string>());
    return 1;
  }
  if (summary["status"] != "interrupted") return 0;
  return summary["signal"] == "SIGTERM"  ? 128 + SIGTERM
         : summary["signal"] == "SIGINT" ? 128 + SIGINT
                                         : 0;
}

// Runs the loop; a failure on one rank of several aborts the job (its peers
// would otherwise wait for it forever); with one rank it is rethrown for main.
int train_loop(engine::Trainer& trainer, dist::Communicator& comm) {
  try {
    return exit_code(trainer.run(), comm);
  } catch (const std::exception& e) {
    const bool oom = dynamic_cast<const std::bad_alloc*>(&e) != nullptr;
    const std::string what =
        oom ? std::string("out of memory; lower batch.micro, data.seq_len or the model size")
            : std::string(e.what());
    // A checkpoint staged before the failure is committed first, as a synchronous save would
    // have been (the ranks' writer threads need no training loop to commit it). The error is
    // said first: a peer's collective timeout may end the job while the save finishes.
    const std::string failed =
        fmt::format("rank {} failed at step {}: {}", comm.rank(), trainer.current_step() + 1, what);
    if (trainer.save_in_flight() && comm.size() > 1) {
      std::fprintf(stderr, "fdtrain: error: %s (letting the checkpoint save in flight finish)\n",
                   failed.c_str());
      log::write_file_only(log::Level::kError, failed);
    }
    trainer.settle_saves();
    if (comm.size() == 1) {
      // Into the log file while it is open (main() prints the message);
      // with more ranks, abort() logs it.
      log::write_file_only(log::Level::kError, what);
      trainer.record_failure(what);
      throw;
    }
    const auto* fe = dynamic_cast<const Error*>(&e);
    // abort() records the failure in summary.json (the trainer's abort hook).
    comm.abort(fe ? fe->exit_code() : 1, failed);
  }
  return 1;  // not reached: abort() ends the process
}

int run_train(const TrainArgs& a) {
  config::LoadResult loaded = load_recipe(a.recipe, a.overrides);
  const config::Recipe& r = loaded.recipe;
  const engine::TrainOptions options = train_options(a);
  install_stop_handlers();

  std::unique_ptr<dist::Communicator> comm = engine::join_job(a.argc, a.argv, r.dist.timeout_s);
  if (comm->rank() != 0) log::set_rank(comm->rank());
  if (comm->rank() == 0) print_warnings(loaded.warnings);
  int code = 0;
  {
    // Setup errors are agreed by every rank (Trainer's constructor).
    engine::Trainer trainer(r, options, *comm);
    if (trainer.finished()) {
      // A resume of a run whose checkpoint is at its last step: nothing to do.
      if (comm->rank() == 0) std::printf("%s\n", trainer.finished_message().c_str());
    } else {
      code = train_loop(trainer, *comm);
    }
  }
  comm.reset();
  engine::leave_job();
  return code;
}

// fdtrain calibrate: see the top of this file.
int run_calibrate(int* argc, char*** argv) {
  std::unique_ptr<dist::Communicator> comm = engine::join_job(argc, argv, 600.0);
  if (comm->rank() != 0) log::set_rank(comm->rank());
  if (comm->num_nodes() > 1)
    comm->abort(2,
                "fdtrain calibrate measures one host: start it on one host (mpirun -n 2, -n 4 "
                "there), and on each kind of host you train on");
  // Rank 0 makes the temporary directory and its data file; every rank learns its name.
  char dir[256] = {};
  if (comm->rank() == 0) {
    std::string templ =
        (std::filesystem::temp_directory_path() / "fdtrain-calibrate-XXXXXX").string();
    if (templ.size() >= sizeof dir || mkdtemp(templ.data()) == nullptr)
      comm->abort(1, "fdtrain calibrate: cannot make a temporary directory under " +
                         std::filesystem::temp_directory_path().string());
    std::snprintf(dir, sizeof dir, "%s", templ.c_str());
    // A text of ~200 KB: words from a fixed generator, so every calibration reads the same.
    std::ofstream text(std::string(dir) + "/text.txt");
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 40000; ++i) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      text << "the quick brown fox jumps over a lazy dog "[x % 41]
           << ((x >> 8) % 9 == 0 ? " " : "");
      if (i % 60 == 59) text << "\n";
    }
  }
  comm->broadcast(dir, sizeof dir, DType::kU8, 0);
  const std::string root = dir;
  const std::string yaml = engine::calibration_recipe_yaml(root + "/text.txt");
  config::LoadResult loaded = config::try_parse_recipe(yaml, root + "/calibrate.yaml");
  FD_CHECK(loaded.ok(), "the calibration recipe is invalid: {}", loaded.errors.front());
  engine::TrainOptions options;
  options.recipe_path = root + "/calibrate.yaml";
  options.run_dir = root + "/run";
  options.progress = false;
  options.print_sample = false;
  options.command_line = "fdtrain calibrate";
  // The log level back, and rank 0's temporary directory gone, however this ends.
  struct Restore {
    log::Level level = log::level();
    std::string root;
    bool rank0;
    ~Restore() {
      log::set_level(level);
      std::error_code ec;
      if (rank0) std::filesystem::remove_all(root, ec);
    }
  } restore{log::level(), root, comm->rank() == 0};
  log::set_level(log::Level::kWarn);
  int64_t data_bytes = 0, transient = 0;
  int rc = 0;
  {
    // A failure on one rank ends the job (train_loop aborts), as in `fdtrain train`.
    engine::Trainer trainer(loaded.recipe, options, *comm);
    rc = train_loop(trainer, *comm);
    if (rc == 0) {
      data_bytes = trainer.data_bytes();
      transient = trainer.transient_bytes();
    }
  }
  if (rc != 0) {
    comm.reset();
    engine::leave_job();
    return rc;
  }
  log::set_level(restore.level);
  const int64_t peak = engine::peak_rss_bytes_now();
  const int64_t tensors = int64_t(cpu_allocator::peak_reserved_bytes());
  double mine[4] = {double(peak - tensors - data_bytes - transient), double(peak), double(tensors),
                    double(data_bytes + transient)};
  std::vector<double> all(4 * size_t(comm->size()));
  comm->all_gather_f64(mine, all.data(), 4);
  int worst = 0;
  for (int r = 1; r < comm->size(); ++r)
    if (all[4 * size_t(r)] > all[4 * size_t(worst)]) worst = r;
  const int per_host = comm->size() / std::max(comm->num_nodes(), 1);
  int code = 0;
  if (comm->rank() == 0) {
    const double* w = &all[4 * size_t(worst)];
    try {
      engine::write_calibration(per_host, int64_t(w[0]));
      std::printf(
          "fdtrain calibrate: %d rank%s per host: runtime %.1f MiB (rank %d: peak RSS %.1f MiB, "
          "tensors %.1f MiB, data, save buffers and sample %.1f MiB); recorded in %s\n",
          per_host, per_host == 1 ? "" : "s", w[0] / 1048576.0, worst, w[1] / 1048576.0,
          w[2] / 1048576.0, w[3] / 1048576.0, engine::calibration_path().c_str());
    } catch (const Error& e) {
      print_error(e.what());
      code = 1;
    }
  }
  comm->barrier();
  comm.reset();
  engine::leave_job();
  return code;
}

}  // namespace

void add_train_command(CLI::App& app, std::vector<Subcommand>* out, int* argc, char*** argv) {
  auto a = std::make_shared<TrainArgs>();
  a->argc = argc;
  a->argv = argv;
  CLI::App* train = app.add_subcommand("train", "train a model from a recipe");
  add_recipe_args(train, &a->recipe, &a->overrides);
  train->add_option("--run-dir", a->run_dir, "run directory (default: runs/<recipe name>)");
  train->add_flag("--overwrite", a->overwrite, "replace a run already in the run directory");
  train->add_flag("--no-progress", a->no_progress, "no progress line on the terminal");
  train->add_option("--resume", a->resume,
                    "resume: 'auto' (from RUN/checkpoints/latest if present, else start fresh) or "
                    "a checkpoint directory");
  train->add_flag("--profile", a->profile,
                  "per-phase wall-time breakdown (data, forward, backward, communication wait, "
                  "optimizer, checkpoint) in the log and summary.json");
  train->add_flag("--progress", a->force_progress,
                  "show the progress line even when stderr is not a terminal (e.g. under mpirun)");
  out->push_back({train, [a] { return run_train(*a); }});
  CLI::App* calibrate = app.add_subcommand(
      "calibrate",
      "measure this build's runtime memory on this host (per rank; run it under mpirun -n N too) "
      "for fdtrain estimate's peak-RSS prediction");
  out->push_back({calibrate, [a] { return run_calibrate(a->argc, a->argv); }});
}

}  // namespace fd::cli
