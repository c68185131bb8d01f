#include "lib/dist/mpi_communicator.h"

#include <fmt/format.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>
#include <vector>

#include "lib/base/check.h"
#include "lib/base/host_name.h"
#include "lib/base/log.h"
#include "lib/tensor/tensor.h"

namespace fd::dist {

using Clock = std::chrono::steady_clock;

namespace detail {
namespace {

int world_rank_or_minus_one() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin) return -1;
  int r = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

}  // namespace

void abort_job(int exit_code, const std::string& message) {
  static std::atomic<bool> aborting{false};
  if (aborting.exchange(true)) {
    for (;;) pause();  // another thread is already ending the job
  }
  const int r = world_rank_or_minus_one();
  std::string text =
      fmt::format("fdtrain: rank {} (host {}): {}\n", r < 0 ? 0 : r, host_name(), message);
  std::fputs(text.c_str(), stderr);
  std::fflush(stderr);
  log::write_file_only(log::Level::kError, message);  // RUN/logs/rank<r>.log, when open
  run_abort_hook(message);
  if (r >= 0) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

void mpi_failed(const char* call, int code, const char* file, int line) {
  char err[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(code, err, &len) != MPI_SUCCESS) std::snprintf(err, sizeof(err), "?");
  abort_job(1, fmt::format("MPI error in {} at {}:{}: {} (code {}); aborting the job", call, file,
                           line, err, code));
}

}  // namespace detail

namespace {

// Communicators alive, so that finalize() can shut them down before MPI_Finalize.
std::mutex g_live_mu;
std::set<MpiCommunicator*> g_live;

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::kF32:
      return MPI_FLOAT;
    case DType::kI32:
      return MPI_INT32_T;
    case DType::kU8:
      return MPI_UINT8_T;
    case DType::kBF16:
    case DType::kF16:
      return MPI_UINT16_T;  // moved as raw bits; sums are staged (fp32 copies, or added here)
  }
  return MPI_DATATYPE_NULL;
}

bool is_16bit(DType t) { return t == DType::kBF16 || t == DType::kF16; }

// The one tag of send_recv: with a single tag, MPI's non-overtaking rule
// matches a pair of ranks' messages in issue order.
constexpr int kSendRecvTag = 7;

int as_int_count(int64_t count, const char* what) {
  FD_CHECK(count >= 0 && count <= INT_MAX, "{}: count {} outside [0, INT_MAX] (MPI counts are int)",
           what, count);
  return int(count);
}

std::string human_bytes(int64_t b) {
  if (b >= (int64_t(1) << 30)) return fmt::format("{:.1f} GiB", double(b) / double(1 << 30));
  if (b >= (int64_t(1) << 20)) return fmt::format("{:.1f} MiB", double(b) / double(1 << 20));
  if (b >= (int64_t(1) << 10)) return fmt::format("{:.1f} KiB", double(b) / double(1 << 10));
  return fmt::format("{} B", b);
}

bool overlaps(const void* a, size_t na, const void* b, size_t nb) {
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return na > 0 && nb > 0 && pa < pb + nb && pb < pa + na;
}

// Whether this node has a core for every rank on it (Open MPI's
// OMPI_COMM_WORLD_LOCAL_SIZE against the online CPUs): false under mpirun
// --oversubscribe with more ranks than cores.
bool cores_to_spare() {
  const char* v = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const long local = v != nullptr ? std::strtol(v, nullptr, 10) : 1;
  return local >= 1 && local <= long(std::thread::hardware_concurrency());
}

// Host staging (MPI reads host memory), whatever the calling thread's default device.
Tensor comm_buffer(int64_t count, DType dtype = DType::kF32) {
  return Tensor::empty(Shape{count}, dtype, MemCategory::kComm, Device::cpu());
}

