// A training run for the multi-rank tests (zero_test, zeropp_test): a Trainer over the given
// communicator, in a run directory of this process's own (only rank 0 of a trainer writes one),
// removed afterwards; what it returns is the run's summary and every parameter of the whole
// model in canonical order (gathered, on every rank).
#pragma once

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "lib/engine/trainer.h"
#include "lib/nn/decoder.h"

namespace fd::mpi_testing {

// A private directory for this process's run `name` (not created).
inline std::string private_run_dir(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("fd_mpi_test_" + name + "_" + std::to_string(::getpid())))
      .string();
}

struct TrainResult {
  nlohmann::json summary;
  std::vector<float> weights;  // every parameter in canonical order
};

inline TrainResult train_run(const config::Recipe& r, dist::Communicator& comm,
                             const std::string& name,
                             std::shared_ptr<HostLink> offload_link = nullptr) {
  engine::TrainOptions o;
  o.offload_link = std::move(offload_link);
  o.run_dir = private_run_dir(name);
  o.overwrite = true;
  o.progress = false;
  o.print_sample = false;
  engine::Trainer t(r, o, comm);
  TrainResult res;
  res.summary = t.run();
  t.with_full_model([&](const nn::Decoder& m) {
    for (const nn::Parameter* p : m.parameters()) {
      std::vector<float> v = p->value.to_vector();
      res.weights.insert(res.weights.end(), v.begin(), v.end());
    }
  });
  std::error_code ec;
  std::filesystem::remove_all(o.run_dir, ec);
  return res;
}

}  // namespace fd::mpi_testing
