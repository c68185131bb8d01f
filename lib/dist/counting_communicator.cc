#include "lib/dist/counting_communicator.h"

#include <algorithm>
#include <cstdint>

#include "lib/base/check.h"
#include "lib/base/error.h"
#include "lib/tensor/memory.h"

namespace fd::dist {
namespace {

WorkPtr done() { return std::make_shared<CompletedWork>(); }

bool is_16bit(DType t) { return t == DType::kBF16 || t == DType::kF16; }

// Null buffers (meta tensors without placeholders) never overlap.
bool overlaps(const void* a, size_t na, const void* b, size_t nb) {
  if (a == nullptr || b == nullptr) return false;
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return na > 0 && nb > 0 && pa < pb + nb && pb < pa + na;
}

// The staging the MPI comm thread holds while it runs one collective: counted
// in and out at once (the peak sees it on top of what the caller holds).
void stage(int64_t bytes) {
  if (bytes <= 0) return;
  MemoryAccountant& acct = MemoryAccountant::global();
  acct.add(MemCategory::kComm, bytes);
  acct.sub(MemCategory::kComm, bytes);
}

}  // namespace

CountingCommunicator::CountingCommunicator(int rank, int size, bool staging)
    : rank_(rank), size_(size), staging_(staging && size > 1) {
  FD_CHECK(size >= 1 && rank >= 0 && rank < size, "rank {} of {} ranks", rank, size);
}

WorkPtr CountingCommunicator::all_reduce_async(void*, int64_t count, DType dtype, ReduceOp) {
  FD_CHECK(count >= 0, "all_reduce of {} elements", count);
  if (staging_ && is_16bit(dtype)) stage(count * 4);
  count_bytes(Collective::kAllReduce, count * int64_t(dtype_size(dtype)));
  return done();
}

WorkPtr CountingCommunicator::reduce_scatter_async(const void* send, void* recv,
                                                   int64_t recv_count, DType dtype) {
  FD_CHECK(recv_count >= 0, "reduce_scatter of {} elements", recv_count);
  const size_t esize = dtype_size(dtype);
  if (staging_) {
    if (is_16bit(dtype)) {
      stage(4 * recv_count * size_ + 4 * recv_count);
    } else if (overlaps(send, size_t(recv_count * size_) * esize, recv,
                        size_t(recv_count) * esize)) {
      stage(recv_count * int64_t(esize));
    }
  }
  count_bytes(Collective::kReduceScatter, int64_t(size_) * recv_count * int64_t(esize));
  return done();
}

WorkPtr CountingCommunicator::all_gather_async(const void*, void*, int64_t send_count,
                                               DType dtype) {
  FD_CHECK(send_count >= 0, "all_gather of {} elements", send_count);
  count_bytes(Collective::kAllGather, int64_t(size_) * send_count * int64_t(dtype_size(dtype)));
  return done();
}

WorkPtr CountingCommunicator::broadcast_async(void*, int64_t count, DType dtype, int root) {
  FD_CHECK(root >= 0 && root < size_, "broadcast root {} outside [0, {})", root, size_);
  count_bytes(Collective::kBroadcast, count * int64_t(dtype_size(dtype)));
  return done();
}

WorkPtr CountingCommunicator::barrier_async() { return done(); }

void CountingCommunicator::all_gather_f64(const double* send, double* recv, int64_t send_count) {
  for (int r = 0; r < size_; ++r) std::copy(send, send + send_count, recv + r * send_count);
  count_control_bytes(Collective::kAllGather, int64_t(size_) * send_count * 8);
}

void CountingCommunicator::set_timeout(double seconds) {
  FD_CHECK(seconds > 0, "communicator timeout must be positive, got {}", seconds);
}

void CountingCommunicator::abort(int, const std::string& message) {
  throw Error(ErrorKind::kRuntime, message);
}

}  // namespace fd::dist