// Sum16::kNative: out = x_0 (+) x_1 (+) ... (+) x_{n-1}, folded from the left
// in rank order, where x_r is the r-th run of `count` 16-bit values at `in`
// and (+) widens both operands to fp32, adds (or takes the larger), and rounds
// to `dtype` with round-to-nearest-even, so that every partial sum is a 16-bit
// value, as in a 16-bit ring. (fp32 holds the sum of two bf16 or two fp16
// values exactly whenever the result can differ from the larger operand
// rounded, so each step is the correctly rounded 16-bit sum.)
void fold16(DType dtype, ReduceOp op, const uint16_t* in, int n, int64_t count, void* out) {
  constexpr int64_t kBlock = 1024;
  float acc[kBlock], x[kBlock];
  auto* o = static_cast<uint16_t*>(out);
  for (int64_t i = 0; i < count; i += kBlock) {
    const size_t m = size_t(std::min(kBlock, count - i));
    if (n == 1) {
      std::memcpy(o + i, in + i, m * sizeof(uint16_t));
      continue;
    }
    convert_to_f32(dtype, in + i, acc, m);
    for (int r = 1; r < n; ++r) {
      convert_to_f32(dtype, in + int64_t(r) * count + i, x, m);
      if (op == ReduceOp::kSum) {
        for (size_t j = 0; j < m; ++j) acc[j] += x[j];
      } else {
        for (size_t j = 0; j < m; ++j) acc[j] = x[j] > acc[j] ? x[j] : acc[j];
      }
      convert_f32_to(dtype, acc, o + i, m);  // the partial sum, rounded to 16 bits
      if (r + 1 < n) convert_to_f32(dtype, o + i, acc, m);
    }
  }
}

}  // namespace

// One queued op. Fields other than `done`/`error` (and split's new_comm) are
// written by the issuing thread before the op is queued and read by the comm
// thread after.
struct MpiCommunicator::Op {
  Collective kind = Collective::kBarrier;
  bool split = false;  // split(): MPI_Comm_split (kind unused)
  int64_t seq = 0;
  DType dtype = DType::kF32;
  ReduceOp reduce = ReduceOp::kSum;
  int root = 0;
  void* buf = nullptr;  // all_reduce / broadcast: in place
  const void* send = nullptr;
  void* recv = nullptr;
  int64_t count = 0;       // elements of buf, or per-rank elements (recv / send count)
  int64_t full_bytes = 0;  // the whole buffer (for diagnostics)
  bool in_place = false;   // all_gather with send == recv + rank*count
  // send_recv: `send`/`count` to `dst`, `recv`/`recv_count` from `src` (-1: no such half).
  int dst = -1, src = -1;
  int64_t recv_count = 0;
  // split: the arguments, and the new communicator (written by the comm thread).
  int color = 0, key = 0;
  MPI_Comm new_comm = MPI_COMM_NULL;
  Sum16 sum16 = Sum16::kFp32;  // 16-bit sums: the communicator's mode when the op was issued
  Tensor stage_in, stage_out;
  Tensor kept;  // the communicator's kept staging when the op was issued (keep_staging)
  MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};  // [1]: send_recv's receive

  // Guarded by State::mu.
  bool done = false;
  bool started = false;
  Clock::time_point start_time;
  std::exception_ptr error;
  std::atomic<bool> done_flag{false};
  std::atomic<int> waiters{0};  // threads blocked in its Work::wait()
};

struct MpiCommunicator::State {
  std::mutex mu;
  std::condition_variable work_cv;  // comm thread: new op or stop
  std::condition_variable done_cv;  // waiters: an op completed
  std::deque<std::shared_ptr<Op>> queue;
  bool stop = false;
  std::atomic<double> timeout_s{600.0};
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
  std::vector<int> world_ranks;  // of each rank here
  std::string label;             // "" for the world; "split(color c, key k)" for a split
  std::shared_ptr<CommStats> stats;
  Tensor kept;  // keep_staging()'s buffer, fp32 or 16-bit (issuing thread only)
  // "ranks 0-1 on host a, ranks 2-3 on host b" when the group spans hosts (nodes_changed; set
  // before any op is issued, read by the comm thread).
  std::string hosts;

  // "all_reduce #3 (4.0 KiB f32, sum)", "send_recv #2 (rank 0 of 2: send 4.0 MiB f32
  // to rank 1, receive nothing)"; on a split communicator also which one.
  std::string describe(const Op& op) const;

