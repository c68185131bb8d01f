#include "lib/dist/hierarchical_communicator.h"

#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>

#include "lib/base/check.h"
#include "lib/base/error.h"

namespace fd::dist {

// One thread running tasks in issue order; each task's Work completes when it has run. A Work
// may outlive the communicator (communicator.h): it shares the task and the lock, not the thread.
struct HierarchicalCommunicator::Worker {
  struct Sync {
    std::mutex mu;
    std::condition_variable work_cv, done_cv;
  };
  struct Task {
    std::function<void()> fn;
    bool done = false;  // under Sync::mu
    std::exception_ptr error;
  };

  class TaskWork final : public Work {
   public:
    TaskWork(std::shared_ptr<Sync> sync, std::shared_ptr<Task> t, std::shared_ptr<CommStats> stats)
        : sync_(std::move(sync)), t_(std::move(t)), stats_(std::move(stats)) {}
    bool is_completed() override {
      std::lock_guard<std::mutex> lock(sync_->mu);
      return t_->done;
    }
    void wait() override {
      const auto t0 = std::chrono::steady_clock::now();
      std::unique_lock<std::mutex> lock(sync_->mu);
      // No timeout of its own: the parts' Works, which the worker waits on, abort the job.
      sync_->done_cv.wait(lock, [&] { return t_->done; });
      lock.unlock();
      stats_->wait_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::steady_clock::now() - t0)
                             .count();
      if (t_->error) {
        std::exception_ptr e = t_->error;
        t_->error = nullptr;  // rethrow once
        std::rethrow_exception(e);
      }
    }

   private:
    std::shared_ptr<Sync> sync_;
    std::shared_ptr<Task> t_;
    std::shared_ptr<CommStats> stats_;
  };

  std::shared_ptr<Sync> sync = std::make_shared<Sync>();
  std::deque<std::shared_ptr<Task>> queue;  // under sync->mu
  bool stopping = false;                    // under sync->mu
  std::thread thread;

  Worker() : thread([this] { loop(); }) {}
  ~Worker() {
    {
      std::lock_guard<std::mutex> lock(sync->mu);
      stopping = true;
    }
    sync->work_cv.notify_all();
    thread.join();
  }

  void loop() {
    for (;;) {
      std::shared_ptr<Task> t;
      {
        std::unique_lock<std::mutex> lock(sync->mu);
        sync->work_cv.wait(lock, [&] { return stopping || !queue.empty(); });
        if (queue.empty()) return;  // stopping, and everything ran
        t = queue.front();
        queue.pop_front();
      }
      try {
        t->fn();
      } catch (...) {
        t->error = std::current_exception();
      }
      t->fn = nullptr;  // drop captures now
      {
        std::lock_guard<std::mutex> lock(sync->mu);
        t->done = true;
      }
      sync->done_cv.notify_all();
    }
  }
};

namespace {

// H and L of `flat`'s node layout, or a usage error naming it.
std::pair<int, int> node_layout(const Communicator& flat, const std::string& setting,
                                const std::vector<int>& world_ranks) {
  const int n = flat.size();
  const std::vector<int>& nodes = flat.nodes();
  if (nodes.empty() || n <= 1) return {1, n};
  const int h = flat.num_nodes(), l = n / h;
  bool regular = n % h == 0;
  for (int r = 0; regular && r < n; ++r) {
    regular = nodes[size_t(r)] == nodes[size_t(r / l * l)];
    if (regular && r % l == 0)
      for (int s = 0; s < r; s += l) regular = regular && nodes[size_t(s)] != nodes[size_t(r)];
  }
  if (!regular) {
    std::vector<int> ranks = world_ranks;
    if (int(ranks.size()) != n) {
      ranks.resize(static_cast<size_t>(n));
      std::iota(ranks.begin(), ranks.end(), 0);
    }
    throw Error(ErrorKind::kUsage,
                fmt::format("{}: node-aware collectives need every host to run the same number "
                            "of the data-parallel group's ranks, consecutively, but the group's "
                            "ranks are {}; launch with mpirun --map-by slot (or ppr:N:node) and "
                            "the same slot count on every host, or turn {} off",
                            setting, flat.ranks_by_host(ranks), setting));
  }
  return {h, l};
}

}  // namespace

