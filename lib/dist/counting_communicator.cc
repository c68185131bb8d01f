#include "lib/dist/counting_communicator.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "lib/base/check.h"
#include "lib/base/error.h"
#include "lib/tensor/tensor.h"

namespace fd::dist {
namespace {

WorkPtr done() { return std::make_shared<CompletedWork>(); }

bool is_16bit(DType t) { return t == DType::kBF16 || t == DType::kF16; }

void check_count(int64_t count) {
  FD_CHECK(count >= 0, "collective with negative count {}", count);
}

}  // namespace

CountingCommunicator::CountingCommunicator(int rank, int size, bool staging)
    : rank_(rank), size_(size), staging_asked_(staging), staging_(staging && size > 1) {
  FD_CHECK(size >= 1 && rank >= 0 && rank < size, "counting communicator: rank {} of {}", rank,
           size);
}

namespace {

// The staging MpiCommunicator uses for a 16-bit sum in `mode`: its element
// type and count (fp32 copies, or every rank's 16-bit contribution).
std::pair<DType, int64_t> staging_of(Collective c, int64_t count, int n, DType dtype, Sum16 mode) {
  if (mode == Sum16::kNative) return {dtype, native16_staging_elements(c, count, n)};
  return {DType::kF32, fp32_staging_elements(c, count, n)};
}

}  // namespace

void CountingCommunicator::stage(Collective c, int64_t count, DType dtype) const {
  if (!staging_) return;
  const auto [dt, n] = staging_of(c, count, size_, dtype, sum16());
  // As MpiCommunicator::State::staging: the kept buffer serves ops of its element size.
  if (kept_.defined() && dtype_size(kept_.dtype()) == dtype_size(dt) && n <= kept_.numel()) return;
  if (n == 0) return;
  // On meta: accounted exactly like MpiCommunicator's host buffers (for a
  // reduce-scatter its input and output, alive together), holding no bytes.
  Tensor staging = Tensor::empty(Shape{n}, dt, MemCategory::kComm, Device::meta());
}

void CountingCommunicator::keep_staging(Collective c, int64_t count, DType dtype) {
  if (!staging_ || !is_16bit(dtype)) return;
  const auto [dt, n] = staging_of(c, count, size_, dtype, sum16());
  if (n > 0 &&
      (!kept_.defined() || dtype_size(kept_.dtype()) != dtype_size(dt) || n > kept_.numel()))
    kept_ = Tensor::empty(Shape{n}, dt, MemCategory::kComm, Device::meta());
}

WorkPtr CountingCommunicator::all_reduce_async(void* buf, int64_t count, DType dtype, ReduceOp op) {
  (void)buf, (void)op;
  check_count(count);
  if (is_16bit(dtype)) stage(Collective::kAllReduce, count, dtype);
  count_bytes(Collective::kAllReduce, count * int64_t(dtype_size(dtype)));
  return done();
}

WorkPtr CountingCommunicator::reduce_scatter_async(const void* send, void* recv, int64_t recv_count,
                                                   DType dtype) {
  (void)send, (void)recv;
  check_count(recv_count);
  if (is_16bit(dtype)) stage(Collective::kReduceScatter, recv_count, dtype);
  count_bytes(Collective::kReduceScatter, int64_t(size_) * recv_count * int64_t(dtype_size(dtype)));
  return done();
}

WorkPtr CountingCommunicator::all_gather_async(const void* send, void* recv, int64_t send_count,
                                               DType dtype) {
  (void)send, (void)recv;
  check_count(send_count);
  count_bytes(Collective::kAllGather, int64_t(size_) * send_count * int64_t(dtype_size(dtype)));
  return done();
}

WorkPtr CountingCommunicator::all_to_all_async(const void* send, void* recv, int64_t count_per_rank,
                                               DType dtype) {
  // Nothing staged: MPI moves 16-bit blocks as raw bits.
  check_all_to_all(send, recv, count_per_rank, dtype);
  count_bytes(Collective::kAllToAll, int64_t(size_) * count_per_rank * int64_t(dtype_size(dtype)));
  return done();
}

WorkPtr CountingCommunicator::broadcast_async(void* buf, int64_t count, DType dtype, int root) {
  (void)buf;
  check_count(count);
  FD_CHECK(root >= 0 && root < size_, "broadcast root {} outside [0, {})", root, size_);
  count_bytes(Collective::kBroadcast, count * int64_t(dtype_size(dtype)));
  return done();
}

WorkPtr CountingCommunicator::barrier_async() { return done(); }

WorkPtr CountingCommunicator::send_recv_async(const void* send, int64_t send_count, int dst,
                                              void* recv, int64_t recv_count, int src,
                                              DType dtype) {
  check_send_recv(send, send_count, dst, recv, recv_count, src, dtype);
  count_bytes(Collective::kSendRecv, send_count * int64_t(dtype_size(dtype)), dst);
  return done();
}

std::unique_ptr<Communicator> CountingCommunicator::split(const SplitPlan& plan) {
  check_split(plan);
  return std::make_unique<CountingCommunicator>(plan.group_rank(rank_), plan.group_size(rank_),
                                                staging_asked_);
}

void CountingCommunicator::all_gather_f64(const double* send, double* recv, int64_t send_count) {
  check_count(send_count);
  // The base class sends a double as two i32 words through all_gather: the same bytes.
  count_control_bytes(Collective::kAllGather, int64_t(size_) * 2 * send_count * 4);
  for (int r = 0; r < size_; ++r) {
    double* slot = recv + r * send_count;
    if (slot != send) std::copy(send, send + send_count, slot);
  }
}

void CountingCommunicator::set_timeout(double seconds) {
  FD_CHECK(seconds > 0, "communicator timeout must be positive, got {}", seconds);
}

void CountingCommunicator::abort(int exit_code, const std::string& message) {
  std::fputs(fmt::format("fdtrain: rank {} of {} (simulated): {}\n", rank_, size_, message).c_str(),
             stderr);
  std::fflush(stderr);
  run_abort_hook(message);
  std::exit(exit_code);
}

}  // namespace fd::dist