  [[noreturn]] void timeout_abort(const Op& op, double waited) {
    const bool p2p = !op.split && op.kind == Collective::kSendRecv;
    detail::abort_job(
        1, fmt::format("{} did not complete within {:g} s (waited {:.1f} s); a peer rank is likely "
                       "dead or stalled{}{}; aborting the job",
                       describe(op), timeout_s.load(), waited,
                       p2p ? ", or has not posted the matching send_recv" : "",
                       hosts.empty() ? ""
                                     : fmt::format(" (the group's ranks: {}; a host that "
                                                   "stopped answering takes all of its ranks)",
                                                   hosts)));
  }
  // An MPI call of `op` failed with `code` (MPI_ERR_IN_STATUS: see `statuses`).
  [[noreturn]] void op_failed(const Op& op, const char* call, int code, const MPI_Status* statuses);

  void start(Op& op);
  Tensor staging(const Op& op, int64_t at, int64_t n) const;  // see its definition
  void finish(Op& op, const MPI_Status* statuses);
  void run(Op& op);
  void thread_main();
};

std::string MpiCommunicator::State::describe(const Op& op) const {
  const std::string where =
      label.empty() ? std::string() : fmt::format(" on {} (rank {} of {})", label, rank, size);
  if (op.split)
    return fmt::format("split #{} (color {}, key {}){}", op.seq, op.color, op.key, where);
  switch (op.kind) {
    case Collective::kBarrier:
      return fmt::format("barrier #{}{}", op.seq, where);
    case Collective::kSendRecv: {
      auto peer = [&](int r) {
        return label.empty() ? fmt::format("rank {}", r)
                             : fmt::format("rank {} (world rank {})", r, world_ranks[size_t(r)]);
      };
      const size_t esize = dtype_size(op.dtype);
      const std::string send =
          op.dst < 0 ? "send nothing"
                     : fmt::format("send {} ({} {}) to {}", human_bytes(op.count * int64_t(esize)),
                                   op.count, dtype_name(op.dtype), peer(op.dst));
      const std::string recv = op.src < 0
                                   ? "receive nothing"
                                   : fmt::format("receive {} ({} {}) from {}",
                                                 human_bytes(op.recv_count * int64_t(esize)),
                                                 op.recv_count, dtype_name(op.dtype), peer(op.src));
      return fmt::format("send_recv #{} (rank {} of {}{}: {}, {})", op.seq, rank, size,
                         label.empty() ? "" : " on " + label, send, recv);
    }
    default:
      break;
  }
  std::string s = fmt::format("{} #{} ({} {}", collective_name(op.kind), op.seq,
                              human_bytes(op.full_bytes), dtype_name(op.dtype));
  if (op.kind == Collective::kAllReduce) s += fmt::format(", {}", reduce_op_name(op.reduce));
  if (op.kind == Collective::kBroadcast) s += fmt::format(", root {}", op.root);
  return s + ")" + where;
}

void MpiCommunicator::State::op_failed(const Op& op, const char* call, int code,
                                       const MPI_Status* statuses) {
  if (code == MPI_ERR_IN_STATUS && statuses != nullptr) {
    for (int i = 0; i < 2; ++i) {
      const int e = statuses[i].MPI_ERROR;
      if (e != MPI_SUCCESS && e != MPI_ERR_PENDING) {
        code = e;
        break;
      }
    }
  }
  char err[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(code, err, &len) != MPI_SUCCESS) std::snprintf(err, sizeof(err), "?");
  detail::abort_job(1, fmt::format("MPI error in {} during {}: {} (code {}); aborting the job",
                                   call, describe(op), err, code));
}

namespace {

class MpiWork final : public Work {
 public:
  MpiWork(std::shared_ptr<MpiCommunicator::Op> op, std::shared_ptr<MpiCommunicator::State> st)
      : op_(std::move(op)), st_(std::move(st)) {}

  bool is_completed() override { return op_->done_flag.load(std::memory_order_acquire); }

