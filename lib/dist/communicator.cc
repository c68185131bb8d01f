#include "lib/dist/communicator.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "lib/base/check.h"

namespace fd::dist {

namespace {
std::mutex g_hook_mu;
std::function<void(const std::string&)> g_abort_hook;
std::atomic<bool> g_hook_ran{false};
}  // namespace

void set_abort_hook(std::function<void(const std::string& message)> hook) {
  std::lock_guard<std::mutex> lock(g_hook_mu);
  g_abort_hook = std::move(hook);
}

void run_abort_hook(const std::string& message) {
  if (g_hook_ran.exchange(true)) return;
  std::function<void(const std::string&)> hook;
  {
    std::lock_guard<std::mutex> lock(g_hook_mu);
    hook = g_abort_hook;
  }
  if (!hook) return;
  try {
    hook(message);
  } catch (...) {
    // Ending the job matters more than the record of why.
  }
}

std::string_view reduce_op_name(ReduceOp op) { return op == ReduceOp::kSum ? "sum" : "max"; }

std::string_view collective_name(Collective c) {
  switch (c) {
    case Collective::kAllReduce:
      return "all_reduce";
    case Collective::kReduceScatter:
      return "reduce_scatter";
    case Collective::kAllGather:
      return "all_gather";
    case Collective::kBroadcast:
      return "broadcast";
    case Collective::kBarrier:
      return "barrier";
    case Collective::kSendRecv:
      return "send_recv";
    case Collective::kAllToAll:
      return "all_to_all";
  }
  return "?";
}

int64_t fp32_staging_elements(Collective c, int64_t count, int n) {
  if (n <= 1) return 0;
  switch (c) {
    case Collective::kAllReduce:
      return count;
    case Collective::kReduceScatter:
      return (int64_t(n) + 1) * count;
    default:
      return 0;
  }
}

std::string_view sum16_name(Sum16 s) { return s == Sum16::kFp32 ? "fp32" : "native"; }

int64_t native16_staging_elements(Collective c, int64_t count, int n) {
  if (n <= 1) return 0;
  switch (c) {
    case Collective::kAllReduce:
    case Collective::kReduceScatter:
      return int64_t(n) * count;
    default:
      return 0;
  }
}

int64_t sum16_staging_bytes(Collective c, int64_t count, int n, Sum16 mode) {
  return mode == Sum16::kFp32 ? 4 * fp32_staging_elements(c, count, n)
                              : 2 * native16_staging_elements(c, count, n);
}

int64_t ring_bytes_times_n(Collective c, int64_t full_bytes, int n) {
  FD_CHECK(n >= 1 && full_bytes >= 0, "ring_bytes_times_n: n={} bytes={}", n, full_bytes);
  switch (c) {
    case Collective::kAllReduce:
      return 2 * int64_t(n - 1) * full_bytes;
    case Collective::kReduceScatter:
    case Collective::kAllGather:
    case Collective::kBroadcast:
    case Collective::kAllToAll:
      return int64_t(n - 1) * full_bytes;
    case Collective::kBarrier:
      return 0;
    case Collective::kSendRecv:
      return int64_t(n) * full_bytes;  // exact: no model
  }
  return 0;
}

void Communicator::count_bytes(Collective c, int64_t full_bytes, int peer) {
  const int n = size();
  int64_t v = ring_bytes_times_n(c, full_bytes, n);
  if (control_scope_) {
    stats_->control_times_n += v;
    if (into_) into_->control_times_n += v / n * into_size_;
    return;
  }
  stats_->bytes_times_n += v;
  int64_t inter = 0;
  const auto family = [&] {
    family_->family_bytes += v / n;
    family_->family_inter += inter / n;
    if (into_) {
      into_->bytes_times_n += v / n * into_size_;
      into_->inter_times_n += inter / n * into_size_;
    }
  };
  if (nodes_.empty() || n <= 1 || v == 0) return family();
  const int me = rank(), node = nodes_[size_t(me)];
  switch (c) {
    case Collective::kSendRecv:
      inter = peer >= 0 && peer < n && nodes_[size_t(peer)] != node ? v : 0;
      break;
    case Collective::kAllToAll: {  // (n-1) blocks of S/n (times n: S each), one per other rank
      const int64_t others =
          std::count_if(nodes_.begin(), nodes_.end(), [&](int x) { return x != node; });
      inter = v / (n - 1) * others;
      break;
    }
    case Collective::kBarrier:
      break;
    default:  // a ring: everything to the successor
      inter = nodes_[size_t((me + 1) % n)] != node ? v : 0;
  }
  stats_->inter_times_n += inter;
  family();
}

int64_t Communicator::family_bytes() const { return stats_->family_bytes.load(); }
int64_t Communicator::family_inter_node_bytes() const { return stats_->family_inter.load(); }

void Communicator::reset_family_counters() {
  stats_->family_bytes = 0;
  stats_->family_inter = 0;
}

void Communicator::join_family(const Communicator& parent) { family_ = parent.family_; }

void Communicator::count_into(const Communicator& whole) {
  into_ = whole.stats_;
  into_size_ = whole.size();
}

void Communicator::set_nodes(std::vector<int> node_of_rank, std::vector<std::string> names) {
  FD_CHECK(node_of_rank.empty() || int(node_of_rank.size()) == size(),
           "set_nodes: {} node ids for {} ranks", node_of_rank.size(), size());
  for (int id : node_of_rank)
    FD_CHECK(id >= 0 && (names.empty() || id < int(names.size())), "set_nodes: node id {} of {}",
             id, names.size());
  nodes_ = std::move(node_of_rank);
  node_names_ = std::move(names);
  nodes_changed();
}

void Communicator::set_name(std::string name) {
  name_ = std::move(name);
  name_changed();
}

std::string Communicator::ranks_by_host(const std::vector<int>& world_ranks) const {
  if (nodes_.empty() || num_nodes() < 2 || int(world_ranks.size()) != size()) return {};
  // Per node in order of first appearance: its ranks as runs "a-b".
  std::vector<int> order;
  for (int id : nodes_)
    if (std::find(order.begin(), order.end(), id) == order.end()) order.push_back(id);
  std::string out;
  for (int id : order) {
    std::vector<int> ranks;
    for (int r = 0; r < size(); ++r)
      if (nodes_[size_t(r)] == id) ranks.push_back(world_ranks[size_t(r)]);
    std::string runs;
    for (size_t i = 0; i < ranks.size();) {
      size_t j = i;
      while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
      runs += (runs.empty() ? "" : ", ") +
              (j == i ? std::to_string(ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]));
      i = j + 1;
    }
    const std::string host =
        id < int(node_names_.size()) ? node_names_[size_t(id)] : fmt::format("node {}", id);
    out += fmt::format("{}rank{} {} on host {}", out.empty() ? "" : ", ",
                       ranks.size() == 1 ? "" : "s", runs, host);
  }
  return out;
}

