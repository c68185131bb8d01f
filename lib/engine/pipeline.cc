#include "lib/engine/pipeline.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <numeric>

#include "lib/base/check.h"
#include "lib/dist/counting_communicator.h"
#include "lib/dist/local_communicator.h"
#include "lib/engine/tensor_parallel.h"
#include "lib/ops/elementwise.h"
#include "lib/ops/reduce.h"
#include "lib/pipe/partition.h"

namespace fd::engine {

using autograd::Tape;
using autograd::TapeScope;
using autograd::Variable;

// One micro-batch between its forward and its backward: its batch, its tape,
// the hidden state it received and the gradient of it to send back, and its
// output (the loss on the last stage).
struct PipelineStage::InFlight {
  int micro = -1;
  Batch batch;
  int64_t targets = 0;
  std::unique_ptr<Tape> tape;
  Tensor input, input_grad;  // stages > 0: (B, T, C) (hidden_shape: this rank's slice)
  Variable out;
  // Sends of `out` and of `input_grad` that nothing waits for yet (a send
  // with no receive in its exchange): waited before the buffer is released
  // or overwritten, so that the stage computes while they travel.
  dist::WorkPtr out_sent, grad_sent;
};

namespace {
void wait(dist::WorkPtr& w) {
  if (w) w->wait();
  w.reset();
}
}  // namespace

namespace {

// This stage's segments as a Module: what its ZeroEngine partitions.
class StageModule final : public nn::Module {
 public:
  StageModule(const nn::Decoder& m, int first, int last) {
    std::vector<const nn::FlatParamGroup*> all = m.groups(), frozen = m.frozen_groups();
    for (int g = first; g <= last; ++g) {
      groups_.push_back(all[size_t(g)]);
      if (!frozen.empty()) frozen_.push_back(frozen[size_t(g)]);
    }
  }
  std::vector<const nn::Parameter*> parameters() const override { return list(groups_); }
  std::vector<const nn::FlatParamGroup*> groups() const override { return groups_; }
  std::vector<const nn::Parameter*> frozen_parameters() const override { return list(frozen_); }
  std::vector<const nn::FlatParamGroup*> frozen_groups() const override { return frozen_; }