  void wait() override {
    if (!is_completed()) {
      const auto t0 = Clock::now();
      op_->waiters.fetch_add(1);
      struct Unwait {
        std::atomic<int>& w;
        ~Unwait() { w.fetch_sub(1); }
      } unwait{op_->waiters};
      std::unique_lock<std::mutex> lock(st_->mu);
      while (!op_->done) {
        st_->done_cv.wait_for(lock, std::chrono::milliseconds(100));
        // Backstop: the comm thread aborts first; this catches a wedged comm thread.
        const double timeout = st_->timeout_s.load();
        if (!op_->done && op_->started) {
          double ran = std::chrono::duration<double>(Clock::now() - op_->start_time).count();
          if (ran > timeout + 5.0) {
            lock.unlock();
            st_->timeout_abort(*op_, ran);
          }
        }
      }
      lock.unlock();
      st_->stats->wait_ns +=
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
    }
    if (op_->error) {
      std::exception_ptr e = op_->error;
      op_->error = nullptr;  // rethrow once
      std::rethrow_exception(e);
    }
  }

 private:
  std::shared_ptr<MpiCommunicator::Op> op_;
  std::shared_ptr<MpiCommunicator::State> st_;
};

}  // namespace

// `n` elements of op's staging (fp32; 16-bit with Sum16::kNative), from
// element `at`: within the kept buffer when it holds elements of that size
// and the whole of the op's staging fits there, else a buffer of its own.
Tensor MpiCommunicator::State::staging(const Op& op, int64_t at, int64_t n) const {
  const bool native = op.sum16 == Sum16::kNative;
  const DType dt = native ? op.dtype : DType::kF32;
  const int64_t need = native ? native16_staging_elements(op.kind, op.count, size)
                              : fp32_staging_elements(op.kind, op.count, size);
  if (op.kept.defined() && dtype_size(op.kept.dtype()) == dtype_size(dt) && op.kept.numel() >= need)
    return op.kept.flat_slice(at, n);
  return comm_buffer(n, dt);
}

