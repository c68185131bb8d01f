// CountingCommunicator: rank r of a world of n ranks that moves no data, for
// `fdtrain estimate` (lib/engine/estimate.h), which runs the real training
// step on the counting device (Device::meta()) with ranks simulated in one
// process.
//
// Every collective completes at once and touches no buffer (its pointers may
// be meta tensors' placeholders). What it does do is what the memory and
// traffic of a real run depend on:
//   - bytes_sent() counts as the real backend does (the ring model of
//     communicator.h), so an estimate's "comm per step" is what summary.json
//     measures;
//   - at n > 1 it allocates and frees, in MemCategory::kComm, the staging the
//     MPI backend's communication thread makes (mpi_communicator.cc): for a
//     16-bit all-reduce an fp32 copy of the buffer; for a 16-bit
//     reduce-scatter fp32 copies of the input and of the output; for an
//     fp32/i32 reduce-scatter whose output overlaps its input, a copy of the
//     output. The comm thread runs one collective at a time, and when it
//     stages one depends on timing; the counting communicator stages each
//     one at the moment it is launched, when the caller holds the most
//     buffers in flight: the worst case, which a run measures or stays under.
//   At n = 1 (the LocalCommunicator a one-rank run uses) nothing is staged.
//   - all_gather_f64 (metrics, norms) gives every rank this rank's values.
#pragma once

#include "lib/dist/communicator.h"

namespace fd::dist {

class CountingCommunicator final : public Communicator {
 public:
  // Rank `rank` of `size` ranks (0 <= rank < size). `staging` false leaves
  // the MPI staging out (to tell it apart from the caller's buffers).
  CountingCommunicator(int rank, int size, bool staging = true);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return size_ == 1 ? "local" : "mpi"; }

  WorkPtr all_reduce_async(void* buf, int64_t count, DType dtype, ReduceOp op) override;
  WorkPtr reduce_scatter_async(const void* send, void* recv, int64_t recv_count,
                               DType dtype) override;
  WorkPtr all_gather_async(const void* send, void* recv, int64_t send_count, DType dtype) override;
  WorkPtr broadcast_async(void* buf, int64_t count, DType dtype, int root) override;
  WorkPtr barrier_async() override;
  void all_gather_f64(const double* send, double* recv, int64_t send_count) override;

  void set_timeout(double seconds) override;
  // Throws fd::Error (kRuntime) with the message: nothing to end.
  [[noreturn]] void abort(int exit_code, const std::string& message) override;

 private:
  int rank_;
  int size_;
  bool staging_;  // size > 1 and staging asked for
};

}  // namespace fd::dist