 private:
  static std::vector<const nn::Parameter*> list(const std::vector<const nn::FlatParamGroup*>& gs) {
    std::vector<const nn::Parameter*> out;
    for (const nn::FlatParamGroup* g : gs)
      for (const nn::Parameter& p : g->params()) out.push_back(&p);
    return out;
  }
  std::vector<const nn::FlatParamGroup*> groups_, frozen_;
};

// An identity on the embedding's output whose backward first runs `before`
// (the first stage adds the tied head's gradient there), then hands the
// gradient on unchanged.
Variable with_backward_prelude(const Variable& y, std::function<void()> before) {
  if (!autograd::should_record({&y})) return y;
  Variable out = Variable::op_output(y.value(), true);
  auto os = out.slot();
  auto ys = y.slot();
  autograd::current_tape().record({"pipeline_tied_gradient", {os}, [os, ys, before] {
                                     before();
                                     ops::pass_grad(*ys, os->grad);
                                   }});
  return out;
}

}  // namespace

PipelineStage::PipelineStage(const dist::Mesh& mesh, std::vector<int> blocks,
                             pipe::Schedule schedule, std::vector<nn::SegmentInfo> segments,
                             int micro_batches, dist::Communicator& world, bool sequence_parallel)
    : blocks_(std::move(blocks)),
      schedule_(schedule),
      micro_batches_(micro_batches),
      sequence_parallel_(sequence_parallel),
      segments_(std::move(segments)),
      world_(world) {
  place(mesh);
  // The stage's replicas and sp ranks at this tp rank (same pp and tp coordinates): they hold
  // the same slices (Ulysses: whole weights with partial gradients, which the engine sums).
  data_ = mesh.group(world, {"dp", "sp"});
  // One engine rank: the stage's engine runs alone, as a one-rank run does (no
  // MPI, no fp32 staging of its reductions).
  if (engine_ranks() == 1) data_ = std::make_unique<dist::LocalCommunicator>();
  pipe_ = mesh.group(world, {"pp"});
  // The tied head's gradient and weights travel on a communicator of their
  // own, so that they never wait behind (or hold up) the hidden states.
  if (tied_) tie_ = mesh.group(world, {"pp"});
  if (sp_size_ > 1) sp_ = mesh.group(world, {"sp"});
  if (tp_size_ > 1) {
    tp_ = mesh.group(world, {"tp"});
    full_ = mesh.group(world, {"pp", "dp", "sp"});
    // full_ holds one rank per (stage, replica, sp rank), all at this tp rank: each stage's
    // first (replica 0, sp rank 0) is the root of its segments' broadcasts.
    const std::vector<int> members = mesh.group_ranks(world.rank(), {"pp", "dp", "sp"});
    for (int s = 0; s < stages(); ++s) {
      const auto it =
          std::find(members.begin(), members.end(), rank_of_[size_t(s)][0][size_t(tp_rank_)]);
      FD_CHECK(it != members.end(), "stage {}'s first rank at tp rank {} is not in its group", s,
               tp_rank_);
      full_root_.push_back(int(it - members.begin()));
    }
  }
}

void PipelineStage::place(const dist::Mesh& mesh) {
  const int P = stages();
  FD_CHECK(P >= 2 && mesh.size("pp") == P && mesh.world() == world_.size(),
           "a pipeline of {} stages over a mesh of {} stages and {} ranks, {} in the world", P,
           mesh.size("pp"), mesh.world(), world_.size());
  const int num_layers = int(std::count_if(segments_.begin(), segments_.end(), [](const auto& s) {
    return s.role == nn::SegmentRole::kBlock;
  }));
  FD_CHECK(std::accumulate(blocks_.begin(), blocks_.end(), 0) == num_layers,
           "stage blocks do not add up to {} layers", num_layers);
  replicas_ = mesh.size("dp");
  tp_size_ = mesh.size("tp");
  stage_ = mesh.coord(world_.rank(), "pp");
  replica_ = mesh.coord(world_.rank(), "dp");
  tp_rank_ = mesh.coord(world_.rank(), "tp");
  sp_size_ = mesh.size("sp");
  sp_rank_ = mesh.coord(world_.rank(), "sp");
  FD_CHECK(tp_size_ > 1 || !sequence_parallel_, "sequence parallelism without tp ranks");
  FD_CHECK(sp_size_ == 1 || !sequence_parallel_,
           "Megatron's sequence parallelism with Ulysses sp ranks");
  // Every (stage, engine rank, tp rank)'s world rank, from rank 0 along the mesh's axes.
  rank_of_.assign(size_t(P), std::vector<std::vector<int>>(size_t(engine_ranks())));
  for (int s = 0; s < P; ++s)
    for (int e = 0; e < engine_ranks(); ++e)
      for (int t = 0; t < tp_size_; ++t)
        rank_of_[size_t(s)][size_t(e)].push_back(mesh.step(
            mesh.step(mesh.step(mesh.step(0, "pp", s), "dp", e / sp_size_), "sp", e % sp_size_),
            "tp", t));
  const pipe::StageSegments mine = pipe::stage_segments(segments_, blocks_, stage_);
  first_ = mine.first;
  last_ = mine.last;
  segment_stage_ = pipe::segment_stages(segments_, blocks_);
  // A tied head: its matrix is the segment it is tied to's. The hand-over
  // below (the head's gradient to the owner before its backward, the updated
  // matrix back after each step) runs from the last stage to the first.
  for (size_t g = 0; g < segments_.size(); ++g) {
    const int owner = segments_[g].tied_to;
    if (owner < 0) continue;
    FD_CHECK(!tied_, "more than one tied segment");
    FD_CHECK(segment_stage_[g] == P - 1 && segment_stage_[size_t(owner)] == 0,
             "segment {} (stage {}) is tied to segment {} (stage {}): a pipeline hands tied "
             "weights from the first stage to the last only",
             g, segment_stage_[g], owner, segment_stage_[size_t(owner)]);
    tied_ = true;
    tied_segment_ = owner;
  }
}

PipelineStage::~PipelineStage() = default;

nn::TensorParallel PipelineStage::tensor_parallel() const {
  return tp_ ? nn::TensorParallel{tp_rank_, tp_size_, tp_.get(), sequence_parallel_}
             : nn::TensorParallel{};
}

nn::SequenceParallel PipelineStage::sequence_parallel() const {
  return sp_ ? nn::SequenceParallel{sp_rank_, sp_size_, sp_.get()} : nn::SequenceParallel{};
}

void PipelineStage::use_device_comms(const MakeComm& make, dist::Communicator& device_world) {
  FD_CHECK(engine_ == nullptr, "use_device_comms after attach");
  FD_CHECK(!tp_ && !sp_,
           "tensor and sequence parallelism run on the CPU only (config refuses device: cuda)");
  device_world_ = &device_world;
  data_host_ = std::move(data_);
  data_ = make(*data_host_);
  pipe_host_ = std::move(pipe_);
  pipe_ = make(*pipe_host_);
  if (tie_) {
    tie_host_ = std::move(tie_);
    tie_ = make(*tie_host_);
  }
}

int PipelineStage::owner_stage(int segment) const {
  FD_CHECK(0 <= segment && segment < int(segment_stage_.size()), "segment {} of {}", segment,
           segment_stage_.size());
  return segment_stage_[size_t(segment)];
}

bool PipelineStage::holds(int segment) const {
  if (segment >= first_ && segment <= last_) return true;
  for (int g = first_; g <= last_; ++g)  // the weights a segment of ours reads (a tied head)
    if (segments_[size_t(g)].tied_to == segment) return true;
  return false;
}

std::unique_ptr<nn::Module> PipelineStage::stage_module(const nn::Decoder& model) const {
  return std::make_unique<StageModule>(model, first_, last_);
}

nn::Module& PipelineStage::engine_module(nn::Decoder& model) {
  stage_module_ = stage_module(model);
  return *stage_module_;
}

zero::ZeroConfig PipelineStage::stage_config(zero::ZeroConfig config) const {
  std::vector<int> mine;
  for (int g : config.checkpoint_segments)
    if (g >= first_ && g <= last_) mine.push_back(g - first_);
  config.checkpoint_segments = mine;
  // Every stage's engine has ranks 0..D-1: offloaded state files are named by
  // the global rank, or the stages would share (and lock each other out of) one.
  config.offload.file_rank = world_.rank();
  return config;
}

void PipelineStage::attach(nn::Decoder& model, zero::ZeroEngine& engine,
                           const nn::ParamFill& fill) {
  model_ = &model;
  engine_ = &engine;
  // The segments outside this stage's engine (the other stages', the head's
  // copy of the embedding) padded as their owners' engines pad them, for as
  // many engine ranks: whole flat buffers cross between stages.
  const std::vector<const nn::FlatParamGroup*> all = model.groups(), base = model.frozen_groups();
  for (int g = 0; g < int(all.size()); ++g) {
    if (g >= first_ && g <= last_) continue;
    all[size_t(g)]->pad_for(engine_ranks());
    if (!base.empty()) base[size_t(g)]->pad_for(engine_ranks());
  }
  const nn::FlatParamGroup* emb = tied_ ? model.groups()[size_t(tied_segment_)] : nullptr;
  if (tied_ && emb->numel() > 0) {
    // Only the embedding matrix crosses (not GPT-2's position table: the head
    // never touches it), as a range of the segment's flat space.
    const nn::Parameter& w = emb->param(nn::family_names(model.config()).embed);
    tied_offset_ = w.offset;
    tied_count_ = w.value.numel();
    if (first_stage())  // where the head's gradient for the embedding arrives
      tied_grad_ = Tensor::empty(Shape{tied_count_}, emb->dtype(), MemCategory::kComm);
    if (last_stage()) emb->flat_grads().storage()->acquire();  // the head's, never reduced
  }
  if (tied_ && last_stage()) {
    // The head's copy of the embedding starts as the first stage's.
    std::vector<const nn::FlatParamGroup*> gs{emb};
    if (!model.frozen_groups().empty()) gs.push_back(model.frozen_groups()[size_t(tied_segment_)]);
    for (const nn::FlatParamGroup* g : gs) {
      if (g->numel() == 0) continue;
      g->flat_params().storage()->acquire();  // released when built deferred (Init::kDeferred)
      g->flat_params().zero_();
      for (const nn::Parameter& p : g->params())
        fill(p, 0, p.value.numel(), p.value.reshape(Shape{p.value.numel()}));
    }
  }
  // The norm over every stage, in the unpipelined order: for each engine
  // rank (a replica's sp rank: each holds its own shard of the gradient
  // reduced over the stage's replicas and sp ranks, counted once), its
  // partials of every segment in segment order.
  // With tensor parallelism each rank's row holds its segments' partials of
  // the sliced parameters, then of the whole ones: for each engine rank, every
  // tp rank's sliced partials and tp rank 0's whole ones (every tp rank holds
  // the same whole parameters and gradients), so every rank adds the same
  // numbers in the same order.
  const int segments = int(segments_.size());
  const int width = tp_ ? 2 * segments : segments;
  norm_row_.assign(size_t(width), 0.0);  // kept: no allocation per step
  norm_all_.assign(size_t(world_.size()) * size_t(width), 0.0);
  engine.set_norm_combine(
      [this, segments, width](const std::vector<double>& mine, const std::vector<double>& whole) {
        std::vector<double>& row = norm_row_;
        const std::vector<double>& all = norm_all_;
        for (size_t i = 0; i < mine.size(); ++i) row[size_t(first_) + i] = mine[i];
        for (size_t i = 0; i < whole.size(); ++i) row[size_t(segments + first_) + i] = whole[i];
        world_.all_gather_f64(row.data(), norm_all_.data(), width);
        auto at = [&](int rank, int column) {
          return all[size_t(rank) * size_t(width) + size_t(column)];
        };
        double sum = 0.0;
        for (int e = 0; e < engine_ranks(); ++e) {
          double partial = 0.0;
          for (int t = 0; t < tp_size_; ++t)
            for (int g = 0; g < segments; ++g)
              partial += at(rank_of_[size_t(owner_stage(g))][size_t(e)][size_t(t)], g);
          if (tp_)
            for (int g = 0; g < segments; ++g)
              partial += at(rank_of_[size_t(owner_stage(g))][size_t(e)][0], segments + g);
          sum += partial;
        }
        return sum;
      },
      tp_ != nullptr);
}

Variable PipelineStage::run(int g, const nn::SegmentFn& fn, const Variable& x,
                            const std::vector<int>& also_needs) {
  FD_CHECK(g >= first_ && g <= last_, "segment {} is not stage {}'s", g, stage_);
  std::vector<int> mapped;
  for (int a : also_needs)
    if (a >= first_ && a <= last_) mapped.push_back(a - first_);  // the tied copy is always here
  if (tied_ && g == tied_segment_ && stages() > 1) {
    // The head's gradient for the embedding, before the embedding's own.
    const nn::FlatParamGroup* emb = model_->groups()[size_t(tied_segment_)];
    nn::SegmentFn wrapped = [this, fn, emb](const Variable& in) {
      return with_backward_prelude(fn(in), [this, emb] {
        if (tied_count_ == 0) return;
        tie_->recv(tied_grad_.comm_data(), tied_count_, stages() - 1, tied_grad_.dtype());
        ops::add_(tied(emb->flat_grads()), tied_grad_);
      });
    };
    return engine_->run(g - first_, wrapped, x, mapped);
  }
  return engine_->run(g - first_, fn, x, mapped);
}

PipelineStage::InFlight& PipelineStage::slot(int micro) {
  FD_CHECK(!in_flight_.empty(), "pipeline slots not sized");
  InFlight& f = *in_flight_[size_t(micro) % in_flight_.size()];
  return f;
}

// Forward of micro-batch m: its batch loaded, its input (stages > 0: already
// received into the slot) as a leaf whose gradient goes back, the stage's
// segments recorded on the micro-batch's own tape.
void PipelineStage::forward(int micro) {
  InFlight& f = slot(micro);
  FD_CHECK(f.micro < 0, "pipeline slot of micro-batch {} still holds micro-batch {}", micro,
           f.micro);
  f.micro = micro;
  wait(f.grad_sent);  // the slot's previous micro-batch's input gradient on its way
  const auto t0 = std::chrono::steady_clock::now();
  f.targets = fns_->load(micro, f.batch);
  const auto t1 = std::chrono::steady_clock::now();
  totals_.data_s += std::chrono::duration<double>(t1 - t0).count();
  f.tape = std::make_unique<Tape>();
  TapeScope scope(*f.tape);
  model_->set_dropout_seed(fns_->dropout_seed(micro));
  Variable in;
  if (!first_stage()) {
    f.input_grad.zero_();
    in = Variable::bound_leaf(f.input, f.input_grad);
  }
  f.out = model_->stage_loss(first_, last_, f.batch.tokens, f.batch.targets, in, this,
                             f.batch.doc_starts);
  // Every sp rank's share of the loss (they add up in the trainer's all-reduce).
  if (last_stage() && tp_rank_ == 0) loss_sum_ += f.out.value().to_vector()[0] * double(f.targets);
  totals_.forward_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
}

// Backward of micro-batch m (in micro-batch order, as the unpipelined step):
// the engine's micro-batch around it, seeded by the loss (last stage) or by
// the received gradient of the stage's output (grad_out_).
void PipelineStage::backward(int micro) {
  InFlight& f = slot(micro);
  FD_CHECK(f.micro == micro, "backward of micro-batch {} without its forward", micro);
  engine_->begin_micro_batch(micro);
  // Recomputed segments (activation checkpointing) draw the same masks.
  model_->set_dropout_seed(fns_->dropout_seed(micro));
  {
    TapeScope scope(*f.tape);
    if (last_stage()) {
      if (tied_count_ > 0) {
        wait_tied_send();  // the head's gradient buffer is sent from: free it first
        tied(model_->groups()[size_t(tied_segment_)]->flat_grads()).zero_();
      }
      f.tape->backward(f.out, fns_->grad_seed(micro, f.targets));
    } else {
      FD_CHECK(grad_out_micro_ == micro, "backward of micro-batch {} with the gradient of {}",
               micro, grad_out_micro_);
      f.out.slot()->grad = grad_out_;
      f.tape->run_backward();
    }
  }
  engine_->end_micro_batch(micro);
  if (last_stage() && tied_ && tied_count_ > 0) {
    const Tensor g = tied(model_->groups()[size_t(tied_segment_)]->flat_grads());
    tied_send_ = tie_->send_recv_async(g.comm_data(), g.numel(), 0, nullptr, 0, -1, g.dtype());
  }
  f.tape.reset();
  wait(f.out_sent);  // the output on its way to the next stage, before it is freed
  f.out = Variable();
  f.micro = -1;
}

dist::WorkPtr PipelineStage::exchange(const Tensor* send, int dst, const Tensor* recv, int src) {
  if (send == nullptr && recv == nullptr) return nullptr;
  const DType dt = send ? send->dtype() : recv->dtype();
  return pipe_->send_recv_async(send ? send->comm_data() : nullptr, send ? send->numel() : 0,
                                send ? dst : -1, recv ? recv->comm_data() : nullptr,
                                recv ? recv->numel() : 0, recv ? src : -1, dt);
}

void PipelineStage::ensure_slots(int micro_batches) {
  if (program_micro_batches_ != micro_batches) {
    program_ = pipe::stage_program(schedule_, stages(), micro_batches, stage_);
    program_micro_batches_ = micro_batches;
  }
  const int k = pipe::max_in_flight(schedule_, stages(), micro_batches, stage_);
  if (int(in_flight_.size()) == k) return;
  in_flight_.clear();
  const DType dt = model_->groups()[size_t(first_)]->dtype();
  for (int i = 0; i < k; ++i) {
    auto f = std::make_unique<InFlight>();
    f->batch = fns_->new_batch();
    if (!first_stage()) {
      f->input = Tensor::empty(hidden_shape(f->batch), dt, MemCategory::kComm);
      f->input_grad = Tensor::empty(hidden_shape(f->batch), dt, MemCategory::kComm);
    }
    in_flight_.push_back(std::move(f));
  }
  if (!last_stage() && !grad_out_.defined())
    grad_out_ = Tensor::empty(hidden_shape(in_flight_[0]->batch), dt, MemCategory::kComm);
}

Shape PipelineStage::hidden_shape(const Batch& b) const {
  // Sequence parallelism: between blocks each tp rank holds its slice of the sequence; Ulysses:
  // each sp rank its slice throughout.
  const int64_t T = b.tokens.shape()[1] / (sequence_parallel_ ? tp_size_ : 1) / sp_size_;
  return Shape{b.tokens.shape()[0], T, model_->config().hidden_size};
}

double PipelineStage::train(int micro_batches, const MicroFns& fns, Batch&, PhaseClock& clock,
                            Phases& ph) {
  const Totals before = totals_;
  const double loss_sum = run_program(micro_batches, fns);
  double program = 0.0;  // the wall time less the waits on the data-parallel group
  clock.lap(program, ph.comm_wait);
  if (clock.on()) {
    const double data = totals_.data_s - before.data_s,
                 forward = totals_.forward_s - before.forward_s,
                 idle = totals_.idle_s - before.idle_s;
    ph.data += data;
    ph.forward += forward;
    ph.comm_wait += idle;
    ph.backward += program - data - forward - idle;
  }
  return loss_sum;
}

double PipelineStage::run_program(int M, const MicroFns& fns) {
  const auto t0 = std::chrono::steady_clock::now();
  auto waited = [this] { return pipe_->wait_seconds() + (tie_ ? tie_->wait_seconds() : 0.0); };
  auto sent = [this] { return pipe_->bytes_sent() + (tie_ ? tie_->bytes_sent() : 0); };
  const double w0 = waited();
  const int64_t b0 = sent();
  const int64_t tp0 = tensor_bytes(), sp0 = sequence_bytes();
  fns_ = &fns;
  loss_sum_ = 0.0;
  ensure_slots(M);
  // What a transfer reads or fills on this stage: the activation is the
  // sender's output and the receiver's input; the gradient is the sender's
  // input gradient and the receiver's output gradient.
  auto to_send = [&](const pipe::Transfer& t) -> const Tensor* {
    InFlight& f = slot(t.micro);
    return t.payload == pipe::Payload::kActivation ? &f.out.value() : &f.input_grad;
  };
  auto received = [&](const pipe::Transfer& t) -> const Tensor* {
    if (t.payload == pipe::Payload::kActivation) return &slot(t.micro).input;
    grad_out_micro_ = t.micro;
    return &grad_out_;
  };
  // Exchanges are posted in the program's order (the order its deadlock
  // freedom rests on) without waiting: one that receives is waited before the
  // next forward or backward (which reads what it brings); a send alone is
  // waited only before its buffer is freed or overwritten, so the stage
  // computes while it travels (the warm-up's and GPipe's activations, the
  // cool-down's gradients). Posting earlier and waiting later than a
  // blocking exchange adds no wait a peer could be stuck behind: each
  // rank's communication thread runs the same ops in the same order.
  std::vector<dist::WorkPtr> receiving;
  for (const pipe::Instruction& in : program_) {
    if (in.kind != pipe::Instruction::Kind::kExchange)
      for (dist::WorkPtr& w : receiving) wait(w);
    switch (in.kind) {
      case pipe::Instruction::Kind::kForward:
        forward(in.micro);
        break;
      case pipe::Instruction::Kind::kBackward:
        backward(in.micro);
        break;
      case pipe::Instruction::Kind::kExchange: {
        dist::WorkPtr w = exchange(in.send ? to_send(*in.send) : nullptr,
                                   in.send ? pipe::send_peer(*in.send, stage_) : -1,
                                   in.recv ? received(*in.recv) : nullptr,
                                   in.recv ? pipe::recv_peer(*in.recv, stage_) : -1);
        if (in.recv) {
          receiving.push_back(std::move(w));
        } else if (in.send->payload == pipe::Payload::kActivation) {
          slot(in.send->micro).out_sent = std::move(w);
        } else {
          slot(in.send->micro).grad_sent = std::move(w);
        }
        break;
      }
    }
  }
  for (dist::WorkPtr& w : receiving) wait(w);
  for (std::unique_ptr<InFlight>& f : in_flight_) {
    wait(f->out_sent);
    wait(f->grad_sent);
  }
  wait_tied_send();
  fns_ = nullptr;
  totals_.train_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  totals_.idle_s += waited() - w0;
  totals_.p2p_bytes += sent() - b0;
  tp_train_bytes_ += tensor_bytes() - tp0;
  sp_train_bytes_ += sequence_bytes() - sp0;
  ++totals_.steps;
  return loss_sum_;
}

double PipelineStage::eval(const Batch& batch) {
  autograd::NoGradGuard no_grad;
  Variable in;
  if (!first_stage()) {
    if (!eval_input_.defined())
      eval_input_ = Tensor::empty(hidden_shape(batch), model_->groups()[size_t(first_)]->dtype(),
                                  MemCategory::kComm);
    dist::WorkPtr w = exchange(nullptr, -1, &eval_input_, stage_ - 1);
    wait(w);
    in = Variable(eval_input_);
  }
  const Variable out =
      model_->stage_loss(first_, last_, batch.tokens, batch.targets, in, this, batch.doc_starts);
  if (!last_stage()) {
    dist::WorkPtr w = exchange(&out.value(), stage_ + 1, nullptr, -1);
    wait(w);
    return 0.0;
  }
  double loss = out.value().to_vector()[0];
  if (sp_) sp_->all_reduce_f64(&loss, 1);  // the shares of one batch's mean, rank order
  return computes_loss() ? loss : 0.0;
}

void PipelineStage::wait_tied_send() {
  if (tied_send_) tied_send_->wait();
  tied_send_.reset();
}

void PipelineStage::sync_tied() {
  if (!tied_) return;
  if (tied_count_ == 0) return;  // LoRA: the embedding is frozen
  const Tensor p = tied(model_->groups()[size_t(tied_segment_)]->flat_params());
  const int64_t before = tie_->bytes_sent();
  if (first_stage()) {
    tie_->send(p.comm_data(), p.numel(), stages() - 1, p.dtype());
  } else if (last_stage()) {
    tie_->recv(p.comm_data(), p.numel(), 0, p.dtype());
  }
  // Per step: the syncs after steps count, the one at setup (or resume) does not.
  if (totals_.steps > 0) totals_.p2p_bytes += tie_->bytes_sent() - before;
}

void PipelineStage::with_full_model(const std::function<void(const nn::Decoder& model)>& fn) {
  std::vector<const nn::FlatParamGroup*> all = model_->groups();
  for (const nn::FlatParamGroup* f : model_->frozen_groups()) all.push_back(f);
  const int segments = int(segments_.size());
  std::vector<const nn::FlatParamGroup*> acquired;
  for (size_t i = 0; i < all.size(); ++i) {
    const int g = int(i) % segments;
    const nn::FlatParamGroup* grp = all[i];
    if (grp->numel() == 0) continue;
    const Tensor& p = grp->flat_params();
    if (!p.storage()->resident()) {
      p.storage()->acquire();
      acquired.push_back(grp);
    }
    // From the first rank (replica 0, sp rank 0) of the owning stage (tensor parallelism: its
    // rank at this tp rank, whose slices this rank holds; every sp rank holds the same).
    if (full_) {
      full_->broadcast(p.comm_data(), p.numel(), p.dtype(), full_root_[size_t(owner_stage(g))]);
    } else {
      (device_world_ ? *device_world_ : world_)
          .broadcast(p.comm_data(), p.numel(), p.dtype(), rank_of_[size_t(owner_stage(g))][0][0]);
    }
  }
  if (tp_) {
    const std::unique_ptr<nn::Decoder> whole = gather_whole_model(*model_);
    fn(*whole);
  } else {
    fn(*model_);
  }
  for (const nn::FlatParamGroup* grp : acquired) grp->flat_params().storage()->release();
}

std::string PipelineStage::describe() const {
  std::string tensor =
      sp_ ? fmt::format(" x {} Ulysses sequence-parallel ranks", sp_size_) : std::string();
  if (tp_)
    tensor += fmt::format(" x {} tensor-parallel ranks{}", tp_size_,
                          sequence_parallel_ ? " with sequence parallelism" : "");
  return fmt::format(
      "pipeline: {} stages x {} data-parallel replica{}{}, {} schedule, blocks per stage [{}], {} "
      "micro-batches per step (bubble {:.1f}%)",
      stages(), replicas_, replicas_ == 1 ? "" : "s", tensor, pipe::to_string(schedule_),
      fmt::join(blocks_, ", "), micro_batches_,
      100.0 * pipe::bubble_fraction(stages(), micro_batches_));
}

void PipelineStage::describe_save(SaveRequest& req) const {
  // The checkpoint sees each stage's engine ranks (replicas x sp ranks) as its ZeRO
  // partitions: world rank = (stage x replicas + replica) x tp size + tp rank holds with
  // replicas = D x S and replica = engine rank.
  req.meta.pipeline = {.stages = stages(),
                       .replicas = engine_ranks(),
                       .stage = stage_,
                       .replica = engine_rank(),
                       .blocks = blocks_,
                       .schedule = std::string(pipe::to_string(schedule_))};
  if (tp_) req.meta.tensor = {tp_size_, tp_rank_, engine_ranks()};
  // Rank 0 (the first stage) holds only its own segments.
  for (const nn::FlatParamGroup* g : model_->groups())
    if (g->numel() > 0) req.segments.push_back({g->name(), g->numel()});
}

void PipelineStage::add_to_summary(nlohmann::json& summary) {
  // Every rank's totals, gathered (collective): per stage, the mean over its
  // ranks (replicas, sp and tp ranks) of the share of the pipeline phase spent waiting for a
  // neighbour.
  const Totals& t = totals_;
  const double mine[4] = {double(stage_), t.train_s, t.idle_s, double(t.p2p_bytes)};
  std::vector<double> all(4 * size_t(world_.size()));
  world_.all_gather_f64(mine, all.data(), 4);
  const int P = stages();
  std::vector<double> idle(size_t(P), 0.0), bytes(size_t(P), 0.0);
  for (int r = 0; r < world_.size(); ++r) {
    const double* v = &all[4 * size_t(r)];
    const size_t s = size_t(v[0]);
    idle[s] += (v[1] > 0.0 ? v[2] / v[1] : 0.0) / double(engine_ranks() * tp_size_);
    bytes[s] = std::max(bytes[s], t.steps > 0 ? v[3] / double(t.steps) : 0.0);
  }
  std::vector<int64_t> bytes_per_step;
  for (double b : bytes) bytes_per_step.push_back(int64_t(b));
  summary["pipeline"] = {{"stages", P},
                         {"replicas", replicas_},
                         {"schedule", std::string(pipe::to_string(schedule_))},
                         {"micro_batches", micro_batches_},
                         {"stage_blocks", blocks_},
                         {"bubble_fraction", pipe::bubble_fraction(P, micro_batches_)},
                         {"idle_fraction", idle},
                         {"p2p_bytes_per_step", bytes_per_step}};
  if (!tp_ && !sp_) return;
  // The stages send different bytes over their tp (sp) groups (the embedding's and the loss's
  // collectives are the first and last stage's; the stages' blocks differ): the largest of any
  // rank, per step.
  const double per_step[2] = {t.steps > 0 ? double(tp_train_bytes_ / t.steps) : 0.0,
                              t.steps > 0 ? double(sp_train_bytes_ / t.steps) : 0.0};
  std::vector<double> gathered(2 * size_t(world_.size()));
  world_.all_gather_f64(per_step, gathered.data(), 2);
  double most[2] = {0.0, 0.0};
  for (int r = 0; r < world_.size(); ++r)
    for (int k = 0; k < 2; ++k) most[k] = std::max(most[k], gathered[2 * size_t(r) + size_t(k)]);
  if (sp_)
    summary["sequence_parallel"] = {
        {"size", sp_size_}, {"replicas", replicas_}, {"bytes_per_step", int64_t(most[1])}};
  if (tp_)
    summary["tensor_parallel"] = {{"size", tp_size_},
                                  {"replicas", replicas_},
                                  {"sequence_parallel", sequence_parallel_},
                                  {"bytes_per_step", int64_t(most[0])}};
}

}  // namespace fd::engine
