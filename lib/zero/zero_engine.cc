#include "lib/zero/zero_engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "lib/autograd/segment.h"
#include "lib/autograd/tape.h"
#include "lib/base/check.h"
#include "lib/ops/reduce.h"

namespace fd::zero {

nn::GroupLayout layout_for(int stage) {
  nn::GroupLayout l;
  // Stage 3 keeps only a parameter shard; the full buffers are transient gathers.
  if (stage >= 3) l.params_category = MemCategory::kComm;
  // Stages 2-3 keep only a gradient shard; full gradients are transient buckets.
  if (stage >= 2) l.grads_category = MemCategory::kComm;
  return l;
}

nn::GroupLayout frozen_layout_for(int stage) {
  nn::GroupLayout l;
  l.params_category = stage >= 3 ? MemCategory::kComm : MemCategory::kFrozen;
  l.with_grads = false;
  return l;
}

ModelStateBytes model_state_bytes(int stage, int world, int accumulation, int64_t P,
                                  int compute_bytes, int64_t offload_buffers,
                                  int64_t offload_params) {
  FD_CHECK(P % world == 0, "padded parameter count {} not divisible by world {}", P, world);
  FD_CHECK(compute_bytes == 2 || compute_bytes == 4, "compute bytes {}", compute_bytes);
  const int64_t c = compute_bytes, S = P / world;
  ModelStateBytes b;
  b.params = stage >= 3 ? c * S : c * P;
  b.grads = stage >= 2 ? c * S : c * P + (accumulation > 1 ? c * S : 0);
  b.optimizer = stage >= 1 ? 8 * S : 8 * P;
  // In fp32 the (sharded) parameters are the master weights.
  b.master = c == 4 ? 0 : (stage >= 1 ? 4 * S : 4 * P);
  if (offload_buffers >= 0) {
    b.optimizer = offload_buffers;
    b.master = 0;
  }
  if (offload_params >= 0) b.params = offload_params;
  return b;
}

namespace {

// Fills elements [begin, begin + count) of `g`'s flat parameter space into
// `out` (count elements of g's dtype): each parameter's overlap through
// `fill`, alignment and world padding zero.
void fill_flat(const nn::FlatParamGroup& g, int64_t begin, int64_t count, const Tensor& out,
               const nn::ParamFill& fill) {
  if (count == 0 || out.is_meta()) return;  // meta tensors hold no values
  out.zero_();
  for (const nn::Parameter& p : g.params()) {
    const int64_t lo = std::max(begin, p.offset);
    const int64_t hi = std::min(begin + count, p.offset + p.value.numel());
    if (lo < hi) fill(p, lo - p.offset, hi - lo, out.flat_slice(lo - begin, hi - lo));
  }
}

// The rank's part [begin, begin + count) of `g`'s parameters, in a new buffer
// of `category`: filled through `fill` when given, else copied from the full
// buffer, which is released afterwards either way.
Tensor take_shard(const nn::FlatParamGroup& g, int64_t begin, int64_t count, MemCategory category,
                  const nn::ParamFill& fill) {
  Tensor shard = Tensor::empty(Shape{count}, g.dtype(), category);
  if (fill) {
    fill_flat(g, begin, count, shard, fill);
  } else {
    FD_CHECK(g.numel() == 0 || g.flat_params().storage()->resident(),
             "group '{}' holds no parameters and no ParamFill was given", g.name());
    shard.copy_from(g.flat_params().flat_slice(begin, count));
  }
  g.flat_params().storage()->release();
  return shard;
}

// Stages 0-2 keep all of `g`'s parameters: with `fill`, allocated (a
// deferred model's start released) and filled through it; without, they must
// be resident already.
void fill_all(const nn::FlatParamGroup& g, const nn::ParamFill& fill) {
  if (!fill) {
    FD_CHECK(g.numel() == 0 || g.flat_params().storage()->resident(),
             "group '{}' holds no parameters and no ParamFill was given", g.name());
    return;
  }
  g.flat_params().storage()->acquire();
  fill_flat(g, 0, g.numel(), g.flat_params(), fill);
}

}  // namespace

ZeroEngine::ZeroEngine(const nn::Module& model, dist::Communicator& comm, const ZeroConfig& c,
                       const nn::ParamFill& fill)
    : comm_(comm), config_(c) {
  FD_CHECK(c.stage >= 0 && c.stage <= 3, "ZeRO stage {}", c.stage);
  FD_CHECK(c.accumulation >= 1, "accumulation {}", c.accumulation);
  FD_CHECK(c.reductions_in_flight >= 1, "reductions in flight {}", c.reductions_in_flight);
  comm_.set_sum16(c.sum16);
  FD_CHECK(!c.offload.params || (c.stage == 3 && c.offload.optimizer),
           "parameter offload needs stage 3 and the optimizer offloaded");
  params_offloaded_ = c.offload.params;
  const int world = comm.size();
  std::vector<optim::AdamWShard> shards;
  const std::vector<const nn::FlatParamGroup*> frozen = model.frozen_groups();
  FD_CHECK(frozen.empty() || frozen.size() == model.groups().size(),
           "frozen groups must align with the trainable ones");
  for (const nn::FlatParamGroup* g : model.groups()) {
    FD_CHECK(g->dtype() != DType::kI32, "group '{}' is not floating point", g->name());
    // The padding this partition needs: the model is built with alignment only.
    g->pad_for(world);
    dtype_ = g->dtype();
    const bool mixed = g->dtype() != DType::kF32;
    Segment s;
    s.group = g;
    s.shard = g->numel() / world;
    if (!frozen.empty()) {
      s.frozen = frozen[segments_.size()];
      s.frozen->pad_for(world);
      if (c.stage >= 3) {
        const int64_t fs = s.frozen->numel() / world;
        // A 4-bit segment (QLoRA: bytes) is partitioned in that form, in its own category.
        const MemCategory shard_category =
            s.frozen->dtype() == DType::kU8 ? MemCategory::kQuantized : MemCategory::kFrozen;
        s.frozen_shard = take_shard(*s.frozen, int64_t(comm.rank()) * fs, fs, shard_category, fill);
      } else {
        fill_all(*s.frozen, fill);
      }
    }
    const int64_t begin = int64_t(comm.rank()) * s.shard;
    if (c.stage < 2 && !g->flat_grads().storage()->resident()) {  // a deferred model's
      g->flat_grads().storage()->acquire();
      g->zero_grads();
    }
    s.grad_shard_own = c.stage >= 2 || c.accumulation > 1;
    s.grad_shard = s.grad_shard_own ? Tensor::zeros(Shape{s.shard}, g->dtype(), MemCategory::kGrads)
                                    : g->flat_grads().flat_slice(begin, s.shard);
    if (c.stage >= 3) {
      s.param_shard = take_shard(*g, begin, s.shard, MemCategory::kParams, fill);
    } else {
      fill_all(*g, fill);
    }
    // What AdamW updates (fp32) and the compute-dtype copy it writes back;
    // offloaded, the master weights start in the optimizer's file instead.
    Tensor compute = c.stage == 0   ? g->flat_params()
                     : c.stage >= 3 ? s.param_shard
                                    : g->flat_params().flat_slice(begin, s.shard);
    if (mixed && !c.offload.optimizer) s.master = compute.to(DType::kF32, MemCategory::kMaster);
    if (c.stage >= 2) g->flat_grads().storage()->release();
    Tensor grads = c.stage == 0 ? g->flat_grads() : s.grad_shard;
    // Offloaded, the master weights live with the moments (16-bit runs, and
    // GPU runs, whose fp32 parameters are on the device), written back to
    // `compute` after each update.
    const bool master_offloaded =
        c.offload.optimizer && (mixed || compute.is_cuda() || c.offload.link != nullptr);
    optim::AdamWShard sh{g,
                         c.stage == 0 ? 0 : begin,
                         c.stage == 0 ? g->numel() : s.shard,
                         master_offloaded ? Tensor()
                         : mixed          ? s.master
                                          : compute,
                         grads,
                         mixed || master_offloaded ? compute : Tensor()};
    shards.push_back(std::move(sh));
    segments_.push_back(std::move(s));
  }
  node_ = dynamic_cast<dist::HierarchicalCommunicator*>(&comm);
  const bool node_collectives = c.hierarchical_partition || c.gradient_codes.bits != 0;
  FD_CHECK(c.stage == 3 || (!node_collectives && !c.quantized_weights),
           "ZeRO++ needs stage 3 (stage {})", c.stage);
  FD_CHECK(!node_collectives || node_ != nullptr,
           "hpZ and qgZ need a HierarchicalCommunicator as the engine's communicator");
  // Per rank, the largest gather: trainable (elements), a frozen base's (bytes), and of those
  // qwZ encodes (elements).
  int64_t largest = 0, largest_frozen = 0, largest_coded = 0;
  for (const Segment& s : segments_) {
    largest = std::max(largest, s.shard);
    if (s.frozen != nullptr)  // bytes: a 4-bit base's segments are bytes, its others 16-bit
      largest_frozen = std::max(largest_frozen,
                                s.frozen->numel() / world * int64_t(dtype_size(s.frozen->dtype())));
    if (s.frozen != nullptr && s.frozen->dtype() != DType::kU8)
      largest_coded = std::max(largest_coded, s.frozen->numel() / world);
  }
  largest_coded = std::max(largest_coded, largest);
  if (c.quantized_weights) {  // held from now on: no allocation per gather, one kComm figure
    const int64_t wb = dist::wire_bytes(largest_coded, kWeightCodes);
    const Device device = segments_.empty() ? Device::cpu() : segments_[0].grad_shard.device();
    weight_wire_ = Tensor::empty(Shape{std::max<int64_t>(int64_t(world) * wb, 1)}, DType::kU8,
                                 MemCategory::kComm, device);
  }
  if (node_ != nullptr) {  // the node collectives' staging, held from now on
    node_->reserve(largest, dtype_, c.gradient_codes);
    if (largest_frozen > 0) node_->reserve(largest_frozen, DType::kU8, {0, 0});
  }
  if (c.hierarchical_partition) {
    const int L = node_->local_size();
    const Device device = segments_.empty() ? Device::cpu() : segments_[0].grad_shard.device();
    for (Segment& s : segments_) {
      if (s.shard > 0)
        s.secondary = Tensor::empty(Shape{s.group->numel() / L}, s.group->dtype(),
                                    MemCategory::kParams, device);
      if (s.frozen != nullptr && s.frozen->numel() > 0)
        s.frozen_secondary = Tensor::empty(
            Shape{s.frozen->numel() / L}, s.frozen->dtype(),
            s.frozen->dtype() == DType::kU8 ? MemCategory::kQuantized : MemCategory::kFrozen,
            device);
    }
  }
  for (int g : c.checkpoint_segments) {
    FD_CHECK(g >= 0 && g < int(segments_.size()), "checkpoint segment {}", g);
    segments_[size_t(g)].checkpointed = true;
  }
  if (c.offload.optimizer) {
    const int file_rank = c.offload.file_rank >= 0 ? c.offload.file_rank : comm.rank();
    optim::AdamWOffload o;
    o.stream.path = c.offload.host ? std::string() : c.offload.optimizer_file(file_rank);
    o.stream.path_setting = c.offload.dir_setting;
    o.stream.buffer_bytes = c.offload.buffer_bytes;
    o.params_in_file = c.offload.params;
    o.link = c.offload.link;
    const Device device = segments_.empty() ? Device::cpu() : segments_[0].grad_shard.device();
    if (o.link == nullptr && (device.is_cuda() || (device.is_meta() && c.offload.gpu)))
      o.link = make_host_link(device, 2 * int(segments_.size()));
    optimizer_ = std::make_unique<optim::AdamW>(std::move(shards), c.adamw, o);
    // The partitions are in the file now: drop the copies setup filled.
    if (params_offloaded_)
      for (Segment& s : segments_) s.param_shard = Tensor();
    if (params_offloaded_ && !frozen.empty()) {
      // The frozen base too, in a file of its own: one field, written once.
      for (const nn::FlatParamGroup* f : frozen)
        FD_CHECK(f->dtype() == frozen[0]->dtype(),
                 "parameter offload of a base with segments of {} and {} (a 4-bit base is not "
                 "offloaded: the recipe refuses it)",
                 dtype_name(frozen[0]->dtype()), dtype_name(f->dtype()));
      std::vector<int64_t> lengths;
      for (const Segment& s : segments_) lengths.push_back(s.frozen_shard.numel());
      optim::StateStreamOptions fo;
      fo.path = c.offload.frozen_file(file_rank);
      fo.path_setting = c.offload.dir_setting;
      fo.buffer_bytes = std::min<int64_t>(c.offload.buffer_bytes, int64_t(3) << 20);
      fo.buffer_category = fo.staging_category = MemCategory::kFrozen;
      frozen_ =
          std::make_unique<optim::StateStream>(lengths, std::vector<DType>{frozen[0]->dtype()}, 0,
                                               fo, segments_[0].frozen_shard.device());
      frozen_->stream(
          0, frozen_->num_chunks(), optim::StateStream::Io::kWrite,
          [&](const optim::StateStream::Chunk& ch, const Tensor* f) {
            f[0].copy_from(segments_[ch.shard].frozen_shard.flat_slice(ch.begin, ch.count));
          });
      frozen_->commit(0);
      frozen_->release_buffers();  // only fetched from now on
      for (Segment& s : segments_) s.frozen_shard = Tensor();
    }
  } else {
    optimizer_ = std::make_unique<optim::AdamW>(std::move(shards), c.adamw);
  }
}

std::string OffloadConfig::optimizer_file(int rank) const {
  return fmt::format("{}/optimizer_rank_{:05d}.fdstate", dir, rank);
}

std::string OffloadConfig::frozen_file(int rank) const {
  return fmt::format("{}/frozen_rank_{:05d}.fdstate", dir, rank);
}

ZeroEngine::~ZeroEngine() {
  // Never leave a collective half-issued: complete what is in flight.
  for (Pending& p : pending_) p.work->wait();
  for (const dist::WorkPtr& w : ordered_) w->wait();
}

int64_t ZeroEngine::padded_params() const {
  int64_t n = 0;
  for (const Segment& s : segments_) n += s.group->numel();
  return n;
}

void ZeroEngine::pin_params(int g, Gather how) {
  Segment& s = segments_[size_t(g)];
  if (config_.stage < 3) return;
  if (s.param_pins++ > 0) return;
  const Tensor& full = s.group->flat_params();
  full.storage()->acquire();
  // hpZ: backward gathers the secondary partitions the forward kept, inside the node.
  const bool from_secondary = how == Gather::kBackward && s.secondary_current;
  if (s.shard > 0) {
    // Offloaded: read from the optimizer's file (or taken from the read
    // started when the previous segment was gathered), then read the next
    // segment in the direction of travel (forward: up, backward: down) ahead.
    const Tensor shard = params_offloaded_ ? optimizer_->fetch_params(size_t(g)) : s.param_shard;
    optimizer_->params_ready(size_t(g));  // host offload: after the shard's upload
    gather(shard, full, s.shard, s.secondary, how, from_secondary);
  }
  const int next = g + (g >= last_pinned_ ? 1 : -1);
  const bool prefetch = params_offloaded_ && next >= 0 && next < int(segments_.size());
  if (prefetch) optimizer_->prefetch_params(size_t(next));
  last_pinned_ = g;
  if (s.frozen != nullptr) {
    const Tensor& base = s.frozen->flat_params();
    base.storage()->acquire();
    const Tensor shard = frozen_ ? frozen_->fetch(size_t(g)) : s.frozen_shard;
    gather(shard, base, shard.numel(), s.frozen_secondary, how, from_secondary);
    if (frozen_ && prefetch) frozen_->prefetch(size_t(next));
  }
  if (config_.hierarchical_partition && how == Gather::kForward) s.secondary_current = true;
}

void ZeroEngine::gather(const Tensor& shard, const Tensor& full, int64_t count,
                        const Tensor& secondary, Gather how, bool from_secondary) {
  const DType dt = full.dtype();
  if (from_secondary && secondary.defined()) {
    node_->node_all_gather_async(secondary.comm_data(), full.comm_data(), secondary.numel(), dt)
        ->wait();
    return;
  }
  if (config_.quantized_weights && how != Gather::kExact && dt != DType::kU8 && count > 0) {
    // Every rank's codes side by side, this rank's encoded in place, then decoded in order
    // (weight_wire_ holds the largest segment's since construction).
    const int n = comm_.size();
    const int64_t wb = dist::wire_bytes(count, kWeightCodes);
    FD_CHECK(weight_wire_.numel() >= n * wb, "qwZ staging of {} bytes for {}", weight_wire_.numel(),
             n * wb);
    uint8_t* wire = static_cast<uint8_t*>(weight_wire_.comm_data());
    uint8_t* mine = wire != nullptr ? wire + comm_.rank() * wb : nullptr;
    if (wire != nullptr) dist::wire_encode(shard.comm_data(), dt, count, kWeightCodes, mine);
    comm_.all_gather(mine, wire, wb, DType::kU8);
    if (wire != nullptr) {
      uint8_t* out = static_cast<uint8_t*>(full.comm_data());
      for (int r = 0; r < n; ++r)
        dist::wire_decode(wire + r * wb, count, kWeightCodes, out + r * count * dtype_size(dt), dt);
    }
  } else {
    comm_.all_gather(shard.comm_data(), full.comm_data(), count, dt);
  }
  if (secondary.defined() && how == Gather::kForward)
    secondary.copy_from(
        full.flat_slice(node_->local_rank() * secondary.numel(), secondary.numel()));
}

ZeroEngine::SecondaryBytes ZeroEngine::secondary_partition_bytes() const {
  SecondaryBytes b;
  for (const Segment& s : segments_) {
    if (s.secondary.defined()) b.params += s.secondary.nbytes();
    if (s.frozen_secondary.defined())
      (s.frozen_secondary.dtype() == DType::kU8 ? b.quantized : b.frozen) +=
          s.frozen_secondary.nbytes();
  }
  return b;
}

void ZeroEngine::unpin_params(int g) {
  Segment& s = segments_[size_t(g)];
  if (config_.stage < 3) return;
  FD_CHECK(s.param_pins > 0, "unbalanced parameter release of segment {}", g);
  if (--s.param_pins == 0) {
    s.group->flat_params().storage()->release();
    if (s.frozen != nullptr) s.frozen->flat_params().storage()->release();
  }
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
      pin_params(g, Gather::kBackward);
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
  autograd::Variable y =
      autograd::segment(fn, x, std::move(hooks), segments_[size_t(g)].checkpointed, "zero_segment");
  unpin_params(g);
  if (!recording) {
    for (int a : also_needs) unpin_params(a);
  }
  return y;
}

void ZeroEngine::launch_reduce(int g) {
  Segment& s = segments_[size_t(g)];
  if (s.shard == 0) {  // nothing trains in this segment (a LoRA run's embedding, say)
    if (config_.stage >= 2) s.group->flat_grads().storage()->release();
    return;
  }
  if (config_.gradient_codes.bits != 0) {  // qgZ: no 16-bit sums to stage
    Pending p;
    p.segment = g;
    p.into_shard = micro_ == 0 && s.grad_shard_own;
    p.recv =
        p.into_shard ? s.grad_shard : Tensor::empty(Shape{s.shard}, dtype_, MemCategory::kComm);
    p.work =
        node_->quantized_reduce_scatter_async(s.group->flat_grads().comm_data(), p.recv.comm_data(),
                                              s.shard, dtype_, config_.gradient_codes);
    pending_.push_back(std::move(p));
    complete_beyond_limit();
    return;
  }
  if (!staging_kept_) {
    // Every reduction is one segment's reduce-scatter: from the first on, the
    // communicator keeps the staging of the largest (MPI's fp32 copies of
    // 16-bit gradients) instead of allocating one at each.
    int64_t largest = 0;
    for (const Segment& seg : segments_) largest = std::max(largest, seg.shard);
    comm_.keep_staging(dist::Collective::kReduceScatter, largest, dtype_);
    staging_kept_ = true;
  }
  Pending p;
  p.segment = g;
  p.into_shard = micro_ == 0 && s.grad_shard_own;
  p.recv = p.into_shard ? s.grad_shard : Tensor::empty(Shape{s.shard}, dtype_, MemCategory::kComm);
  const Tensor& full = s.group->flat_grads();
  p.work = comm_.reduce_scatter_async(full.comm_data(), p.recv.comm_data(), s.shard, dtype_);
  pending_.push_back(std::move(p));
  complete_beyond_limit();
}

void ZeroEngine::complete_beyond_limit() {
  // Bounds the transient gradient buckets of stages 2-3 while still
  // overlapping with backward; on a GPU the host does not block here.
  const size_t limit = config_.overlap_comm ? size_t(config_.reductions_in_flight) : 0;
  while (pending_.size() > limit) {
    complete(pending_.front());
    pending_.pop_front();
  }
}

void ZeroEngine::complete(Pending& p) {
  // Host backends: the reduction is complete; NCCL: later device work (the
  // add below, whatever reuses the buffers released here) waits for it.
  p.work->order_device_after();
  ordered_.push_back(p.work);
  Segment& s = segments_[size_t(p.segment)];
  if (!p.into_shard) {
    if (micro_ == 0) {
      s.grad_shard.copy_from(p.recv);
    } else {
      ops::add_(s.grad_shard, p.recv);
    }
  }
  if (config_.stage >= 2) s.group->flat_grads().storage()->release();
  // Host offload: the shard is final after the last micro-batch; its download
  // runs while backward goes on (stage 0 updates the full gradients, final
  // only after step()'s all-gather).
  if (config_.stage >= 1 && micro_ == config_.accumulation - 1 && optimizer_->device_shards())
    optimizer_->stage_grads(size_t(p.segment));
}

void ZeroEngine::settle_params() const {
  for (size_t i = 0; i < segments_.size(); ++i) optimizer_->params_ready(i);
}

void ZeroEngine::drain() {
  while (!pending_.empty()) {
    complete(pending_.front());
    pending_.pop_front();
  }
  // The host waits for every reduction here (and sees failures and timeouts).
  for (const dist::WorkPtr& w : ordered_) w->wait();
  ordered_.clear();
}

void ZeroEngine::end_micro_batch(int micro) {
  FD_CHECK(micro == micro_, "end_micro_batch({}) after begin_micro_batch({})", micro, micro_);
  drain();
  // Pins deferred to a segment whose backward never ran (nothing in it
  // trains: a LoRA run's frozen embedding) are dropped here.
  for (size_t g = 0; g < segments_.size(); ++g) {
    while (segments_[g].deferred_unpins > 0) {
      --segments_[g].deferred_unpins;
      unpin_params(int(g));
    }
  }
}

StepResult ZeroEngine::step(float lr, double loss_scale) {
  drain();
  StepResult r;
  std::vector<double>& per_segment = norm_partials_;  // kept: no allocation per step
  per_segment.clear();
  norm_whole_.clear();
  for (const Segment& s : segments_) {
    if (!norm_split_whole_) {
      per_segment.push_back(ops::sum_of_squares(s.grad_shard));
      continue;
    }
    // Parameter by parameter, over the part of it in this rank's shard.
    double split = 0.0, whole = 0.0;
    const int64_t begin = begin_of(s), end = begin + s.shard;
    for (const nn::Parameter& p : s.group->params()) {
      const int64_t a = std::max(begin, p.offset), b = std::min(end, p.offset + p.value.numel());
      if (a >= b) continue;
      (p.slice.whole() ? whole : split) +=
          ops::sum_of_squares(s.grad_shard.flat_slice(a - begin, b - a));
    }
    per_segment.push_back(split);
    norm_whole_.push_back(whole);
  }
  double sum = 0.0;
  if (norm_combine_) {
    sum = norm_combine_(per_segment, norm_whole_);
  } else {
    double partial = 0.0;
    for (double v : per_segment) partial += v;
    std::vector<double> partials(static_cast<size_t>(comm_.size()));
    comm_.all_gather_f64(&partial, partials.data(), 1);
    for (double v : partials) sum += v;  // rank order: identical on every rank
  }
  const double scaled_norm = std::sqrt(sum);
  r.grad_norm = scaled_norm / loss_scale;
  if (!std::isfinite(scaled_norm)) {
    r.skipped = true;
    optimizer_->forget_staged();
    return r;
  }
  // One factor removes the loss scale and clips (DeepSpeed's formula with a
  // scale; torch's clip_grad_norm_ without one), applied as AdamW reads the
  // gradients in fp32.
  float factor = 1.0f;
  const double max_norm = config_.grad_clip;
  if (loss_scale == 1.0) {
    if (max_norm > 0.0) {
      const float coef = float(max_norm / (scaled_norm + 1e-6));
      if (coef < 1.0f) factor = coef;
    }
  } else {
    const double clip = max_norm > 0.0 ? std::max((r.grad_norm + 1e-6) / max_norm, 1.0) : 1.0;
    factor = float(1.0 / (clip * loss_scale));
  }
  if (config_.stage == 0) {
    // Replicated update: gather every gradient shard into the full buffers.
    std::vector<dist::WorkPtr> works;
    for (const Segment& s : segments_) {
      if (s.shard == 0) continue;
      Tensor mine = s.group->flat_grads().flat_slice(begin_of(s), s.shard);
      if (s.grad_shard_own) mine.copy_from(s.grad_shard);
      works.push_back(comm_.all_gather_async(mine.comm_data(), s.group->flat_grads().comm_data(),
                                             s.shard, dtype_));
    }
    for (auto& w : works) w->wait();
  }
  // Stages 1-2: each segment's parameter all-gather starts as soon as its
  // shard is updated (and, offloaded to the host, uploaded), overlapping the
  // update of the next.
  std::vector<dist::WorkPtr> works;
  optim::AdamW::ShardDone gather;
  if (config_.stage == 1 || config_.stage == 2) {
    gather = [&](size_t i) {
      const Segment& s = segments_[i];
      if (s.shard == 0) return;
      optimizer_->params_ready(i);
      const Tensor& full = s.group->flat_params();
      works.push_back(comm_.all_gather_async(full.flat_slice(begin_of(s), s.shard).comm_data(),
                                             full.comm_data(), s.shard, dtype_));
    };
  }
  optimizer_->step(lr, factor, gather);
  for (auto& w : works) w->wait();
  for (Segment& s : segments_) s.secondary_current = false;  // hpZ: stale until the next forward
  // Stage 0's next forward reads the updated parameters directly; stage 3
  // orders each segment's gather after its upload (pin_params).
  if (config_.stage == 0) settle_params();
  return r;
}

std::vector<ZeroEngine::SegmentState> ZeroEngine::saved_state() const {
  settle_params();  // the saved parameters are read on the device
  std::vector<SegmentState> out;
  for (size_t i = 0; i < segments_.size(); ++i) {
    const Segment& s = segments_[i];
    if (s.shard == 0) continue;  // nothing trains here
    const int64_t begin = begin_of(s);
    // Stage 0 holds everything (AdamW shard i covers the whole group); others hold their range.
    const int64_t in_state = config_.stage == 0 ? begin : 0;
    SegmentState st;
    st.segment = s.group->name();
    st.segment_numel = s.group->numel();
    st.offset = begin;
    st.count = s.shard;
    Tensor compute =
        config_.stage >= 3 ? s.param_shard : s.group->flat_params().flat_slice(begin, s.shard);
    // fp32: the parameters are the master weights; store them once.
    const bool mixed = dtype_ != DType::kF32;
    st.params = mixed && compute.defined() ? compute : Tensor();
    if (mixed && params_offloaded_) st.stream_params = dtype_;  // streamed from the file
    if (optimizer_->offloaded()) {
      optim::AdamW* opt = optimizer_.get();
      const int64_t count = s.shard;
      st.stream = [opt, i, in_state, count](const SegmentState::PieceFn& fn) {
        opt->visit_state(i, in_state, count, fn);
      };
    } else {
      st.master = mixed ? s.master.flat_slice(in_state, s.shard) : compute;
      st.exp_avg = optimizer_->exp_avg(i).flat_slice(in_state, s.shard);
      st.exp_avg_sq = optimizer_->exp_avg_sq(i).flat_slice(in_state, s.shard);
    }
    out.push_back(std::move(st));
  }
  return out;
}

void ZeroEngine::load_state(const StateReader& read, int64_t optimizer_step) {
  FD_CHECK(pending_.empty(), "load_state with reductions in flight");
  for (size_t i = 0; i < segments_.size(); ++i) {
    Segment& s = segments_[i];
    if (s.shard == 0) continue;
    const std::string& name = s.group->name();
    // What this rank updates: everything (stage 0) or its range. The optimizer
    // rewrites the compute-dtype parameters from the master weights.
    const int64_t begin = config_.stage == 0 ? 0 : begin_of(s);
    optimizer_->fill_state(i, [&](int64_t offset, const Tensor& master, const Tensor& m,
                                  const Tensor& v, const Tensor&) {
      read(name, "master", begin + offset, master.numel(), master);
      read(name, "exp_avg", begin + offset, m.numel(), m);
      read(name, "exp_avg_sq", begin + offset, v.numel(), v);
    });
  }
  optimizer_->set_steps_taken(optimizer_step);
  for (Segment& s : segments_) s.secondary_current = false;
  // Make every rank's full parameters current again.
  if (config_.stage == 1 || config_.stage == 2) {
    for (const Segment& s : segments_) {
      if (s.shard == 0) continue;
      const Tensor& full = s.group->flat_params();
      comm_.all_gather(full.flat_slice(begin_of(s), s.shard).comm_data(), full.comm_data(), s.shard,
                       dtype_);
    }
  }
}

void ZeroEngine::acquire_all() {
  for (size_t g = 0; g < segments_.size(); ++g) {
    pin_params(int(g));
    ensure_grads(int(g));
  }
}

void ZeroEngine::reduce_all() {
  for (size_t g = 0; g < segments_.size(); ++g) {
    unpin_params(int(g));
    launch_reduce(int(g));
  }
}

void ZeroEngine::with_full_parameters(const std::function<void()>& fn) {
  // The parameters as they are: no codes (qwZ), so digests and exports are the shards' values.
  for (size_t g = 0; g < segments_.size(); ++g) pin_params(int(g), Gather::kExact);
  fn();
  for (size_t g = 0; g < segments_.size(); ++g) unpin_params(int(g));
}

}  // namespace fd::zero
