#include "lib/dist/mpi_communicator.h"

#include <fmt/format.h>
#include <mpi.h>
#include <unistd.h>

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
#include <set>

#include "lib/base/check.h"
#include "lib/base/log.h"
#include "lib/tensor/tensor.h"

namespace fd::dist {

using Clock = std::chrono::steady_clock;

namespace detail {
namespace {

std::string host_name() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) return "?";
  return host;
}

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
    case DType::kBF16:
    case DType::kF16:
      return MPI_UINT16_T;  // moved as raw bits; reductions are staged in fp32
  }
  return MPI_DATATYPE_NULL;
}

bool is_16bit(DType t) { return t == DType::kBF16 || t == DType::kF16; }

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

// Host staging (MPI reads host memory), whatever the calling thread's default device.
Tensor comm_buffer(int64_t count) {
  return Tensor::empty(Shape{count}, DType::kF32, MemCategory::kComm, Device::cpu());
}

}  // namespace

// One queued collective. Fields other than `done`/`error` are written by the
// issuing thread before the op is queued and read by the comm thread after.
struct MpiCommunicator::Op {
  Collective kind = Collective::kBarrier;
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
  Tensor stage_in, stage_out;
  MPI_Request req = MPI_REQUEST_NULL;

  // Guarded by State::mu.
  bool done = false;
  bool started = false;
  Clock::time_point start_time;
  std::exception_ptr error;
  std::atomic<bool> done_flag{false};

  std::string describe() const {
    std::string s = fmt::format("{} #{} ({} {}", collective_name(kind), seq,
                                human_bytes(full_bytes), dtype_name(dtype));
    if (kind == Collective::kAllReduce) s += fmt::format(", {}", reduce_op_name(reduce));
    if (kind == Collective::kBroadcast) s += fmt::format(", root {}", root);
    if (kind == Collective::kBarrier) return fmt::format("barrier #{}", seq);
    return s + ")";
  }
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
  std::shared_ptr<CommStats> stats;

  [[noreturn]] void timeout_abort(const Op& op, double waited) {
    detail::abort_job(
        1, fmt::format("{} did not complete within {:g} s (waited {:.1f} s); a peer rank is likely "
                       "dead or stalled; aborting the job",
                       op.describe(), timeout_s.load(), waited));
  }

  void start(Op& op);
  void finish(Op& op);
  void run(Op& op);
  void thread_main();
};

namespace {

class MpiWork final : public Work {
 public:
  MpiWork(std::shared_ptr<MpiCommunicator::Op> op, std::shared_ptr<MpiCommunicator::State> st)
      : op_(std::move(op)), st_(std::move(st)) {}

  bool is_completed() override { return op_->done_flag.load(std::memory_order_acquire); }

