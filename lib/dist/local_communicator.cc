#include "lib/dist/local_communicator.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "lib/base/check.h"
#include "lib/base/host_name.h"

namespace fd::dist {
namespace {

WorkPtr done() { return std::make_shared<CompletedWork>(); }

void check_count(int64_t count) {
  FD_CHECK(count >= 0, "collective with negative count {}", count);
}

}  // namespace

void LocalCommunicator::copy(void* dst, const void* src, size_t bytes) const {
  if (copy_ == nullptr) {
    std::memmove(dst, src, bytes);
    return;
  }
  const auto d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
  FD_CHECK(d + bytes <= s || s + bytes <= d,
           "a device copy of {} bytes between overlapping buffers", bytes);
  copy_(dst, src, bytes);
}

WorkPtr LocalCommunicator::all_reduce_async(void* buf, int64_t count, DType dtype, ReduceOp op) {
  (void)buf, (void)dtype, (void)op;
  check_count(count);
  count_bytes(Collective::kAllReduce, count * int64_t(dtype_size(dtype)));
  return done();
}

WorkPtr LocalCommunicator::reduce_scatter_async(const void* send, void* recv, int64_t recv_count,
                                                DType dtype) {
  check_count(recv_count);
  const size_t bytes = size_t(recv_count) * dtype_size(dtype);
  if (bytes > 0 && send != recv && send != nullptr) copy(recv, send, bytes);
  count_bytes(Collective::kReduceScatter, int64_t(bytes));
  return done();
}

WorkPtr LocalCommunicator::all_gather_async(const void* send, void* recv, int64_t send_count,
                                            DType dtype) {
  check_count(send_count);
  const size_t bytes = size_t(send_count) * dtype_size(dtype);
  if (bytes > 0 && send != recv && send != nullptr) copy(recv, send, bytes);
  count_bytes(Collective::kAllGather, int64_t(bytes));
  return done();
}

WorkPtr LocalCommunicator::all_to_all_async(const void* send, void* recv, int64_t count_per_rank,
                                            DType dtype) {
  check_all_to_all(send, recv, count_per_rank, dtype);
  // One rank: its own block is the whole buffer.
  const size_t bytes = size_t(count_per_rank) * dtype_size(dtype);
  if (bytes > 0 && send != nullptr && recv != nullptr) copy(recv, send, bytes);
  count_bytes(Collective::kAllToAll, int64_t(bytes));
  return done();
}

WorkPtr LocalCommunicator::broadcast_async(void* buf, int64_t count, DType dtype, int root) {
  (void)buf;
  check_count(count);
  FD_CHECK(root == 0, "broadcast from root {} in a world of 1", root);
  count_bytes(Collective::kBroadcast, count * int64_t(dtype_size(dtype)));
  return done();
}

WorkPtr LocalCommunicator::barrier_async() { return done(); }

WorkPtr LocalCommunicator::send_recv_async(const void* send, int64_t send_count, int dst,
                                           void* recv, int64_t recv_count, int src, DType dtype) {
  // With one rank the only peer would be rank 0 itself: the check refuses any
  // non-empty half.
  check_send_recv(send, send_count, dst, recv, recv_count, src, dtype);
  return done();
}

std::unique_ptr<Communicator> LocalCommunicator::split(const SplitPlan& plan) {
  check_split(plan);
  return std::make_unique<LocalCommunicator>(copy_);
}

void LocalCommunicator::set_timeout(double seconds) {
  FD_CHECK(seconds > 0, "communicator timeout must be positive, got {}", seconds);
}

void LocalCommunicator::abort(int exit_code, const std::string& message) {
  std::fputs(fmt::format("fdtrain: rank 0 (host {}): {}\n", host_name(), message).c_str(), stderr);
  std::fflush(stderr);
  run_abort_hook(message);
  std::exit(exit_code);
}

}  // namespace fd::dist
