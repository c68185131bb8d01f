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
  if (mesh.size("tp") == 1 && mesh.size("sp") == 1) return;  // the world is the dp group
  // Each ZeroEngine over the ranks holding the same parameters (slices): dp, and sp (whose
  // ranks hold whole parameters with partial gradients).
  dp_ = mesh.group(world, {"dp", "sp"});
  comm_ = dp_.get();
  if (mesh.size("sp") > 1) {
    sp_ = mesh.group(world, {"sp"});
    sp_rank_ = sp_->rank();
    sp_size_ = sp_->size();
  }
  if (mesh.size("tp") > 1) {
    tp_ = mesh.group(world, {"tp"});
    tp_rank_ = tp_->rank();
    tp_size_ = tp_->size();
  }
}

nn::TensorParallel DataParallel::tensor_parallel() const {
  return tp_ ? nn::TensorParallel{tp_rank_, tp_size_, tp_.get(), sequence_parallel_}
             : nn::TensorParallel{};
}

nn::SequenceParallel DataParallel::sequence_parallel() const {
  return sp_ ? nn::SequenceParallel{sp_rank_, sp_size_, sp_.get()} : nn::SequenceParallel{};
}

void DataParallel::use_device_comms(const MakeComm&, dist::Communicator& device_world) {
  FD_CHECK(!dp_, "tensor and sequence parallelism run on the CPU only (config refuses cuda)");
  comm_ = &device_world;
}

zero::ZeroConfig DataParallel::engine_config(zero::ZeroConfig config) const {
  // The dp groups' ranks repeat over the tp (sp) ranks: offload files are named by world rank.
  if (dp_) config.offload.file_rank = world_.rank();
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
  const int64_t tp_before = tensor_bytes(), sp_before = sequence_bytes();
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
  sp_train_bytes_ += sequence_bytes() - sp_before;
  ++train_steps_;
  // A tp group computes one replica's loss: counted once, on its rank 0; an sp group's ranks
  // each their share (the trainer adds them up).
  return tp_rank_ == 0 ? loss_sum : 0.0;
}

double DataParallel::eval(const Batch& batch) {
  double loss = eval_batch(*model_, *engine_, batch);
  if (sp_) sp_->all_reduce_f64(&loss, 1);  // the shares of one batch's mean, rank order
  return computes_loss() ? loss : 0.0;
}

void DataParallel::with_full_model(const std::function<void(const nn::Decoder& model)>& fn) {
  engine_->with_full_parameters([&] {
    if (!tp_) return fn(*model_);  // with Ulysses alone every parameter is whole already
    const std::unique_ptr<nn::Decoder> whole = gather_whole_model(*model_);
    fn(*whole);
  });
}

std::string DataParallel::describe() const {
  if (!dp_) return {};
  const int replicas = dp_->size() / sp_size_;
  std::string s;
  if (tp_)
    s = fmt::format("tensor parallel: {} ranks per layer{}", tp_size_,
                    sequence_parallel_ ? " with sequence parallelism" : "");
  if (sp_)
    s += fmt::format("{}Ulysses sequence parallel: {} ranks per sequence", s.empty() ? "" : "; ",
                     sp_size_);
  return s + fmt::format(" x {} data-parallel replica{} (ZeRO over {} ranks)", replicas,
                         replicas == 1 ? "" : "s", dp_->size());
}

void DataParallel::describe_save(SaveRequest& request) const {
  if (!tp_) return;
  request.meta.tensor = {tp_size_, tp_rank_, dp_->size()};
}

void DataParallel::add_to_summary(nlohmann::json& summary) {
  if (sp_)
    summary["sequence_parallel"] = {
        {"size", sp_size_},
        {"replicas", dp_->size() / sp_size_},
        {"bytes_per_step", train_steps_ > 0 ? sp_train_bytes_ / train_steps_ : 0}};
  if (!tp_) return;
  // Rank 0's (every tp rank sends the same bytes but for the vocabulary's uneven rows, which
  // the collectives do not depend on).
  summary["tensor_parallel"] = {
      {"size", tp_size_},
      {"replicas", dp_->size() / sp_size_},
      {"sequence_parallel", sequence_parallel_},
      {"bytes_per_step", train_steps_ > 0 ? tp_train_bytes_ / train_steps_ : 0}};
}

}  // namespace fd::engine
