// The NCCL backend (CUDA builds; lib/dist/nccl_communicator.h).
#include "lib/dist/nccl_communicator.h"

#include <fmt/format.h>
#include <nccl.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "kernels/kernels.h"
#include "lib/base/check.h"
#include "lib/base/error.h"
#include "lib/tensor/tensor.h"

namespace fd::dist {
namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kF16:
      return ncclFloat16;
    case DType::kI32:
      return ncclInt32;
    case DType::kU8:
      return ncclUint8;
  }
  return ncclFloat32;
}

bool is_16bit(DType t) { return t == DType::kBF16 || t == DType::kF16; }

Device gpu() { return Device::cuda(kernels::current_device()); }

}  // namespace

// Shared by the communicator and its Works (a Work may outlive the communicator).
struct NcclCommunicator::State {
  Communicator* host = nullptr;
  std::shared_ptr<Communicator> owned_host;  // split(): the host sub-communicator
  ncclComm_t comm = nullptr;
  void* stream = nullptr;  // the communication stream
  cudaStream_t cuda_stream() const { return static_cast<cudaStream_t>(stream); }
  double timeout_s = 600.0;
  int64_t next_seq = 1;
  std::shared_ptr<CommStats> stats;
  // keep_staging()'s fp32 buffer on the GPU (Sum16::kFp32). Every op's casts
  // and collective run on `stream`, one op after the other, so ops in flight
  // share it safely; each op's Work holds the buffer it used.
  Tensor kept;
  bool aborted = false;
  std::mutex mu;  // guards aborted / comm teardown

  void check(ncclResult_t rc, const char* call) {
    if (rc == ncclSuccess) return;
    fail(fmt::format("NCCL error in {}: {} ({})", call, ncclGetErrorString(rc),
                     ncclGetLastError(comm) ? ncclGetLastError(comm) : ""));
  }

  [[noreturn]] void fail(const std::string& message) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!aborted && comm != nullptr) ncclCommAbort(comm);
      aborted = true;
      comm = nullptr;
    }
    host->abort(1, message + "; aborting the job");
    std::abort();  // not reached: abort() ends the job
  }
};

namespace {

// One collective in flight: its completion event on the communication stream
// (recorded after everything the op queued there, a 16-bit sum's rounding
// back included), and the buffers it must keep alive until then.
class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<NcclCommunicator::State> st, std::string what, int64_t seq)
      : st_(std::move(st)), what_(std::move(what)), seq_(seq), started_(Clock::now()) {
    done_ = kernels::event_create();
  }
  ~NcclWork() override {
    // Ordered on the device (order_device_after): the compute stream waits for
    // the op, so memory released here goes only to work ordered after it.
    if (!finished_ && !device_ordered_) wait_quietly();
    try {  // a destructor does not throw (std::terminate): the event is lost
      kernels::event_destroy(done_);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fdtrain: %s: releasing its event: %s\n", what_.c_str(), e.what());
    }
  }

  void* done_event() const { return done_; }
  // Holds `t` (staging, a barrier's scalar) until the op has completed.
  void keep(Tensor t) {
    for (Tensor& k : keep_) {
      if (!k.defined()) {
        k = std::move(t);
        return;
      }
    }
    FD_CHECK(false, "{}: more than {} buffers kept", what_, keep_.size());
  }

  void wait() override {
    if (finished_) return;
    const auto t0 = Clock::now();
    auto sleep = std::chrono::microseconds(20);
    while (!kernels::event_query(done_)) {
      ncclResult_t async = ncclSuccess;
      if (st_->comm != nullptr) ncclCommGetAsyncError(st_->comm, &async);
      if (async != ncclSuccess && async != ncclInProgress)
        st_->fail(fmt::format("NCCL reported {} during {} (op #{})", ncclGetErrorString(async),
                              what_, seq_));
      const double ran = std::chrono::duration<double>(Clock::now() - started_).count();
      if (ran > st_->timeout_s)
        st_->fail(
            fmt::format("{} (op #{}) did not complete within dist.timeout_s = {:.0f} s "
                        "(waited {:.1f} s): a peer rank is dead or stalled",
                        what_, seq_, st_->timeout_s, ran));
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, std::chrono::microseconds(200));
    }
    finish();
    st_->stats->wait_ns +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
  }

  bool is_completed() override {
    if (finished_) return true;
    if (!kernels::event_query(done_)) return false;
    finish();
    return true;
  }

  // The compute stream waits for the op's event; the host goes on. wait()
  // later still checks for failure and the timeout.
  void order_device_after() override {
    if (finished_ || device_ordered_) return;
    kernels::stream_wait_event(kernels::compute_stream(), done_);
    device_ordered_ = true;
  }

 private:
  void finish() {
    finished_ = true;
    for (Tensor& k : keep_) k = Tensor();
  }
  void wait_quietly() {
    try {
      wait();
    } catch (...) {
    }
  }

  std::shared_ptr<NcclCommunicator::State> st_;
  std::string what_;
  int64_t seq_;
  Clock::time_point started_;
  void* done_ = nullptr;
  bool finished_ = false;
  bool device_ordered_ = false;  // the compute stream waits for done_
  std::array<Tensor, 2> keep_;
};