std::unique_ptr<HierarchicalCommunicator> HierarchicalCommunicator::make(
    Communicator& flat, bool hierarchical, const std::string& setting,
    const std::vector<int>& world_ranks) {
  const auto [h, l] = node_layout(flat, setting, world_ranks);
  return std::unique_ptr<HierarchicalCommunicator>(
      new HierarchicalCommunicator(flat, hierarchical, h, l));
}

HierarchicalCommunicator::HierarchicalCommunicator(Communicator& flat, bool hierarchical, int nodes,
                                                   int local)
    : flat_(flat),
      hierarchical_(hierarchical),
      nodes_h_(nodes),
      local_l_(local),
      moves_data_(flat.backend() != "counting") {
  const int n = flat.size();
  whole_ = flat.split(SplitPlan::whole(n));
  intra_ = flat.split(SplitPlan::by(n, [local](int r) { return SplitKey{r / local, r % local}; }));
  inter_ = flat.split(SplitPlan::by(n, [local](int r) { return SplitKey{r % local, r / local}; }));
  for (Communicator* part : {whole_.get(), intra_.get(), inter_.get()}) {
    part->count_into(*this);
    part->join_family(flat);
  }
  if (!flat.nodes().empty()) {
    set_nodes(flat.nodes(), flat.node_names());
    // The parts' ranks' nodes, for their inside / across counts.
    const int me = flat.rank();
    std::vector<int> in(static_cast<size_t>(local)), across(static_cast<size_t>(nodes));
    for (int l = 0; l < local; ++l) in[size_t(l)] = flat.nodes()[size_t(me / local * local + l)];
    for (int h = 0; h < nodes; ++h)
      across[size_t(h)] = flat.nodes()[size_t(h * local + me % local)];
    whole_->set_nodes(flat.nodes(), flat.node_names());
    intra_->set_nodes(in, flat.node_names());
    inter_->set_nodes(across, flat.node_names());
  }
  worker_ = std::make_unique<Worker>();
}

HierarchicalCommunicator::~HierarchicalCommunicator() {
  worker_.reset();  // runs what is queued, then joins
}

WorkPtr HierarchicalCommunicator::enqueue(std::function<void()> task) {
  auto t = std::make_shared<Worker::Task>();
  t->fn = std::move(task);
  {
    std::lock_guard<std::mutex> lock(worker_->sync->mu);
    worker_->queue.push_back(t);
  }
  worker_->sync->work_cv.notify_one();
  return std::make_shared<Worker::TaskWork>(worker_->sync, std::move(t), stats());
}

uint8_t* HierarchicalCommunicator::scratch(int i, int64_t bytes) {
  if (scratch_.size() <= size_t(i)) scratch_.resize(size_t(i) + 1);
  Tensor& t = scratch_[size_t(i)];
  if (!t.defined() || t.numel() < bytes)
    t = Tensor::empty(Shape{std::max<int64_t>(bytes, 1)}, DType::kU8, MemCategory::kComm,
                      moves_data_ ? Device::cpu() : Device::meta());
  return static_cast<uint8_t*>(t.comm_data());
}

namespace {

// Copies `chunks` chunks of `bytes` from src to dst, chunk i of dst from chunk from(i) of src.
template <class From>
void permute_chunks(const uint8_t* src, uint8_t* dst, int chunks, int64_t bytes, From from) {
  if (src == nullptr || dst == nullptr) return;
  for (int i = 0; i < chunks; ++i)
    std::memcpy(dst + int64_t(i) * bytes, src + int64_t(from(i)) * bytes, size_t(bytes));
}

}  // namespace