void MpiCommunicator::State::start(Op& op) {
  if (op.split) {
    // MPI has no nonblocking split: a barrier, which can time out, first
    // brings every rank to it, so that the blocking split then cannot hang.
    FD_MPI_CHECK(MPI_Ibarrier(comm, &op.req[0]));
    return;
  }
  const size_t esize = dtype_size(op.dtype);
  switch (op.kind) {
    case Collective::kAllReduce: {
      const int n = as_int_count(op.count, "all_reduce");
      const MPI_Op mop = op.reduce == ReduceOp::kSum ? MPI_SUM : MPI_MAX;
      if (is_16bit(op.dtype) && op.sum16 == Sum16::kNative) {
        // Every rank's buffer, in rank order; summed on this thread when complete.
        as_int_count(op.count * size, "all_reduce (16-bit, every rank's)");
        op.stage_in = staging(op, 0, op.count * size);
        FD_MPI_CHECK(MPI_Iallgather(op.buf, n, MPI_UINT16_T, op.stage_in.raw(), n, MPI_UINT16_T,
                                    comm, &op.req[0]));
      } else if (is_16bit(op.dtype)) {
        op.stage_in = staging(op, 0, op.count);
        convert_to_f32(op.dtype, op.buf, op.stage_in.f32(), size_t(op.count));
        FD_MPI_CHECK(
            MPI_Iallreduce(MPI_IN_PLACE, op.stage_in.f32(), n, MPI_FLOAT, mop, comm, &op.req[0]));
      } else {
        FD_MPI_CHECK(
            MPI_Iallreduce(MPI_IN_PLACE, op.buf, n, mpi_type(op.dtype), mop, comm, &op.req[0]));
      }
      return;
    }
    case Collective::kReduceScatter: {
      const int n = as_int_count(op.count, "reduce_scatter");
      as_int_count(op.count * size, "reduce_scatter (total)");
      const void* send = op.send;
      void* recv = op.recv;
      MPI_Datatype type = mpi_type(op.dtype);
      if (is_16bit(op.dtype) && op.sum16 == Sum16::kNative) {
        // Chunk r of every rank, in rank order, to rank r; summed when complete.
        op.stage_in = staging(op, 0, op.count * size);
        FD_MPI_CHECK(MPI_Ialltoall(op.send, n, MPI_UINT16_T, op.stage_in.raw(), n, MPI_UINT16_T,
                                   comm, &op.req[0]));
        return;
      }
      if (is_16bit(op.dtype)) {
        op.stage_in = staging(op, 0, op.count * size);
        convert_to_f32(op.dtype, op.send, op.stage_in.f32(), size_t(op.count * size));
        op.stage_out = staging(op, op.count * size, op.count);
        send = op.stage_in.f32();
        recv = op.stage_out.f32();
        type = MPI_FLOAT;
      } else if (overlaps(op.send, size_t(op.count * size) * esize, op.recv,
                          size_t(op.count) * esize)) {
        op.stage_out = Tensor::empty(Shape{op.count}, op.dtype, MemCategory::kComm, Device::cpu());
        recv = op.stage_out.raw();
      }
      FD_MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, n, type, MPI_SUM, comm, &op.req[0]));
      return;
    }
    case Collective::kAllGather: {
      const int n = as_int_count(op.count, "all_gather");
      as_int_count(op.count * size, "all_gather (total)");
      const MPI_Datatype type = mpi_type(op.dtype);
      if (op.in_place) {
        FD_MPI_CHECK(MPI_Iallgather(MPI_IN_PLACE, 0, type, op.recv, n, type, comm, &op.req[0]));
      } else {
        FD_MPI_CHECK(MPI_Iallgather(op.send, n, type, op.recv, n, type, comm, &op.req[0]));
      }
      return;
    }
    case Collective::kAllToAll: {
      // Raw elements (16-bit as MPI_UINT16_T): nothing is summed.
      const int n = as_int_count(op.count, "all_to_all");
      const MPI_Datatype type = mpi_type(op.dtype);
      FD_MPI_CHECK(MPI_Ialltoall(op.send, n, type, op.recv, n, type, comm, &op.req[0]));
      return;
    }
    case Collective::kBroadcast: {
      const int n = as_int_count(op.count, "broadcast");
      FD_MPI_CHECK(MPI_Ibcast(op.buf, n, mpi_type(op.dtype), op.root, comm, &op.req[0]));
      return;
    }
    case Collective::kBarrier:
      FD_MPI_CHECK(MPI_Ibarrier(comm, &op.req[0]));
      return;
    case Collective::kSendRecv: {
      const MPI_Datatype type = mpi_type(op.dtype);
      if (op.src >= 0) {
        const int n = as_int_count(op.recv_count, "send_recv (receive)");
        int rc = MPI_Irecv(op.recv, n, type, op.src, kSendRecvTag, comm, &op.req[1]);
        if (rc != MPI_SUCCESS) op_failed(op, "MPI_Irecv", rc, nullptr);
      }
      if (op.dst >= 0) {
        const int n = as_int_count(op.count, "send_recv (send)");
        int rc = MPI_Isend(op.send, n, type, op.dst, kSendRecvTag, comm, &op.req[0]);
        if (rc != MPI_SUCCESS) op_failed(op, "MPI_Isend", rc, nullptr);
      }
      return;
    }
  }
}

void MpiCommunicator::State::finish(Op& op, const MPI_Status* statuses) {
  if (op.split) {
    FD_MPI_CHECK(MPI_Comm_split(comm, op.color, op.key, &op.new_comm));
    return;
  }
  switch (op.kind) {
    case Collective::kSendRecv:
      if (op.src >= 0) {
        int got = MPI_UNDEFINED;
        FD_MPI_CHECK(MPI_Get_count(&statuses[1], mpi_type(op.dtype), &got));
        if (got != op.recv_count)
          detail::abort_job(1, fmt::format("{}: rank {} sent {} elements, not {}: the two ranks "
                                           "disagree on the message size; aborting the job",
                                           describe(op), op.src, got, op.recv_count));
      }
      break;
    case Collective::kAllReduce:
      if (op.stage_in.defined() && op.sum16 == Sum16::kNative)
        fold16(op.dtype, op.reduce, static_cast<const uint16_t*>(op.stage_in.raw()), size, op.count,
               op.buf);
      else if (op.stage_in.defined())
        convert_f32_to(op.dtype, op.stage_in.f32(), op.buf, size_t(op.count));
      break;
    case Collective::kReduceScatter:
      if (is_16bit(op.dtype) && op.sum16 == Sum16::kNative) {
        fold16(op.dtype, ReduceOp::kSum, static_cast<const uint16_t*>(op.stage_in.raw()), size,
               op.count, op.recv);
      } else if (is_16bit(op.dtype)) {
        convert_f32_to(op.dtype, op.stage_out.f32(), op.recv, size_t(op.count));
      } else if (op.stage_out.defined()) {
        std::memcpy(op.recv, op.stage_out.raw(), op.stage_out.nbytes());
      }
      break;
    default:
      break;
  }
  op.stage_in = Tensor();
  op.stage_out = Tensor();
  op.kept = Tensor();
}

