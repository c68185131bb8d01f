// LocalCommunicator: the world of one process. Collectives are copies or
// no-ops done synchronously (the returned Work is already complete); the ring
// model gives 0 bytes sent (n - 1 = 0). Null buffers (meta tensors'
// Tensor::comm_data()) are left alone, so a meta run at world 1 works too.
// There is no peer for send_recv: only empty ones are allowed (they complete);
// split() gives another world of one.
//
// The copies (a reduce-scatter's or all-gather's out of place, an all-to-all's
// one block) are memmove on host memory; a GPU run at world 1 passes the
// device's copy instead (make_gpu_communicator: kernels::copy_device, ordered
// on the compute stream), so it needs no NCCL. Buffers then must not partly
// overlap.
#pragma once

#include <cstddef>

#include "lib/dist/communicator.h"

namespace fd::dist {

class LocalCommunicator final : public Communicator {
 public:
  using CopyFn = void (*)(void* dst, const void* src, size_t bytes);
  LocalCommunicator() = default;
  explicit LocalCommunicator(CopyFn copy) : copy_(copy) {}

  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string_view backend() const override { return "local"; }

  FD_COMMUNICATOR_OVERRIDES;

 private:
  void copy(void* dst, const void* src, size_t bytes) const;
  CopyFn copy_ = nullptr;  // null: memmove
};

}  // namespace fd::dist