// Staging: 0 the reordered send / gathered buffer (N chunks), 1 the intermediate (H chunks), 8 the
// partials received across nodes, 9-10 their fp32 sum and term (16-bit dtypes).
void HierarchicalCommunicator::do_reduce_scatter(const uint8_t* send, uint8_t* recv, int64_t count,
                                                 DType dtype, Sum16 mode) {
  const int H = nodes_h_, L = local_l_;
  const int64_t chunk = count * int64_t(dtype_size(dtype));
  uint8_t* a = scratch(0, int64_t(H) * L * chunk);
  uint8_t* b = scratch(1, int64_t(H) * chunk);
  // Block l' of a: the chunks of ranks h' * L + l', h' = 0..H-1.
  permute_chunks(send, a, H * L, chunk, [H, L](int i) { return (i % H) * L + i / H; });
  intra_->set_sum16(mode);
  intra_->reduce_scatter(a, b, int64_t(H) * count, dtype);
  // Across hosts: each host's partial of chunk h to host h (an all-to-all), summed here in host
  // order. MPI's reduce-scatter of few ranks reduces to one rank and scatters (1.5x the ring's
  // bytes at 2 ranks, measured on the hosts' links); the all-to-all sends exactly (H-1)/H.
  uint8_t* c = scratch(8, int64_t(H) * chunk);
  inter_->all_to_all(b, c, count, dtype);
  if (!moves_data_) return;
  if (dtype == DType::kF32) {
    float* out = reinterpret_cast<float*>(recv);
    const float* in = reinterpret_cast<const float*>(c);
    std::copy(in, in + count, out);
    for (int h = 1; h < H; ++h)
      for (int64_t i = 0; i < count; ++i) out[i] += in[int64_t(h) * count + i];
    return;
  }
  // 16-bit: widened and added in fp32, rounded once (Sum16::kFp32) or after every add (kNative,
  // as MpiCommunicator's native sums).
  float* acc = reinterpret_cast<float*>(scratch(9, count * 4));
  float* term = reinterpret_cast<float*>(scratch(10, count * 4));
  convert_to_f32(dtype, c, acc, size_t(count));
  for (int h = 1; h < H; ++h) {
    convert_to_f32(dtype, c + int64_t(h) * chunk, term, size_t(count));
    for (int64_t i = 0; i < count; ++i) acc[i] += term[i];
    if (mode == Sum16::kNative) {
      convert_f32_to(dtype, acc, recv, size_t(count));
      convert_to_f32(dtype, recv, acc, size_t(count));
    }
  }
  convert_f32_to(dtype, acc, recv, size_t(count));
}

void HierarchicalCommunicator::do_all_gather(const uint8_t* send, uint8_t* recv, int64_t count,
                                             DType dtype) {
  const int H = nodes_h_, L = local_l_;
  const int64_t chunk = count * int64_t(dtype_size(dtype));
  uint8_t* a = scratch(0, int64_t(H) * L * chunk);
  uint8_t* b = scratch(1, int64_t(H) * chunk);
  inter_->all_gather(send, b, count, dtype);
  intra_->all_gather(b, a, int64_t(H) * count, dtype);
  // a holds local rank l''s H chunks side by side: rank h * L + l at (l * H + h).
  permute_chunks(a, recv, H * L, chunk, [H, L](int r) { return (r % L) * H + r / L; });
}

void HierarchicalCommunicator::do_all_reduce(uint8_t* buf, int64_t count, DType dtype, Sum16 mode) {
  const int L = local_l_;
  const int64_t elem = int64_t(dtype_size(dtype));
  const int64_t slice = (count + L - 1) / L;  // per local rank, the buffer padded to L slices
  uint8_t* a = scratch(0, slice * L * elem);
  uint8_t* b = scratch(1, slice * elem);
  if (moves_data_) {
    std::memcpy(a, buf, size_t(count * elem));
    std::memset(a + count * elem, 0, size_t((slice * L - count) * elem));
  }
  intra_->set_sum16(mode);
  inter_->set_sum16(mode);
  intra_->reduce_scatter(a, b, slice, dtype);
  inter_->all_reduce(b, slice, dtype, ReduceOp::kSum);
  intra_->all_gather(b, a, slice, dtype);
  if (moves_data_) std::memcpy(buf, a, size_t(count * elem));
}

