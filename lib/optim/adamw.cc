#include "lib/optim/adamw.h"

#include <fmt/format.h>

#include <algorithm>

#include "lib/base/error.h"
#include "lib/ops/adamw.h"

namespace fd::optim {

AdamW::AdamW(std::vector<AdamWShard> shards, const AdamWOptions& options)
    : AdamW(std::move(shards), options, nullptr) {}

AdamW::AdamW(std::vector<AdamWShard> shards, const AdamWOptions& options,
             const AdamWOffload& offload)
    : AdamW(std::move(shards), options, &offload) {}

AdamW::AdamW(std::vector<AdamWShard> shards, const AdamWOptions& options,
             const AdamWOffload* offload)
    : options_(options) {
  std::vector<int64_t> lengths;
  int fields = 0;  // offloaded: 3 with master weights in the file, 2 without
  Device device = default_device();
  for (AdamWShard& sh : shards) {
    FD_CHECK(sh.group != nullptr && sh.begin >= 0 && sh.begin + sh.count <= sh.group->numel(),
             "bad AdamW shard [{}, {})", sh.begin, sh.begin + sh.count);
    const bool master_in_file = !sh.params.defined();
    FD_CHECK(!master_in_file || (offload != nullptr && sh.compute_params.defined()),
             "AdamW shard without master weights: only an offloaded mixed-precision shard, "
             "whose master weights start as its compute copy");
    FD_CHECK(master_in_file || sh.params.dtype() == DType::kF32, "AdamW updates fp32 (master) values");
    FD_CHECK(!sh.compute_params.defined() || sh.compute_params.numel() == sh.count,
             "compute copy of {} elements for a range of {}", sh.compute_params.numel(), sh.count);
    FD_CHECK((master_in_file || sh.params.numel() == sh.count) && sh.grads.numel() == sh.count,
             "AdamW shard tensors of {} / {} elements for a range of {}",
             master_in_file ? -1 : sh.params.numel(), sh.grads.numel(), sh.count);
    FD_CHECK(fields == 0 || fields == (master_in_file ? 3 : 2),
             "offloaded shards mix fp32 and 16-bit parameters");
    fields = master_in_file ? 3 : 2;
    device = sh.grads.device();
    ShardState s;
    if (offload == nullptr) {
      s.m = Tensor::zeros(Shape{sh.count}, DType::kF32, MemCategory::kOptimizer);
      s.v = Tensor::zeros(Shape{sh.count}, DType::kF32, MemCategory::kOptimizer);
    }
    const int64_t end = sh.begin + sh.count;
    for (const nn::Parameter& p : sh.group->params()) {
      int64_t lo = std::max(p.offset, sh.begin);
      int64_t hi = std::min(p.offset + p.value.numel(), end);
      if (lo >= hi) continue;
      Run r{lo - sh.begin, hi - lo, p.decay};
      if (!s.runs.empty() && s.runs.back().decay == r.decay &&
          s.runs.back().offset + s.runs.back().count == r.offset) {
        s.runs.back().count += r.count;  // contiguous with the previous run
      } else {
        s.runs.push_back(r);
      }
    }
    lengths.push_back(sh.count);
    s.shard = std::move(sh);
    state_.push_back(std::move(s));
  }
  if (offload == nullptr) return;
  // The file's fields: [master,] m, v[, the 16-bit parameters]. ZeRO-3 offload
  // of fp32 parameters keeps them as the master field.
  params_in_file_ = offload->params_in_file;
  std::vector<DType> types;
  const bool mixed = fields == 3;
  DType compute_dtype = DType::kF32;
  for (const ShardState& s : state_)
    if (s.shard.compute_params.defined()) compute_dtype = s.shard.compute_params.dtype();
  if (mixed || params_in_file_) {
    master_field_ = 0;
    types.push_back(DType::kF32);
  }
  m_field_ = int(types.size());
  types.push_back(DType::kF32);
  v_field_ = int(types.size());
  types.push_back(DType::kF32);
  int fetch = -1;
  if (params_in_file_) {
    if (mixed) {
      compute_field_ = int(types.size());
      types.push_back(compute_dtype);
    }
    fetch = mixed ? compute_field_ : master_field_;
  }
  stream_ = std::make_unique<StateStream>(lengths, types, fetch, offload->stream,
                                          device.is_meta() ? device : Device::cpu());
  // Device shards: gradients come down and parameters go up through the link.
  link_ = offload->link;
  FD_CHECK(link_ != nullptr || !device.is_cuda(),
           "GPU shards need a host link to an offloaded optimizer (AdamWOffload::link)");
  if (link_ != nullptr) {
    FD_CHECK(!params_in_file_, "device parameters cannot live in the optimizer's file");
    FD_CHECK(link_->slots() >= 2 * int(state_.size()), "a host link of {} slots for {} shards",
             link_->slots(), state_.size());
    int64_t total = 0;
    for (const ShardState& s : state_) {
      FD_CHECK(s.shard.compute_params.defined(),
               "a device shard's parameters must be given as its compute copy");
      offsets_.push_back(total);
      total += s.shard.count;
    }
    host_grads_ = link_->host_buffer(total, state_[0].shard.grads.dtype(), MemCategory::kOptimizer);
    host_params_ = link_->host_buffer(total, state_[0].shard.compute_params.dtype(),
                                      MemCategory::kOptimizer);
    staged_.assign(state_.size(), false);
    // Uploads write whole shards, alignment padding included, which no update
    // touches: it starts as the device's.
    if (!device.is_meta())
      for (size_t i = 0; i < state_.size(); ++i)
        host_params_.flat_slice(offsets_[i], state_[i].shard.count)
            .copy_from(state_[i].shard.compute_params);
  }
  // The file starts as the resident optimizer does: master = the parameters, m = v = 0.
  for (size_t i = 0; i < state_.size(); ++i) {
    ShardState& st = state_[i];
    const Tensor initial = params_in_file_ && !mixed ? st.shard.params : st.shard.compute_params;
    if (params_in_file_ && !mixed) st.shard.params = Tensor();  // the master field holds them
    fill_state(i, [&](int64_t offset, const Tensor& master, const Tensor& m, const Tensor& v,
                      const Tensor&) {
      if (master_field_ >= 0) master.copy_from(initial.flat_slice(offset, m.numel()));
      m.zero_();
      v.zero_();
    });
    if (params_in_file_) st.shard.compute_params = Tensor();  // the file holds them now
  }
  stream_->commit(0);
}

AdamW::~AdamW() {
  if (link_ == nullptr) return;
  // Copies in flight read or write the host buffers freed with this object.
  try {
    for (int i = 0; i < 2 * int(state_.size()); ++i) link_->wait(i);
  } catch (const std::exception&) {  // a failed device: nothing left to protect
  }
}

namespace {
std::vector<AdamWShard> whole_groups(const std::vector<const nn::FlatParamGroup*>& groups) {
  std::vector<AdamWShard> shards;
  for (const nn::FlatParamGroup* g : groups)
    shards.push_back({g, 0, g->numel(), g->flat_params(), g->flat_grads(), Tensor()});
  return shards;
}
}  // namespace

AdamW::AdamW(const std::vector<const nn::FlatParamGroup*>& groups, const AdamWOptions& options)
    : AdamW(whole_groups(groups), options) {}

void AdamW::update(size_t i, int64_t begin, int64_t count, const Tensor& master, const Tensor& m,
                   const Tensor& v, const Tensor& compute, float lr, float grad_scale) const {
  // Device shards: the gradients as downloaded, the parameters into the
  // upload buffer.
  const ShardState& s = state_[i];
  const Tensor grads = link_ ? host_grads_.flat_slice(offsets_[i] + begin, count)
                             : s.shard.grads.flat_slice(begin, count);
  const Tensor out = link_ ? host_params_.flat_slice(offsets_[i] + begin, count) : compute;
  for (const Run& r : s.runs) {
    const int64_t lo = std::max(r.offset, begin), hi = std::min(r.offset + r.count, begin + count);
    if (lo >= hi) continue;
    ops::AdamWStep hp{lr, options_.beta1, options_.beta2, options_.eps,
                      r.decay ? options_.weight_decay : 0.0f, step_};
    ops::adamw_update(master, grads, grad_scale, m, v, out, lo - begin, hi - lo, hp);
  }
}

void AdamW::stage_grads(size_t i) {
  FD_CHECK(link_ != nullptr && i < state_.size(), "stage_grads({}) without device shards", i);
  const AdamWShard& sh = state_[i].shard;
  if (sh.count > 0) link_->copy(slot_grads(i), host_grads_.flat_slice(offsets_[i], sh.count), sh.grads);
  staged_[i] = true;
}

void AdamW::forget_staged() {
  if (link_ == nullptr) return;
  for (size_t i = 0; i < state_.size(); ++i) link_->wait(slot_grads(i));
  staged_.assign(state_.size(), false);
}

void AdamW::params_ready(size_t i) {
  if (link_ != nullptr) link_->order(slot_params(i));
}

int64_t AdamW::link_bytes() const {
  int64_t b = 0;
  for (const Tensor* t : {&host_grads_, &host_params_})
    if (t->defined()) b += int64_t(t->storage()->bytes());
  return b;
}

Tensor AdamW::master_of(const ShardState& s, const StateStream::Chunk& c, const Tensor* f) const {
  return master_field_ >= 0 ? f[master_field_] : s.shard.params.flat_slice(c.begin, c.count);
}

Tensor AdamW::compute_of(const ShardState& s, const StateStream::Chunk& c, const Tensor* f) const {
  if (compute_field_ >= 0) return f[compute_field_];
  if (s.shard.compute_params.defined()) return s.shard.compute_params.flat_slice(c.begin, c.count);
  return Tensor();
}

void AdamW::step(float lr, float grad_scale, const ShardDone& on_shard_done) {
  if (link_ != nullptr)
    for (size_t i = 0; i < state_.size(); ++i)
      if (!staged_[i]) stage_grads(i);
  // Device shards: a shard's gradients must be down, and its previous upload
  // out of the parameter buffer, before its first chunk; its upload starts
  // after its last.
  auto begin_shard = [&](size_t i) {
    if (link_ == nullptr) return;
    link_->wait(slot_grads(i));
    link_->wait(slot_params(i));
  };
  auto end_shard = [&](size_t i) {
    const AdamWShard& sh = state_[i].shard;
    if (link_ != nullptr)
      link_->copy(slot_params(i), sh.compute_params, host_params_.flat_slice(offsets_[i], sh.count));
    if (on_shard_done) on_shard_done(i);
  };
  if (stream_ == nullptr) {
    ++step_;
    for (size_t i = 0; i < state_.size(); ++i) {
      const ShardState& s = state_[i];
      if (s.shard.count == 0) continue;
      update(i, 0, s.shard.count, s.shard.params, s.m, s.v, s.shard.compute_params, lr, grad_scale);
      end_shard(i);
    }
    return;
  }
  try {
    stream_->check(step_);  // the file holds the state after the previous step
    ++step_;
    stream_->stream(0, stream_->num_chunks(), StateStream::Io::kReadWrite,
                    [&](const StateStream::Chunk& c, const Tensor* f) {
                      const ShardState& s = state_[c.shard];
                      if (c.begin == 0) begin_shard(c.shard);
                      update(c.shard, c.begin, c.count, master_of(s, c, f), f[m_field_],
                             f[v_field_], compute_of(s, c, f), lr, grad_scale);
                      if (c.begin + c.count == s.shard.count) end_shard(c.shard);
                    });
    stream_->commit(step_);
    if (link_ != nullptr) staged_.assign(state_.size(), false);
  } catch (const Error& e) {
    // Half the state may be updated: this run cannot go on, its checkpoints can.
    const std::string what = e.what();
    if (what.find("--resume auto") != std::string::npos)
      throw Error(e.kind(), fmt::format("optimizer step {}: {}", step_, what));
    throw Error(e.kind(), fmt::format("optimizer step {}: {}; the update was left half done, so "
                                      "the run stops here: resume from the last checkpoint "
                                      "(fdtrain train RECIPE --resume auto)",
                                      step_, what));
  }
}

void AdamW::set_steps_taken(int64_t steps) {
  step_ = steps;
  if (stream_) stream_->commit(steps);
}

void AdamW::visit_state(size_t i, int64_t begin, int64_t count, const StateFn& fn) {
  const ShardState& s = state_[i];
  FD_CHECK(begin >= 0 && count >= 0 && begin + count <= s.shard.count,
           "state range [{}, {}) of a shard of {}", begin, begin + count, s.shard.count);
  if (stream_ == nullptr) {
    fn(0, s.shard.params.flat_slice(begin, count), s.m.flat_slice(begin, count),
       s.v.flat_slice(begin, count), Tensor());
    return;
  }
  // The shard's chunks that overlap the range.
  stream_->stream(stream_->first_chunk(i), stream_->end_chunk(i), StateStream::Io::kRead,
                  [&](const StateStream::Chunk& c, const Tensor* f) {
                    const int64_t lo = std::max(c.begin, begin);
                    const int64_t hi = std::min(c.begin + c.count, begin + count);
                    if (lo >= hi) return;
                    fn(lo - begin, master_of(s, c, f).flat_slice(lo - c.begin, hi - lo),
                       f[m_field_].flat_slice(lo - c.begin, hi - lo),
                       f[v_field_].flat_slice(lo - c.begin, hi - lo),
                       compute_field_ >= 0 ? f[compute_field_].flat_slice(lo - c.begin, hi - lo)
                                           : Tensor());
                  });
}

void AdamW::fill_state(size_t i, const StateFn& fn) {
  const ShardState& s = state_[i];
  if (link_ != nullptr) link_->wait(slot_params(i));  // an upload in flight would overwrite
  if (stream_ == nullptr) {
    fn(0, s.shard.params, s.m, s.v, Tensor());
    if (s.shard.compute_params.defined())
      s.shard.compute_params.copy_from(s.shard.params);  // round to the compute dtype
    return;
  }
  // Device shards: the compute copy goes through the upload buffer, as in step().
  stream_->stream(stream_->first_chunk(i), stream_->end_chunk(i), StateStream::Io::kWrite,
                  [&](const StateStream::Chunk& c, const Tensor* f) {
                    const Tensor master = master_of(s, c, f);
                    fn(c.begin, master, f[m_field_], f[v_field_], Tensor());
                    const Tensor compute = link_ ? host_params_.flat_slice(offsets_[i] + c.begin, c.count)
                                                 : compute_of(s, c, f);
                    if (compute.defined() && master_field_ >= 0) compute.copy_from(master);
                  });
  if (link_ != nullptr) {
    link_->copy(slot_params(i), s.shard.compute_params,
                host_params_.flat_slice(offsets_[i], s.shard.count));
    link_->wait(slot_params(i));
  }
}

int64_t AdamW::state_bytes() const {
  if (stream_) return stream_->buffer_bytes() + stream_->host_bytes() + link_bytes();
  int64_t b = 0;
  for (const ShardState& s : state_) b += int64_t(s.m.nbytes() + s.v.nbytes());
  return b;
}

}  // namespace fd::optim
