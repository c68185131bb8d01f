// DataParallel: the Strategy (strategy.h) of a run without a pipeline. Every
// rank holds every segment and runs the whole model on its own micro-batches,
// one at a time; the ZeroEngine partitions the model over the world (ZeRO
// stages 0-3), on the GPU over the world's device communicator.
//
// With tensor parallelism (the mesh's tp axis, size T > 1) each segment is
// sliced over a tp group (nn::TensorParallel), whose T ranks run one replica's
// micro-batches together; the ZeroEngine partitions each rank's slices over
// its dp group (the ranks holding the same slices), ZeRO stages 0-3 alike. The
// global gradient norm counts each split parameter's slices once per tp rank
// and each whole parameter once (tp rank 0's, identical on every rank); the
// loss is tp rank 0's.
//
// With Ulysses sequence parallelism (the mesh's sp axis, size S > 1) the S
// ranks of an sp group share a micro-batch, each computing its slice of every
// sequence (nn::SequenceParallel); every parameter is whole with a partial
// gradient, so the ZeroEngine works over the dp x sp group (as DeepSpeed's
// sequence-data-parallel group), whose reduction sums them. A rank's loss is
// its share of the micro-batch's: train() returns every sp rank's (they add up
// in the trainer's all-reduce); eval() sums them over the sp group and counts
// the result on sp rank 0.
#pragma once

#include "lib/engine/strategy.h"

namespace fd::engine {

class DataParallel final : public Strategy {
 public:
  // `world` must outlive the strategy. `mesh`: {dp}, {pp: 1, dp}, or with a
  // tp axis; collective over `world` when it has one (its groups are split).
  // `sequence_parallel`: Megatron's sequence parallelism over the tp group (nn::TensorParallel).
  DataParallel(const dist::Mesh& mesh, dist::Communicator& world, bool sequence_parallel = false);

  bool holds(int) const override { return true; }
  nn::TensorParallel tensor_parallel() const override;
  nn::SequenceParallel sequence_parallel() const override;
  void use_device_comms(const MakeComm&, dist::Communicator& device_world) override;
  nn::Module& engine_module(nn::Decoder& model) override { return model; }
  dist::Communicator& engine_comm() override { return *comm_; }
  zero::ZeroConfig engine_config(zero::ZeroConfig config) const override;
  void attach(nn::Decoder& model, zero::ZeroEngine& engine, const nn::ParamFill&) override;

  void sync() override {}  // one copy of every weight
  // Micro-batch after micro-batch through `batch`: load (phase data),
  // forward (forward), backward with the engine's hooks (backward).
  double train(int micro_batches, const MicroFns& fns, Batch& batch, PhaseClock& clock,
               Phases& phases) override;
  bool computes_loss() const override { return tp_rank_ == 0 && sp_rank_ == 0; }
  double eval(const Batch& batch) override;
  void with_full_model(const std::function<void(const nn::Decoder& model)>& fn) override;

  std::string describe() const override;
  void describe_save(SaveRequest& request) const override;
  void add_to_summary(nlohmann::json& summary) override;
  int64_t p2p_bytes() const override { return 0; }
  int64_t tensor_bytes() const override { return tp_ ? tp_->bytes_sent() : 0; }
  int64_t sequence_bytes() const override { return sp_ ? sp_->bytes_sent() : 0; }

 private:
  dist::Communicator& world_;
  // Tensor parallelism: the tp group; Ulysses: the sp group; with either, this rank's group
  // over dp (and sp): the ZeroEngine's. Null without.
  std::unique_ptr<dist::Communicator> tp_, sp_, dp_;
  int tp_rank_ = 0, tp_size_ = 1, sp_rank_ = 0, sp_size_ = 1;
  bool sequence_parallel_ = false;
  dist::Communicator* comm_;  // the engine's: the world (or its device communicator), or dp_
  nn::Decoder* model_ = nullptr;
  zero::ZeroEngine* engine_ = nullptr;
  std::vector<double> norm_gather_;  // the norm's per-rank partials (kept: no allocation per step)
  int64_t tp_train_bytes_ = 0;       // sent over tp_ by train() calls (summary.json)
  int64_t sp_train_bytes_ = 0;       // sent over sp_ by train() calls
  int64_t train_steps_ = 0;
};

}  // namespace fd::engine
