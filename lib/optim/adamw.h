// AdamW over flat parameter shards (decoupled weight decay, as torch.optim.AdamW).
//
// The optimizer updates contiguous ranges of flat parameter groups: whole
// groups on one process, or the rank's ZeRO shard of each group. It owns fp32
// Adam moments m and v for exactly those ranges, and walks each range as a
// few contiguous runs of equal weight-decay setting (decay on 2-D weights;
// none on biases, norms and other 1-D tensors), so the update is one fused
// loop per run. Alignment padding inside a range is skipped.
//
// Offloaded (ZeRO-Infinity's NVMe tier): with an AdamWOffload the moments,
// and for mixed-precision shards the fp32 master weights too, live in a file
// (StateStream) and each step streams them through fixed-size chunk buffers:
// one fused pass per chunk reads master, m and v, updates them with the same
// arithmetic, writes them back and rewrites the 16-bit parameters. The update
// is elementwise, so the results are bitwise those of the resident optimizer.
//
// Device shards (ZeRO-Offload's host tier on a GPU; the NVMe tier on a GPU
// too): the state stays on the host and the device is reached through a
// HostLink (lib/tensor/host_link.h) with two host buffers the size of the
// rank's shards: gradients, and parameters in the compute dtype. The caller
// starts each shard's gradient download as soon as it is final
// (stage_grads, while backward goes on); step() waits for a shard's download
// before its first chunk, updates it on the CPU into the parameter buffer and
// starts its upload when its last chunk is done, so the upload of shard i
// overlaps the update of shard i+1; on_shard_done(i) then lets the caller
// launch what needs shard i (an all-gather), after params_ready(i), which
// orders later device work after the upload without blocking the CPU.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lib/nn/parameter.h"
#include "lib/optim/state_stream.h"
#include "lib/tensor/host_link.h"

namespace fd::optim {

struct AdamWOptions {
  float lr = 3e-4f;           // peak learning rate (the schedule scales it per step)
  float beta1 = 0.9f;         // first-moment decay
  float beta2 = 0.999f;       // second-moment decay
  float eps = 1e-8f;          // added to sqrt(v̂)
  float weight_decay = 0.0f;  // decoupled decay for parameters with decay = true
};

// Elements [begin, begin + count) of `group`'s flat space, with the tensors
// (count elements each) that hold their values and gradients.
struct AdamWShard {
  const nn::FlatParamGroup* group = nullptr;  // gives the parameters' layout and decay flags
  int64_t begin = 0;
  int64_t count = 0;
  Tensor params;          // fp32 values (the master weights), updated in place; offloaded
                          // mixed precision: undefined (the master weights live in the file,
                          // initialised from compute_params)
  Tensor grads;           // gradients in any float dtype (read as fp32)
  Tensor compute_params;  // optional: the 16-bit copy, rewritten from params after each update
                          // (round to nearest even)
};

// Where an offloaded optimizer keeps its state (StateStream).
struct AdamWOffload {
  StateStreamOptions stream;  // stream.path empty: host memory (GPU runs)
  // ZeRO-3 parameter offload: the parameters live in the file too (fp32: the
  // master weights are the parameters; 16-bit: their rounded copy, one more
  // field), rewritten by each step; the shards' compute_params are only read
  // at construction (the initial values) and not kept; fetch_params() reads
  // a shard's parameters back.
  bool params_in_file = false;
  // The shards' device, seen from the host (slots: twice the shards). Needed
  // for GPU shards; with CPU shards it emulates one (tests); on the counting
  // device it only accounts the buffers. Null: the shards are host memory.
  std::shared_ptr<HostLink> link;
};

class AdamW {
 public:
  explicit AdamW(std::vector<AdamWShard> shards, const AdamWOptions& options);
  // Offloaded: the state lives in offload.stream.path (created now, removed by
  // the destructor), on the shards' device's host side (CPU or meta).
  AdamW(std::vector<AdamWShard> shards, const AdamWOptions& options,
        const AdamWOffload& offload);
  ~AdamW();
  // Every element of every group (single process, or ZeRO stage 0).
  AdamW(const std::vector<const nn::FlatParamGroup*>& groups, const AdamWOptions& options);