kernels::DT kdt(DType t) { return static_cast<kernels::DT>(t); }

// `n` fp32 elements of a 16-bit sum's staging from element `at`: in the kept
// buffer when the op's whole staging (`need` elements) fits there, else a
// buffer of the op's own.
Tensor staging(const NcclCommunicator::State& st, int64_t need, int64_t at, int64_t n) {
  if (st.kept.defined() && st.kept.numel() >= need) return st.kept.flat_slice(at, n);
  return Tensor::empty(Shape{n}, DType::kF32, MemCategory::kComm, gpu());
}

}  // namespace

NcclCommunicator::NcclCommunicator(Communicator& host)
    : host_(host), state_(std::make_shared<State>()) {
  begin();
}

NcclCommunicator::NcclCommunicator(std::shared_ptr<Communicator> host)
    : host_(*host), state_(std::make_shared<State>()) {
  state_->owned_host = std::move(host);
  begin();
}

void NcclCommunicator::begin() {
  Communicator& host = host_;
  FD_CHECK(kernels::current_device() >= 0, "NcclCommunicator before init_cuda_device");
  state_->host = &host;
  state_->stats = stats();
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (host.rank() == 0) state_->check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  static_assert(sizeof(ncclUniqueId) % 4 == 0);
  host.broadcast(&id, int64_t(sizeof(id) / 4), DType::kI32, 0);
  state_->stream = kernels::stream_create();
  state_->check(ncclCommInitRank(&state_->comm, host.size(), id, host.rank()), "ncclCommInitRank");
}

