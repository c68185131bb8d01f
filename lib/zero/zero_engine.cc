#include "lib/zero/zero_engine.h"

#include <cmath>

#include "lib/autograd/segment.h"
#include "lib/autograd/tape.h"
#include "lib/base/check.h"
#include "lib/ops/reduce.h"

namespace fd::zero {
namespace {

// Reductions in flight before the oldest is completed: bounds the transient
// gradient buckets of stages 2-3 while still overlapping with backward.
constexpr size_t kMaxInFlight = 2;

void add_into(const Tensor& acc, const Tensor& x) {
  float* a = acc.f32();
  const float* b = x.f32();
  const int64_t n = acc.numel();
  for (int64_t i = 0; i < n; ++i) a[i] += b[i];
}

}  // namespace

nn::GroupLayout layout_for(int stage, int world) {
  nn::GroupLayout l;
  l.pad_multiple = world;
  // Stage 3 keeps only a parameter shard; the full buffers are transient gathers.
  if (stage >= 3) l.params_category = MemCategory::kComm;
  // Stages 2-3 keep only a gradient shard; full gradients are transient buckets.
  if (stage >= 2) l.grads_category = MemCategory::kComm;
  return l;
}

ModelStateBytes model_state_bytes(int stage, int world, int accumulation, int64_t P) {
  FD_CHECK(P % world == 0, "padded parameter count {} not divisible by world {}", P, world);
  const int64_t shard = P / world * 4;
  ModelStateBytes b;
  b.params = stage >= 3 ? shard : 4 * P;
  b.grads = stage >= 2 ? shard : 4 * P + (accumulation > 1 ? shard : 0);
  b.optimizer = stage >= 1 ? 2 * shard : 8 * P;
  b.master = 0;  // fp32: the (sharded) parameters are the master weights
  return b;
}

ZeroEngine::ZeroEngine(const nn::Module& model, dist::Communicator& comm, const ZeroConfig& c)
    : comm_(comm), config_(c) {
  FD_CHECK(c.stage >= 0 && c.stage <= 3, "ZeRO stage {}", c.stage);
  FD_CHECK(c.accumulation >= 1, "accumulation {}", c.accumulation);
  const int world = comm.size();
  std::vector<optim::AdamWShard> shards;
  for (const nn::FlatParamGroup* g : model.groups()) {
    FD_CHECK(g->dtype() == DType::kF32, "ZeRO engine runs fp32 groups");
    FD_CHECK(g->numel() % world == 0, "group '{}' of {} elements not padded for world {}",
             g->name(), g->numel(), world);
    Segment s;
    s.group = g;
    s.shard = g->numel() / world;
    const int64_t begin = int64_t(comm.rank()) * s.shard;
    s.grad_shard_own = c.stage >= 2 || c.accumulation > 1;
    s.grad_shard = s.grad_shard_own
                       ? Tensor::zeros(Shape{s.shard}, DType::kF32, MemCategory::kGrads)
                       : g->flat_grads().flat_slice(begin, s.shard);
    if (c.stage >= 3) {
      s.param_shard = Tensor::empty(Shape{s.shard}, DType::kF32, MemCategory::kParams);
      s.param_shard.copy_from(g->flat_params().flat_slice(begin, s.shard));
      g->flat_params().storage()->release();
    }
    if (c.stage >= 2) g->flat_grads().storage()->release();
    if (c.stage == 0) {
      shards.push_back({g, 0, g->numel(), g->flat_params(), g->flat_grads()});
    } else {
      Tensor params = c.stage >= 3 ? s.param_shard : g->flat_params().flat_slice(begin, s.shard);
      shards.push_back({g, begin, s.shard, params, s.grad_shard});
    }
    segments_.push_back(std::move(s));
  }
  optimizer_ = std::make_unique<optim::AdamW>(std::move(shards), c.adamw);
}

ZeroEngine::~ZeroEngine() {
  // Never leave a collective half-issued: complete what is in flight.
  for (Pending& p : pending_) p.work->wait();
}

int64_t ZeroEngine::padded_params() const {
  int64_t n = 0;
  for (const Segment& s : segments_) n += s.group->numel();
  return n;
}

void ZeroEngine::pin_params(int g) {
  Segment& s = segments_[size_t(g)];
  if (config_.stage < 3) return;
  if (s.param_pins++ > 0) return;
  const Tensor& full = s.group->flat_params();
  full.storage()->acquire();
  comm_.all_gather(s.param_shard.raw(), full.raw(), s.shard, DType::kF32);
}

void ZeroEngine::unpin_params(int g) {
  Segment& s = segments_[size_t(g)];
  if (config_.stage < 3) return;
  FD_CHECK(s.param_pins > 0, "unbalanced parameter release of segment {}", g);
  if (--s.param_pins == 0) s.group->flat_params().storage()->release();
}

void ZeroEngine::ensure_grads(int g) {
  if (config_.stage < 2) return;  // stages 0-1 keep full gradient buffers
  const Tensor& full = segments_[size_t(g)].group->flat_grads();
  if (full.storage()->resident()) return;
  full.storage()->acquire();
  full.zero_();
}

void ZeroEngine::begin_micro_batch(int micro) {
  FD_CHECK(pending_.empty(), "reductions of the previous micro-batch still in flight");
  micro_ = micro;
  if (config_.stage < 2) {
    for (const Segment& s : segments_) s.group->zero_grads();
  }
}

autograd::Variable ZeroEngine::run(int g, const nn::SegmentFn& fn, const autograd::Variable& x,
                                   const std::vector<int>& also_needs) {
  pin_params(g);
  for (int a : also_needs) pin_params(a);
  const bool recording = autograd::grad_enabled();
  autograd::SegmentHooks hooks;
  if (recording) {
    hooks.before_backward = [this, g, also_needs] {
      pin_params(g);
      ensure_grads(g);
      for (int a : also_needs) ensure_grads(a);
    };
    hooks.after_backward = [this, g, also_needs] {
      unpin_params(g);
      // Parameters of other segments pinned since this segment's forward stay
      // resident until their owner's backward is done: with the tied lm head,
      // wte is gathered twice per step (embedding forward; head forward through
      // embedding backward), like every other parameter.
      for (int a : also_needs) segments_[size_t(a)].deferred_unpins++;
      for (int i = 0; i < segments_[size_t(g)].deferred_unpins; ++i) unpin_params(g);
      segments_[size_t(g)].deferred_unpins = 0;
      launch_reduce(g);
    };
  }
  autograd::Variable y = autograd::segment(fn, x, std::move(hooks), "zero_segment");
  unpin_params(g);
  if (!recording) {
    for (int a : also_needs) unpin_params(a);
  }
  return y;
}

void ZeroEngine::launch_reduce(int g) {
  Segment& s = segments_[size_t(g)];
  Pending p;
  p.segment = g;
  p.into_shard = micro_ == 0 && s.grad_shard_own;
  p.recv = p.into_shard ? s.grad_shard : Tensor::empty(Shape{s.shard}, DType::kF32, MemCategory::kComm);
  const Tensor& full = s.group->flat_grads();
  p.work = comm_.reduce_scatter_async(full.raw(), p.recv.raw(), s.shard, DType::kF32);
  pending_.push_back(std::move(p));
  const size_t limit = config_.overlap_comm ? kMaxInFlight : 0;
  while (pending_.size() > limit) {
    complete(pending_.front());
    pending_.pop_front();
  }
}

void ZeroEngine::complete(Pending& p) {
  p.work->wait();
  Segment& s = segments_[size_t(p.segment)];
  if (!p.into_shard) {
    if (micro_ == 0) {
      s.grad_shard.copy_from(p.recv);
    } else {
      add_into(s.grad_shard, p.recv);
    }
  }
  if (config_.stage >= 2) s.group->flat_grads().storage()->release();
}

void ZeroEngine::drain() {
  while (!pending_.empty()) {
    complete(pending_.front());
    pending_.pop_front();
  }
}

void ZeroEngine::end_micro_batch(int micro) {
  FD_CHECK(micro == micro_, "end_micro_batch({}) after begin_micro_batch({})", micro, micro_);
  drain();
}

StepResult ZeroEngine::step(float lr) {
  drain();
  StepResult r;
  double partial = 0.0;
  for (const Segment& s : segments_) partial += ops::sum_of_squares(s.grad_shard);
  std::vector<double> partials(static_cast<size_t>(comm_.size()));
  comm_.all_gather_f64(&partial, partials.data(), 1);
  double sum = 0.0;
  for (double v : partials) sum += v;  // rank order: identical on every rank
  r.grad_norm = std::sqrt(sum);
  if (!std::isfinite(r.grad_norm)) {
    r.skipped = true;
    return r;
  }
  if (config_.grad_clip > 0.0f) {
    const float coef = float(double(config_.grad_clip) / (r.grad_norm + 1e-6));
    if (coef < 1.0f) {
      for (const Segment& s : segments_) ops::scale_(s.grad_shard, coef);
    }
  }
  if (config_.stage == 0) {
    // Replicated update: gather every gradient shard into the full buffers.
    std::vector<dist::WorkPtr> works;
    for (const Segment& s : segments_) {
      Tensor mine = s.group->flat_grads().flat_slice(begin_of(s), s.shard);
      if (s.grad_shard_own) mine.copy_from(s.grad_shard);
      works.push_back(comm_.all_gather_async(mine.raw(), s.group->flat_grads().raw(), s.shard,
                                             DType::kF32));
    }
    for (auto& w : works) w->wait();
  }
  optimizer_->step(lr);
  if (config_.stage == 1 || config_.stage == 2) {
    std::vector<dist::WorkPtr> works;
    for (const Segment& s : segments_) {
      const Tensor& full = s.group->flat_params();
      works.push_back(comm_.all_gather_async(full.flat_slice(begin_of(s), s.shard).raw(),
                                             full.raw(), s.shard, DType::kF32));
    }
    for (auto& w : works) w->wait();
  }
  return r;
}

void ZeroEngine::with_full_parameters(const std::function<void()>& fn) {
  for (size_t g = 0; g < segments_.size(); ++g) pin_params(int(g));
  fn();
  for (size_t g = 0; g < segments_.size(); ++g) unpin_params(int(g));
}

}  // namespace fd::zero