  // One update of every shard at learning rate `lr` from its gradients times
  // grad_scale (clipping and loss-scale removal folded into the fp32 read).
  // on_shard_done(i), when given, is called as soon as shard i is updated
  // (in shard order; shards without elements are skipped).
  using ShardDone = std::function<void(size_t shard)>;
  void step(float lr, float grad_scale = 1.0f, const ShardDone& on_shard_done = {});
  // Device shards (AdamWOffload::link): starts copying shard i's gradients
  // (final now) down to the host; step() starts the copies not started.
  void stage_grads(size_t i);
  // Waits for the downloads started and forgets them (a skipped step).
  void forget_staged();
  // Device shards: device work queued from now on (a gather, a forward) sees
  // shard i's parameters as step() updated them. No-op otherwise.
  void params_ready(size_t i);
  bool device_shards() const { return link_ != nullptr; }
  int64_t steps_taken() const { return step_; }
  // Restores the step counter (bias correction) when resuming from a checkpoint.
  void set_steps_taken(int64_t steps);
  // The fp32 moments of shard i (in the order given to the constructor);
  // undefined when offloaded (use visit_state).
  const Tensor& exp_avg(size_t i) const { return state_[i].m; }
  const Tensor& exp_avg_sq(size_t i) const { return state_[i].v; }
  size_t num_shards() const { return state_.size(); }
  // Bytes of resident optimizer state (m and v; offloaded: the chunk buffers).
  int64_t state_bytes() const;

  bool offloaded() const { return stream_ != nullptr; }
  // AdamWOffload::params_in_file: shard i's parameters in the compute dtype,
  // in a staging buffer valid until the next fetch_params (read now unless
  // prefetch_params(i) started it); prefetch_params starts the read early.
  Tensor fetch_params(size_t i) { return stream_->fetch(i); }
  void prefetch_params(size_t i) { stream_->prefetch(i); }
  bool params_in_file() const { return params_in_file_; }
  // Offloaded: bytes of the staging buffers of fetch_params (0 otherwise).
  int64_t params_staging_bytes() const { return stream_ ? stream_->staging_bytes() : 0; }
  // Offloaded: the state file's size in bytes (0 when resident or in host memory).
  int64_t file_bytes() const {
    return stream_ && !stream_->in_host_memory() ? stream_->file_bytes() : 0;
  }
  // Offloaded to host memory: its bytes (0 otherwise).
  int64_t host_bytes() const { return stream_ ? stream_->host_bytes() : 0; }
  // Device shards: the link's host buffers (gradients and parameters of the
  // rank's shards; page-locked on a GPU), 0 otherwise.
  int64_t link_bytes() const;

  // The state of shard i, a piece at a time, resident or offloaded alike:
  // visit_state calls fn(offset, master, m, v, compute) for consecutive
  // pieces of elements [begin, begin + count) of the shard, offset relative
  // to begin, each tensor with the piece's length (host memory when
  // offloaded): master, m, v fp32; compute the 16-bit parameters when they
  // live in the file (AdamWOffload::params_in_file, 16-bit), else undefined.
  using StateFn = std::function<void(int64_t offset, const Tensor& master, const Tensor& m,
                                     const Tensor& v, const Tensor& compute)>;
  void visit_state(size_t i, int64_t begin, int64_t count, const StateFn& fn);
  // fill_state calls fn for consecutive pieces of the whole shard (compute
  // undefined); fn must fill master, m and v (a checkpoint's values); the
  // 16-bit compute copy, if any, is then rewritten from the master weights.
  void fill_state(size_t i, const StateFn& fn);

 private:
  struct Run {
    int64_t offset;  // relative to the shard's begin
    int64_t count;
    bool decay;
  };
  struct ShardState {
    AdamWShard shard;
    Tensor m, v;  // resident only
    std::vector<Run> runs;
  };
  // One fused update of elements [begin, begin + count) of shard i (master
  // weights, moments and the 16-bit copy if any: `count` elements starting there).
  void update(size_t i, int64_t begin, int64_t count, const Tensor& master, const Tensor& m,
              const Tensor& v, const Tensor& compute, float lr, float grad_scale) const;
  // Offloaded: the master weights of chunk or piece views (a field, or the
  // resident fp32 parameters), and the 16-bit copy to write (a field, the
  // resident copy, or none).
  Tensor master_of(const ShardState& s, const StateStream::Chunk& c, const Tensor* f) const;
  Tensor compute_of(const ShardState& s, const StateStream::Chunk& c, const Tensor* f) const;
  AdamW(std::vector<AdamWShard> shards, const AdamWOptions& options, const AdamWOffload* offload);
  AdamWOptions options_;
  std::vector<ShardState> state_;
  int64_t step_ = 0;
  std::unique_ptr<StateStream> stream_;  // offloaded state
  // Offloaded: the fields of the file (-1: not there).
  int master_field_ = -1, m_field_ = 0, v_field_ = 1, compute_field_ = -1;
  bool params_in_file_ = false;
  // Device shards: the link, its host buffers (shard i at offsets_[i]) and
  // which shards' downloads are started.
  Tensor host_grads_, host_params_;
  std::vector<int64_t> offsets_;
  std::vector<bool> staged_;
  std::shared_ptr<HostLink> link_;
  int slot_grads(size_t i) const { return int(i); }
  int slot_params(size_t i) const { return int(state_.size() + i); }
};

}  // namespace fd::optim