int Communicator::num_nodes() const {
  if (nodes_.empty()) return 1;
  std::vector<int> ids = nodes_;
  std::sort(ids.begin(), ids.end());
  return int(std::unique(ids.begin(), ids.end()) - ids.begin());
}

int64_t Communicator::inter_node_bytes() const { return stats_->inter_times_n.load() / size(); }

void Communicator::count_control_bytes(Collective c, int64_t full_bytes) {
  const int64_t v = ring_bytes_times_n(c, full_bytes, size());
  stats_->control_times_n += v;
  if (into_) into_->control_times_n += v / size() * into_size_;
}

SplitPlan::SplitPlan(std::vector<SplitKey> of_rank) : of_rank_(std::move(of_rank)) {
  FD_CHECK(!of_rank_.empty(), "a split plan of no ranks");
  for (size_t r = 0; r < of_rank_.size(); ++r)
    FD_CHECK(of_rank_[r].color >= 0, "split: color {} of rank {} must be >= 0", of_rank_[r].color,
             r);
}

SplitPlan SplitPlan::by(int n, const std::function<SplitKey(int rank)>& key_of) {
  std::vector<SplitKey> keys(size_t(std::max(n, 0)));
  for (int r = 0; r < n; ++r) keys[size_t(r)] = key_of(r);
  return SplitPlan(std::move(keys));
}

SplitPlan SplitPlan::whole(int n) {
  return by(n, [](int r) { return SplitKey{0, r}; });
}

SplitPlan SplitPlan::each(int n) {
  return by(n, [](int r) { return SplitKey{r, 0}; });
}

const SplitKey& SplitPlan::of(int rank) const {
  FD_CHECK(rank >= 0 && rank < size(), "rank {} outside a split plan of {}", rank, size());
  return of_rank_[size_t(rank)];
}

int SplitPlan::group_size(int rank) const {
  const int color = of(rank).color;
  return int(std::count_if(of_rank_.begin(), of_rank_.end(),
                           [&](const SplitKey& k) { return k.color == color; }));
}

int SplitPlan::group_rank(int rank) const {
  const SplitKey me = of(rank);
  int before = 0;
  for (int q = 0; q < size(); ++q) {
    const SplitKey& k = of_rank_[size_t(q)];
    if (k.color == me.color && (k.key < me.key || (k.key == me.key && q < rank))) ++before;
  }
  return before;
}

const SplitKey& Communicator::check_split(const SplitPlan& plan) const {
  FD_CHECK(plan.size() == size(), "split: a plan of {} ranks for a communicator of {}", plan.size(),
           size());
  return plan.of(rank());
}