void MpiCommunicator::State::run(Op& op) {
  start(op);
  const auto t0 = Clock::now();
  // Spin briefly, then sleep 20 us doubling to 200 us between tests so that the
  // thread leaves the cores to the compute threads. While the caller waits
  // for this op (a pipeline stage for its neighbour's data, the engine for a
  // reduction), its core is idle: the thread polls without sleeping then,
  // unless the node runs more ranks than it has cores, where it naps 20 us
  // at most, so that the op's end reaches the caller within microseconds.
  constexpr auto kSpin = std::chrono::microseconds(50);
  constexpr auto kMaxNap = std::chrono::microseconds(200);
  constexpr auto kWaitedNap = std::chrono::microseconds(20);
  static const bool spare_cores = cores_to_spare();
  auto nap = std::chrono::microseconds(20);
  MPI_Status statuses[2] = {};
  for (;;) {
    int flag = 0;
    const int rc = MPI_Testall(2, op.req, &flag, statuses);
    if (rc != MPI_SUCCESS) op_failed(op, "MPI_Testall", rc, statuses);
    if (flag) break;
    const auto now = Clock::now();
    if (now - t0 < kSpin) {  // small ops finish within microseconds: poll without sleeping
      std::this_thread::yield();
      continue;
    }
    const double ran = std::chrono::duration<double>(now - t0).count();
    if (ran > timeout_s.load()) timeout_abort(op, ran);
    if (op.waiters.load(std::memory_order_relaxed) > 0) {
      if (spare_cores) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(kWaitedNap);
      }
      continue;
    }
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, kMaxNap);
  }
  finish(op, statuses);
}

void MpiCommunicator::State::thread_main() {
  for (;;) {
    std::shared_ptr<Op> op;
    {
      std::unique_lock<std::mutex> lock(mu);
      work_cv.wait(lock, [&] { return stop || !queue.empty(); });
      if (queue.empty()) return;  // stop requested and drained
      op = std::move(queue.front());
      queue.pop_front();
      op->started = true;
      op->start_time = Clock::now();
    }
    try {
      run(*op);
    } catch (...) {
      op->error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      op->done = true;
      op->done_flag.store(true, std::memory_order_release);
    }
    done_cv.notify_all();
  }
}

MpiCommunicator::MpiCommunicator() : state_(std::make_shared<State>()) {
  FD_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &state_->comm));
  begin();
}

MpiCommunicator::MpiCommunicator(std::shared_ptr<State> state) : state_(std::move(state)) {
  begin();
}

void MpiCommunicator::begin() {
  FD_MPI_CHECK(MPI_Comm_set_errhandler(state_->comm, MPI_ERRORS_RETURN));
  FD_MPI_CHECK(MPI_Comm_rank(state_->comm, &rank_));
  FD_MPI_CHECK(MPI_Comm_size(state_->comm, &size_));
  MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  FD_MPI_CHECK(MPI_Comm_group(state_->comm, &group));
  FD_MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world));
  std::vector<int> here(size_t(size_), 0);
  std::iota(here.begin(), here.end(), 0);
  state_->world_ranks.assign(size_t(size_), MPI_UNDEFINED);
  FD_MPI_CHECK(
      MPI_Group_translate_ranks(group, size_, here.data(), world, state_->world_ranks.data()));
  FD_MPI_CHECK(MPI_Group_free(&group));
  FD_MPI_CHECK(MPI_Group_free(&world));
  state_->rank = rank_;
  state_->size = size_;
  state_->stats = stats();
  thread_ = std::thread([st = state_] { st->thread_main(); });
  std::lock_guard<std::mutex> lock(g_live_mu);
  g_live.insert(this);
}

