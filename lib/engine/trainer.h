// Trainer: builds a training run from a Recipe and runs it to the end.
//
// Assembles the dataset, sampler, model, optimizer and schedule the recipe
// describes, trains for recipe.steps optimizer steps, and leaves a run
// directory (run_dir.h) with config.yaml, command.txt, metrics.jsonl and
// summary.json. User-caused problems (bad data files, a batch that does not
// fit the world size, an existing run) throw fd::Error before any training;
// a diverging run (non-finite loss) throws a runtime fd::Error after writing
// a summary with exit_reason "diverged".
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lib/config/recipe.h"
#include "lib/optim/schedule.h"
#include "lib/tensor/tensor.h"

namespace fd::data {
class TokenDataset;
class Sampler;
}  // namespace fd::data
namespace fd::nn {
class Gpt;
}
namespace fd::optim {
class AdamW;
}

namespace fd::engine {

class RunDirectory;

struct TrainOptions {
  std::string recipe_path;             // as given on the command line
  std::vector<std::string> overrides;  // key.path=value / ~key.path, as given
  std::string run_dir;                 // where config.yaml, metrics.jsonl, summary.json go
  bool overwrite = false;              // replace a run already in run_dir
  bool progress = true;                // progress line when stderr is a terminal
  bool print_sample = true;            // print the generated sample to stdout at the end
  std::string command_line;            // recorded in command.txt and summary.json
};

class Trainer {
 public:
  // Validates what the recipe alone cannot (world size, data files) and
  // builds every component; creates the run directory.
  Trainer(const config::Recipe& recipe, const TrainOptions& options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Trains for recipe.steps steps; returns the summary written to summary.json.
  nlohmann::json run();

  const nn::Gpt& model() const { return *model_; }

 private:
  double train_step(int64_t step);  // returns the step's mean loss
  double evaluate();                // mean validation loss (NaN when there is no split)
  nlohmann::json memory_json() const;

  config::Recipe recipe_;
  TrainOptions options_;
  int world_size_ = 1;
  std::unique_ptr<data::TokenDataset> dataset_;
  std::unique_ptr<data::Sampler> sampler_;
  std::unique_ptr<nn::Gpt> model_;
  std::unique_ptr<optim::AdamW> optimizer_;
  std::unique_ptr<RunDirectory> run_dir_;
  Tensor tokens_;   // (micro, seq_len) i32, reused every micro-batch
  Tensor targets_;  // (micro, seq_len) i32
  optim::ScheduleOptions schedule_;
  double last_grad_norm_ = 0.0;
};

}  // namespace fd::engine