void Communicator::check_send_recv(const void* send, int64_t send_count, int dst, const void* recv,
                                   int64_t recv_count, int src, DType dtype) const {
  const int me = rank(), n = size();
  FD_CHECK(send_count >= 0 && recv_count >= 0, "send_recv: negative count (send {}, recv {})",
           send_count, recv_count);
  FD_CHECK(dst >= -1 && dst < n, "send_recv: dst rank {} outside [0, {}) (or -1 for none)", dst, n);
  FD_CHECK(src >= -1 && src < n, "send_recv: src rank {} outside [0, {}) (or -1 for none)", src, n);
  FD_CHECK(dst >= 0 || send_count == 0, "send_recv: {} elements to send but no dst (-1)",
           send_count);
  FD_CHECK(src >= 0 || recv_count == 0, "send_recv: {} elements to receive but no src (-1)",
           recv_count);
  FD_CHECK(dst != me || send_count == 0,
           "send_recv: rank {} of {} sends {} elements to itself; point-to-point needs a peer", me,
           n, send_count);
  FD_CHECK(src != me || recv_count == 0,
           "send_recv: rank {} of {} receives {} elements from itself; point-to-point needs a peer",
           me, n, recv_count);
  const auto s = reinterpret_cast<uintptr_t>(send), r = reinterpret_cast<uintptr_t>(recv);
  const uintptr_t sb = uintptr_t(send_count) * dtype_size(dtype);
  const uintptr_t rb = uintptr_t(recv_count) * dtype_size(dtype);
  FD_CHECK(send == nullptr || recv == nullptr || sb == 0 || rb == 0 || s + sb <= r || r + rb <= s,
           "send_recv: the send and recv buffers overlap");
}

void Communicator::check_all_to_all(const void* send, const void* recv, int64_t count_per_rank,
                                    DType dtype) const {
  FD_CHECK(count_per_rank >= 0, "all_to_all: negative count {}", count_per_rank);
  const auto s = reinterpret_cast<uintptr_t>(send), r = reinterpret_cast<uintptr_t>(recv);
  const uintptr_t bytes = uintptr_t(size()) * uintptr_t(count_per_rank) * dtype_size(dtype);
  FD_CHECK(send == nullptr || recv == nullptr || bytes == 0 || s + bytes <= r || r + bytes <= s,
           "all_to_all: the send and recv buffers overlap ({} bytes each)", bytes);
}

void Communicator::all_reduce(void* buf, int64_t count, DType dtype, ReduceOp op) {
  all_reduce_async(buf, count, dtype, op)->wait();
}
void Communicator::reduce_scatter(const void* send, void* recv, int64_t recv_count, DType dtype) {
  reduce_scatter_async(send, recv, recv_count, dtype)->wait();
}
void Communicator::all_gather(const void* send, void* recv, int64_t send_count, DType dtype) {
  all_gather_async(send, recv, send_count, dtype)->wait();
}
void Communicator::all_to_all(const void* send, void* recv, int64_t count_per_rank, DType dtype) {
  all_to_all_async(send, recv, count_per_rank, dtype)->wait();
}
void Communicator::broadcast(void* buf, int64_t count, DType dtype, int root) {
  broadcast_async(buf, count, dtype, root)->wait();
}
void Communicator::barrier() { barrier_async()->wait(); }
void Communicator::send(const void* buf, int64_t count, int dst, DType dtype) {
  send_recv_async(buf, count, dst, nullptr, 0, -1, dtype)->wait();
}
void Communicator::recv(void* buf, int64_t count, int src, DType dtype) {
  send_recv_async(nullptr, 0, -1, buf, count, src, dtype)->wait();
}
void Communicator::send_recv(const void* send, int64_t send_count, int dst, void* recv,
                             int64_t recv_count, int src, DType dtype) {
  send_recv_async(send, send_count, dst, recv, recv_count, src, dtype)->wait();
}

void Communicator::all_gather_f64(const double* send, double* recv, int64_t send_count) {
  // A double is moved as two i32 words: bitwise, no MPI_DOUBLE needed.
  control_scope_ = true;
  WorkPtr w;
  try {
    w = all_gather_async(send, recv, 2 * send_count, DType::kI32);
  } catch (...) {
    control_scope_ = false;
    throw;
  }
  control_scope_ = false;
  w->wait();
}

void Communicator::all_reduce_f64(double* buf, int64_t count, ReduceOp op) {
  const int n = size();
  std::vector<double> all(size_t(n) * size_t(count));
  all_gather_f64(buf, all.data(), count);
  for (int64_t i = 0; i < count; ++i) {
    double acc = all[size_t(i)];
    for (int r = 1; r < n; ++r) {
      double v = all[size_t(r) * size_t(count) + size_t(i)];
      if (op == ReduceOp::kSum) {
        acc += v;
      } else if (v > acc || v != v) {  // max that propagates NaN
        acc = v;
      }
    }
    buf[i] = acc;
  }
}

int64_t Communicator::bytes_sent() const { return stats_->bytes_times_n.load() / size(); }
int64_t Communicator::control_bytes() const { return stats_->control_times_n.load() / size(); }
double Communicator::wait_seconds() const { return double(stats_->wait_ns.load()) * 1e-9; }

void Communicator::reset_counters() {
  stats_->bytes_times_n = 0;
  stats_->inter_times_n = 0;
  stats_->control_times_n = 0;
  stats_->wait_ns = 0;
}

}  // namespace fd::dist