// Staging: 2 the codes sent inside the node, 3 those received, 4 the node's partial sums (fp32),
// 5 the codes sent across, 6 those received, 7 the total (fp32).
void HierarchicalCommunicator::do_quantized_reduce_scatter(const uint8_t* send, uint8_t* recv,
                                                           int64_t count, DType dtype,
                                                           const WireFormat& f) {
  const int H = nodes_h_, L = local_l_;
  const int64_t elem = int64_t(dtype_size(dtype)), wb = wire_bytes(count, f);
  float* partial = reinterpret_cast<float*>(scratch(4, int64_t(H) * count * 4));
  if (L == 1) {  // this rank is its node: its chunks are the node's partial, exact
    if (moves_data_)
      for (int h = 0; h < H; ++h)
        convert_to_f32(dtype, send + int64_t(h) * count * elem, partial + int64_t(h) * count,
                       size_t(count));
  } else {
    uint8_t* out = scratch(2, int64_t(L) * H * wb);
    uint8_t* in = scratch(3, int64_t(L) * H * wb);
    if (moves_data_)
      for (int l = 0; l < L; ++l)
        for (int h = 0; h < H; ++h)  // block l: chunks of ranks h * L + l, h = 0..H-1
          wire_encode(send + int64_t(h * L + l) * count * elem, dtype, count, f,
                      out + (int64_t(l) * H + h) * wb);
    intra_->all_to_all(out, in, int64_t(H) * wb, DType::kU8);
    if (moves_data_) {
      std::fill(partial, partial + int64_t(H) * count, 0.0f);
      for (int l = 0; l < L; ++l)  // local rank order
        for (int h = 0; h < H; ++h)
          wire_decode_add(in + (int64_t(l) * H + h) * wb, count, f, partial + int64_t(h) * count);
    }
  }
  if (H == 1) {
    if (moves_data_) convert_f32_to(dtype, partial, recv, size_t(count));
    return;
  }
  uint8_t* out = scratch(5, int64_t(H) * wb);
  uint8_t* in = scratch(6, int64_t(H) * wb);
  float* total = reinterpret_cast<float*>(scratch(7, count * 4));
  if (moves_data_)
    for (int h = 0; h < H; ++h)
      wire_encode(partial + int64_t(h) * count, DType::kF32, count, f, out + int64_t(h) * wb);
  inter_->all_to_all(out, in, wb, DType::kU8);
  if (moves_data_) {
    std::fill(total, total + count, 0.0f);
    for (int h = 0; h < H; ++h)
      wire_decode_add(in + int64_t(h) * wb, count, f, total);  // node order
    convert_f32_to(dtype, total, recv, size_t(count));
  }
}

WorkPtr HierarchicalCommunicator::all_reduce_async(void* buf, int64_t count, DType dtype,
                                                   ReduceOp op) {
  const Sum16 mode = sum16();
  const bool flat = !hierarchical_ || nodes_h_ == 1 || local_l_ == 1 || op != ReduceOp::kSum ||
                    dtype == DType::kI32 || dtype == DType::kU8;
  return enqueue([=, this] {
    if (flat) {
      whole_->set_sum16(mode);
      whole_->all_reduce(buf, count, dtype, op);
    } else {
      do_all_reduce(static_cast<uint8_t*>(buf), count, dtype, mode);
    }
  });
}

WorkPtr HierarchicalCommunicator::reduce_scatter_async(const void* send, void* recv,
                                                       int64_t recv_count, DType dtype) {
  const Sum16 mode = sum16();
  const bool flat = !hierarchical_ || nodes_h_ == 1 || local_l_ == 1 || dtype == DType::kI32 ||
                    dtype == DType::kU8;
  return enqueue([=, this] {
    if (flat) {
      whole_->set_sum16(mode);
      whole_->reduce_scatter(send, recv, recv_count, dtype);
    } else {
      do_reduce_scatter(static_cast<const uint8_t*>(send), static_cast<uint8_t*>(recv), recv_count,
                        dtype, mode);
    }
  });
}

WorkPtr HierarchicalCommunicator::all_gather_async(const void* send, void* recv, int64_t send_count,
                                                   DType dtype) {
  const bool flat = !hierarchical_ || nodes_h_ == 1 || local_l_ == 1;
  return enqueue([=, this] {
    if (flat) {
      whole_->all_gather(send, recv, send_count, dtype);
    } else {
      do_all_gather(static_cast<const uint8_t*>(send), static_cast<uint8_t*>(recv), send_count,
                    dtype);
    }
  });
}