NcclCommunicator::~NcclCommunicator() {
  std::lock_guard<std::mutex> lock(state_->mu);
  // A destructor does not throw (std::terminate): a GPU in an error state is
  // reported, and what could not be released is lost with the process.
  try {
    if (state_->comm != nullptr && !state_->aborted) {
      kernels::stream_synchronize(state_->stream);
      ncclCommDestroy(state_->comm);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fdtrain: closing the NCCL communicator: %s\n", e.what());
  }
  state_->comm = nullptr;
  try {
    kernels::stream_destroy(state_->stream);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fdtrain: closing the NCCL stream: %s\n", e.what());
  }
}

namespace {

// Runs `issue` on the communication stream after the compute stream's queued
// work, and returns a Work completed by an event recorded after it.
template <typename Issue>
WorkPtr launch(const std::shared_ptr<NcclCommunicator::State>& st, const std::string& what,
               Issue&& issue) {
  auto work = std::make_shared<NcclWork>(st, what, st->next_seq++);
  void* ready = kernels::event_create();
  kernels::event_record(ready, kernels::compute_stream());
  kernels::stream_wait_event(st->stream, ready);
  kernels::event_destroy(ready);  // destruction is deferred by CUDA until the event completes
  issue(work.get());
  kernels::event_record(work->done_event(), st->stream);
  return work;
}

}  // namespace

WorkPtr NcclCommunicator::all_reduce_async(void* buf, int64_t count, DType dtype, ReduceOp op) {
  count_bytes(Collective::kAllReduce, count * int64_t(dtype_size(dtype)));
  if (count == 0) return std::make_shared<CompletedWork>();
  const ncclRedOp_t rop = op == ReduceOp::kSum ? ncclSum : ncclMax;
  // Sum16::kNative, a max, and 32-bit types: NCCL in the buffer's own dtype, in place.
  const bool staged = is_16bit(dtype) && op == ReduceOp::kSum && sum16() == Sum16::kFp32;
  auto st = state_;
  return launch(st, fmt::format("all_reduce of {} {}", count, dtype_name(dtype)), [&](NcclWork* w) {
    if (staged) {
      // Widen, sum in fp32, round back once: all on the communication stream.
      Tensor f32 = staging(*st, count, 0, count);
      kernels::cast_on(st->stream, buf, kdt(dtype), f32.raw(), kernels::DT::kF32, count);
      st->check(ncclAllReduce(f32.raw(), f32.raw(), size_t(count), ncclFloat32, rop, st->comm,
                              st->cuda_stream()),
                "ncclAllReduce");
      kernels::cast_on(st->stream, f32.raw(), kernels::DT::kF32, buf, kdt(dtype), count);
      w->keep(std::move(f32));
    } else {
      st->check(ncclAllReduce(buf, buf, size_t(count), nccl_type(dtype), rop, st->comm,
                              st->cuda_stream()),
                "ncclAllReduce");
    }
  });
}

WorkPtr NcclCommunicator::reduce_scatter_async(const void* send, void* recv, int64_t recv_count,
                                               DType dtype) {
  const int64_t total = recv_count * size();
  count_bytes(Collective::kReduceScatter, total * int64_t(dtype_size(dtype)));
  if (recv_count == 0) return std::make_shared<CompletedWork>();
  // Sum16::kNative and 32-bit types: NCCL sums in the buffers' own dtype, no staging.
  const bool staged = is_16bit(dtype) && sum16() == Sum16::kFp32;
  auto st = state_;
  return launch(
      st, fmt::format("reduce_scatter of {} {}", total, dtype_name(dtype)), [&](NcclWork* w) {
        if (staged) {
          // Widen, sum in fp32, round back once: all on the communication stream.
          const int64_t need =
              fp32_staging_elements(Collective::kReduceScatter, recv_count, size());
          Tensor in = staging(*st, need, 0, total);
          Tensor out = staging(*st, need, total, recv_count);
          kernels::cast_on(st->stream, send, kdt(dtype), in.raw(), kernels::DT::kF32, total);
          st->check(ncclReduceScatter(in.raw(), out.raw(), size_t(recv_count), ncclFloat32, ncclSum,
                                      st->comm, st->cuda_stream()),
                    "ncclReduceScatter");
          kernels::cast_on(st->stream, out.raw(), kernels::DT::kF32, recv, kdt(dtype), recv_count);
          w->keep(std::move(in));
          w->keep(std::move(out));
        } else {
          st->check(ncclReduceScatter(send, recv, size_t(recv_count), nccl_type(dtype), ncclSum,
                                      st->comm, st->cuda_stream()),
                    "ncclReduceScatter");
        }
      });
}

void NcclCommunicator::keep_staging(Collective c, int64_t count, DType dtype) {
  if (!is_16bit(dtype) || sum16() != Sum16::kFp32) return;  // kNative stages nothing
  const int64_t need = fp32_staging_elements(c, count, size());
  // Ops in flight hold the buffer they were issued with.
  if (need > state_->kept.numel())
    state_->kept = Tensor::empty(Shape{need}, DType::kF32, MemCategory::kComm, gpu());
}

WorkPtr NcclCommunicator::all_gather_async(const void* send, void* recv, int64_t send_count,
                                           DType dtype) {
  count_bytes(Collective::kAllGather, send_count * size() * int64_t(dtype_size(dtype)));
  if (send_count == 0) return std::make_shared<CompletedWork>();
  auto st = state_;
  return launch(st, fmt::format("all_gather of {} {}", send_count * size(), dtype_name(dtype)),
                [&](NcclWork*) {
                  st->check(ncclAllGather(send, recv, size_t(send_count), nccl_type(dtype),
                                          st->comm, st->cuda_stream()),
                            "ncclAllGather");
                });
}

WorkPtr NcclCommunicator::all_to_all_async(const void* send, void* recv, int64_t count_per_rank,
                                           DType dtype) {
  check_all_to_all(send, recv, count_per_rank, dtype);
  const int n = size();
  count_bytes(Collective::kAllToAll, count_per_rank * n * int64_t(dtype_size(dtype)));
  if (count_per_rank == 0) return std::make_shared<CompletedWork>();
  const size_t block = size_t(count_per_rank) * dtype_size(dtype);
  auto st = state_;
  return launch(st, fmt::format("all_to_all of {} {}", count_per_rank * n, dtype_name(dtype)),
                [&](NcclWork*) {
                  // NCCL has no all-to-all: a send and a receive per peer (this rank
                  // included) in one group, as nccl-tests' alltoall. No sum: 16-bit
                  // blocks move in their own dtype.
                  const auto* s = static_cast<const char*>(send);
                  auto* r = static_cast<char*>(recv);
                  st->check(ncclGroupStart(), "ncclGroupStart");
                  for (int peer = 0; peer < n; ++peer) {
                    st->check(ncclSend(s + size_t(peer) * block, size_t(count_per_rank),
                                       nccl_type(dtype), peer, st->comm, st->cuda_stream()),
                              "ncclSend");
                    st->check(ncclRecv(r + size_t(peer) * block, size_t(count_per_rank),
                                       nccl_type(dtype), peer, st->comm, st->cuda_stream()),
                              "ncclRecv");
                  }
                  st->check(ncclGroupEnd(), "ncclGroupEnd");
                });
}

WorkPtr NcclCommunicator::broadcast_async(void* buf, int64_t count, DType dtype, int root) {
  FD_CHECK(root >= 0 && root < size(), "broadcast root {} outside [0, {})", root, size());
  count_bytes(Collective::kBroadcast, count * int64_t(dtype_size(dtype)));
  if (count == 0) return std::make_shared<CompletedWork>();
  auto st = state_;
  return launch(st, fmt::format("broadcast of {} {} from rank {}", count, dtype_name(dtype), root),
                [&](NcclWork*) {
                  st->check(ncclBroadcast(buf, buf, size_t(count), nccl_type(dtype), root, st->comm,
                                          st->cuda_stream()),
                            "ncclBroadcast");
                });
}

WorkPtr NcclCommunicator::barrier_async() {
  // NCCL has no barrier: an all-reduce of one value on the GPU stands in.
  Tensor one = Tensor::zeros(Shape{1}, DType::kF32, MemCategory::kComm, gpu());
  auto st = state_;
  return launch(st, "barrier", [&](NcclWork* w) {
    st->check(
        ncclAllReduce(one.raw(), one.raw(), 1, ncclFloat32, ncclSum, st->comm, st->cuda_stream()),
        "ncclAllReduce (barrier)");
    w->keep(one);
  });
}

WorkPtr NcclCommunicator::send_recv_async(const void* send, int64_t send_count, int dst, void* recv,
                                          int64_t recv_count, int src, DType dtype) {
  check_send_recv(send, send_count, dst, recv, recv_count, src, dtype);
  count_bytes(Collective::kSendRecv, send_count * int64_t(dtype_size(dtype)), dst);
  if (send_count == 0 && recv_count == 0) return std::make_shared<CompletedWork>();
  const std::string send_what =
      send_count > 0 ? fmt::format("send {} {} to rank {}", send_count, dtype_name(dtype), dst)
                     : std::string("send nothing");
  const std::string recv_what =
      recv_count > 0 ? fmt::format("receive {} {} from rank {}", recv_count, dtype_name(dtype), src)
                     : std::string("receive nothing");
  auto st = state_;
  return launch(
      st, fmt::format("send_recv (rank {} of {}: {}, {})", rank(), size(), send_what, recv_what),
      [&](NcclWork*) {
        st->check(ncclGroupStart(), "ncclGroupStart");
        if (send_count > 0)
          st->check(ncclSend(send, size_t(send_count), nccl_type(dtype), dst, st->comm,
                             st->cuda_stream()),
                    "ncclSend");
        if (recv_count > 0)
          st->check(ncclRecv(recv, size_t(recv_count), nccl_type(dtype), src, st->comm,
                             st->cuda_stream()),
                    "ncclRecv");
        st->check(ncclGroupEnd(), "ncclGroupEnd");
      });
}

std::unique_ptr<Communicator> NcclCommunicator::split(const SplitPlan& plan) {
  // The host sub-communicator carries the new one's unique id, f64 helpers
  // and abort; shared so that the new communicator's Works keep it alive.
  std::shared_ptr<Communicator> host = host_.split(plan);
  host->set_timeout(state_->timeout_s);
  auto sub = std::unique_ptr<NcclCommunicator>(new NcclCommunicator(std::move(host)));
  sub->state_->timeout_s = state_->timeout_s;
  return sub;
}

void NcclCommunicator::all_gather_f64(const double* send, double* recv, int64_t send_count) {
  count_control_bytes(Collective::kAllGather, send_count * size() * int64_t(sizeof(double)));
  host_.all_gather_f64(send, recv, send_count);
}

void NcclCommunicator::set_timeout(double seconds) {
  FD_CHECK(seconds > 0, "communicator timeout must be positive, got {}", seconds);
  state_->timeout_s = seconds;
  host_.set_timeout(seconds);
}

void NcclCommunicator::abort(int exit_code, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (!state_->aborted && state_->comm != nullptr) ncclCommAbort(state_->comm);
    state_->aborted = true;
    state_->comm = nullptr;
  }
  host_.abort(exit_code, message);
  std::abort();  // not reached
}

std::string nccl_version() {
  int v = 0;
  ncclGetVersion(&v);
  return fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

}  // namespace fd::dist