MpiCommunicator::~MpiCommunicator() {
  shutdown();
  std::lock_guard<std::mutex> lock(g_live_mu);
  g_live.erase(this);
}

void detail::shutdown_live_communicators() {
  std::set<MpiCommunicator*> live;
  {
    std::lock_guard<std::mutex> lock(g_live_mu);
    live = g_live;
  }
  for (MpiCommunicator* c : live) c->shutdown();
}

void MpiCommunicator::shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
  }
  state_->work_cv.notify_all();
  if (thread_.joinable()) thread_.join();
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin && state_->comm != MPI_COMM_NULL) FD_MPI_CHECK(MPI_Comm_free(&state_->comm));
}

WorkPtr MpiCommunicator::enqueue(std::shared_ptr<Op> op) {
  FD_CHECK(!shut_down_, "{} issued after the communicator was shut down", state_->describe(*op));
  op->seq = next_seq_++;
  auto work = std::make_shared<MpiWork>(op, state_);
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->queue.push_back(std::move(op));
  }
  state_->work_cv.notify_one();
  return work;
}

WorkPtr MpiCommunicator::all_reduce_async(void* buf, int64_t count, DType dtype, ReduceOp op) {
  auto o = std::make_shared<Op>();
  o->kind = Collective::kAllReduce;
  o->buf = buf;
  o->count = count;
  o->dtype = dtype;
  o->reduce = op;
  o->full_bytes = count * int64_t(dtype_size(dtype));
  o->sum16 = sum16();
  o->kept = state_->kept;
  as_int_count(count, "all_reduce");
  count_bytes(o->kind, o->full_bytes);
  return enqueue(std::move(o));
}

WorkPtr MpiCommunicator::reduce_scatter_async(const void* send, void* recv, int64_t recv_count,
                                              DType dtype) {
  auto o = std::make_shared<Op>();
  o->kind = Collective::kReduceScatter;
  o->send = send;
  o->recv = recv;
  o->count = recv_count;
  o->dtype = dtype;
  o->full_bytes = int64_t(size_) * recv_count * int64_t(dtype_size(dtype));
  o->sum16 = sum16();
  o->kept = state_->kept;
  as_int_count(recv_count * size_, "reduce_scatter (total)");
  count_bytes(o->kind, o->full_bytes);
  return enqueue(std::move(o));
}

void MpiCommunicator::keep_staging(Collective c, int64_t count, DType dtype) {
  if (!is_16bit(dtype)) return;
  const bool native = sum16() == Sum16::kNative;
  const int64_t need =
      native ? native16_staging_elements(c, count, size_) : fp32_staging_elements(c, count, size_);
  const DType dt = native ? dtype : DType::kF32;
  // Ops already queued keep the buffer they were issued with.
  Tensor& kept = state_->kept;
  if (need > 0 &&
      (!kept.defined() || dtype_size(kept.dtype()) != dtype_size(dt) || need > kept.numel()))
    kept = comm_buffer(need, dt);
}

WorkPtr MpiCommunicator::all_gather_async(const void* send, void* recv, int64_t send_count,
                                          DType dtype) {
  auto o = std::make_shared<Op>();
  const size_t esize = dtype_size(dtype);
  o->kind = Collective::kAllGather;
  o->send = send;
  o->recv = recv;
  o->count = send_count;
  o->dtype = dtype;
  o->full_bytes = int64_t(size_) * send_count * int64_t(esize);
  as_int_count(send_count * size_, "all_gather (total)");
  o->in_place = send == static_cast<const char*>(recv) + size_t(rank_) * size_t(send_count) * esize;
  FD_CHECK(o->in_place || !overlaps(send, size_t(send_count) * esize, recv, size_t(o->full_bytes)),
           "all_gather: send overlaps recv but is not recv + rank()*send_count");
  count_bytes(o->kind, o->full_bytes);
  return enqueue(std::move(o));
}