WorkPtr HierarchicalCommunicator::all_to_all_async(const void* send, void* recv,
                                                   int64_t count_per_rank, DType dtype) {
  return enqueue([=, this] { whole_->all_to_all(send, recv, count_per_rank, dtype); });
}

WorkPtr HierarchicalCommunicator::broadcast_async(void* buf, int64_t count, DType dtype, int root) {
  return enqueue([=, this] { whole_->broadcast(buf, count, dtype, root); });
}

WorkPtr HierarchicalCommunicator::barrier_async() {
  return enqueue([this] { whole_->barrier(); });
}

WorkPtr HierarchicalCommunicator::send_recv_async(const void* send, int64_t send_count, int dst,
                                                  void* recv, int64_t recv_count, int src,
                                                  DType dtype) {
  return enqueue(
      [=, this] { whole_->send_recv(send, send_count, dst, recv, recv_count, src, dtype); });
}

WorkPtr HierarchicalCommunicator::node_all_gather_async(const void* send, void* recv,
                                                        int64_t send_count, DType dtype) {
  return enqueue([=, this] { intra_->all_gather(send, recv, send_count, dtype); });
}

WorkPtr HierarchicalCommunicator::quantized_reduce_scatter_async(const void* send, void* recv,
                                                                 int64_t recv_count, DType dtype,
                                                                 const WireFormat& format) {
  return enqueue([=, this] {
    do_quantized_reduce_scatter(static_cast<const uint8_t*>(send), static_cast<uint8_t*>(recv),
                                recv_count, dtype, format);
  });
}

void HierarchicalCommunicator::reserve(int64_t count, DType dtype, const WireFormat& codes) {
  enqueue([=, this] {
    const int H = nodes_h_, L = local_l_;
    const int64_t chunk = count * int64_t(dtype_size(dtype));
    if (hierarchical_ && H > 1 && L > 1) {  // do_reduce_scatter's and do_all_gather's
      scratch(0, int64_t(H) * L * chunk);
      scratch(1, int64_t(H) * chunk);
      scratch(8, int64_t(H) * chunk);
      if (dtype == DType::kBF16 || dtype == DType::kF16) {
        scratch(9, count * 4);
        scratch(10, count * 4);
      }
    }
    if (codes.bits != 0) {  // do_quantized_reduce_scatter's
      const int64_t wb = wire_bytes(count, codes);
      scratch(4, int64_t(H) * count * 4);
      if (L > 1) {
        scratch(2, int64_t(L) * H * wb);
        scratch(3, int64_t(L) * H * wb);
      }
      if (H > 1) {
        scratch(5, int64_t(H) * wb);
        scratch(6, int64_t(H) * wb);
        scratch(7, count * 4);
      }
    }
  })->wait();
}

void HierarchicalCommunicator::all_gather_f64(const double* send, double* recv,
                                              int64_t send_count) {
  enqueue([=, this] { whole_->all_gather_f64(send, recv, send_count); })->wait();
}

void HierarchicalCommunicator::keep_staging(Collective c, int64_t count, DType dtype) {
  enqueue([=, this] {
    const bool parts = hierarchical_ && nodes_h_ > 1 && local_l_ > 1;
    if (!parts || c != Collective::kReduceScatter) {
      whole_->set_sum16(sum16());
      whole_->keep_staging(c, count, dtype);
      return;
    }
    // The 16-bit sums' staging of the part that sums (inside the node); this communicator's
    // own buffers are reserve()'s.
    intra_->set_sum16(sum16());
    intra_->keep_staging(c, int64_t(nodes_h_) * count, dtype);
  })->wait();
}

std::unique_ptr<Communicator> HierarchicalCommunicator::split(const SplitPlan& plan) {
  std::unique_ptr<Communicator> out;
  enqueue([&] { out = whole_->split(plan); })->wait();
  return out;
}

void HierarchicalCommunicator::set_timeout(double seconds) {
  enqueue([=, this] {
    whole_->set_timeout(seconds);
    intra_->set_timeout(seconds);
    inter_->set_timeout(seconds);
  })->wait();
}

void HierarchicalCommunicator::abort(int exit_code, const std::string& message) {
  flat_.abort(exit_code, message);
  std::abort();  // not reached: flat's abort() ends the job
}

}  // namespace fd::dist