  void wait() override {
    if (!is_completed()) {
      const auto t0 = Clock::now();
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

void MpiCommunicator::State::start(Op& op) {
  const size_t esize = dtype_size(op.dtype);
  switch (op.kind) {
    case Collective::kAllReduce: {
      const int n = as_int_count(op.count, "all_reduce");
      const MPI_Op mop = op.reduce == ReduceOp::kSum ? MPI_SUM : MPI_MAX;
      if (is_16bit(op.dtype)) {
        op.stage_in = comm_buffer(op.count);
        convert_to_f32(op.dtype, op.buf, op.stage_in.f32(), size_t(op.count));
        FD_MPI_CHECK(
            MPI_Iallreduce(MPI_IN_PLACE, op.stage_in.f32(), n, MPI_FLOAT, mop, comm, &op.req));
      } else {
        FD_MPI_CHECK(
            MPI_Iallreduce(MPI_IN_PLACE, op.buf, n, mpi_type(op.dtype), mop, comm, &op.req));
      }
      return;
    }
    case Collective::kReduceScatter: {
      const int n = as_int_count(op.count, "reduce_scatter");
      as_int_count(op.count * size, "reduce_scatter (total)");
      const void* send = op.send;
      void* recv = op.recv;
      MPI_Datatype type = mpi_type(op.dtype);
      if (is_16bit(op.dtype)) {
        op.stage_in = comm_buffer(op.count * size);
        convert_to_f32(op.dtype, op.send, op.stage_in.f32(), size_t(op.count * size));
        op.stage_out = comm_buffer(op.count);
        send = op.stage_in.f32();
        recv = op.stage_out.f32();
        type = MPI_FLOAT;
      } else if (overlaps(op.send, size_t(op.count * size) * esize, op.recv,
                          size_t(op.count) * esize)) {
        op.stage_out = Tensor::empty(Shape{op.count}, op.dtype, MemCategory::kComm, Device::cpu());
        recv = op.stage_out.raw();
      }
      FD_MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, n, type, MPI_SUM, comm, &op.req));
      return;
    }
    case Collective::kAllGather: {
      const int n = as_int_count(op.count, "all_gather");
      as_int_count(op.count * size, "all_gather (total)");
      const MPI_Datatype type = mpi_type(op.dtype);
      if (op.in_place) {
        FD_MPI_CHECK(MPI_Iallgather(MPI_IN_PLACE, 0, type, op.recv, n, type, comm, &op.req));
      } else {
        FD_MPI_CHECK(MPI_Iallgather(op.send, n, type, op.recv, n, type, comm, &op.req));
      }
      return;
    }
    case Collective::kBroadcast: {
      const int n = as_int_count(op.count, "broadcast");
      FD_MPI_CHECK(MPI_Ibcast(op.buf, n, mpi_type(op.dtype), op.root, comm, &op.req));
      return;
    }
    case Collective::kBarrier:
      FD_MPI_CHECK(MPI_Ibarrier(comm, &op.req));
      return;
  }
}

void MpiCommunicator::State::finish(Op& op) {
  switch (op.kind) {
    case Collective::kAllReduce:
      if (op.stage_in.defined())
        convert_f32_to(op.dtype, op.stage_in.f32(), op.buf, size_t(op.count));
      break;
    case Collective::kReduceScatter:
      if (is_16bit(op.dtype)) {
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
}

void MpiCommunicator::State::run(Op& op) {
  start(op);
  const auto t0 = Clock::now();
  // Spin briefly, then sleep 20 us doubling to 200 us between tests so that the
  // thread leaves the (oversubscribed) cores to the compute threads.
  constexpr auto kSpin = std::chrono::microseconds(50);
  constexpr auto kMaxNap = std::chrono::microseconds(200);
  auto nap = std::chrono::microseconds(20);
  for (;;) {
    int flag = 0;
    FD_MPI_CHECK(MPI_Test(&op.req, &flag, MPI_STATUS_IGNORE));
    if (flag) break;
    const auto now = Clock::now();
    if (now - t0 < kSpin) {  // small ops finish within microseconds: poll without sleeping
      std::this_thread::yield();
      continue;
    }
    const double ran = std::chrono::duration<double>(now - t0).count();
    if (ran > timeout_s.load()) timeout_abort(op, ran);
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, kMaxNap);
  }
  finish(op);
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
  FD_MPI_CHECK(MPI_Comm_set_errhandler(state_->comm, MPI_ERRORS_RETURN));
  FD_MPI_CHECK(MPI_Comm_rank(state_->comm, &rank_));
  FD_MPI_CHECK(MPI_Comm_size(state_->comm, &size_));
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
  FD_CHECK(!shut_down_, "collective {} issued after the communicator was shut down",
           op->describe());
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
  as_int_count(recv_count * size_, "reduce_scatter (total)");
  count_bytes(o->kind, o->full_bytes);
  return enqueue(std::move(o));
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

void MpiCommunicator::set_timeout(double seconds) {
  FD_CHECK(seconds > 0, "communicator timeout must be positive, got {}", seconds);
  state_->timeout_s = seconds;
}

void MpiCommunicator::abort(int exit_code, const std::string& message) {
  detail::abort_job(exit_code, message);
}

}  // namespace fd::dist
