// DataParallel: the Strategy (strategy.h) of a run without a pipeline. Every
// rank holds every segment and runs the whole model on its own micro-batches,
// one at a time; the ZeroEngine partitions the model over the world (ZeRO
// stages 0-3), on the GPU over the world's device communicator.
#pragma once

#include "lib/engine/strategy.h"

namespace fd::engine {

class DataParallel final : public Strategy {
 public:
  // `world` must outlive the strategy.
  explicit DataParallel(dist::Communicator& world) : comm_(&world) {}

  bool holds(int) const override { return true; }
  void use_device_comms(const MakeComm&, dist::Communicator& device_world) override {
    comm_ = &device_world;
  }
  nn::Module& engine_module(nn::Decoder& model) override { return model; }
  dist::Communicator& engine_comm() override { return *comm_; }
  zero::ZeroConfig engine_config(zero::ZeroConfig config) const override { return config; }
  void attach(nn::Decoder& model, zero::ZeroEngine& engine, const nn::ParamFill&) override {
    model_ = &model;
    engine_ = &engine;
  }

  void sync() override {}  // one copy of every weight
  // Micro-batch after micro-batch through `batch`: load (phase data),
  // forward (forward), backward with the engine's hooks (backward).
  double train(int micro_batches, const MicroFns& fns, Batch& batch, PhaseClock& clock,
               Phases& phases) override;
  bool computes_loss() const override { return true; }
  double eval(const Batch& batch) override;
  void with_full_parameters(const std::function<void()>& fn) override;

  std::string describe() const override { return {}; }
  void describe_save(SaveRequest&) const override {}
  void add_to_summary(nlohmann::json&) override {}
  int64_t p2p_bytes() const override { return 0; }

 private:
  dist::Communicator* comm_;  // the engine's: the world, or its device communicator
  nn::Decoder* model_ = nullptr;
  zero::ZeroEngine* engine_ = nullptr;
};

}  // namespace fd::engine
