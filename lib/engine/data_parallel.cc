#include "lib/engine/data_parallel.h"

#include <fmt/format.h>

#include "lib/engine/tensor_parallel.h"

namespace fd::engine {

DataParallel::DataParallel(const dist::Mesh& mesh, dist::Communicator& world,
                           bool sequence_parallel)
    : world_(world), sequence_parallel_(sequence_parallel), comm_(&world) {
  FD_CHECK(mesh.size("pp") == 1 && mesh.world() == world.size(),
           "data parallelism over a mesh of {} ranks ({} stages) on a world of {}", mesh.world(),
           mesh.size("pp"), world.size());
  if (mesh.size("tp") == 1) return;  // the world is the data-parallel group
  tp_ = mesh.group(world, {"tp"});
  dp_ = mesh.group(world, {"dp"});
  tp_rank_ = tp_->rank();
  tp_size_ = tp_->size();
  comm_ = dp_.get();
}

nn::TensorParallel DataParallel::tensor_parallel() const {
  return tp_ ? nn::TensorParallel{tp_rank_, tp_size_, tp_.get(), sequence_parallel_}
             : nn::TensorParallel{};
}

void DataParallel::use_device_comms(const MakeComm&, dist::Communicator& device_world) {
  FD_CHECK(!tp_, "tensor parallelism runs on the CPU only (config refuses device: cuda)");
  comm_ = &device_world;
}

zero::ZeroConfig DataParallel::engine_config(zero::ZeroConfig config) const {
  // The dp groups' ranks repeat over the tp ranks: offload files are named by world rank.
  if (tp_) config.offload.file_rank = world_.rank();
  return config;
}

void DataParallel::attach(nn::Decoder& model, zero::ZeroEngine& engine, const nn::ParamFill&) {
  model_ = &model;
  engine_ = &engine;
  if (!tp_) return;
  // The global norm: over this tp rank's dp group the split and whole partials, in dp rank
  // order; then over the tp group the split sums of every tp rank, in tp rank order, plus tp
  // rank 0's whole sum (every tp rank's whole parameters, and so their squares, are the same).
  norm_gather_.assign(size_t(std::max(dp_->size(), tp_size_)) * 2, 0.0);
  engine.set_norm_combine(
      [this](const std::vector<double>& split, const std::vector<double>& whole) {
        double mine[2] = {0.0, 0.0};
        for (double v : split) mine[0] += v;
        for (double v : whole) mine[1] += v;
        std::vector<double>& all = norm_gather_;
        dp_->all_gather_f64(mine, all.data(), 2);
        double dp_sums[2] = {0.0, 0.0};
        for (int r = 0; r < dp_->size(); ++r) {
          dp_sums[0] += all[size_t(2 * r)];
          dp_sums[1] += all[size_t(2 * r + 1)];
        }
        tp_->all_gather_f64(dp_sums, all.data(), 2);
        double sum = 0.0;
        for (int r = 0; r < tp_size_; ++r) sum += all[size_t(2 * r)];
        return sum + all[1];
      },
      true);
}

double DataParallel::train(int micro_batches, const MicroFns& fns, Batch& batch, PhaseClock& clock,
                           Phases& ph) {
  nn::SegmentRunner& runner = fns.runner != nullptr ? *fns.runner : *engine_;
  const int64_t tp_before = tensor_bytes();
  double loss_sum = 0.0;
  for (int micro = 0; micro < micro_batches; ++micro) {
    const int64_t targets = fns.load(micro, batch);
    clock.lap(ph.data, ph.comm_wait);
    const double loss =
        train_micro_batch(*model_, *engine_, runner, batch, micro, fns.dropout_seed(micro),
                          fns.grad_seed(micro, targets),
                          [&](const autograd::Tape& tape, const autograd::Variable& loss_var) {
                            if (fns.forwarded) fns.forwarded(micro, tape, loss_var);
                            clock.lap(ph.forward, ph.comm_wait);
                          });
    loss_sum += loss * double(targets);
    clock.lap(ph.backward, ph.comm_wait);
  }
  tp_train_bytes_ += tensor_bytes() - tp_before;
  ++tp_train_steps_;
  // A tp group computes one replica's loss: counted once, on its rank 0.
  return computes_loss() ? loss_sum : 0.0;
}

double DataParallel::eval(const Batch& batch) {
  const double loss = eval_batch(*model_, *engine_, batch);
  return computes_loss() ? loss : 0.0;
}

void DataParallel::with_full_model(const std::function<void(const nn::Decoder& model)>& fn) {
  engine_->with_full_parameters([&] {
    if (!tp_) return fn(*model_);
    const std::unique_ptr<nn::Decoder> whole = gather_whole_model(*model_);
    fn(*whole);
  });
}

std::string DataParallel::describe() const {
  if (!tp_) return {};
  return fmt::format(
      "tensor parallel: {} ranks per layer{} x {} data-parallel replica{} (ZeRO over each "
      "replica group)",
      tp_size_, sequence_parallel_ ? " with sequence parallelism" : "", dp_->size(),
      dp_->size() == 1 ? "" : "s");
}

void DataParallel::describe_save(SaveRequest& request) const {
  if (!tp_) return;
  request.meta.tensor = {tp_size_, tp_rank_, dp_->size()};
}

void DataParallel::add_to_summary(nlohmann::json& summary) {
  if (!tp_) return;
  // Rank 0's (every tp rank sends the same bytes but for the vocabulary's uneven rows, which
  // the collectives do not depend on).
  summary["tensor_parallel"] = {
      {"size", tp_size_},
      {"replicas", dp_->size()},
      {"sequence_parallel", sequence_parallel_},
      {"bytes_per_step", tp_train_steps_ > 0 ? tp_train_bytes_ / tp_train_steps_ : 0}};
}

}  // namespace fd::engine