WorkPtr MpiCommunicator::all_to_all_async(const void* send, void* recv, int64_t count_per_rank,
                                          DType dtype) {
  check_all_to_all(send, recv, count_per_rank, dtype);
  as_int_count(count_per_rank, "all_to_all");
  auto o = std::make_shared<Op>();
  o->kind = Collective::kAllToAll;
  o->send = send;
  o->recv = recv;
  o->count = count_per_rank;
  o->dtype = dtype;
  o->full_bytes = int64_t(size_) * count_per_rank * int64_t(dtype_size(dtype));
  FD_CHECK(o->full_bytes == 0 || (send != nullptr && recv != nullptr),
           "all_to_all: a null buffer with {} elements per rank", count_per_rank);
  count_bytes(o->kind, o->full_bytes);
  return enqueue(std::move(o));
}

WorkPtr MpiCommunicator::broadcast_async(void* buf, int64_t count, DType dtype, int root) {
  FD_CHECK(root >= 0 && root < size_, "broadcast root {} outside [0, {})", root, size_);
  auto o = std::make_shared<Op>();
  o->kind = Collective::kBroadcast;
  o->buf = buf;
  o->count = count;
  o->dtype = dtype;
  o->root = root;
  o->full_bytes = count * int64_t(dtype_size(dtype));
  as_int_count(count, "broadcast");
  count_bytes(o->kind, o->full_bytes);
  return enqueue(std::move(o));
}

WorkPtr MpiCommunicator::barrier_async() {
  auto o = std::make_shared<Op>();
  o->kind = Collective::kBarrier;
  return enqueue(std::move(o));
}

void MpiCommunicator::nodes_changed() {
  std::vector<int> world_ranks = state_->world_ranks;
  if (world_ranks.empty())  // the world itself
    for (int r = 0; r < size_; ++r) world_ranks.push_back(r);
  state_->hosts = ranks_by_host(world_ranks);
}

void MpiCommunicator::name_changed() { state_->label = name(); }

WorkPtr MpiCommunicator::send_recv_async(const void* send, int64_t send_count, int dst, void* recv,
                                         int64_t recv_count, int src, DType dtype) {
  check_send_recv(send, send_count, dst, recv, recv_count, src, dtype);
  as_int_count(send_count, "send_recv (send)");
  as_int_count(recv_count, "send_recv (receive)");
  FD_CHECK((send_count == 0 || send != nullptr) && (recv_count == 0 || recv != nullptr),
           "send_recv: a null buffer with a non-zero count (send {}, receive {})", send_count,
           recv_count);
  count_bytes(Collective::kSendRecv, send_count * int64_t(dtype_size(dtype)), dst);
  if (send_count == 0 && recv_count == 0) return std::make_shared<CompletedWork>();
  auto o = std::make_shared<Op>();
  o->kind = Collective::kSendRecv;
  o->dtype = dtype;
  o->send = send;
  o->count = send_count;
  o->dst = send_count > 0 ? dst : -1;  // an empty half posts nothing
  o->recv = recv;
  o->recv_count = recv_count;
  o->src = recv_count > 0 ? src : -1;
  o->full_bytes = send_count * int64_t(dtype_size(dtype));
  return enqueue(std::move(o));
}

std::unique_ptr<Communicator> MpiCommunicator::split(const SplitPlan& plan) {
  const auto [color, key] = check_split(plan);
  auto o = std::make_shared<Op>();
  o->split = true;
  o->color = color;
  o->key = key;
  enqueue(o)->wait();  // the comm thread has written o->new_comm before `done`
  auto st = std::make_shared<State>();
  st->comm = o->new_comm;
  st->timeout_s = state_->timeout_s.load();
  st->label = fmt::format("split(color {}, key {})", color, key);
  if (!state_->label.empty()) st->label += " of " + state_->label;
  return std::unique_ptr<Communicator>(new MpiCommunicator(std::move(st)));
}

void MpiCommunicator::set_timeout(double seconds) {
  FD_CHECK(seconds > 0, "communicator timeout must be positive, got {}", seconds);
  state_->timeout_s = seconds;
}

void MpiCommunicator::abort(int exit_code, const std::string& message) {
  detail::abort_job(exit_code, message);
}

}  // namespace fd::dist
